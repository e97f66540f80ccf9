//! The primitives every join algorithm is written in, behind one trait with two twins:
//! [`CudaBackend`] launches the kernels of `kernels/`, [`HostBackend`] runs the same steps in
//! plain Rust. Given the same inputs the two return the same bytes — partitioning is stable and
//! match output has one defined order — and the GPU test suite checks each CUDA primitive
//! against its host twin.
//!
//! # Queues, events and the ownership rule
//!
//! A backend value is one *queue* of work on one device (a CUDA stream; on the host, the
//! calling thread). Primitives and copies are *enqueued*: on CUDA they return before the device
//! has done them; on the host they are done when they return. Work on one queue runs in order.
//! [`fork`](Backend::fork) makes another queue on the same device, whose work may run at the
//! same time; [`record`](Backend::record) marks a point of a queue and
//! [`wait`](Backend::wait) makes another queue wait for it, which is how the streaming engine
//! overlaps uploads, kernels and downloads. Two rules keep this sound:
//! - a queue that uses a buffer written on another queue first waits for an event recorded
//!   after the write;
//! - a buffer is dropped only after the work that uses it has finished (an event the host saw
//!   complete, or [`synchronize`](Backend::synchronize)), or when all that work is on the queue
//!   that allocated it, or that queue waits for an event recorded after the work on other
//!   queues (a buffer is freed in its allocating queue's order).
//!
//! Host memory that copies use is a [`HostBlock`], fenced until its copies finish (see
//! `device::host_memory`). Buffers are untyped bytes ([`Backend::Buf`]); each primitive states
//! the element type it reads and writes. Every allocation is counted in the queue's
//! [`MemoryTracker`], whose limit is what the join reserved from the device's [`MemoryBudget`].

mod cuda;
mod host;
mod keys;

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use datafusion::common::Result;

use crate::columns::Frame;
use crate::device::{HostBlock, HostPool, MemoryBudget, MemoryTracker};
use crate::filter::PairFilter;

pub use crate::device::JOIN_CHUNK;
pub use cuda::CudaBackend;
pub use host::{HostBackend, HostBuffer, system_memory};
pub use keys::{
    CLASS_BITS, CLASS_MASK, KeyColumnEncoding, KeyType, KeyWidth, checked_hash, float_key_bits,
    with_class,
};

/// A relation's encoded keys after stable radix partitioning.
#[derive(Debug)]
pub struct Partitioned<B> {
    /// Encoded keys (u32 or u64) in partition order; not kept by [`Backend::route`].
    pub keys: B,
    /// `segments` arrays of `2^bits + 1` u32 offsets, back to back: segment k of partition p
    /// holds rows `bounds[k * (2^bits + 1) + p]..bounds[k * (2^bits + 1) + p + 1]`. One
    /// segment where the rows were partitioned in one piece: partition p holds rows
    /// `bounds[p]..bounds[p+1]`.
    pub bounds: B,
    /// Number of rows.
    pub rows: usize,
    /// Partition bits: `2^bits` partitions.
    pub bits: u32,
    /// How many pieces each partition's rows lie in: 1, except for a device's share of a
    /// relation dealt out by partition ([`crate::join::exchange_partitioned`]), whose sources
    /// each give one. Segment k's rows lie after segment k - 1's in every partition, and only
    /// [`Backend::hash_join`] reads more than one.
    pub segments: usize,
    /// The columns given to [`Backend::partition`] to carry, in partition order like the keys.
    pub carried: Vec<B>,
}

/// A relation's encoded keys after a stable radix sort by their sort key
/// ([`Backend::sort`]): the top `bits` bits of the key's partition hash (its partition id of
/// `bits` bits), so that equal keys lie in one run of equal sort keys, with the other keys of
/// that sort key. With 32 bits and 4-byte keys the sort key is a bijection: a run holds one key.
#[derive(Debug)]
pub struct Sorted<B> {
    /// Encoded keys (u32 or u64) in sort-key order.
    pub keys: B,
    /// Number of rows.
    pub rows: usize,
    /// Bits of the sort key (1 to 32).
    pub bits: u32,
    /// The columns given to [`Backend::sort`] to carry, in the keys' order.
    pub carried: Vec<B>,
}

/// What [`Backend::bucket_lookup`] gives.
#[derive(Debug)]
pub struct Looked<B> {
    /// Per probe row (u32): the build position holding its key, or [`NO_ROW`] for none (the
    /// first of them where several do).
    pub positions: B,
    /// Two u64: the probe rows without a build row, and the probe rows whose key more than one
    /// build row holds (any of the latter makes the lookup no join).
    pub counts: B,
}

/// Matching pairs of positions in the build and probe relations.
#[derive(Debug)]
pub struct MatchIndices<B> {
    /// Build-side positions (u32 per match).
    pub build: B,
    /// Probe-side positions (u32 per match).
    pub probe: B,
    /// Number of matches.
    pub len: usize,
}

/// The position of a row that is not there: the build position of a probe row output without a
/// match. [`Backend::gather`] gives zeros for it, and [`Backend::present`] a 0.
pub const NO_ROW: u32 = u32::MAX;

/// What a probe row adds to a join's output in [`Backend::bucket_count`] and
/// [`Backend::bucket_write`] (the kernels read the values through `KERNEL_CONSTANTS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProbeEmit {
    /// One row per matching pair (inner and left joins).
    Pairs = 0,
    /// One row per matching pair, or the probe row alone (with [`NO_ROW`]) if it has none
    /// (right and full joins).
    PairsOrAlone = 1,
    /// The probe row once, with its first match, if it has a match (right semi joins).
    Matched = 2,
    /// The probe row once, with [`NO_ROW`], if it has no match (right anti joins).
    Unmatched = 3,
    /// Every probe row once, with its first match or [`NO_ROW`] (right mark joins).
    Every = 4,
    /// Nothing: probing only marks the build rows it matches (left semi, anti and mark joins).
    Nothing = 5,
}

impl ProbeEmit {
    /// Whether it looks at every match of a probe row, so that it can mark them visited.
    pub fn visits_all(self) -> bool {
        matches!(self, Self::Pairs | Self::PairsOrAlone | Self::Nothing)
    }
}

/// Check bytes that a match of hashed keys must also agree on ([`Backend::bucket_count`] and
/// [`Backend::bucket_write`]): per side, one to [`KEY_CHECK_WORDS`] words of
/// [`KEY_CHECK_BYTES`] bytes a row (word j a buffer of bytes 16j..16j + 15 of every row's key),
/// build rows in bucket order, probe rows in probe order, the same number of words on both
/// sides. Two keys whose encoded hashes are equal match only if all their check bytes are equal
/// too, so where the check bytes are the key itself a hash collision never makes a match.
#[derive(Debug)]
pub struct KeyCheck<'a, Buf> {
    pub build: Vec<&'a Buf>,
    pub probe: Vec<&'a Buf>,
}

/// A compiled residual filter and the columns it reads ([`Backend::bucket_count`] and
/// [`Backend::bucket_write`]): a pair of equal keys matches only if the filter is true for it.
/// Per side, in the filter's slot order ([`PairFilter::build_columns`]), each column's values
/// and, if some row is null, its validity (a byte per row, 1 = valid); build columns in bucket
/// order, probe columns per probe row.
#[derive(Debug)]
pub struct FilterInput<'a, Buf> {
    pub filter: &'a PairFilter,
    pub build: Vec<(&'a Buf, Option<&'a Buf>)>,
    pub probe: Vec<(&'a Buf, Option<&'a Buf>)>,
}

/// A build view column's data buffers on a backend ([`Backend::view_offsets`],
/// [`Backend::view_copy`]): the bytes of its `buffers` buffers one after another in `data`,
/// buffer `b` from byte `starts[b]` (u64 each); values longer than `max_copied` bytes are left
/// to the host.
#[derive(Debug)]
pub struct ViewData<'a, Buf> {
    pub data: &'a Buf,
    pub starts: &'a Buf,
    pub buffers: usize,
    pub max_copied: u32,
}

impl<Buf> Clone for ViewData<'_, Buf> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<Buf> Copy for ViewData<'_, Buf> {}

/// Bytes of one word of a row's check bytes ([`KeyCheck`]).
pub const KEY_CHECK_BYTES: usize = 16;

/// Words of check bytes a row carries at most ([`KeyCheck`]): keys of up to 64 bytes are
/// checked on the device.
pub const KEY_CHECK_WORDS: usize = 4;

/// Bytes of the longest key checked on the device: [`KEY_CHECK_WORDS`] words.
pub const KEY_CHECK_MAX_BYTES: usize = KEY_CHECK_WORDS * KEY_CHECK_BYTES;

/// Which rows [`Backend::select_count`] keeps, by their flag byte (the kernels read the values
/// through `KERNEL_CONSTANTS`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Keep {
    /// Rows whose flag is 0.
    Unset = 0,
    /// Rows whose flag is not 0.
    Set = 1,
    /// Every row.
    All = 2,
}

/// Probe rows one block of the bucket probe handles, one a thread; [`Backend::bucket_count`]
/// counts matches per run of this many consecutive probe rows.
pub const PROBE_RUN: usize = 32 * crate::device::PROBE_ROUNDS;

/// The multiplier of the partition hash of 32-bit encoded keys (`partition_of`: the top bits of
/// the key times it), shared by the kernels (`GJ_PARTITION_MUL_U32`), the host twin and the
/// direct key encoder, which inverts it.
pub const PARTITION_MUL_U32: u32 = 0x9E37_79B1;
/// The same for 64-bit encoded keys (`GJ_PARTITION_MUL_U64`).
pub const PARTITION_MUL_U64: u64 = 0x9E37_79B9_7F4A_7C15;

/// The most partition bits [`Backend::partition`] takes.
pub const MAX_PARTITION_BITS: u32 = 32;

/// The most bits of a key's route ([`Backend::route`]): at most `2^MAX_ROUTE_BITS` routes,
/// which [`join::exchange`](crate::join::exchange) deals out to devices.
pub const MAX_ROUTE_BITS: u32 = 8;

/// The primitives of the join algorithms, enqueued on one queue of one device.
pub trait Backend: Send + Sync + Sized + 'static {
    /// A buffer of bytes in this backend's memory.
    type Buf: Send + Sync + std::fmt::Debug + 'static;
    /// A point in a queue's work.
    type Event: Send + Sync + 'static;

    /// "cuda" or "host".
    fn name(&self) -> &'static str;

    // ---- queues and events ----

    /// Another queue on the same device, sharing this one's memory tracker and pools.
    fn fork(&self) -> Result<Self>;

    /// An event marking the work enqueued on this queue so far.
    fn record(&self) -> Result<Self::Event>;

    /// Makes the work enqueued on this queue from now on wait for `event` (the host does not
    /// wait).
    fn wait(&self, event: &Self::Event) -> Result<()>;

    /// Whether the work before `event` has finished; never blocks.
    fn is_done(&self, event: &Self::Event) -> Result<bool>;

    /// Blocks the calling thread until the work before `event` has finished.
    fn block_on(&self, event: &Self::Event) -> Result<()>;

    /// Time between two finished events of this device.
    fn elapsed(&self, start: &Self::Event, end: &Self::Event) -> Result<Duration>;

    /// Blocks until all work enqueued on this queue has finished.
    fn synchronize(&self) -> Result<()>;

    // ---- memory ----

    /// The memory accounting of this queue (shared with its forks).
    fn tracker(&self) -> &Arc<MemoryTracker>;

    /// The device memory joins may hold at once on this device.
    fn budget(&self) -> &Arc<MemoryBudget>;

    /// Host blocks that data is staged in before it is copied to this device.
    fn staging(&self) -> &HostPool;

    /// Host blocks that results are copied into from this device.
    fn output(&self) -> &HostPool;

    /// Small host blocks that totals are copied into from this device.
    fn scalars(&self) -> &HostPool;

    /// A new buffer of `bytes` uninitialized bytes.
    fn alloc(&self, bytes: usize) -> Result<Self::Buf>;

    /// The size of a buffer in bytes.
    fn buf_len(buf: &Self::Buf) -> usize;

    /// Enqueues a copy of `len` bytes of `src` (from `src_offset`) into `dst` at `dst_offset`.
    fn copy_to_device(
        &self,
        src: &mut HostBlock,
        src_offset: usize,
        dst: &mut Self::Buf,
        dst_offset: usize,
        len: usize,
    ) -> Result<()>;

    /// Enqueues a copy of `len` bytes of `src` (from `src_offset`) into `dst` at `dst_offset`.
    fn copy_to_host(
        &self,
        src: &Self::Buf,
        src_offset: usize,
        dst: &mut HostBlock,
        dst_offset: usize,
        len: usize,
    ) -> Result<()>;

    /// Enqueues a copy of the `u64` at element `index` of `src` into the first 8 bytes of `dst`,
    /// a value the host waits for (a total): unlike [`copy_to_host`](Self::copy_to_host), it
    /// need not wait behind other queues' copies.
    fn read_u64(&self, src: &Self::Buf, index: usize, dst: &mut HostBlock) -> Result<()> {
        self.copy_to_host(src, index * 8, dst, 0, 8)
    }

    /// Enqueues a copy of `len` bytes between two buffers.
    fn copy_within(
        &self,
        src: &Self::Buf,
        src_offset: usize,
        dst: &mut Self::Buf,
        dst_offset: usize,
        len: usize,
    ) -> Result<()>;

    /// Copies host bytes into a new buffer; the bytes may be reused when this returns.
    fn upload(&self, bytes: &[u8]) -> Result<Self::Buf> {
        self.upload_parts(&[bytes])
    }

    /// Copies several host byte slices, one after another, into one new buffer; the slices may
    /// be reused when this returns.
    fn upload_parts(&self, parts: &[&[u8]]) -> Result<Self::Buf>;

    /// Copies the first `out.len()` bytes of `buf` to the host, waiting for the work enqueued
    /// before.
    fn download(&self, buf: &Self::Buf, out: &mut [u8]) -> Result<()>;

    // ---- primitives ----

    /// Encodes one key column (`rows` values of `enc.ty`, optional validity bytes) into keys of
    /// `width`; `acc` holds the encoding of the previous key columns of a composite key.
    fn encode_keys(
        &self,
        values: &Self::Buf,
        validity: Option<&Self::Buf>,
        rows: usize,
        enc: &KeyColumnEncoding,
        width: KeyWidth,
        acc: Option<Self::Buf>,
    ) -> Result<Self::Buf>;

    /// The hashes (u64, [`checked_hash`] with `mask`) of `rows` checked keys from their check
    /// bytes (one to [`KEY_CHECK_WORDS`] words of 16 bytes a row, a buffer a word) and length
    /// classes (a byte a row): what a checked key column is staged as, turned into the column
    /// the join encodes.
    fn hash_checked(
        &self,
        check: &[&Self::Buf],
        classes: &Self::Buf,
        rows: usize,
        mask: u64,
    ) -> Result<Self::Buf>;

    /// Exclusive prefix sum of `n` u32 values; the result has `n + 1` values, the last the total.
    fn exclusive_scan(&self, values: &Self::Buf, n: usize) -> Result<Self::Buf>;

    /// Stable radix partitioning of `rows` encoded keys into `2^bits` partitions (`bits` at most
    /// [`MAX_PARTITION_BITS`], `rows` below 2^32), carrying along the columns in `carry`
    /// (buffers of `rows` values of 1, 2, 4, 8 or 16 bytes).
    fn partition(
        &self,
        keys: &Self::Buf,
        rows: usize,
        width: KeyWidth,
        bits: u32,
        carry: &[(&Self::Buf, usize)],
    ) -> Result<Partitioned<Self::Buf>>;

    /// Stable radix sort of `rows` encoded keys (below 2^32) by their sort key of `bits` bits
    /// (1 to 32), carrying along the columns in `carry` as [`partition`](Self::partition)
    /// does: its passes, with no bounds ([`Sorted`]).
    fn sort(
        &self,
        keys: &Self::Buf,
        rows: usize,
        width: KeyWidth,
        bits: u32,
        carry: &[(&Self::Buf, usize)],
    ) -> Result<Sorted<Self::Buf>>;

    /// All pairs of equal keys between two relations [sorted](Self::sort) with the same
    /// encoder and bits (both sides: CUDA finds each tile of probe rows its build rows by the
    /// tile's first and last sort keys), as positions in each, ordered by probe position, then
    /// build position (the match finding of the sort-merge join: each probe row's run of its
    /// sort key found by binary search, its keys compared, then count → scan → write). Null
    /// and out-of-range keys (the sentinel) match nothing. Waits for the device once (the
    /// number of pairs).
    fn merge_join(
        &self,
        build: &Sorted<Self::Buf>,
        probe: &Sorted<Self::Buf>,
        width: KeyWidth,
    ) -> Result<MatchIndices<Self::Buf>>;

    /// All pairs of equal keys between a relation [sorted](Self::sort) by sort keys of `bits`
    /// bits (the index) and `probe_rows` encoded keys in any order, with the same encoder, as
    /// positions in each, ordered by probe position, then build position: the match finding
    /// of the index nested loop join, [`merge_join`](Self::merge_join)'s search from every
    /// probe row over the whole index. Waits for the device once (the number of pairs).
    fn index_join(
        &self,
        build: &Sorted<Self::Buf>,
        probe_keys: &Self::Buf,
        probe_rows: usize,
        width: KeyWidth,
    ) -> Result<MatchIndices<Self::Buf>>;

    /// Stable split of `rows` encoded keys into `2^bits` routes (`bits` at most
    /// [`MAX_ROUTE_BITS`]), carrying along the columns in `carry` as
    /// [`partition`](Self::partition) does. A key's route is the top `bits` bits of a hash
    /// independent of the partition hash, so the rows of one route still spread over every
    /// partition and bucket of a join that partitions them again. The result's bounds are where
    /// each route starts; its keys are not kept (a buffer of no keys).
    fn route(
        &self,
        keys: &Self::Buf,
        rows: usize,
        width: KeyWidth,
        bits: u32,
        carry: &[(&Self::Buf, usize)],
    ) -> Result<Partitioned<Self::Buf>>;

    /// Enqueues on this backend's queue a copy of `len` bytes of `src` (from `src_offset`), a
    /// buffer of this backend's device, into `dst` at `dst_offset`, a buffer of `peer`'s device
    /// (the same device or another; across devices over their direct link where there is one).
    /// `dst` must be ready for this queue: allocated before an event this queue waits for; and
    /// neither buffer may be freed before the copy is done (`dst` is freed on `peer`'s queue,
    /// which must first wait for an event recorded here after the copy).
    fn copy_to_peer(
        &self,
        src: &Self::Buf,
        src_offset: usize,
        peer: &Self,
        dst: &mut Self::Buf,
        dst_offset: usize,
        len: usize,
    ) -> Result<()>;

    /// Enqueues setting every byte of `buf` to `byte`.
    fn fill(&self, buf: &mut Self::Buf, byte: u8) -> Result<()>;

    /// `out[i] = src[idx[i]]` for `rows` values of `width` bytes (1, 2, 4, 8 or 16); zeros
    /// where `idx[i]` is [`NO_ROW`].
    fn gather(
        &self,
        src: &Self::Buf,
        idx: &Self::Buf,
        rows: usize,
        width: usize,
    ) -> Result<Self::Buf>;

    /// [`gather`](Self::gather) of each of `planes` (buffers with their bytes a value) by the
    /// same positions, in order. The CUDA backend reads `idx` once for up to
    /// [`MAX_PLANES`](crate::device::MAX_PLANES) planes; the default gathers plane by plane.
    fn gather_planes(
        &self,
        planes: &[(&Self::Buf, usize)],
        idx: &Self::Buf,
        rows: usize,
    ) -> Result<Vec<Self::Buf>> {
        planes
            .iter()
            .map(|&(src, width)| self.gather(src, idx, rows, width))
            .collect()
    }

    /// One byte per position of `idx` (`rows` u32 values): 0 where it is [`NO_ROW`], else 1.
    fn present(&self, idx: &Self::Buf, rows: usize) -> Result<Self::Buf>;

    /// The positions `0, 1, ..., rows - 1` (u32 each); an error for 2^32 rows or more (the last
    /// would be [`NO_ROW`]).
    fn row_positions(&self, rows: usize) -> Result<Self::Buf>;

    /// Counts, for each run of [`PROBE_RUN`] of `rows` flag bytes, the rows `keep` keeps, and
    /// scans the counts: `runs + 1` u64 values, where each run's rows start and, last, their
    /// total.
    fn select_count(&self, flags: &Self::Buf, rows: usize, keep: Keep) -> Result<Self::Buf>;

    /// Writes the positions (u32, ascending) of the rows [`select_count`](Self::select_count)
    /// counted whose place lies in `window`, at place minus `window.start`.
    fn select_write(
        &self,
        flags: &Self::Buf,
        rows: usize,
        keep: Keep,
        offsets: &Self::Buf,
        window: Range<u64>,
        out: &mut Self::Buf,
    ) -> Result<()>;

    /// One byte (0 or 1) per bit of an LSB-first bitmap of `rows` bits.
    fn unpack_bits(&self, bits: &Self::Buf, rows: usize) -> Result<Self::Buf>;

    /// An LSB-first bitmap (whole u32 words) of `rows` bytes, bit set where the byte is not 0.
    fn pack_bits(&self, bytes: &Self::Buf, rows: usize) -> Result<Self::Buf>;

    /// `rows` values of `width` bytes from values packed in `frame` (offsets of `frame.width`
    /// bytes): each offset added to the frame's base, wrapping at `width` bytes.
    fn unframe(
        &self,
        packed: &Self::Buf,
        rows: usize,
        width: usize,
        frame: &Frame,
    ) -> Result<Self::Buf>;

    /// All pairs of equal keys between two relations partitioned with the same bits, as
    /// positions in each; ordered by partition, build chunk, probe row, build row. Waits for
    /// the device twice (the number of tasks, the number of pairs).
    fn hash_join(
        &self,
        build: &Partitioned<Self::Buf>,
        probe: &Partitioned<Self::Buf>,
        width: KeyWidth,
    ) -> Result<MatchIndices<Self::Buf>>;

    /// Counts, for each run of [`PROBE_RUN`] probe rows, the output rows that `rows` encoded
    /// probe keys make with a bucketed build side (`build` partitioned into buckets) under
    /// `emit`, and scans the counts: `runs + 1` u64 values, where each run's rows start and,
    /// last, their total. With `check`, a build row matches only if its check bytes equal the
    /// probe row's too; with `filter`, only if the filter is true for the pair. With `visited`
    /// (a byte per build row; only with an `emit` that
    /// [visits all](ProbeEmit::visits_all) matches), sets the byte of every build row matched.
    #[allow(clippy::too_many_arguments)]
    fn bucket_count(
        &self,
        build: &Partitioned<Self::Buf>,
        probe_keys: &Self::Buf,
        rows: usize,
        width: KeyWidth,
        emit: ProbeEmit,
        check: Option<&KeyCheck<'_, Self::Buf>>,
        filter: Option<&FilterInput<'_, Self::Buf>>,
        visited: Option<&mut Self::Buf>,
    ) -> Result<Self::Buf>;

    /// Writes the output rows that [`bucket_count`](Self::bucket_count) counted whose place
    /// lies in `window`, at place minus `window.start`: build positions (u32, [`NO_ROW`] for a
    /// probe row without one) into `build_out`, probe rows (u32) into `probe_out`. Rows are
    /// ordered by probe row, then build position. `check` and `filter` must be the ones counted
    /// with.
    #[allow(clippy::too_many_arguments)]
    fn bucket_write(
        &self,
        build: &Partitioned<Self::Buf>,
        probe_keys: &Self::Buf,
        rows: usize,
        width: KeyWidth,
        emit: ProbeEmit,
        check: Option<&KeyCheck<'_, Self::Buf>>,
        filter: Option<&FilterInput<'_, Self::Buf>>,
        offsets: &Self::Buf,
        window: Range<u64>,
        build_out: &mut Self::Buf,
        probe_out: &mut Self::Buf,
    ) -> Result<()>;

    /// Each of `rows` probe keys' one build position in `build`, in one pass, for a build side
    /// whose keys are unique (LOOKUP, [`crate::join::lookup`]); exact keys only (no check bytes,
    /// no filter). With `exact` (a direct table: each bucket holds one key value) every row of
    /// a probe key's bucket holds its key, and build keys are not read, but in the bucket the
    /// sentinel hashes to, where null build keys lie.
    fn bucket_lookup(
        &self,
        build: &Partitioned<Self::Buf>,
        probe_keys: &Self::Buf,
        rows: usize,
        width: KeyWidth,
        exact: bool,
    ) -> Result<Looked<Self::Buf>>;

    /// Where the out-of-line bytes of each of `rows` 16-byte Arrow views (a build view
    /// column's, gathered into an output window; `validity` its packed bitmap where some row
    /// may be null) go in a buffer of the window's own: `rows + 1` u64 offsets, the last their
    /// total. An inline value (at most 12 bytes), a null row, a value longer than
    /// `data.max_copied` and a view naming bytes outside `data` take none.
    fn view_offsets(
        &self,
        views: &Self::Buf,
        validity: Option<&Self::Buf>,
        rows: usize,
        data: ViewData<'_, Self::Buf>,
    ) -> Result<Self::Buf>;

    /// Copies the out-of-line value of each of `rows` views from `data` into `out` at its
    /// offset ([`view_offsets`](Self::view_offsets)'s), and points its view there (buffer 0,
    /// that offset); the view of a null row, or of one of at most `data.max_copied` bytes that
    /// takes no bytes but is not inline, becomes 0 (an empty value); the view of a longer value
    /// is left for the host to copy: it keeps naming its bytes in `data`'s buffers, its buffer
    /// index raised by one (0 where it names no buffer).
    #[allow(clippy::too_many_arguments)]
    fn view_copy(
        &self,
        views: &mut Self::Buf,
        validity: Option<&Self::Buf>,
        rows: usize,
        offsets: &Self::Buf,
        data: ViewData<'_, Self::Buf>,
        out: &mut Self::Buf,
    ) -> Result<()>;
}

/// Checks that a buffer of `have` bytes holds `rows` values of `width` bytes.
pub(crate) fn check_len(what: &str, have: usize, rows: usize, width: usize) -> Result<()> {
    let need = rows.checked_mul(width);
    match need {
        Some(need) if need <= have => Ok(()),
        _ => datafusion::common::internal_err!(
            "{what}: buffer of {have} bytes cannot hold {rows} values of {width} bytes"
        ),
    }
}

/// An error where `rows` rows cannot each have a u32 position other than [`NO_ROW`]
/// ([`Backend::row_positions`]).
pub(crate) fn check_positions(rows: usize) -> Result<()> {
    match rows as u64 <= NO_ROW as u64 {
        true => Ok(()),
        false => datafusion::common::exec_err!(
            "{rows} rows cannot be numbered by 32-bit positions (at most 2^32 - 1)"
        ),
    }
}

/// Checks the sides of [`Backend::hash_join`] on `B`: the same partition bits, at least one
/// segment each, and bounds for every segment.
pub(crate) fn check_sides<B: Backend>(
    build: &Partitioned<B::Buf>,
    probe: &Partitioned<B::Buf>,
) -> Result<()> {
    if build.bits != probe.bits {
        return datafusion::common::internal_err!(
            "hash_join: build has {} partition bits, probe {}",
            build.bits,
            probe.bits
        );
    }
    let parts = (1usize << build.bits) + 1;
    for side in [build, probe] {
        if side.segments == 0 || side.segments > u32::MAX as usize {
            return datafusion::common::internal_err!(
                "hash_join: a side in {} segments",
                side.segments
            );
        }
        check_len(
            "hash_join bounds",
            B::buf_len(&side.bounds),
            side.segments * parts,
            4,
        )?;
    }
    Ok(())
}

/// Checks the sort bits of [`Backend::sort`]: 1 to 32.
pub(crate) fn check_sort_bits(bits: u32) -> Result<()> {
    match (1..=32).contains(&bits) {
        true => Ok(()),
        false => datafusion::common::internal_err!("sort: 1 to 32 bits, asked for {bits}"),
    }
}

/// Checks the sides of [`Backend::merge_join`] on `B`: the same sort bits, keys of `width` for
/// every row, and positions that fit 32 bits (not that the keys are in order: that is the
/// caller's, [`Backend::sort`]'s).
pub(crate) fn check_merge_sides<B: Backend>(
    build: &Sorted<B::Buf>,
    probe: &Sorted<B::Buf>,
    width: KeyWidth,
) -> Result<()> {
    if build.bits != probe.bits {
        return datafusion::common::internal_err!(
            "merge_join: build sorted by {} bits, probe by {}",
            build.bits,
            probe.bits
        );
    }
    check_sort_bits(build.bits)?;
    for side in [build, probe] {
        check_search_side::<B>("merge_join", &side.keys, side.rows, width)?;
    }
    Ok(())
}

/// Checks the sides of [`Backend::index_join`] on `B`.
pub(crate) fn check_index_sides<B: Backend>(
    build: &Sorted<B::Buf>,
    probe_keys: &B::Buf,
    probe_rows: usize,
    width: KeyWidth,
) -> Result<()> {
    check_sort_bits(build.bits)?;
    check_search_side::<B>("index_join", &build.keys, build.rows, width)?;
    check_search_side::<B>("index_join", probe_keys, probe_rows, width)
}

/// Checks one side of a sorted search: positions of 32 bits, and a key a row.
fn check_search_side<B: Backend>(
    what: &str,
    keys: &B::Buf,
    rows: usize,
    width: KeyWidth,
) -> Result<()> {
    if rows >= u32::MAX as usize {
        return datafusion::common::internal_err!("{what}: {rows} rows; positions are 32-bit");
    }
    check_len(
        &format!("{what} keys"),
        B::buf_len(keys),
        rows,
        width.bytes(),
    )
}

/// Checks the route bits of [`Backend::route`].
pub(crate) fn check_route_bits(bits: u32) -> Result<()> {
    match bits <= MAX_ROUTE_BITS {
        true => Ok(()),
        false => datafusion::common::internal_err!(
            "route: at most {MAX_ROUTE_BITS} bits, asked for {bits}"
        ),
    }
}

/// Checks the columns given to [`Backend::partition`] to carry, as (bytes, width) pairs:
/// `rows` values of 1, 2, 4, 8 or 16 bytes each; and the partition bits and rows.
pub(crate) fn check_partition(
    carry: impl IntoIterator<Item = (usize, usize)>,
    rows: usize,
    bits: u32,
) -> Result<()> {
    if bits > MAX_PARTITION_BITS {
        return datafusion::common::internal_err!(
            "partition: at most {MAX_PARTITION_BITS} bits, asked for {bits}"
        );
    }
    if rows >= u32::MAX as usize {
        return datafusion::common::internal_err!("partition: {rows} rows; positions are 32-bit");
    }
    for (bytes, width) in carry {
        if !matches!(width, 1 | 2 | 4 | 8 | 16) {
            return datafusion::common::internal_err!(
                "partition: cannot carry {width}-byte values"
            );
        }
        check_len("partition carry", bytes, rows, width)?;
    }
    Ok(())
}

/// Checks an output window of [`Backend::bucket_write`] or [`Backend::select_write`] against
/// the output buffers (u32 positions each).
pub(crate) fn check_window(window: &Range<u64>, outputs: &[usize]) -> Result<()> {
    let len = window.end.saturating_sub(window.start);
    if window.end < window.start || len > u32::MAX as u64 {
        return datafusion::common::internal_err!("bad output window {window:?}");
    }
    for &bytes in outputs {
        check_len("output window", bytes, len as usize, 4)?;
    }
    Ok(())
}

/// Checks the arguments of [`Backend::bucket_count`]'s marking: `visited` only with an emit
/// that visits every match, and a byte per build row.
pub(crate) fn check_visited(
    emit: ProbeEmit,
    visited: Option<usize>,
    build_rows: usize,
) -> Result<()> {
    match visited {
        Some(_) if !emit.visits_all() => datafusion::common::internal_err!(
            "bucket_count: {emit:?} stops at the first match and cannot mark build rows"
        ),
        Some(bytes) => check_len("bucket_count visited", bytes, build_rows, 1),
        None => Ok(()),
    }
}

/// Checks a bucket probe's check bytes ([`KeyCheck`]), `len` giving a buffer's bytes: as many
/// words on both sides, at least one and at most [`KEY_CHECK_WORDS`], of 16 bytes per build row
/// and per probe row.
pub(crate) fn check_key_check<Buf>(
    check: Option<&KeyCheck<'_, Buf>>,
    len: impl Fn(&Buf) -> usize,
    build_rows: usize,
    probe_rows: usize,
) -> Result<()> {
    let Some(c) = check else { return Ok(()) };
    let words = c.build.len();
    if words == 0 || words > KEY_CHECK_WORDS || c.probe.len() != words {
        return datafusion::common::internal_err!(
            "bucket probe check: {} build and {} probe words",
            words,
            c.probe.len()
        );
    }
    for (b, p) in c.build.iter().zip(&c.probe) {
        check_len("bucket build check", len(b), build_rows, KEY_CHECK_BYTES)?;
        check_len("bucket probe check", len(p), probe_rows, KEY_CHECK_BYTES)?;
    }
    Ok(())
}

/// Checks the inputs of [`Backend::bucket_count`] and [`Backend::bucket_write`], `len` giving
/// a buffer's bytes: the keys of both sides, the bounds, the check bytes and the filter's
/// columns.
pub(crate) fn check_bucket_probe<Buf>(
    build: &Partitioned<Buf>,
    probe_keys: &Buf,
    (rows, width): (usize, KeyWidth),
    check: Option<&KeyCheck<'_, Buf>>,
    filter: Option<&FilterInput<'_, Buf>>,
    len: impl Fn(&Buf) -> usize,
) -> Result<()> {
    check_len("bucket probe keys", len(probe_keys), rows, width.bytes())?;
    check_len(
        "bucket build keys",
        len(&build.keys),
        build.rows,
        width.bytes(),
    )?;
    let buckets = (1usize << build.bits) + 1;
    check_len("bucket bounds", len(&build.bounds), buckets, 4)?;
    check_key_check(check, &len, build.rows, rows)?;
    check_filter(filter, &len, build.rows, rows)
}

/// Checks a bucket probe's filter columns against the filter and the rows: `len` gives a
/// buffer's bytes.
fn check_filter<Buf>(
    filter: Option<&FilterInput<'_, Buf>>,
    len: impl Fn(&Buf) -> usize,
    build_rows: usize,
    probe_rows: usize,
) -> Result<()> {
    let Some(f) = filter else { return Ok(()) };
    let sides = [
        ("build", &f.build, &f.filter.build_columns, build_rows),
        ("probe", &f.probe, &f.filter.probe_columns, probe_rows),
    ];
    for (side, columns, types, rows) in sides {
        if columns.len() != types.len() {
            return datafusion::common::internal_err!(
                "bucket probe filter: {} {side} columns for a filter reading {}",
                columns.len(),
                types.len()
            );
        }
        for ((values, validity), (_, ty)) in columns.iter().zip(types) {
            check_len("bucket probe filter column", len(values), rows, ty.width())?;
            if let Some(v) = validity {
                check_len("bucket probe filter validity", len(v), rows, 1)?;
            }
        }
    }
    Ok(())
}

/// Checks the inputs of [`Backend::hash_checked`] (as byte lengths): one to
/// [`KEY_CHECK_WORDS`] words of 16 check bytes a row, and a class byte a row.
pub(crate) fn check_hash_checked(check: &[usize], classes: usize, rows: usize) -> Result<()> {
    if check.is_empty() || check.len() > KEY_CHECK_WORDS {
        return datafusion::common::internal_err!("hash_checked: {} check words", check.len());
    }
    for &word in check {
        check_len("hash_checked check bytes", word, rows, KEY_CHECK_BYTES)?;
    }
    check_len("hash_checked classes", classes, rows, 1)
}

/// Runs of [`PROBE_RUN`] rows in `rows` probe rows.
pub fn probe_runs(rows: usize) -> usize {
    rows.div_ceil(PROBE_RUN)
}
