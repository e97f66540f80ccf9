//! [`GpuJoinMetrics`]: what EXPLAIN ANALYZE shows for a `GpuJoinExec` — rows, per-phase times, bytes moved
//! and peak device memory.

use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, Gauge, MetricBuilder,
};

use crate::join::Phases;

/// Metrics of one partition of a `GpuJoinExec` (phase times and memory are operator-wide).
#[derive(Debug, Clone)]
pub struct GpuJoinMetrics {
    /// Output rows and total elapsed compute time of this partition.
    pub baseline: BaselineMetrics,
    /// Probe rows read by this partition.
    pub probe_rows: Count,
    /// Build rows (counted once, by the partition that built).
    pub build_rows: Count,
    /// Upload, transform, match, materialize and download times.
    pub phases: Phases,
    /// Most device memory held at once by the operator, in bytes.
    pub peak_device_memory: Gauge,
}

impl GpuJoinMetrics {
    /// Registers a partition's metrics; `peak_device_memory` is the operator's one gauge.
    pub fn new(
        partition: usize,
        metrics: &ExecutionPlanMetricsSet,
        peak_device_memory: Gauge,
    ) -> Self {
        Self {
            baseline: BaselineMetrics::new(metrics, partition),
            probe_rows: MetricBuilder::new(metrics).counter("probe_rows", partition),
            build_rows: MetricBuilder::new(metrics).global_counter("build_rows"),
            phases: Phases::new(metrics),
            peak_device_memory,
        }
    }
}
