//! Launch wrappers of `kernels/merge_join.cu`: match finding of the sort-merge join (sorted
//! search → count → scan → write) between two relations sorted by their sort keys, and of the
//! index nested loop join, the same search from probe keys in any order.

use datafusion::common::Result;

use super::CudaBackend;
use super::launch::{blocks, launch};
use super::scan::{ScanType, exclusive_scan};
use crate::backend::{
    Backend, KeyWidth, MatchIndices, Sorted, check_index_sides, check_merge_sides,
};
use crate::device::{BLOCK_THREADS, DeviceBuffer, MERGE_ITEMS, WARPS};

/// Probe rows of one block (`kMergeTile` of merge_join.cu).
const MERGE_TILE: usize = BLOCK_THREADS * MERGE_ITEMS;

/// All pairs of equal keys of `build` and `probe`, as positions in each.
pub(crate) fn merge_join(
    q: &CudaBackend,
    build: &Sorted<DeviceBuffer>,
    probe: &Sorted<DeviceBuffer>,
    width: KeyWidth,
) -> Result<MatchIndices<DeviceBuffer>> {
    check_merge_sides::<CudaBackend>(build, probe, width)?;
    search(q, build, &probe.keys, probe.rows, width, false)
}

/// All pairs of equal keys of `build` (the index) and `probe_rows` probe keys in any order, as
/// positions in each.
pub(crate) fn index_join(
    q: &CudaBackend,
    build: &Sorted<DeviceBuffer>,
    probe_keys: &DeviceBuffer,
    probe_rows: usize,
    width: KeyWidth,
) -> Result<MatchIndices<DeviceBuffer>> {
    check_index_sides::<CudaBackend>(build, probe_keys, probe_rows, width)?;
    search(q, build, probe_keys, probe_rows, width, true)
}

/// The pairs of a sorted search: each tile of probe rows searches the build rows between its
/// first and last sort keys (sorted probe keys), or every build row (`indexed`).
fn search(
    q: &CudaBackend,
    build: &Sorted<DeviceBuffer>,
    probe_keys: &DeviceBuffer,
    probe_rows: usize,
    width: KeyWidth,
    indexed: bool,
) -> Result<MatchIndices<DeviceBuffer>> {
    if build.rows == 0 || probe_rows == 0 {
        return q.no_matches();
    }
    let (count, write) = match width {
        KeyWidth::U32 => ("merge_count_u32", "merge_write_u32"),
        KeyWidth::U64 => ("merge_count_u64", "merge_write_u64"),
    };
    let (r_keys, s_keys) = (build.keys.ptr(), probe_keys.ptr());
    let (r_rows, s_rows, bits) = (build.rows as u64, probe_rows as u64, build.bits);
    let indexed = u32::from(indexed);
    // A block per tile of probe rows; each group of 32 rows of every tile stores its total.
    let grid = blocks(probe_rows, MERGE_TILE);
    let groups = grid * WARPS * MERGE_ITEMS;
    let mut counts = q.alloc(groups * 8)?;
    let counts_ptr = counts.ptr_mut();
    launch!(
        q,
        "merge_join.cu",
        count,
        grid,
        r_keys,
        r_rows,
        s_keys,
        s_rows,
        bits,
        indexed,
        counts_ptr
    );
    let mut offsets = q.alloc((groups + 1) * 8)?;
    exclusive_scan(q, &counts, groups, ScanType::U64, &mut offsets)?;
    let (len, mut r_out, mut s_out) = q.pair_buffers(&offsets, groups)?;
    let (offsets_ptr, r_ptr, s_ptr) = (offsets.ptr(), r_out.ptr_mut(), s_out.ptr_mut());
    launch!(
        q,
        "merge_join.cu",
        write,
        grid,
        r_keys,
        r_rows,
        s_keys,
        s_rows,
        bits,
        indexed,
        offsets_ptr,
        r_ptr,
        s_ptr
    );
    Ok(MatchIndices {
        build: r_out,
        probe: s_out,
        len,
    })
}
