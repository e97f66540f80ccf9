//! Launch wrappers of `kernels/bucket_probe.cu`: probing a bucketed build side with a chunk of
//! probe keys (count → scan → windowed write), in probe order, for every join type's
//! [`ProbeEmit`].

use std::ops::Range;

use datafusion::common::Result;

use super::CudaBackend;
use super::launch::{blocks, launch};
use super::scan::{ScanType, exclusive_scan};
use crate::backend::{
    Backend, KeyCheck, KeyWidth, Partitioned, ProbeEmit, check_key_check, check_len, check_visited,
    check_window, probe_runs,
};
use crate::device::{DeviceBuffer, WARPS};

/// Checks the arguments; gives the check bytes' pointers (0 for none).
fn checked(
    build: &Partitioned<DeviceBuffer>,
    probe_keys: &DeviceBuffer,
    rows: usize,
    width: KeyWidth,
    check: Option<KeyCheck<'_, DeviceBuffer>>,
) -> Result<(u64, u64)> {
    check_key_check(
        check.map(|c| (c.build.len(), c.probe.len())),
        build.rows,
        rows,
    )?;
    check_len("bucket probe keys", probe_keys.len(), rows, width.bytes())?;
    check_len(
        "bucket build keys",
        build.keys.len(),
        build.rows,
        width.bytes(),
    )?;
    check_len(
        "bucket bounds",
        build.bounds.len(),
        (1usize << build.bits) + 1,
        4,
    )?;
    Ok(check.map_or((0, 0), |c| (c.build.ptr(), c.probe.ptr())))
}

/// Output rows per run of probe rows, scanned: `runs + 1` u64 values.
#[allow(clippy::too_many_arguments)]
pub(crate) fn bucket_count(
    q: &CudaBackend,
    build: &Partitioned<DeviceBuffer>,
    probe_keys: &DeviceBuffer,
    rows: usize,
    width: KeyWidth,
    emit: ProbeEmit,
    check: Option<KeyCheck<'_, DeviceBuffer>>,
    visited: Option<&mut DeviceBuffer>,
) -> Result<DeviceBuffer> {
    let (r_check, s_check) = checked(build, probe_keys, rows, width, check)?;
    check_visited(emit, visited.as_ref().map(|v| v.len()), build.rows)?;
    let (emit, visited) = (emit as u32, visited.map_or(0u64, |v| v.ptr_mut()));
    let runs = probe_runs(rows);
    let mut counts = q.alloc(runs * 8)?;
    let name = match width {
        KeyWidth::U32 => "bucket_count_u32",
        KeyWidth::U64 => "bucket_count_u64",
    };
    let (r_keys, bounds, bits) = (build.keys.ptr(), build.bounds.ptr(), build.bits);
    let (s_keys, n64, counts_ptr) = (probe_keys.ptr(), rows as u64, counts.ptr_mut());
    launch!(
        q,
        "bucket_probe.cu",
        name,
        blocks(runs, WARPS),
        r_keys,
        bounds,
        bits,
        s_keys,
        n64,
        r_check,
        s_check,
        emit,
        visited,
        counts_ptr
    );
    let mut offsets = q.alloc((runs + 1) * 8)?;
    exclusive_scan(q, &counts, runs, ScanType::U64, &mut offsets)?;
    Ok(offsets)
}

/// The counted output rows whose place lies in `window`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn bucket_write(
    q: &CudaBackend,
    build: &Partitioned<DeviceBuffer>,
    probe_keys: &DeviceBuffer,
    rows: usize,
    width: KeyWidth,
    emit: ProbeEmit,
    check: Option<KeyCheck<'_, DeviceBuffer>>,
    offsets: &DeviceBuffer,
    window: Range<u64>,
    build_out: &mut DeviceBuffer,
    probe_out: &mut DeviceBuffer,
) -> Result<()> {
    let (r_check, s_check) = checked(build, probe_keys, rows, width, check)?;
    let runs = probe_runs(rows);
    check_len("bucket offsets", offsets.len(), runs + 1, 8)?;
    check_window(&window, &[build_out.len(), probe_out.len()])?;
    let emit = emit as u32;
    let name = match width {
        KeyWidth::U32 => "bucket_write_u32",
        KeyWidth::U64 => "bucket_write_u64",
    };
    let (r_keys, bounds, bits) = (build.keys.ptr(), build.bounds.ptr(), build.bits);
    let (s_keys, n64, offsets_ptr) = (probe_keys.ptr(), rows as u64, offsets.ptr());
    let (lo, hi) = (window.start, window.end);
    let (r_out, s_out) = (build_out.ptr_mut(), probe_out.ptr_mut());
    launch!(
        q,
        "bucket_probe.cu",
        name,
        blocks(runs, WARPS),
        r_keys,
        bounds,
        bits,
        s_keys,
        n64,
        r_check,
        s_check,
        emit,
        offsets_ptr,
        lo,
        hi,
        r_out,
        s_out
    );
    Ok(())
}
