//! [`GpuJoinMetrics`]: what EXPLAIN ANALYZE shows for a `GpuJoinExec`.
//!
//! Per output partition: output rows, `elapsed_compute` (host time spent in the partition's
//! stream: staging probe batches, gathering host columns and applying the residual filter to
//! the lane's output, handing out results), probe rows and chunks. For the whole
//! join: build rows and `build_time` (from when it begins collecting the build side until the
//! table is ready on the device), the device time of each phase measured with events (`upload_time`,
//! `transform_time`, `match_time`, `materialize_time`, `download_time`; phases of different
//! chunks overlap, so they add up to more than the wall time), bytes moved each way, output
//! passes, output bytes that had to be downloaded into pageable memory because the pinned
//! output pool was full, build bytes copied off another join's pinned output pages (so that
//! they go back to their pool while the build side is held), build view values gathered on the
//! device (`view_bytes_gathered`), peak device memory, and how long
//! the lane's thread waited (`lane_wait_time`) and the partitions waited for pinned blocks
//! (`staging_wait_time`).

use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder, Time,
};

use crate::join::Phases;

/// Metrics of the whole join, shared by its partitions and its device lane.
#[derive(Debug, Clone)]
pub struct RunMetrics {
    /// Device time per phase and bytes moved.
    pub phases: Phases,
    /// Build rows.
    pub build_rows: Count,
    /// From when the join begins collecting its build side until the table is ready (on
    /// several devices, the first device's).
    pub build_time: Time,
    /// Output passes (windows of a chunk's output).
    pub passes: Count,
    /// Output bytes downloaded into pageable memory (the pinned output pool was full).
    pub unpooled_bytes: Count,
    /// Bytes of build batches copied off pages of the output pool (another join's output),
    /// which would otherwise stay out of the pool as long as the build side is held.
    pub build_copied_bytes: Count,
    /// Most device memory held at once, in bytes (on several devices, the largest of one
    /// device's).
    pub peak_device_memory: Gauge,
    /// Time the device lane's thread waited (for the device, or for work).
    pub lane_wait_time: Time,
    /// Host time hashing keys as batches arrive (for checked keys, staging their length classes
    /// and check bytes, which the device hashes), summed over the threads that do it; zero for
    /// keys encoded exactly.
    pub key_hash_time: Time,
    /// Device lanes that joined probe chunks: one per device the join ran on
    /// (`gpu_join.devices`; fewer where a device's memory was not free, or where fewer probe
    /// partitions had rows); a join in groups counts its lanes for every group.
    pub device_lanes: Count,
    /// Bytes of build view values the device gathered into the output windows and downloaded
    /// (`gpu_join.view_bytes_on_device`); 0 where the host gathers them.
    pub view_bytes_gathered: Count,
}

impl RunMetrics {
    /// Registers the join-wide metrics.
    pub fn new(metrics: &ExecutionPlanMetricsSet) -> Self {
        Self {
            phases: Phases::new(metrics),
            build_rows: MetricBuilder::new(metrics).global_counter("build_rows"),
            build_time: MetricBuilder::new(metrics).subset_time("build_time", 0),
            passes: MetricBuilder::new(metrics).global_counter("output_passes"),
            unpooled_bytes: MetricBuilder::new(metrics).global_counter("unpooled_output_bytes"),
            build_copied_bytes: MetricBuilder::new(metrics).global_counter("build_copied_bytes"),
            peak_device_memory: MetricBuilder::new(metrics).global_gauge("peak_device_memory"),
            lane_wait_time: MetricBuilder::new(metrics).subset_time("lane_wait_time", 0),
            key_hash_time: MetricBuilder::new(metrics).subset_time("key_hash_time", 0),
            device_lanes: MetricBuilder::new(metrics).global_counter("device_lanes"),
            view_bytes_gathered: MetricBuilder::new(metrics).global_counter("view_bytes_gathered"),
        }
    }
}

/// Metrics of one output partition of a `GpuJoinExec`.
#[derive(Debug, Clone)]
pub struct GpuJoinMetrics {
    /// Output rows and the host time of this partition's stream.
    pub baseline: BaselineMetrics,
    /// Probe rows read by this partition.
    pub probe_rows: Count,
    /// Probe chunks this partition sent to the device.
    pub chunks: Count,
    /// Time this partition waited for a pinned block to stage into.
    pub staging_wait: Time,
}

impl GpuJoinMetrics {
    /// Registers a partition's metrics.
    pub fn new(partition: usize, metrics: &ExecutionPlanMetricsSet) -> Self {
        Self {
            baseline: BaselineMetrics::new(metrics, partition),
            probe_rows: MetricBuilder::new(metrics).counter("probe_rows", partition),
            chunks: MetricBuilder::new(metrics).counter("probe_chunks", partition),
            staging_wait: MetricBuilder::new(metrics).subset_time("staging_wait_time", partition),
        }
    }
}
