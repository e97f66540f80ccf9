//! Kernel launches: [`launch!`] looks the kernel up (cached per device), checks the grid and
//! launches it on the queue's stream with `BLOCK_THREADS` threads per block. Kernel arguments are
//! device addresses (`DeviceBuffer::ptr`, or `ptr_mut` for outputs) and scalars.
//!
//! `GPU_JOIN_PROFILE=1` synchronizes around every launch and prints its time to stderr.

/// Launches `$name` of module `$module` on `$queue` with `$grid` blocks: the only `unsafe` of the
/// launch wrappers. Each wrapper checks, before it launches, that every buffer holds the
/// elements the kernel touches. `@with $queue, $function, ...` launches a kernel already looked
/// up (one of a compiled filter's module).
macro_rules! launch {
    ($queue:expr, $module:expr, $name:expr, $grid:expr, $($arg:expr),* $(,)?) => {{
        let queue: &$crate::backend::CudaBackend = $queue;
        $crate::backend::cuda::launch::launch!(@with queue, queue.device().function($module, $name)?,
            $name, $grid, $($arg),*)
    }};
    (@with $queue:expr, $function:expr, $name:expr, $grid:expr, $($arg:expr),* $(,)?) => {{
        let queue: &$crate::backend::CudaBackend = $queue;
        let name: &'static str = $name;
        let grid = u32::try_from($grid).map_err(|_| {
            datafusion::common::internal_datafusion_err!("{name}: grid of {} blocks is too large", $grid)
        })?;
        if grid > 0 {
            use cudarc::driver::PushKernelArg as _;
            let f = $function;
            let mut args = queue.stream().launch_builder(&f);
            $( args.arg(&$arg); )*
            let cfg = cudarc::driver::LaunchConfig {
                grid_dim: (grid, 1, 1),
                block_dim: ($crate::device::BLOCK_THREADS as u32, 1, 1),
                shared_mem_bytes: 0,
            };
            let start = $crate::backend::cuda::launch::profile_start(queue)?;
            // SAFETY: the arguments match the kernel's signature in its kernels/ file (device
            // addresses as u64, scalars and `#[repr(C)]` argument structs of the declared types),
            // and the calling wrapper checked that every buffer holds the elements the kernel
            // touches.
            unsafe { args.launch(cfg) }
                .map_err(|e| $crate::device::driver_error(e, name))?;
            $crate::backend::cuda::launch::profile_end(queue, name, grid, start)?;
        }
    }};
}

pub(crate) use launch;

use std::time::Instant;

use datafusion::common::Result;

use super::CudaBackend;
use crate::backend::Backend;

/// Whether `GPU_JOIN_PROFILE=1`: every kernel is synchronized and timed on stderr.
fn profiling() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("GPU_JOIN_PROFILE").is_ok_and(|v| v == "1"))
}

/// When profiling: waits for the queue and starts a clock.
pub(crate) fn profile_start(queue: &CudaBackend) -> Result<Option<Instant>> {
    if !profiling() {
        return Ok(None);
    }
    queue.synchronize()?;
    Ok(Some(Instant::now()))
}

/// When profiling: waits for the kernel and prints its time.
pub(crate) fn profile_end(
    queue: &CudaBackend,
    name: &str,
    grid: u32,
    start: Option<Instant>,
) -> Result<()> {
    if let Some(start) = start {
        queue.synchronize()?;
        eprintln!(
            "gpu_join kernel {name:<24} grid {grid:>9} {:>9.3} ms",
            start.elapsed().as_secs_f64() * 1e3
        );
    }
    Ok(())
}

/// Blocks of `per_block` items for `n` items.
pub(crate) fn blocks(n: usize, per_block: usize) -> usize {
    n.div_ceil(per_block)
}
