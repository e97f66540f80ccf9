//! Launch wrappers of `kernels/hash_join.cu`: match finding of the partitioned hash join
//! (count → scan → write) between two relations partitioned with the same bits.

use datafusion::common::Result;

use super::CudaBackend;
use super::launch::{blocks, launch};
use super::scan::{ScanType, exclusive_scan};
use crate::backend::{Backend, KeyWidth, MatchIndices, Partitioned, check_sides};
use crate::device::{BLOCK_THREADS, DeviceBuffer, WARPS};

/// All pairs of equal keys of `build` and `probe`, as positions in each.
pub(crate) fn hash_join(
    q: &CudaBackend,
    build: &Partitioned<DeviceBuffer>,
    probe: &Partitioned<DeviceBuffer>,
    width: KeyWidth,
) -> Result<MatchIndices<DeviceBuffer>> {
    check_sides::<CudaBackend>(build, probe)?;
    if build.rows == 0 || probe.rows == 0 {
        return q.no_matches();
    }
    let parts = 1u32 << build.bits;
    let (count, write) = match width {
        KeyWidth::U32 => ("join_count_u32", "join_write_u32"),
        KeyWidth::U64 => ("join_count_u64", "join_write_u64"),
    };
    let (r_keys, s_keys) = (build.keys.ptr(), probe.keys.ptr());
    let (r_bounds, s_bounds) = (build.bounds.ptr(), probe.bounds.ptr());
    let (r_segs, s_segs) = (build.segments as u32, probe.segments as u32);
    // Tasks: per partition, build chunks x probe tiles; block b runs task b.
    let mut tasks = q.alloc(parts as usize * 4)?;
    let tasks_ptr = tasks.ptr_mut();
    launch!(
        q,
        "hash_join.cu",
        "join_task_counts",
        blocks(parts as usize, BLOCK_THREADS),
        r_bounds,
        r_segs,
        s_bounds,
        s_segs,
        parts,
        tasks_ptr
    );
    let mut task_offsets = q.alloc((parts as usize + 1) * 4)?;
    exclusive_scan(q, &tasks, parts as usize, ScanType::U32, &mut task_offsets)?;
    let task_count = q.read_scalar(&task_offsets, parts as usize * 4, 4)? as usize;
    if task_count == 0 {
        return q.no_matches();
    }
    let task_ptr = task_offsets.ptr();
    // Count: matches per warp of each task.
    let mut counts = q.alloc(task_count * WARPS * 8)?;
    let counts_ptr = counts.ptr_mut();
    launch!(
        q,
        "hash_join.cu",
        count,
        task_count,
        r_keys,
        s_keys,
        task_ptr,
        parts,
        r_bounds,
        r_segs,
        s_bounds,
        s_segs,
        counts_ptr
    );
    // Scan: where each warp writes.
    let mut offsets = q.alloc((task_count * WARPS + 1) * 8)?;
    exclusive_scan(q, &counts, task_count * WARPS, ScanType::U64, &mut offsets)?;
    let (len, mut r_out, mut s_out) = q.pair_buffers(&offsets, task_count * WARPS)?;
    // Write: the pairs, at exactly the counted positions.
    let (offsets_ptr, r_ptr, s_ptr) = (offsets.ptr(), r_out.ptr_mut(), s_out.ptr_mut());
    launch!(
        q,
        "hash_join.cu",
        write,
        task_count,
        r_keys,
        s_keys,
        task_ptr,
        parts,
        r_bounds,
        r_segs,
        s_bounds,
        s_segs,
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
