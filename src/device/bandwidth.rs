//! Host⇄device copy bandwidth with pinned host memory, measured on the spot: the figure a
//! PCIe floor (bytes moved / bandwidth) is computed from.

use std::time::Instant;

use datafusion::common::Result;

use super::context::CudaDevice;
use super::memory::driver_error;

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
    // SAFETY: the host buffer's bytes are never read on the host; the device copies write and
    // read it only through the stream, which is synchronized before each timing ends.
    let mut host = unsafe { device.context().alloc_pinned_with_flags::<u8>(bytes, 0) }
        .map_err(|e| driver_error(e, "allocate pinned memory"))?;
    let mut dev = stream
        .alloc_zeros::<u8>(bytes)
        .map_err(|e| driver_error(e, "allocate device memory"))?;
    let mut best = [f64::MAX; 2];
    for run in 0..=runs.max(1) {
        let start = Instant::now();
        stream
            .memcpy_htod(&host, &mut dev)
            .and_then(|_| stream.synchronize())
            .map_err(|e| driver_error(e, "copy to device"))?;
        let up = start.elapsed().as_secs_f64();
        let start = Instant::now();
        stream
            .memcpy_dtoh(&dev, &mut host)
            .and_then(|_| stream.synchronize())
            .map_err(|e| driver_error(e, "copy to host"))?;
        let down = start.elapsed().as_secs_f64();
        if run > 0 {
            best = [best[0].min(up), best[1].min(down)];
        }
    }
    Ok(CopyBandwidth {
        host_to_device: bytes as f64 / best[0],
        device_to_host: bytes as f64 / best[1],
    })
}
