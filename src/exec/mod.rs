//! `GpuJoinExec`, the physical plan node that runs a join on the GPU, with its stream, its
//! shared build side and its metrics.

mod build;
mod exec;
mod metrics;
mod stream;

pub use exec::{GpuJoinExec, JoinBackend};
pub use metrics::GpuJoinMetrics;
