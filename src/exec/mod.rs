//! `GpuJoinExec`, the physical plan node that runs a join on the GPU, and the engine under it:
//! one execution's shared state and build side (`run`), the device lane that drives every chunk
//! of every partition through upload, kernel and download queues (`lane`, `chunk`), each
//! partition's stream (`stream`, `stager`), chunk sizing against the memory budget (`sizing`),
//! the dynamic filter (`filter`) and the build keys' set it may hold (`key_set`), residual join filters evaluated on the host (`residual`; those
//! compiled for the device are in `crate::filter`),
//! hashed keys (`key_hash`), build-row marks merged across devices (`marks`), the columns staged from each input (`side`), columns gathered on
//! the host from the device's positions (`gather`, `view_gather`, `dictionary_gather`), which of a join's columns
//! travel which way (`carriage`: `gpu_join.probe_columns`), a build side's view columns
//! carried through the device as their views (`device_views`) and their values gathered there
//! (`view_bytes`), null-aware anti joins (`null_aware`),
//! metrics, what the engine holds (`usage`), and build sides kept across a session's queries
//! (`build_cache`).

mod build_cache;
mod carriage;
mod chunk;
mod coalesce;
mod device_views;
mod dictionary_gather;
mod filter;
mod gather;
mod grace;
mod key_check;
mod key_hash;
mod key_set;
mod lane;
mod marks;
mod metrics;
mod node;
mod null_aware;
mod residual;
mod run;
mod side;
mod sizing;
mod stager;
mod stream;
mod usage;
mod view_bytes;
mod view_gather;

pub use build_cache::BuildCache;
pub use carriage::ProbeColumns;
pub(crate) use device_views::carried_as_views;
pub(crate) use filter::{applied_above_scans, enabled as dynamic_filters_enabled};
pub use lane::lanes_running;
pub use metrics::{GpuJoinMetrics, RunMetrics};
pub use node::{GpuJoinExec, GpuJoinExecBuilder, JoinBackend, Replaced, unsupported};
pub use sizing::{ColumnKinds, Limits, MIN_CHUNK_ROWS, PassValues, Sizing, plan};
pub use usage::{EngineUsage, engine_usage};
