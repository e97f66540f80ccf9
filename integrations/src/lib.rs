//! `GpuJoinExec` on distributed DataFusion engines: [Ballista](crate::ballista) and
//! [datafusion-distributed](crate::distributed).
//!
//! Each module starts a cluster in this process, as the engine's own tests do (a scheduler
//! and executors for Ballista; workers behind in-memory channels for datafusion-distributed),
//! with [`GpuJoinRule`](datafusion_gpu_join::GpuJoinRule) where the engine plans and
//! [`GpuJoinCodec`](datafusion_gpu_join::GpuJoinCodec) where plans are sent and received. The
//! examples `ballista` and `distributed` run TPC-H queries ([`tpch`]) on them and compare the
//! answers with a local `SessionContext`'s.
//!
//! This crate is a workspace member of its own, so that Ballista, datafusion-distributed and
//! arrow-flight stay out of `datafusion-gpu-join`'s build.

pub mod ballista;
pub mod distributed;
pub mod example;
pub mod tpch;
