//! Device memory with accounting: every [`DeviceBuffer`] counts its bytes in a shared
//! [`MemoryTracker`] (current and peak use, shown in EXPLAIN ANALYZE) and is freed, stream
//! ordered, when dropped — at the end of a query, or when it is cancelled. Allocation failure
//! is `ResourcesExhausted`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use cudarc::driver::sys::CUresult;
use cudarc::driver::{CudaSlice, CudaStream, DriverError};
use datafusion::common::{DataFusionError, Result, exec_datafusion_err};

/// Current and peak bytes of device memory held by one operator.
#[derive(Debug, Default)]
pub struct MemoryTracker {
    current: AtomicUsize,
    peak: AtomicUsize,
}

impl MemoryTracker {
    fn grow(&self, bytes: usize) {
        let now = self.current.fetch_add(bytes, Ordering::Relaxed) + bytes;
        self.peak.fetch_max(now, Ordering::Relaxed);
    }

    fn shrink(&self, bytes: usize) {
        self.current.fetch_sub(bytes, Ordering::Relaxed);
    }

    /// Bytes held now.
    pub fn current(&self) -> usize {
        self.current.load(Ordering::Relaxed)
    }

    /// Most bytes held at once.
    pub fn peak(&self) -> usize {
        self.peak.load(Ordering::Relaxed)
    }
}

/// A device allocation of bytes; kernels see it as whatever element type they declare.
#[derive(Debug)]
pub struct DeviceBuffer {
    slice: CudaSlice<u8>,
    tracker: Arc<MemoryTracker>,
}

impl DeviceBuffer {
    /// Allocates `bytes` (at least 1, so every buffer has a valid address) on `stream`.
    pub fn alloc(
        stream: &Arc<CudaStream>,
        bytes: usize,
        tracker: &Arc<MemoryTracker>,
    ) -> Result<Self> {
        let bytes = bytes.max(1);
        // SAFETY: the memory is uninitialized; every caller writes it (a kernel, a copy or a
        // memset) before reading, which the primitives' tests check on poisoned outputs.
        let slice =
            unsafe { stream.alloc::<u8>(bytes) }.map_err(|e| driver_error(e, "allocate"))?;
        tracker.grow(bytes);
        Ok(Self {
            slice,
            tracker: Arc::clone(tracker),
        })
    }

    /// The underlying slice, for kernel arguments and copies.
    pub fn slice(&self) -> &CudaSlice<u8> {
        &self.slice
    }

    /// The underlying slice, mutably.
    pub fn slice_mut(&mut self) -> &mut CudaSlice<u8> {
        &mut self.slice
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.slice.len()
    }

    /// Whether the buffer holds no bytes (never, since allocations are at least one byte).
    pub fn is_empty(&self) -> bool {
        self.slice.len() == 0
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        self.tracker.shrink(self.slice.len());
    }
}

/// Makes the device's default (stream-ordered) memory pool keep freed memory instead of giving
/// it back to the driver at every synchronization, so that later allocations of a query, and
/// later queries, reuse it.
pub fn keep_freed_memory(ctx: &cudarc::driver::CudaContext) -> Result<()> {
    use cudarc::driver::sys;
    ctx.bind_to_thread()
        .map_err(|e| driver_error(e, "bind context"))?;
    let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
    // SAFETY: `pool` is a valid out-pointer and `cu_device()` a device handle of a live context.
    unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, ctx.cu_device()) }
        .result()
        .map_err(|e| driver_error(e, "get the default memory pool"))?;
    let mut threshold: u64 = u64::MAX;
    // SAFETY: the release threshold attribute takes a pointer to a cuuint64_t, which lives for
    // the call; `pool` was just returned by the driver.
    unsafe {
        sys::cuMemPoolSetAttribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut threshold as *mut u64).cast(),
        )
    }
    .result()
    .map_err(|e| driver_error(e, "set the memory pool's release threshold"))
}

/// Turns a driver error into a DataFusion error: out of memory is `ResourcesExhausted`.
pub fn driver_error(e: DriverError, what: &str) -> DataFusionError {
    if e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        DataFusionError::ResourcesExhausted(format!("GPU out of memory during {what}"))
    } else {
        exec_datafusion_err!("CUDA error during {what}: {e:?}")
    }
}
