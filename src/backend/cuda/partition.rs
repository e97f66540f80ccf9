//! Launch wrappers of `kernels/partition.cu`: stable radix partitioning of encoded keys into
//! up to 2^32 partitions, one pass per digit of at most 8 bits, with the carried columns moving
//! with the keys, then the partition bounds; sorting, the same passes without bounds; and
//! routing, one such pass by the keys' routes.

use datafusion::common::Result;

use super::CudaBackend;
use super::launch::{blocks, launch};
use super::planes::Planes;
use super::scan::{ScanType, exclusive_scan};
use crate::backend::{
    Backend, KeyWidth, Partitioned, Sorted, check_len, check_partition, check_route_bits,
    check_sort_bits,
};
use crate::device::{BLOCK_THREADS, BOUNDS_RUN, DeviceBuffer, PART_ITEMS};

/// Items one block of the partitioning kernels covers.
const PART_TILE: usize = BLOCK_THREADS * PART_ITEMS;
/// Largest radix digit of one partitioning pass.
const DIGIT_BITS: u32 = 8;
/// A `BoundsRun` of partition.cu (only its size is used here).
#[repr(C)]
struct BoundsRun {
    _first: u64,
    _last: u64,
    _value: u32,
    _pad: u32,
}

/// What one pass sorts by.
#[derive(Debug, Clone, Copy)]
enum Digit {
    /// Bits `shift..shift + digit_bits` of the partition id, the top `bits` bits of the hash.
    Partition {
        bits: u32,
        shift: u32,
        digit_bits: u32,
    },
    /// The route: the top `bits` bits of a hash independent of the partition hash.
    Route { bits: u32 },
}

impl Digit {
    fn bits(self) -> u32 {
        match self {
            Self::Partition { digit_bits, .. } => digit_bits,
            Self::Route { bits } => bits,
        }
    }

    /// The histogram kernel of this digit for `width`-wide keys.
    fn histogram(self, width: KeyWidth) -> &'static str {
        match (self, width) {
            (Self::Partition { .. }, KeyWidth::U32) => "radix_histogram_u32",
            (Self::Partition { .. }, KeyWidth::U64) => "radix_histogram_u64",
            (Self::Route { .. }, KeyWidth::U32) => "route_histogram_u32",
            (Self::Route { .. }, KeyWidth::U64) => "route_histogram_u64",
        }
    }

    /// The scatter kernel of this digit for `width`-wide keys, moving `moves` columns (a
    /// 16-byte plane counts twice): for 4-byte keys and at most one move, the `_narrow` form,
    /// compiled for more blocks an SM (partition.cu says why).
    fn scatter(self, width: KeyWidth, moves: usize) -> &'static str {
        let narrow = width == KeyWidth::U32 && moves <= 1;
        match (self, width, narrow) {
            (Self::Partition { .. }, KeyWidth::U32, true) => "radix_scatter_narrow_u32",
            (Self::Partition { .. }, KeyWidth::U32, false) => "radix_scatter_u32",
            (Self::Partition { .. }, KeyWidth::U64, _) => "radix_scatter_u64",
            (Self::Route { .. }, KeyWidth::U32, true) => "route_scatter_narrow_u32",
            (Self::Route { .. }, KeyWidth::U32, false) => "route_scatter_u32",
            (Self::Route { .. }, KeyWidth::U64, _) => "route_scatter_u64",
        }
    }
}

fn bounds_kernel(width: KeyWidth) -> &'static str {
    match width {
        KeyWidth::U32 => "partition_bounds_u32",
        KeyWidth::U64 => "partition_bounds_u64",
    }
}

/// What one pass gives: the keys and every plane in the digit's order, and the exclusive scan
/// of the digit-major histogram (`radix * tiles + 1` u32, the last the row count).
struct Pass {
    keys: DeviceBuffer,
    planes: Vec<DeviceBuffer>,
    offsets: DeviceBuffer,
}

/// One stable counting-sort pass over `keys` on `digit`; returns the keys and every plane
/// (values, width) in its order.
fn pass(
    q: &CudaBackend,
    keys: &DeviceBuffer,
    rows: usize,
    width: KeyWidth,
    digit: Digit,
    planes: &[(&DeviceBuffer, usize)],
) -> Result<Pass> {
    let histogram = digit.histogram(width);
    let tiles = blocks(rows, PART_TILE);
    let radix = 1usize << digit.bits();
    let n64 = rows as u64;
    let mut hist = q.alloc(radix * tiles * 4)?;
    let hist_ptr = hist.ptr_mut();
    let keys_ptr = keys.ptr();
    match digit {
        Digit::Partition {
            bits,
            shift,
            digit_bits,
        } => launch!(
            q,
            "partition.cu",
            histogram,
            tiles,
            keys_ptr,
            n64,
            bits,
            shift,
            digit_bits,
            hist_ptr
        ),
        Digit::Route { bits } => {
            launch!(
                q,
                "partition.cu",
                histogram,
                tiles,
                keys_ptr,
                n64,
                bits,
                hist_ptr
            )
        }
    }
    let mut offsets = q.alloc((radix * tiles + 1) * 4)?;
    exclusive_scan(q, &hist, radix * tiles, ScanType::U32, &mut offsets)?;
    let offsets_ptr = offsets.ptr();
    // A route keeps no keys: the scatter writes none (a null address).
    let (keys_out, keys_out_ptr) = match digit {
        Digit::Route { .. } => (q.alloc(0)?, 0u64),
        Digit::Partition { .. } => {
            let mut k = q.alloc(rows * width.bytes())?;
            let ptr = k.ptr_mut();
            (k, ptr)
        }
    };
    let mut moved = planes
        .iter()
        .map(|&(_, w)| q.alloc(rows * w))
        .collect::<Result<Vec<_>>>()?;
    // At most MAX_PLANES per launch; every launch writes the same keys (at least one runs; a
    // route's writes none).
    for arg in Planes::groups(planes, &mut moved) {
        let scatter = digit.scatter(width, arg.moves());
        match digit {
            Digit::Partition {
                bits,
                shift,
                digit_bits,
            } => launch!(
                q,
                "partition.cu",
                scatter,
                tiles,
                keys_ptr,
                n64,
                bits,
                shift,
                digit_bits,
                offsets_ptr,
                keys_out_ptr,
                arg
            ),
            Digit::Route { bits } => launch!(
                q,
                "partition.cu",
                scatter,
                tiles,
                keys_ptr,
                n64,
                bits,
                offsets_ptr,
                keys_out_ptr,
                arg
            ),
        }
    }
    Ok(Pass {
        keys: keys_out,
        planes: moved,
        offsets,
    })
}

/// `bounds[p]`: the first row of partition p in `keys` (partitioned with `bits`), and
/// `bounds[2^bits] = rows`.
fn bounds(
    q: &CudaBackend,
    keys: &DeviceBuffer,
    rows: usize,
    width: KeyWidth,
    bits: u32,
    out: &mut DeviceBuffer,
) -> Result<()> {
    let parts = 1usize << bits;
    check_len("partition bounds", out.len(), parts + 1, 4)?;
    let kernel = bounds_kernel(width);
    let max_runs = (parts + 1) / (BOUNDS_RUN + 1) + 1;
    let mut runs = q.alloc(max_runs * std::mem::size_of::<BoundsRun>())?;
    let mut run_count = q.alloc(4)?;
    crate::device::zero(q.stream(), &mut run_count)?;
    let (keys_ptr, n64, out_ptr) = (keys.ptr(), rows as u64, out.ptr_mut());
    let (runs_ptr, count_ptr) = (runs.ptr_mut(), run_count.ptr_mut());
    launch!(
        q,
        "partition.cu",
        kernel,
        blocks(rows + 1, PART_TILE),
        keys_ptr,
        n64,
        bits,
        out_ptr,
        runs_ptr,
        count_ptr
    );
    // Long runs: at most one block per run, at most a few per SM.
    launch!(
        q,
        "partition.cu",
        "fill_bounds",
        max_runs.min(1024),
        runs_ptr,
        count_ptr,
        out_ptr
    );
    Ok(())
}

/// What partitioning or routing no rows into `2^bits` pieces gives: no keys, every bound 0, and
/// an empty buffer per carried column.
fn nothing_to_split(
    q: &CudaBackend,
    bits: u32,
    carry: &[(&DeviceBuffer, usize)],
) -> Result<Partitioned<DeviceBuffer>> {
    let mut bounds = q.alloc(((1usize << bits) + 1) * 4)?;
    crate::device::zero(q.stream(), &mut bounds)?;
    Ok(Partitioned {
        keys: q.alloc(0)?,
        bounds,
        rows: 0,
        bits,
        segments: 1,
        carried: carry.iter().map(|_| q.alloc(0)).collect::<Result<_>>()?,
    })
}

/// Partitions `rows` keys into `2^bits` partitions, carrying `carry` along.
pub(crate) fn partition(
    q: &CudaBackend,
    keys: &DeviceBuffer,
    rows: usize,
    width: KeyWidth,
    bits: u32,
    carry: &[(&DeviceBuffer, usize)],
) -> Result<Partitioned<DeviceBuffer>> {
    check_len("partition", keys.len(), rows, width.bytes())?;
    check_partition(carry.iter().map(|(b, w)| (b.len(), *w)), rows, bits)?;
    if rows == 0 {
        return nothing_to_split(q, bits, carry);
    }
    let parts = 1usize << bits;
    let mut bounds_out = q.alloc((parts + 1) * 4)?;
    let (keys_out, moved) = passes(q, keys, rows, width, bits, carry)?;
    bounds(q, &keys_out, rows, width, bits, &mut bounds_out)?;
    Ok(Partitioned {
        keys: keys_out,
        bounds: bounds_out,
        rows,
        bits,
        segments: 1,
        carried: moved,
    })
}

/// Sorts `rows` keys by their sort key (the top `bits` bits of the partition hash), carrying
/// `carry` along: [`partition`]'s passes without its bounds.
pub(crate) fn sort(
    q: &CudaBackend,
    keys: &DeviceBuffer,
    rows: usize,
    width: KeyWidth,
    bits: u32,
    carry: &[(&DeviceBuffer, usize)],
) -> Result<Sorted<DeviceBuffer>> {
    check_len("sort", keys.len(), rows, width.bytes())?;
    check_sort_bits(bits)?;
    check_partition(carry.iter().map(|(b, w)| (b.len(), *w)), rows, bits)?;
    if rows == 0 {
        return Ok(Sorted {
            keys: q.alloc(0)?,
            rows,
            bits,
            carried: carry.iter().map(|_| q.alloc(0)).collect::<Result<_>>()?,
        });
    }
    let (keys, carried) = passes(q, keys, rows, width, bits, carry)?;
    Ok(Sorted {
        keys,
        rows,
        bits,
        carried,
    })
}

/// The keys and carried columns in the order of the top `bits` bits of the partition hash:
/// one pass per digit of at most 8 bits, low digit first (0 bits: one pass with a 0-bit digit,
/// a stable copy). The first pass reads the caller's buffers, later passes the previous pass's
/// output.
fn passes(
    q: &CudaBackend,
    keys: &DeviceBuffer,
    rows: usize,
    width: KeyWidth,
    bits: u32,
    carry: &[(&DeviceBuffer, usize)],
) -> Result<(DeviceBuffer, Vec<DeviceBuffer>)> {
    let mut keys_out: Option<DeviceBuffer> = None;
    let mut moved: Vec<DeviceBuffer> = vec![];
    let mut shift = 0;
    while shift < bits.max(1) {
        let digit = Digit::Partition {
            bits,
            shift,
            digit_bits: (bits - shift).min(DIGIT_BITS),
        };
        let done = match &keys_out {
            None => pass(q, keys, rows, width, digit, carry)?,
            Some(prev) => {
                let planes: Vec<_> = moved.iter().zip(carry).map(|(b, &(_, w))| (b, w)).collect();
                pass(q, prev, rows, width, digit, &planes)?
            }
        };
        (keys_out, moved) = (Some(done.keys), done.planes);
        shift += DIGIT_BITS;
    }
    match keys_out {
        Some(k) => Ok((k, moved)),
        None => datafusion::common::internal_err!("partition ran no pass"),
    }
}

/// Splits `rows` keys stably into `2^bits` routes, carrying `carry` along: one pass by the
/// keys' routes, its bounds read off the pass's scanned histogram.
pub(crate) fn route(
    q: &CudaBackend,
    keys: &DeviceBuffer,
    rows: usize,
    width: KeyWidth,
    bits: u32,
    carry: &[(&DeviceBuffer, usize)],
) -> Result<Partitioned<DeviceBuffer>> {
    check_len("route", keys.len(), rows, width.bytes())?;
    check_route_bits(bits)?;
    check_partition(carry.iter().map(|(b, w)| (b.len(), *w)), rows, bits)?;
    if rows == 0 {
        return nothing_to_split(q, bits, carry);
    }
    let routes = 1usize << bits;
    let mut bounds_out = q.alloc((routes + 1) * 4)?;
    let done = pass(q, keys, rows, width, Digit::Route { bits }, carry)?;
    let tiles = blocks(rows, PART_TILE) as u64;
    let (offsets_ptr, bounds_ptr) = (done.offsets.ptr(), bounds_out.ptr_mut());
    launch!(
        q,
        "partition.cu",
        "route_bounds",
        blocks(routes + 1, crate::device::BLOCK_THREADS),
        offsets_ptr,
        tiles,
        bits,
        bounds_ptr
    );
    Ok(Partitioned {
        keys: done.keys,
        bounds: bounds_out,
        rows,
        bits,
        segments: 1,
        carried: done.planes,
    })
}
