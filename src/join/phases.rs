//! Per-phase timers of a join (upload, transform, match, materialize, download) and the bytes
//! it moved between host and backend (and kept from moving by packing), shown by EXPLAIN ANALYZE. A phase's time includes
//! waiting for the backend to finish its work.

use datafusion::common::Result;
use datafusion::physical_plan::metrics::{Count, ExecutionPlanMetricsSet, MetricBuilder, Time};

use crate::backend::Backend;

/// The phase timers and transfer counters of one operator, shared by all its partitions.
#[derive(Debug, Clone)]
pub struct Phases {
    pub upload: Time,
    pub transform: Time,
    pub matching: Time,
    pub materialize: Time,
    pub download: Time,
    /// Bytes of Arrow data uploaded to the backend (the host layout: bit-packed validity).
    pub bytes_uploaded: Count,
    /// Bytes of Arrow data downloaded from the backend.
    pub bytes_downloaded: Count,
    /// Bytes that packing integer columns of a narrow range kept from being uploaded
    /// (`gpu_join.pack_uploads`): `bytes_uploaded` plus these is what the copies would have
    /// moved unpacked.
    pub upload_bytes_saved: Count,
}

impl Phases {
    /// Registers the timers in `metrics` (one set per operator: partition-independent).
    pub fn new(metrics: &ExecutionPlanMetricsSet) -> Self {
        let t = |name: &'static str| MetricBuilder::new(metrics).subset_time(name, 0);
        Self {
            upload: t("upload_time"),
            transform: t("transform_time"),
            matching: t("match_time"),
            materialize: t("materialize_time"),
            download: t("download_time"),
            bytes_uploaded: MetricBuilder::new(metrics).global_counter("bytes_uploaded"),
            bytes_downloaded: MetricBuilder::new(metrics).global_counter("bytes_downloaded"),
            upload_bytes_saved: MetricBuilder::new(metrics).global_counter("upload_bytes_saved"),
        }
    }
}

/// Runs `f` and waits for the backend, adding the elapsed time to `time`.
pub fn timed<B: Backend, T>(backend: &B, time: &Time, f: impl FnOnce() -> Result<T>) -> Result<T> {
    let guard = time.timer();
    let out = f()?;
    backend.synchronize()?;
    drop(guard);
    Ok(out)
}
