//! [`HostBackend`]: the primitives in plain Rust over host memory — the twin of the CUDA
//! kernels (same hash functions, same stable partitioning, same match order), used where
//! there is no GPU and as the reference the CUDA primitives are tested against. One module per
//! kernel file, like `backend/cuda`.
//!
//! Work runs on the calling thread when it is enqueued, so every event is complete when it is
//! recorded. Memory is accounted and budgeted like device memory (a process-wide
//! [`MemoryBudget`] of its own), so that a small `gpu_join.memory_limit` exercises on any machine
//! the paths it forces on a GPU.

mod bucket_probe;
mod columns;
mod hash_join;
mod keys;
mod merge_join;
mod partition;
mod select;
mod views;

use std::ops::Range;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use arrow::buffer::MutableBuffer;
use arrow::datatypes::ArrowNativeType;
use datafusion::common::{Result, internal_err};

use super::{
    Backend, FilterInput, Keep, KeyCheck, KeyColumnEncoding, KeyWidth, Looked, MatchIndices,
    Partitioned, ProbeEmit, Sorted, ViewData, check_bucket_probe, check_hash_checked,
    check_index_sides, check_len, check_merge_sides, check_partition, check_positions,
    check_route_bits, check_sides, check_sort_bits, check_visited, check_window,
};
use crate::columns::{Frame, unpack_values};
use crate::device::{HostBlock, HostPool, MemoryBudget, MemoryTracker};
use partition::SplitBy;

/// Runs the join primitives on the CPU.
#[derive(Debug, Clone, Default)]
pub struct HostBackend {
    tracker: Arc<MemoryTracker>,
}

/// Host memory counted in a [`MemoryTracker`]: the host backend's buffer.
#[derive(Debug)]
pub struct HostBuffer {
    data: MutableBuffer,
    tracker: Arc<MemoryTracker>,
}

impl HostBuffer {
    fn zeroed(tracker: &Arc<MemoryTracker>, bytes: usize) -> Result<Self> {
        let bytes = bytes.max(1);
        tracker.grow(bytes)?;
        Ok(Self {
            data: MutableBuffer::from_len_zeroed(bytes),
            tracker: Arc::clone(tracker),
        })
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        self.data.as_slice()
    }

    /// The bytes, mutably.
    pub fn as_slice_mut(&mut self) -> &mut [u8] {
        self.data.as_slice_mut()
    }

    /// Size in bytes.
    pub fn len(&self) -> usize {
        self.data.len()
    }

    /// Whether the buffer has no bytes (never: allocations are at least one byte).
    pub fn is_empty(&self) -> bool {
        self.data.is_empty()
    }
}

impl Drop for HostBuffer {
    fn drop(&mut self) {
        self.tracker.shrink(self.data.len());
    }
}

/// The first `rows` values of `bytes` as `T`s.
pub(crate) fn typed<T: ArrowNativeType>(bytes: &[u8], rows: usize) -> &[T] {
    let bytes = &bytes[..rows * std::mem::size_of::<T>()];
    // SAFETY: `T` is a primitive Arrow type (any bit pattern is a value); the assert below
    // rejects a slice that is not aligned for `T` instead of reading it.
    let (prefix, values, suffix) = unsafe { bytes.align_to::<T>() };
    assert!(
        prefix.is_empty() && suffix.is_empty(),
        "host buffers are 64-byte aligned"
    );
    values
}

/// A view primitive's arguments, checked: the views (16 bytes a row), the validity bitmap and
/// the buffer starts.
struct ViewArgs<'a> {
    views: Vec<u128>,
    validity: Option<&'a [u8]>,
    starts: &'a [u64],
}

impl<'a> ViewArgs<'a> {
    fn of(
        views: &HostBuffer,
        validity: Option<&'a HostBuffer>,
        rows: usize,
        data: &ViewData<'a, HostBuffer>,
    ) -> Result<Self> {
        check_len("views", views.len(), rows, 16)?;
        if let Some(v) = validity {
            check_len("views' validity", v.len(), rows.div_ceil(8), 1)?;
        }
        check_len("view buffer starts", data.starts.len(), data.buffers, 8)?;
        Ok(Self {
            views: (typed::<i128>(views.as_slice(), rows).iter())
                .map(|&x| x as u128)
                .collect(),
            validity: validity.map(|b| &b.as_slice()[..rows.div_ceil(8)]),
            starts: typed::<u64>(data.starts.as_slice(), data.buffers),
        })
    }
}

/// The first `rows` values of `bytes` as mutable `T`s.
pub(crate) fn typed_mut<T: ArrowNativeType>(bytes: &mut [u8], rows: usize) -> &mut [T] {
    let bytes = &mut bytes[..rows * std::mem::size_of::<T>()];
    // SAFETY: as in `typed`.
    let (prefix, values, suffix) = unsafe { bytes.align_to_mut::<T>() };
    assert!(
        prefix.is_empty() && suffix.is_empty(),
        "host buffers are 64-byte aligned"
    );
    values
}

/// The host backend's budget and pools, shared by the process.
struct HostMemory {
    budget: Arc<MemoryBudget>,
    staging: HostPool,
    output: HostPool,
    scalars: HostPool,
}

/// A heap pool with the page geometry of the CUDA pools, so that sizes planned against either
/// fit both.
fn pool((pages, bytes): (usize, usize)) -> HostPool {
    HostPool::heap(bytes, pages)
}

fn host_memory() -> &'static HostMemory {
    static MEMORY: OnceLock<HostMemory> = OnceLock::new();
    MEMORY.get_or_init(|| HostMemory {
        budget: MemoryBudget::new(system_memory() / 10 * 8),
        staging: pool(crate::device::STAGING_PAGES),
        output: pool(crate::device::OUTPUT_PAGES),
        scalars: pool(crate::device::SCALAR_PAGES),
    })
}

/// Bytes of memory of this machine (`MemTotal` of /proc/meminfo), or 16 GiB if unknown.
pub fn system_memory() -> usize {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            let line = s.lines().find(|l| l.starts_with("MemTotal:"))?;
            let kib: usize = line.split_whitespace().nth(1)?.parse().ok()?;
            Some(kib * 1024)
        })
        .unwrap_or(16 << 30)
}

impl HostBackend {
    /// A backend counting its memory in `tracker`.
    pub fn new(tracker: Arc<MemoryTracker>) -> Self {
        Self { tracker }
    }

    fn zeroed(&self, bytes: usize) -> Result<HostBuffer> {
        HostBuffer::zeroed(&self.tracker, bytes)
    }

    /// Each probe key's matches in `build` by binary search (the twin of merge_join.cu, which
    /// the probe keys' order does not change).
    fn sorted_search(
        &self,
        build: &Sorted<HostBuffer>,
        probe_keys: &HostBuffer,
        probe_rows: usize,
        width: KeyWidth,
    ) -> Result<MatchIndices<HostBuffer>> {
        let (b, p, bits) = (build.keys.as_slice(), probe_keys.as_slice(), build.bits);
        let (r, s) = match width {
            KeyWidth::U32 => merge_join::merge_join::<u32>(b, build.rows, p, probe_rows, bits),
            KeyWidth::U64 => merge_join::merge_join::<u64>(b, build.rows, p, probe_rows, bits),
        };
        Ok(MatchIndices {
            len: r.len(),
            build: self.buffer_of_u32s(&r)?,
            probe: self.buffer_of_u32s(&s)?,
        })
    }

    fn buffer_of_u32s(&self, v: &[u32]) -> Result<HostBuffer> {
        let mut b = self.zeroed(v.len() * 4)?;
        typed_mut::<u32>(b.as_slice_mut(), v.len()).copy_from_slice(v);
        Ok(b)
    }

    /// [`Backend::partition`] and [`Backend::route`]: the keys split `by`, `carry` gathered
    /// into their order.
    fn split(
        &self,
        keys: &HostBuffer,
        rows: usize,
        width: KeyWidth,
        by: SplitBy,
        carry: &[(&HostBuffer, usize)],
    ) -> Result<Partitioned<HostBuffer>> {
        let (bounds, order) = match width {
            KeyWidth::U32 => partition::split::<u32>(keys.as_slice(), rows, by),
            KeyWidth::U64 => partition::split::<u64>(keys.as_slice(), rows, by),
        };
        let (keys, carried) = self.in_order(&order, keys, width, carry)?;
        Ok(Partitioned {
            keys,
            bounds: self.buffer_of_u32s(&bounds)?,
            rows,
            bits: by.bits(),
            segments: 1,
            carried,
        })
    }

    /// `keys` (of `width`) and each of `carry`, moved into `order` (for each position, the input
    /// row it holds).
    fn in_order(
        &self,
        order: &[u32],
        keys: &HostBuffer,
        width: KeyWidth,
        carry: &[(&HostBuffer, usize)],
    ) -> Result<(HostBuffer, Vec<HostBuffer>)> {
        let rows = order.len();
        let order = self.buffer_of_u32s(order)?;
        let keys = self.gather(keys, &order, rows, width.bytes())?;
        let carried = carry
            .iter()
            .map(|&(buf, w)| self.gather(buf, &order, rows, w))
            .collect::<Result<_>>()?;
        Ok((keys, carried))
    }
}

fn copy_checked(
    what: &str,
    src: &[u8],
    src_offset: usize,
    dst: &mut [u8],
    dst_offset: usize,
    len: usize,
) -> Result<()> {
    let (Some(src_end), Some(dst_end)) = (src_offset.checked_add(len), dst_offset.checked_add(len))
    else {
        return internal_err!("{what}: range overflows");
    };
    if src_end > src.len() || dst_end > dst.len() {
        return internal_err!(
            "{what}: {len} bytes from {src_offset} to {dst_offset} do not fit {} and {} bytes",
            src.len(),
            dst.len()
        );
    }
    dst[dst_offset..dst_end].copy_from_slice(&src[src_offset..src_end]);
    Ok(())
}

impl Backend for HostBackend {
    type Buf = HostBuffer;
    type Event = Instant;

    fn name(&self) -> &'static str {
        "host"
    }

    fn fork(&self) -> Result<Self> {
        Ok(self.clone())
    }

    fn record(&self) -> Result<Instant> {
        Ok(Instant::now())
    }

    fn wait(&self, _event: &Instant) -> Result<()> {
        Ok(())
    }

    fn is_done(&self, _event: &Instant) -> Result<bool> {
        Ok(true)
    }

    fn block_on(&self, _event: &Instant) -> Result<()> {
        Ok(())
    }

    fn elapsed(&self, start: &Instant, end: &Instant) -> Result<Duration> {
        Ok(end.saturating_duration_since(*start))
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn tracker(&self) -> &Arc<MemoryTracker> {
        &self.tracker
    }

    fn budget(&self) -> &Arc<MemoryBudget> {
        &host_memory().budget
    }

    fn staging(&self) -> &HostPool {
        &host_memory().staging
    }

    fn output(&self) -> &HostPool {
        &host_memory().output
    }

    fn scalars(&self) -> &HostPool {
        &host_memory().scalars
    }

    fn alloc(&self, bytes: usize) -> Result<HostBuffer> {
        self.zeroed(bytes)
    }

    fn buf_len(buf: &HostBuffer) -> usize {
        buf.len()
    }

    fn copy_to_device(
        &self,
        src: &mut HostBlock,
        src_offset: usize,
        dst: &mut HostBuffer,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        let src = src.bytes()?;
        copy_checked(
            "copy to device",
            src,
            src_offset,
            dst.as_slice_mut(),
            dst_offset,
            len,
        )
    }

    fn copy_to_host(
        &self,
        src: &HostBuffer,
        src_offset: usize,
        dst: &mut HostBlock,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        copy_checked(
            "copy to host",
            src.as_slice(),
            src_offset,
            dst.bytes_mut()?,
            dst_offset,
            len,
        )
    }

    fn copy_within(
        &self,
        src: &HostBuffer,
        src_offset: usize,
        dst: &mut HostBuffer,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        copy_checked(
            "device copy",
            src.as_slice(),
            src_offset,
            dst.as_slice_mut(),
            dst_offset,
            len,
        )
    }

    fn copy_to_peer(
        &self,
        src: &HostBuffer,
        src_offset: usize,
        _peer: &Self,
        dst: &mut HostBuffer,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        self.copy_within(src, src_offset, dst, dst_offset, len)
    }

    fn upload_parts(&self, parts: &[&[u8]]) -> Result<HostBuffer> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let mut b = self.zeroed(total)?;
        let mut at = 0;
        for p in parts {
            b.as_slice_mut()[at..at + p.len()].copy_from_slice(p);
            at += p.len();
        }
        Ok(b)
    }

    fn download(&self, buf: &HostBuffer, out: &mut [u8]) -> Result<()> {
        check_len("download", buf.len(), out.len(), 1)?;
        out.copy_from_slice(&buf.as_slice()[..out.len()]);
        Ok(())
    }

    fn hash_checked(
        &self,
        check: &[&HostBuffer],
        classes: &HostBuffer,
        rows: usize,
        mask: u64,
    ) -> Result<HostBuffer> {
        let lens: Vec<usize> = check.iter().map(|c| c.len()).collect();
        check_hash_checked(&lens, classes.len(), rows)?;
        let mut out = self.zeroed(rows * 8)?;
        let words: Vec<&[u8]> = check.iter().map(|c| c.as_slice()).collect();
        keys::hash_checked(&words, classes.as_slice(), mask, out.as_slice_mut());
        Ok(out)
    }

    fn encode_keys(
        &self,
        values: &HostBuffer,
        validity: Option<&HostBuffer>,
        rows: usize,
        enc: &KeyColumnEncoding,
        width: KeyWidth,
        acc: Option<HostBuffer>,
    ) -> Result<HostBuffer> {
        check_len("encode_keys values", values.len(), rows, enc.ty.bytes())?;
        if let Some(v) = validity {
            check_len("encode_keys validity", v.len(), rows, 1)?;
        }
        let (mut out, first) = match acc {
            Some(a) => {
                check_len("encode_keys accumulator", a.len(), rows, width.bytes())?;
                (a, false)
            }
            None => (self.zeroed(rows * width.bytes())?, true),
        };
        let valid = validity.map(|v| v.as_slice());
        match width {
            KeyWidth::U32 => keys::encode::<u32>(
                values.as_slice(),
                valid,
                rows,
                enc,
                first,
                out.as_slice_mut(),
            ),
            KeyWidth::U64 => keys::encode::<u64>(
                values.as_slice(),
                valid,
                rows,
                enc,
                first,
                out.as_slice_mut(),
            ),
        }
        Ok(out)
    }

    fn exclusive_scan(&self, values: &HostBuffer, n: usize) -> Result<HostBuffer> {
        check_len("exclusive_scan", values.len(), n, 4)?;
        self.buffer_of_u32s(&columns::exclusive_scan(typed::<u32>(values.as_slice(), n)))
    }

    fn partition(
        &self,
        keys: &HostBuffer,
        rows: usize,
        width: KeyWidth,
        bits: u32,
        carry: &[(&HostBuffer, usize)],
    ) -> Result<Partitioned<HostBuffer>> {
        check_len("partition", keys.len(), rows, width.bytes())?;
        check_partition(carry.iter().map(|(b, w)| (b.len(), *w)), rows, bits)?;
        self.split(keys, rows, width, SplitBy::Partition(bits), carry)
    }

    fn sort(
        &self,
        keys: &HostBuffer,
        rows: usize,
        width: KeyWidth,
        bits: u32,
        carry: &[(&HostBuffer, usize)],
    ) -> Result<Sorted<HostBuffer>> {
        check_len("sort", keys.len(), rows, width.bytes())?;
        check_sort_bits(bits)?;
        check_partition(carry.iter().map(|(b, w)| (b.len(), *w)), rows, bits)?;
        let order = match width {
            KeyWidth::U32 => partition::sort::<u32>(keys.as_slice(), rows, bits),
            KeyWidth::U64 => partition::sort::<u64>(keys.as_slice(), rows, bits),
        };
        let (keys, carried) = self.in_order(&order, keys, width, carry)?;
        Ok(Sorted {
            keys,
            rows,
            bits,
            carried,
        })
    }

    fn merge_join(
        &self,
        build: &Sorted<HostBuffer>,
        probe: &Sorted<HostBuffer>,
        width: KeyWidth,
    ) -> Result<MatchIndices<HostBuffer>> {
        check_merge_sides::<Self>(build, probe, width)?;
        self.sorted_search(build, &probe.keys, probe.rows, width)
    }

    fn index_join(
        &self,
        build: &Sorted<HostBuffer>,
        probe_keys: &HostBuffer,
        probe_rows: usize,
        width: KeyWidth,
    ) -> Result<MatchIndices<HostBuffer>> {
        check_index_sides::<Self>(build, probe_keys, probe_rows, width)?;
        self.sorted_search(build, probe_keys, probe_rows, width)
    }

    fn route(
        &self,
        keys: &HostBuffer,
        rows: usize,
        width: KeyWidth,
        bits: u32,
        carry: &[(&HostBuffer, usize)],
    ) -> Result<Partitioned<HostBuffer>> {
        check_len("route", keys.len(), rows, width.bytes())?;
        check_route_bits(bits)?;
        check_partition(carry.iter().map(|(b, w)| (b.len(), *w)), rows, bits)?;
        let mut routed = self.split(keys, rows, width, SplitBy::Route(bits), carry)?;
        // As on the device, a route keeps no keys.
        routed.keys = self.zeroed(0)?;
        Ok(routed)
    }

    fn gather(
        &self,
        src: &HostBuffer,
        idx: &HostBuffer,
        rows: usize,
        width: usize,
    ) -> Result<HostBuffer> {
        check_len("gather idx", idx.len(), rows, 4)?;
        let mut out = self.zeroed(rows * width)?;
        columns::gather(
            src.as_slice(),
            typed::<u32>(idx.as_slice(), rows),
            width,
            out.as_slice_mut(),
        )?;
        Ok(out)
    }

    fn fill(&self, buf: &mut HostBuffer, byte: u8) -> Result<()> {
        buf.as_slice_mut().fill(byte);
        Ok(())
    }

    fn row_positions(&self, rows: usize) -> Result<HostBuffer> {
        check_positions(rows)?;
        let mut out = self.zeroed(rows * 4)?;
        for (i, o) in typed_mut::<u32>(out.as_slice_mut(), rows)
            .iter_mut()
            .enumerate()
        {
            *o = i as u32;
        }
        Ok(out)
    }

    fn present(&self, idx: &HostBuffer, rows: usize) -> Result<HostBuffer> {
        check_len("present idx", idx.len(), rows, 4)?;
        let mut out = self.zeroed(rows)?;
        columns::present(typed::<u32>(idx.as_slice(), rows), out.as_slice_mut());
        Ok(out)
    }

    fn select_count(&self, flags: &HostBuffer, rows: usize, keep: Keep) -> Result<HostBuffer> {
        check_len("select flags", flags.len(), rows, 1)?;
        let offsets = select::count(&flags.as_slice()[..rows], keep);
        let mut out = self.zeroed(offsets.len() * 8)?;
        typed_mut::<u64>(out.as_slice_mut(), offsets.len()).copy_from_slice(&offsets);
        Ok(out)
    }

    fn select_write(
        &self,
        flags: &HostBuffer,
        rows: usize,
        keep: Keep,
        offsets: &HostBuffer,
        window: Range<u64>,
        out: &mut HostBuffer,
    ) -> Result<()> {
        check_len("select flags", flags.len(), rows, 1)?;
        check_len(
            "select offsets",
            offsets.len(),
            super::probe_runs(rows) + 1,
            8,
        )?;
        check_window(&window, &[out.len()])?;
        let len = (window.end - window.start) as usize;
        let out = typed_mut::<u32>(out.as_slice_mut(), len);
        select::write(&flags.as_slice()[..rows], keep, window.start, out);
        Ok(())
    }

    fn unpack_bits(&self, bits: &HostBuffer, rows: usize) -> Result<HostBuffer> {
        check_len("unpack_bits", bits.len(), rows.div_ceil(8), 1)?;
        let mut out = self.zeroed(rows)?;
        columns::unpack_bits(bits.as_slice(), rows, out.as_slice_mut());
        Ok(out)
    }

    fn pack_bits(&self, bytes: &HostBuffer, rows: usize) -> Result<HostBuffer> {
        check_len("pack_bits", bytes.len(), rows, 1)?;
        let mut out = self.zeroed(rows.div_ceil(32) * 4)?;
        columns::pack_bits(&bytes.as_slice()[..rows], out.as_slice_mut());
        Ok(out)
    }

    fn unframe(
        &self,
        packed: &HostBuffer,
        rows: usize,
        width: usize,
        frame: &Frame,
    ) -> Result<HostBuffer> {
        check_len("unframe", packed.len(), rows, frame.width)?;
        if frame.width >= width
            || ![2, 4, 8, 16].contains(&width)
            || ![1, 2, 4, 8].contains(&frame.width)
        {
            return internal_err!(
                "unframe: {}-byte offsets into {width}-byte values",
                frame.width
            );
        }
        let mut out = self.zeroed(rows * width)?;
        unpack_values(packed.as_slice(), rows, width, frame, out.as_slice_mut());
        Ok(out)
    }

    fn hash_join(
        &self,
        build: &Partitioned<HostBuffer>,
        probe: &Partitioned<HostBuffer>,
        width: KeyWidth,
    ) -> Result<MatchIndices<HostBuffer>> {
        check_sides::<Self>(build, probe)?;
        let (r, s) = match width {
            KeyWidth::U32 => hash_join::hash_join::<u32>(build, probe),
            KeyWidth::U64 => hash_join::hash_join::<u64>(build, probe),
        };
        Ok(MatchIndices {
            len: r.len(),
            build: self.buffer_of_u32s(&r)?,
            probe: self.buffer_of_u32s(&s)?,
        })
    }

    fn bucket_count(
        &self,
        build: &Partitioned<HostBuffer>,
        probe_keys: &HostBuffer,
        rows: usize,
        width: KeyWidth,
        emit: ProbeEmit,
        check: Option<&KeyCheck<'_, HostBuffer>>,
        filter: Option<&FilterInput<'_, HostBuffer>>,
        visited: Option<&mut HostBuffer>,
    ) -> Result<HostBuffer> {
        let tests = bucket_probe::PairTests::of(build, probe_keys, (rows, width), check, filter)?;
        check_visited(emit, visited.as_ref().map(|v| v.len()), build.rows)?;
        let visited = visited.map(|v| v.as_slice_mut());
        let keys = probe_keys.as_slice();
        let offsets = match width {
            KeyWidth::U32 => bucket_probe::count::<u32>(build, keys, rows, emit, &tests, visited),
            KeyWidth::U64 => bucket_probe::count::<u64>(build, keys, rows, emit, &tests, visited),
        };
        let mut out = self.zeroed(offsets.len() * 8)?;
        typed_mut::<u64>(out.as_slice_mut(), offsets.len()).copy_from_slice(&offsets);
        Ok(out)
    }

    fn bucket_write(
        &self,
        build: &Partitioned<HostBuffer>,
        probe_keys: &HostBuffer,
        rows: usize,
        width: KeyWidth,
        emit: ProbeEmit,
        check: Option<&KeyCheck<'_, HostBuffer>>,
        filter: Option<&FilterInput<'_, HostBuffer>>,
        offsets: &HostBuffer,
        window: Range<u64>,
        build_out: &mut HostBuffer,
        probe_out: &mut HostBuffer,
    ) -> Result<()> {
        let tests = bucket_probe::PairTests::of(build, probe_keys, (rows, width), check, filter)?;
        let runs = super::probe_runs(rows);
        check_len("bucket offsets", offsets.len(), runs + 1, 8)?;
        check_window(&window, &[build_out.len(), probe_out.len()])?;
        let len = (window.end - window.start) as usize;
        let out = bucket_probe::Window {
            first: window.start,
            offsets: typed::<u64>(offsets.as_slice(), runs + 1),
            build: typed_mut::<u32>(build_out.as_slice_mut(), len),
            probe: typed_mut::<u32>(probe_out.as_slice_mut(), len),
        };
        match width {
            KeyWidth::U32 => {
                bucket_probe::write::<u32>(build, probe_keys.as_slice(), rows, emit, &tests, out)
            }
            KeyWidth::U64 => {
                bucket_probe::write::<u64>(build, probe_keys.as_slice(), rows, emit, &tests, out)
            }
        }
        Ok(())
    }

    fn bucket_lookup(
        &self,
        build: &Partitioned<HostBuffer>,
        probe_keys: &HostBuffer,
        rows: usize,
        width: KeyWidth,
        exact: bool,
    ) -> Result<Looked<HostBuffer>> {
        check_bucket_probe(
            build,
            probe_keys,
            (rows, width),
            None,
            None,
            HostBuffer::len,
        )?;
        let mut positions = self.alloc(rows * 4)?;
        let out = typed_mut::<u32>(positions.as_slice_mut(), rows);
        let counts = match width {
            KeyWidth::U32 => bucket_probe::lookup::<u32>(build, probe_keys.as_slice(), exact, out),
            KeyWidth::U64 => bucket_probe::lookup::<u64>(build, probe_keys.as_slice(), exact, out),
        };
        let counts: Vec<u8> = counts.iter().flat_map(|c| c.to_le_bytes()).collect();
        Ok(Looked {
            positions,
            counts: self.upload(&counts)?,
        })
    }

    fn view_offsets(
        &self,
        views: &HostBuffer,
        validity: Option<&HostBuffer>,
        rows: usize,
        data: ViewData<'_, HostBuffer>,
    ) -> Result<HostBuffer> {
        let a = ViewArgs::of(views, validity, rows, &data)?;
        let data_len = data.data.len() as u64;
        let offsets = views::offsets(&a.views, a.validity, a.starts, data_len, data.max_copied);
        let mut out = self.zeroed(offsets.len() * 8)?;
        typed_mut::<u64>(out.as_slice_mut(), offsets.len()).copy_from_slice(&offsets);
        Ok(out)
    }

    fn view_copy(
        &self,
        views: &mut HostBuffer,
        validity: Option<&HostBuffer>,
        rows: usize,
        offsets: &HostBuffer,
        data: ViewData<'_, HostBuffer>,
        out: &mut HostBuffer,
    ) -> Result<()> {
        check_len("view offsets", offsets.len(), rows + 1, 8)?;
        let ViewArgs {
            views: mut copied,
            validity,
            starts,
        } = ViewArgs::of(views, validity, rows, &data)?;
        let offsets = typed::<u64>(offsets.as_slice(), rows + 1);
        let (max_copied, out) = (data.max_copied, out.as_slice_mut());
        let from = (data.data.as_slice(), starts);
        views::copy(&mut copied, validity, offsets, from, max_copied, out);
        let written = typed_mut::<i128>(views.as_slice_mut(), rows);
        for (w, v) in written.iter_mut().zip(copied) {
            *w = v as i128;
        }
        Ok(())
    }
}
