//! Host⇄device copy bandwidth with pinned host memory, measured on the spot: the figure a
//! PCIe floor (bytes moved / bandwidth) is computed from. Benchmark support.

use std::time::Instant;

use datafusion::common::Result;

use super::context::CudaDevice;
use super::host_memory::HostPool;
use super::memory::{DeviceBuffer, MemoryTracker, driver_error};
use super::transfer::{device_to_host, host_to_device};

/// Copy bandwidths in bytes per second.
#[derive(Debug, Clone, Copy)]
pub struct CopyBandwidth {
    pub host_to_device: f64,
    pub device_to_host: f64,
}

/// The best of `runs` copies of `bytes` bytes each way between pinned host memory and the
/// device, after one warm-up copy each way.
pub fn pinned_copy_bandwidth(
    device: &CudaDevice,
    bytes: usize,
    runs: usize,
) -> Result<CopyBandwidth> {
    let stream = device.new_stream()?;
    let pool = HostPool::pinned(device.context(), bytes, 1)?;
    let mut host = pool
        .try_take(bytes)?
        .ok_or_else(|| datafusion::common::exec_datafusion_err!("no pinned block"))?;
    host.bytes_mut()?.fill(1);
    let tracker = std::sync::Arc::new(MemoryTracker::default());
    let mut dev = DeviceBuffer::alloc(device.pool(), &stream, bytes, &tracker)?;
    let sync = |what| stream.synchronize().map_err(|e| driver_error(e, what));
    let mut best = [f64::MAX; 2];
    for run in 0..=runs.max(1) {
        let start = Instant::now();
        host_to_device(&stream, &mut host, 0, &mut dev, 0, bytes)?;
        sync("copy to device")?;
        let up = start.elapsed().as_secs_f64();
        let start = Instant::now();
        device_to_host(&stream, &dev, 0, &mut host, 0, bytes)?;
        sync("copy to host")?;
        let down = start.elapsed().as_secs_f64();
        if run > 0 {
            best = [best[0].min(up), best[1].min(down)];
        }
    }
    host.wait()?;
    Ok(CopyBandwidth {
        host_to_device: bytes as f64 / best[0],
        device_to_host: bytes as f64 / best[1],
    })
}
