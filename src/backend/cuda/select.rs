//! Launch wrappers of `kernels/select.cu`: the positions of the rows whose flag byte passes
//! a [`Keep`] test (count → scan → windowed write).

use std::ops::Range;

use datafusion::common::Result;

use super::CudaBackend;
use super::launch::{blocks, launch};
use super::scan::{ScanType, exclusive_scan};
use crate::backend::{Backend, Keep, check_len, check_window, probe_runs};
use crate::device::{DeviceBuffer, WARPS};

/// Rows kept per run of rows, scanned: `runs + 1` u64 values.
pub(crate) fn select_count(
    q: &CudaBackend,
    flags: &DeviceBuffer,
    rows: usize,
    keep: Keep,
) -> Result<DeviceBuffer> {
    check_len("select flags", flags.len(), rows, 1)?;
    let runs = probe_runs(rows);
    let mut counts = q.alloc(runs * 8)?;
    let (f, n64, keep, c) = (flags.ptr(), rows as u64, keep as u32, counts.ptr_mut());
    launch!(
        q,
        "select.cu",
        "select_count",
        blocks(runs, WARPS),
        f,
        n64,
        keep,
        c
    );
    let mut offsets = q.alloc((runs + 1) * 8)?;
    exclusive_scan(q, &counts, runs, ScanType::U64, &mut offsets)?;
    Ok(offsets)
}

/// The positions of the kept rows whose place lies in `window`.
pub(crate) fn select_write(
    q: &CudaBackend,
    flags: &DeviceBuffer,
    rows: usize,
    keep: Keep,
    offsets: &DeviceBuffer,
    window: Range<u64>,
    out: &mut DeviceBuffer,
) -> Result<()> {
    check_len("select flags", flags.len(), rows, 1)?;
    let runs = probe_runs(rows);
    check_len("select offsets", offsets.len(), runs + 1, 8)?;
    check_window(&window, &[out.len()])?;
    let (f, n64, keep, o) = (flags.ptr(), rows as u64, keep as u32, offsets.ptr());
    let (lo, hi, out) = (window.start, window.end, out.ptr_mut());
    launch!(
        q,
        "select.cu",
        "select_write",
        blocks(runs, WARPS),
        f,
        n64,
        keep,
        o,
        lo,
        hi,
        out
    );
    Ok(())
}
