//! [`EngineUsage`]: what the streaming engine holds on one backend right now — running lanes,
//! reserved device memory, pinned blocks in use, allocated device memory — so that a caller (a
//! test, an operator's health check) can see that a finished, failed or cancelled query left
//! nothing behind.

use datafusion::common::Result;

use super::lane::lanes_running;
use super::node::JoinBackend;
use crate::backend::{Backend, HostBackend};

/// What the engine holds now on one backend.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EngineUsage {
    /// Device lanes whose threads are running (every backend).
    pub lanes: usize,
    /// Bytes of the backend's memory budget reserved by joins.
    pub reserved: usize,
    /// Bytes of staging and output host blocks in use (handed out, not idle in their pools).
    pub host_blocks: usize,
    /// Bytes allocated from the device's memory pool (CUDA only; 0 on the host backend).
    pub device_allocated: usize,
}

impl EngineUsage {
    /// Whether nothing is held.
    pub fn is_idle(&self) -> bool {
        *self == Self::default()
    }
}

/// What the engine holds now on `backend` (on every one of its devices, added up).
pub fn engine_usage(backend: JoinBackend) -> Result<EngineUsage> {
    let lanes = lanes_running();
    match backend {
        JoinBackend::Host(_) => {
            let b = HostBackend::default();
            Ok(EngineUsage {
                lanes,
                reserved: b.budget().capacity() - b.budget().available(),
                host_blocks: b.staging().in_use() + b.output().in_use(),
                device_allocated: 0,
            })
        }
        JoinBackend::Cuda(devices) => {
            let mut usage = EngineUsage {
                lanes,
                ..Default::default()
            };
            for ordinal in devices.iter() {
                let d = crate::device::cuda_device(ordinal)?;
                usage.reserved += d.budget().capacity() - d.budget().available();
                usage.host_blocks += d.staging().in_use() + d.output().in_use();
                usage.device_allocated += d.pool().used()?;
            }
            Ok(usage)
        }
    }
}
