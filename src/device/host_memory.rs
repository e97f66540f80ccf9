//! Host memory that device copies read and write: [`HostBlock`]s from a [`HostPool`].
//!
//! For a CUDA device the blocks are pinned (page-locked), the only host memory the copy engines
//! move at full speed and asynchronously; for the host backend they are ordinary aligned heap
//! memory. A pool hands out *pages* of one size. Pinning and unpinning memory are slow driver
//! calls that synchronize with other threads' device work (a stall was seen when they ran next
//! to running joins), so a pinned pool pins all its pages once, when the device opens, and
//! queries only reuse them; a heap pool allocates its pages as first needed. When every page is
//! in use, [`HostPool::take`] waits for one to come back and [`HostPool::try_take`] says no; a
//! request larger than a page is refused (callers size their blocks to the page).
//!
//! A holder must not keep a block while it waits for anything but the block's own device copies:
//! a probe partition, say, takes one only once a whole chunk's rows are in hand, and fills and
//! sends it at once. Were a block kept while its holder waited for input (which may be another
//! join's output, needing blocks of the same pool), holders could wait on each other for ever.
//! [`HostPool::take_unpooled`] allocates outside the pages, for the rare caller that must not
//! wait (it is meant for heap pools).
//!
//! A block carries *fences*: the events after the device copies that still read or write it.
//! The host can reach its bytes only through [`HostBlock::bytes`] / [`HostBlock::bytes_mut`],
//! which wait for those copies first, and a block goes back to its pool (when dropped) only
//! after they finish. A filled block can become an Arrow [`Buffer`] without a copy
//! ([`HostBlock::into_buffer`]); it returns to the pool when the last array using it is dropped.

use std::ptr::NonNull;
use std::sync::{Arc, Mutex};

use arrow::buffer::Buffer;
use cudarc::driver::{CudaContext, CudaEvent, result};
use datafusion::common::{Result, internal_err, resources_err};
use tokio::sync::Notify;

use super::memory::{bind, driver_error, poisoned};

/// Alignment of every block (Arrow's, and enough for any column type).
const ALIGN: usize = 64;

/// Where a pool's memory comes from.
#[derive(Debug)]
enum Source {
    /// Page-locked memory of a CUDA context.
    Pinned(Arc<CudaContext>),
    /// Ordinary heap memory (the host backend).
    Heap,
}

/// A pool of host pages of one size.
#[derive(Debug, Clone)]
pub struct HostPool {
    shared: Arc<Shared>,
}

#[derive(Debug)]
struct Shared {
    source: Source,
    /// Bytes of a page.
    page: usize,
    state: Mutex<State>,
    returned: Notify,
}

#[derive(Debug)]
struct State {
    /// Idle pages.
    free: Vec<Raw>,
    /// Pages allocated (idle or in use).
    pages: usize,
    /// Where each allocated page starts, in ascending order.
    starts: Vec<usize>,
    /// Most pages.
    max_pages: usize,
    /// Bytes of blocks allocated outside the pages, in use.
    unpooled: usize,
}

/// The address of an allocation the pool owns.
#[derive(Debug, Clone, Copy)]
struct Raw(NonNull<u8>);

// SAFETY: `Raw` is the address of a pool allocation that at most one owner (the pool's free list
// or one `HostBlock`) uses at a time, from whichever thread holds it.
unsafe impl Send for Raw {}

impl HostPool {
    /// A pool of `pages` pinned pages of `page` bytes of `ctx`, all pinned now.
    pub fn pinned(ctx: &Arc<CudaContext>, page: usize, pages: usize) -> Result<Self> {
        let pool = Self::new(Source::Pinned(Arc::clone(ctx)), page, pages);
        let mut allocated = Vec::with_capacity(pages);
        for _ in 0..pages {
            allocated.push(pool.allocate(pool.shared.page)?);
        }
        if let Ok(mut state) = pool.shared.state.lock() {
            state.pages = allocated.len();
            state.starts = allocated.iter().map(|r| r.0.as_ptr() as usize).collect();
            state.starts.sort_unstable();
            state.free = allocated;
        }
        Ok(pool)
    }

    /// A pool of at most `pages` heap pages of `page` bytes, allocated as first needed.
    pub fn heap(page: usize, pages: usize) -> Self {
        Self::new(Source::Heap, page, pages)
    }

    fn new(source: Source, page: usize, pages: usize) -> Self {
        Self {
            shared: Arc::new(Shared {
                source,
                page: page.max(ALIGN).div_ceil(ALIGN) * ALIGN,
                state: Mutex::new(State {
                    free: vec![],
                    pages: 0,
                    starts: vec![],
                    max_pages: pages,
                    unpooled: 0,
                }),
                returned: Notify::new(),
            }),
        }
    }

    /// Bytes of a page: the largest block the pool hands out.
    pub fn page_bytes(&self) -> usize {
        self.shared.page
    }

    /// Bytes the pool has allocated (idle or in use).
    pub fn held(&self) -> usize {
        self.shared
            .state
            .lock()
            .map_or(0, |s| s.pages * self.shared.page + s.unpooled)
    }

    /// Bytes of blocks in use (not idle in the pool).
    pub fn in_use(&self) -> usize {
        self.shared.state.lock().map_or(0, |s| {
            (s.pages - s.free.len()) * self.shared.page + s.unpooled
        })
    }

    /// Where the pool's pages are now (not its unpooled blocks): memory that others wait for
    /// while anything refers to it.
    pub fn pages(&self) -> Pages {
        let starts = self
            .shared
            .state
            .lock()
            .map_or_else(|_| vec![], |s| s.starts.clone());
        Pages {
            starts,
            page: self.shared.page,
        }
    }

    /// A block of `len` bytes (at most a page) if a page is idle or may be allocated now.
    pub fn try_take(&self, len: usize) -> Result<Option<HostBlock>> {
        let page = self.shared.page;
        if len > page {
            return Ok(None);
        }
        {
            let mut state = self
                .shared
                .state
                .lock()
                .map_err(|_| poisoned("host pool"))?;
            if let Some(raw) = state.free.pop() {
                return Ok(Some(self.block(raw, len, page, false)));
            }
            if state.pages >= state.max_pages {
                return Ok(None);
            }
            state.pages += 1;
        }
        match self.allocate(page) {
            Ok(raw) => {
                if let Ok(mut state) = self.shared.state.lock() {
                    let start = raw.0.as_ptr() as usize;
                    let at = state.starts.partition_point(|&s| s < start);
                    state.starts.insert(at, start);
                }
                Ok(Some(self.block(raw, len, page, false)))
            }
            Err(e) => {
                if let Ok(mut state) = self.shared.state.lock() {
                    state.pages -= 1;
                }
                Err(e)
            }
        }
    }

    /// A block of `len` bytes (at most a page), waiting for a page to come back if all are in
    /// use. A request larger than a page is an error.
    pub async fn take(&self, len: usize) -> Result<HostBlock> {
        if len > self.shared.page {
            return resources_err!(
                "GpuJoinExec needs a host block of {len} bytes, larger than the pool's pages of \
                 {} bytes",
                self.shared.page
            );
        }
        loop {
            let returned = self.shared.returned.notified();
            tokio::pin!(returned);
            returned.as_mut().enable();
            if let Some(block) = self.try_take(len)? {
                return Ok(block);
            }
            returned.await;
        }
    }

    /// A block of `len` bytes allocated outside the pages, freed (not kept) when it comes back.
    pub fn take_unpooled(&self, len: usize) -> Result<HostBlock> {
        let capacity = len.max(ALIGN).div_ceil(ALIGN) * ALIGN;
        let raw = self.allocate(capacity)?;
        if let Ok(mut state) = self.shared.state.lock() {
            state.unpooled += capacity;
        }
        Ok(self.block(raw, len, capacity, true))
    }

    /// Frees the idle pages (their memory goes back to the system; a pinned pool pins pages
    /// again as they are needed).
    pub fn trim(&self) {
        let freed = match self.shared.state.lock() {
            Ok(mut state) => {
                let freed: Vec<_> = state.free.drain(..).collect();
                state.pages -= freed.len();
                state
                    .starts
                    .retain(|s| !freed.iter().any(|r| r.0.as_ptr() as usize == *s));
                freed
            }
            Err(_) => return,
        };
        let page = self.shared.page;
        self.shared
            .free_all(freed.into_iter().map(|r| (page, r)).collect());
    }

    fn block(&self, raw: Raw, len: usize, capacity: usize, unpooled: bool) -> HostBlock {
        HostBlock {
            ptr: raw.0,
            len,
            capacity,
            fences: vec![],
            pool: Arc::clone(&self.shared),
            unpooled,
        }
    }

    fn allocate(&self, bytes: usize) -> Result<Raw> {
        let ptr = match &self.shared.source {
            Source::Pinned(ctx) => {
                bind(ctx)?;
                // SAFETY: allocates `bytes` of page-locked memory (flags 0: cached, which the
                // host reads fast); the pointer is owned by the pool until `free_all`.
                unsafe { result::malloc_host(bytes, 0) }
                    .map_err(|e| driver_error(e, "allocate pinned host memory"))?
                    .cast::<u8>()
            }
            Source::Heap => {
                let layout = std::alloc::Layout::from_size_align(bytes, ALIGN)
                    .map_err(|e| datafusion::common::exec_datafusion_err!("host block: {e}"))?;
                // SAFETY: `layout` has a non-zero size (at least ALIGN). Zeroed, so that the
                // block's bytes are initialized before anything reads them.
                unsafe { std::alloc::alloc_zeroed(layout) }
            }
        };
        match NonNull::new(ptr) {
            Some(p) => Ok(Raw(p)),
            None => resources_err!("out of host memory ({bytes} bytes)"),
        }
    }
}

impl Shared {
    fn free_all(&self, blocks: Vec<(usize, Raw)>) {
        for (capacity, raw) in blocks {
            match &self.source {
                Source::Pinned(ctx) => {
                    let _ = ctx.bind_to_thread();
                    // SAFETY: `raw` came from `malloc_host` and no block refers to it any more.
                    let _ = unsafe { result::free_host(raw.0.as_ptr().cast()) };
                }
                Source::Heap => {
                    if let Ok(layout) = std::alloc::Layout::from_size_align(capacity, ALIGN) {
                        // SAFETY: `raw` came from `alloc` with this layout and is no longer used.
                        unsafe { std::alloc::dealloc(raw.0.as_ptr(), layout) };
                    }
                }
            }
        }
    }

    /// Takes a block back (its device copies have finished).
    fn give_back(&self, capacity: usize, raw: Raw, unpooled: bool) {
        if unpooled {
            if let Ok(mut state) = self.state.lock() {
                state.unpooled -= capacity;
            }
            self.free_all(vec![(capacity, raw)]);
            return;
        }
        if let Ok(mut state) = self.state.lock() {
            state.free.push(raw);
        }
        self.returned.notify_waiters();
    }
}

impl Drop for Shared {
    fn drop(&mut self) {
        let freed = match self.state.get_mut() {
            Ok(state) => std::mem::take(&mut state.free),
            Err(_) => return,
        };
        let page = self.page;
        self.free_all(freed.into_iter().map(|r| (page, r)).collect());
    }
}

/// Where a pool's pages were when [`HostPool::pages`] looked.
#[derive(Debug, Clone)]
pub struct Pages {
    /// In ascending order.
    starts: Vec<usize>,
    page: usize,
}

impl Pages {
    /// Whether `ptr` points into one of the pages.
    pub fn hold(&self, ptr: *const u8) -> bool {
        let at = ptr as usize;
        let i = self.starts.partition_point(|&s| s <= at);
        i > 0 && at - self.starts[i - 1] < self.page
    }
}

/// A block of host memory from a [`HostPool`].
#[derive(Debug)]
pub struct HostBlock {
    ptr: NonNull<u8>,
    len: usize,
    capacity: usize,
    /// Events after the device copies that read or write this block and may not have finished.
    fences: Vec<CudaEvent>,
    pool: Arc<Shared>,
    /// Allocated past the pool's limit: freed, not kept, when it comes back.
    unpooled: bool,
}

// SAFETY: the block owns its memory exclusively; device copies that use it are fenced, and the
// host reaches the bytes only after waiting for the fences.
unsafe impl Send for HostBlock {}
// SAFETY: `&HostBlock` gives no access to the bytes (reading them needs `&mut` to wait for the
// fences, or ownership to turn the block into an Arrow buffer).
unsafe impl Sync for HostBlock {}

impl std::panic::RefUnwindSafe for HostBlock {}

impl HostBlock {
    /// Usable bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the block has no usable bytes.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Waits for the device copies that use this block.
    pub fn wait(&mut self) -> Result<()> {
        for fence in self.fences.drain(..) {
            fence
                .synchronize()
                .map_err(|e| driver_error(e, "wait for a copy"))?;
        }
        Ok(())
    }

    /// The bytes, once the device copies that use them have finished.
    pub fn bytes(&mut self) -> Result<&[u8]> {
        self.wait()?;
        // SAFETY: the block owns `len` bytes at `ptr` (pool blocks are at least `len` long),
        // initialized: heap pages are zeroed when allocated, and pinned pages come from the
        // driver (memory Rust did not allocate, so never uninitialized to it); no device copy
        // uses them any more.
        Ok(unsafe { std::slice::from_raw_parts(self.ptr.as_ptr(), self.len) })
    }

    /// The bytes, mutably, once the device copies that use them have finished.
    pub fn bytes_mut(&mut self) -> Result<&mut [u8]> {
        self.wait()?;
        // SAFETY: as in `bytes`; `&mut self` makes this the only reference.
        Ok(unsafe { std::slice::from_raw_parts_mut(self.ptr.as_ptr(), self.len) })
    }

    /// The address of byte `offset`, for enqueueing a device copy of `len` bytes there. The
    /// caller must fence the block with an event recorded after the copy
    /// ([`fence`](Self::fence)) before the block can be used or dropped.
    pub(crate) fn address(&mut self, offset: usize, len: usize) -> Result<*mut u8> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => {
                // SAFETY: `offset + len <= self.len`, inside the allocation.
                Ok(unsafe { self.ptr.as_ptr().add(offset) })
            }
            _ => internal_err!(
                "host block: {len} bytes at {offset} do not fit {} bytes",
                self.len
            ),
        }
    }

    /// The context whose page-locked memory this block is, if it is pinned.
    pub(crate) fn pinned_by(&self) -> Option<&Arc<CudaContext>> {
        match &self.pool.source {
            Source::Pinned(ctx) => Some(ctx),
            Source::Heap => None,
        }
    }

    /// Records that a device copy using this block ends at `event`.
    pub(crate) fn fence(&mut self, event: CudaEvent) {
        self.fences.push(event);
    }

    /// The first `len` bytes as an Arrow buffer, without a copy: the block is given back to its
    /// pool when the last array using the buffer is dropped.
    pub fn into_buffer(mut self, len: usize) -> Result<Buffer> {
        self.wait()?;
        if len > self.len {
            return internal_err!("host block: {len} bytes asked of {}", self.len);
        }
        let ptr = self.ptr;
        // SAFETY: `ptr` points to at least `len` bytes that the block owns, aligned to 64; the
        // block moves into the buffer's owner, which keeps the memory alive and unchanged (no
        // device copy uses it any more) until the last reference is dropped.
        Ok(unsafe { Buffer::from_custom_allocation(ptr, len, Arc::new(self)) })
    }
}

impl Drop for HostBlock {
    fn drop(&mut self) {
        if let Err(e) = self.wait() {
            // A copy may still use the memory: keep it rather than hand it out again.
            log::error!("GpuJoinExec: a host block is leaked after a failed copy: {e}");
            return;
        }
        self.pool
            .give_back(self.capacity, Raw(self.ptr), self.unpooled);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn pages_are_reused_and_takers_wait_for_them() {
        let pool = HostPool::heap(1 << 20, 2);
        let mut a = pool.try_take(1 << 20).unwrap().unwrap();
        a.bytes_mut().unwrap().fill(7);
        let b = pool.try_take(100).unwrap().unwrap();
        assert_eq!(b.len(), 100);
        assert!(pool.try_take(1).unwrap().is_none(), "both pages in use");
        assert!(
            pool.try_take((1 << 20) + 1).unwrap().is_none(),
            "larger than a page"
        );
        assert!(pool.take((1 << 20) + 1).await.is_err());
        let waiting = {
            let pool = pool.clone();
            tokio::spawn(async move { pool.take(1 << 20).await.map(|b| b.len()) })
        };
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        drop(a);
        assert_eq!(waiting.await.unwrap().unwrap(), 1 << 20);
        assert_eq!(pool.held(), 2 << 20);
        assert_eq!(pool.in_use(), 1 << 20, "b is still out");
        let buffer = b.into_buffer(16).unwrap();
        assert_eq!(buffer.len(), 16);
        drop(buffer);
        assert_eq!(pool.in_use(), 0);
        let big = pool.take_unpooled(3 << 20).unwrap();
        assert_eq!(pool.in_use(), 3 << 20);
        drop(big);
        assert_eq!(pool.in_use(), 0);
        pool.trim();
        assert_eq!(pool.held(), 0);
    }
}
