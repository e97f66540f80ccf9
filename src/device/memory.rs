//! Device memory with accounting. Buffers come from the crate's own stream-ordered memory pool
//! ([`DevicePool`], one per device), which keeps freed memory for later allocations of the
//! process instead of returning it to the driver, without changing the device's default pool
//! that other CUDA users of the process share. Every [`DeviceBuffer`] counts its bytes in a
//! shared [`MemoryTracker`] (current and peak use, shown in EXPLAIN ANALYZE). A tracker can
//! carry a limit, the device memory a join has reserved from its
//! [`MemoryBudget`](super::MemoryBudget): an allocation past it first tries to reserve more
//! from the budget, without waiting (the join's estimate of its needs can fall short), and is
//! refused with `ResourcesExhausted` if the budget has none free, instead of taking memory the
//! budget gave to someone else. Buffers are
//! freed, stream ordered, when dropped; their owners drop them only after the device work that
//! uses them has finished (see `backend`).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::driver::sys::{self, CUresult};
use cudarc::driver::{CudaContext, CudaStream, DriverError};
use datafusion::common::{DataFusionError, Result, exec_datafusion_err, resources_err};

use super::budget::{Holder, MemoryBudget, Reservation};

/// Current and peak bytes held by one join (or one test), with an optional limit.
#[derive(Debug)]
pub struct MemoryTracker {
    current: AtomicUsize,
    peak: AtomicUsize,
    limit: AtomicUsize,
    /// The budget to reserve more from past the limit, and what was reserved so (given back
    /// with the tracker).
    overdraft: Mutex<Option<Reservation>>,
    /// Bytes reserved past the limit.
    extra: AtomicUsize,
}

impl Default for MemoryTracker {
    fn default() -> Self {
        Self {
            current: AtomicUsize::new(0),
            peak: AtomicUsize::new(0),
            limit: AtomicUsize::new(usize::MAX),
            overdraft: Mutex::new(None),
            extra: AtomicUsize::new(0),
        }
    }
}

/// Least bytes reserved past the limit at a time.
const OVERDRAFT_STEP: usize = 16 << 20;

impl MemoryTracker {
    /// Lets allocations past the limit reserve more from `budget` for `holder`, if it has
    /// memory free.
    pub fn set_overdraft(&self, budget: &Arc<MemoryBudget>, holder: Holder) {
        if let Ok(mut o) = self.overdraft.lock() {
            *o = Some(budget.nothing(holder));
        }
    }

    /// Reserves at least `bytes` more from the overdraft budget; whether it could.
    fn overdraw(&self, bytes: usize) -> bool {
        let Ok(mut guard) = self.overdraft.lock() else {
            return false;
        };
        let Some(held) = guard.as_mut() else {
            return false;
        };
        match held.try_more(bytes.max(OVERDRAFT_STEP)) {
            Some(r) => {
                self.extra.fetch_add(r.bytes(), Ordering::Relaxed);
                log::debug!(
                    "GpuJoinExec reserved {} more bytes of device memory",
                    r.bytes()
                );
                held.merge(r);
                true
            }
            None => false,
        }
    }

    /// Counts `bytes` more, unless that would pass the limit (and the budget has no more).
    pub fn grow(&self, bytes: usize) -> Result<()> {
        let mut now = self.current.load(Ordering::Relaxed);
        loop {
            let limit = self
                .limit
                .load(Ordering::Relaxed)
                .saturating_add(self.extra.load(Ordering::Relaxed));
            let next = now.saturating_add(bytes);
            if next > limit {
                if self.overdraw(next - limit) {
                    continue;
                }
                return resources_err!(
                    "GpuJoinExec: allocating {bytes} bytes would pass the {limit} bytes of \
                     memory this join reserved ({now} in use)"
                );
            }
            match self.current.compare_exchange_weak(
                now,
                next,
                Ordering::Relaxed,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    self.peak.fetch_max(next, Ordering::Relaxed);
                    return Ok(());
                }
                Err(seen) => now = seen,
            }
        }
    }

    /// Counts `bytes` fewer.
    pub fn shrink(&self, bytes: usize) {
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

    /// Sets the most bytes that may be held at once (`usize::MAX`: no limit).
    pub fn set_limit(&self, bytes: usize) {
        self.limit.store(bytes, Ordering::Relaxed);
    }

    /// The limit set by [`set_limit`](Self::set_limit).
    pub fn limit(&self) -> usize {
        self.limit.load(Ordering::Relaxed)
    }

    /// Bytes reserved past the limit so far.
    pub fn overdrawn(&self) -> usize {
        self.extra.load(Ordering::Relaxed)
    }
}

/// The crate's stream-ordered device memory pool of one device.
#[derive(Debug)]
pub struct DevicePool {
    pool: sys::CUmemoryPool,
    ctx: Arc<CudaContext>,
    /// The devices [`grant`](Self::grant) asked about, and those it let in.
    peers: Mutex<Peers>,
}

/// Device ordinals as bits: those asked about for peer access, and those granted it.
#[derive(Debug, Default)]
struct Peers {
    asked: u64,
    granted: u64,
}

// SAFETY: a CUmemoryPool handle may be used from any thread (the driver API is thread safe);
// the pool lives until `DevicePool` drops.
unsafe impl Send for DevicePool {}
// SAFETY: as above; no method mutates Rust-side state.
unsafe impl Sync for DevicePool {}

impl DevicePool {
    /// A pool of device memory of `ctx`'s device that keeps freed memory (release threshold:
    /// never).
    pub fn new(ctx: &Arc<CudaContext>) -> Result<Self> {
        bind(ctx)?;
        // SAFETY: CUmemPoolProps is a plain C struct for which all zeros is the documented
        // default; the fields set below are the required ones.
        let mut props: sys::CUmemPoolProps = unsafe { std::mem::zeroed() };
        props.allocType = sys::CUmemAllocationType::CU_MEM_ALLOCATION_TYPE_PINNED;
        props.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
        props.location.id = ctx.ordinal() as i32;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: `pool` is a valid out-pointer and `props` lives for the call.
        unsafe { sys::cuMemPoolCreate(&mut pool, &props) }
            .result()
            .map_err(|e| driver_error(e, "create a memory pool"))?;
        let mut threshold: u64 = u64::MAX;
        // SAFETY: the release threshold attribute takes a pointer to a cuuint64_t, which lives
        // for the call; `pool` was just created.
        unsafe {
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
                (&mut threshold as *mut u64).cast(),
            )
        }
        .result()
        .map_err(|e| driver_error(e, "set the memory pool's release threshold"))?;
        // No hidden waits between streams: the crate frees a buffer only after the work that
        // used it has finished, so memory is reusable without the driver making one stream
        // wait for another's free.
        let mut no: i32 = 0;
        // SAFETY: the attribute takes a pointer to an int, which lives for the call.
        unsafe {
            sys::cuMemPoolSetAttribute(
                pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES,
                (&mut no as *mut i32).cast(),
            )
        }
        .result()
        .map_err(|e| driver_error(e, "set the memory pool's reuse policy"))?;
        Ok(Self {
            pool,
            ctx: Arc::clone(ctx),
            peers: Mutex::default(),
        })
    }

    /// Lets device `peer` read and write this pool's memory where the driver says it can reach
    /// this device's memory directly (`cuDeviceCanAccessPeer`), so that copies between the two
    /// take the direct link (NVLink or PCIe peer to peer) instead of going through host memory.
    /// Asks the driver once per peer; returns whether access is granted.
    pub fn grant(&self, peer: &CudaContext) -> Result<bool> {
        let (own, other) = (self.ctx.ordinal(), peer.ordinal());
        if own == other || other >= 64 {
            return Ok(own == other);
        }
        let bit = 1u64 << other;
        let mut peers = self.peers.lock().map_err(|_| poisoned("pool access"))?;
        if peers.asked & bit != 0 {
            return Ok(peers.granted & bit != 0);
        }
        let mut can: i32 = 0;
        // SAFETY: `can` is a valid out-pointer; both device handles come from live contexts.
        unsafe { sys::cuDeviceCanAccessPeer(&mut can, peer.cu_device(), self.ctx.cu_device()) }
            .result()
            .map_err(|e| driver_error(e, "ask for peer access"))?;
        if can != 0 {
            bind(&self.ctx)?;
            // SAFETY: CUmemAccessDesc is a plain C struct; all zeros is a valid start and every
            // field the call reads is set below.
            let mut desc: sys::CUmemAccessDesc = unsafe { std::mem::zeroed() };
            desc.location.type_ = sys::CUmemLocationType::CU_MEM_LOCATION_TYPE_DEVICE;
            desc.location.id = other as i32;
            desc.flags = sys::CUmemAccess_flags::CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
            // SAFETY: `pool` is alive and `desc` is one valid descriptor that lives for the call.
            unsafe { sys::cuMemPoolSetAccess(self.pool, &desc, 1) }
                .result()
                .map_err(|e| driver_error(e, "grant peer access"))?;
            peers.granted |= bit;
        }
        peers.asked |= bit;
        Ok(can != 0)
    }

    /// Bytes of the pool's memory allocated now (not yet freed).
    pub fn used(&self) -> Result<usize> {
        bind(&self.ctx)?;
        let mut used: u64 = 0;
        // SAFETY: the used-memory attribute writes a cuuint64_t through the pointer, which lives
        // for the call; `pool` is alive.
        unsafe {
            sys::cuMemPoolGetAttribute(
                self.pool,
                sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_USED_MEM_CURRENT,
                (&mut used as *mut u64).cast(),
            )
        }
        .result()
        .map_err(|e| driver_error(e, "query the memory pool"))?;
        Ok(used as usize)
    }

    /// Gives the memory the pool keeps but nobody uses back to the driver.
    pub fn trim(&self) -> Result<()> {
        bind(&self.ctx)?;
        // SAFETY: `pool` is alive; trimming to 0 frees only unused memory.
        unsafe { sys::cuMemPoolTrimTo(self.pool, 0) }
            .result()
            .map_err(|e| driver_error(e, "trim the memory pool"))
    }
}

impl Drop for DevicePool {
    fn drop(&mut self) {
        // SAFETY: every DeviceBuffer holds an Arc of its pool, so none is alive now.
        let _ = unsafe { sys::cuMemPoolDestroy(self.pool) };
    }
}

/// A device allocation of bytes; kernels see it as whatever element type they declare.
#[derive(Debug)]
pub struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    len: usize,
    /// The stream the buffer was allocated on, and is freed on.
    stream: Arc<CudaStream>,
    /// Keeps the pool alive while its memory is.
    _pool: Arc<DevicePool>,
    tracker: Arc<MemoryTracker>,
}

impl DeviceBuffer {
    /// Allocates `bytes` (at least 1, so every buffer has a valid address) from `pool` on
    /// `stream`, in stream order: work enqueued on `stream` afterwards may use it at once; work
    /// on another stream must first wait for an event recorded on `stream` after this call.
    pub fn alloc(
        pool: &Arc<DevicePool>,
        stream: &Arc<CudaStream>,
        bytes: usize,
        tracker: &Arc<MemoryTracker>,
    ) -> Result<Self> {
        let len = bytes.max(1);
        bind(stream.context())?;
        tracker.grow(len)?;
        let mut ptr: sys::CUdeviceptr = 0;
        // SAFETY: `ptr` is a valid out-pointer; `pool` and `stream` belong to the same live
        // context. The memory is uninitialized: every primitive writes its outputs (a kernel, a
        // copy or a memset) before anything reads them, which the CUDA suite's initcheck run
        // (compute-sanitizer --tool initcheck) checks.
        let allocated =
            unsafe { sys::cuMemAllocFromPoolAsync(&mut ptr, len, pool.pool, stream.cu_stream()) }
                .result();
        if let Err(e) = allocated {
            tracker.shrink(len);
            return Err(driver_error(e, "allocate"));
        }
        Ok(Self {
            ptr,
            len,
            stream: Arc::clone(stream),
            _pool: Arc::clone(pool),
            tracker: Arc::clone(tracker),
        })
    }

    /// The context of the device the buffer lives on.
    pub fn context(&self) -> &Arc<CudaContext> {
        self.stream.context()
    }

    /// The device address, for kernel arguments and copies that read the buffer.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// The device address, for kernel arguments and copies that write the buffer: taking
    /// `&mut` makes the borrow checker see the write.
    pub fn ptr_mut(&mut self) -> u64 {
        self.ptr
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the buffer holds no bytes (never, since allocations are at least one byte).
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        let _ = self.stream.context().bind_to_thread();
        // SAFETY: the owner drops a buffer only once the device work that uses it has finished
        // or is ordered before this point of `stream` (the rule of `backend`), so freeing it in
        // stream order cannot take memory from under a kernel or copy.
        let freed = unsafe { sys::cuMemFreeAsync(self.ptr, self.stream.cu_stream()) }.result();
        if let Err(e) = freed {
            log::error!(
                "GpuJoinExec: freeing {} bytes of device memory failed: {e:?}",
                self.len
            );
        }
        self.tracker.shrink(self.len);
    }
}

/// Turns a driver error into a DataFusion error: out of memory is `ResourcesExhausted`; other
/// errors keep the driver's error as their source.
pub fn driver_error(e: DriverError, what: &str) -> DataFusionError {
    if e.0 == CUresult::CUDA_ERROR_OUT_OF_MEMORY {
        DataFusionError::ResourcesExhausted(format!("GPU out of memory during {what}"))
    } else {
        DataFusionError::Context(
            format!("CUDA error during {what}"),
            Box::new(DataFusionError::External(Box::new(e))),
        )
    }
}

/// Makes `ctx` current on this thread, as every driver call on its memory or streams needs.
pub(crate) fn bind(ctx: &CudaContext) -> Result<()> {
    ctx.bind_to_thread()
        .map_err(|e| driver_error(e, "bind context"))
}

/// An error for a broken invariant of the device layer.
pub(crate) fn poisoned(what: &str) -> DataFusionError {
    exec_datafusion_err!("{what} lock poisoned")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn past_the_limit_reserves_free_budget_or_refuses() {
        let budget = MemoryBudget::new(64 << 20);
        let tracker = MemoryTracker::default();
        tracker.set_limit(1 << 20);
        assert!(tracker.grow(2 << 20).is_err(), "no overdraft: refused");
        tracker.set_overdraft(&budget, Holder(1));
        tracker.grow(2 << 20).unwrap();
        assert_eq!(tracker.overdrawn(), OVERDRAFT_STEP);
        assert_eq!(budget.available(), (64 << 20) - OVERDRAFT_STEP);
        assert!(
            tracker.grow(100 << 20).is_err(),
            "more than the budget has free"
        );
        drop(tracker);
        assert_eq!(budget.available(), 64 << 20, "given back with the tracker");
    }
}
