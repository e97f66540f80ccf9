//! `GpuJoinExec`, the physical plan node that runs a join on the GPU, with its stream, its
//! shared build side and its metrics.

mod build;
mod metrics;
mod node;
mod stream;

pub use metrics::GpuJoinMetrics;
pub use node::{GpuJoinExec, JoinBackend};
