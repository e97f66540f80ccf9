//! Launch wrappers of `kernels/columns.cu`: gathers of fixed-width values (a column, or several
//! by one list of positions), the validity of a side that may be missing, validity bitmaps to
//! bytes and back, and packed values widened.

use datafusion::common::{Result, internal_err};

use super::CudaBackend;
use super::launch::{blocks, launch};
use super::planes::Planes;
use crate::backend::check_len;
use crate::columns::Frame;
use crate::device::{BLOCK_THREADS, DeviceBuffer, GATHER_ITEMS};

/// `out[i] = src[idx[i]]` for `rows` values of `width` bytes (zeros where `idx[i]` is
/// `NO_ROW`).
pub(crate) fn gather(
    q: &CudaBackend,
    src: &DeviceBuffer,
    idx: &DeviceBuffer,
    rows: usize,
    width: usize,
    out: &mut DeviceBuffer,
) -> Result<()> {
    let name = match width {
        1 => "gather_w1",
        2 => "gather_w2",
        4 => "gather_w4",
        8 => "gather_w8",
        16 => "gather_w16",
        _ => return internal_err!("gather: cannot move {width}-byte values"),
    };
    check_len("gather idx", idx.len(), rows, 4)?;
    check_len("gather output", out.len(), rows, width)?;
    let (s, i, n64, o) = (src.ptr(), idx.ptr(), rows as u64, out.ptr_mut());
    launch!(
        q,
        "columns.cu",
        name,
        blocks(rows, BLOCK_THREADS * GATHER_ITEMS),
        s,
        i,
        n64,
        o
    );
    Ok(())
}

/// [`gather`] of every plane of `planes` (buffers with their bytes a value: 1, 2, 4, 8 or 16)
/// into the buffer of `out` at its place, reading `idx` once a launch of at most
/// [`MAX_PLANES`](crate::device::MAX_PLANES) planes.
pub(crate) fn gather_planes(
    q: &CudaBackend,
    planes: &[(&DeviceBuffer, usize)],
    idx: &DeviceBuffer,
    rows: usize,
    out: &mut [DeviceBuffer],
) -> Result<()> {
    if planes.len() != out.len() {
        return internal_err!(
            "gather_planes: {} planes into {} outputs",
            planes.len(),
            out.len()
        );
    }
    check_len("gather idx", idx.len(), rows, 4)?;
    for (&(_, width), o) in planes.iter().zip(out.iter()) {
        if !matches!(width, 1 | 2 | 4 | 8 | 16) {
            return internal_err!("gather: cannot move {width}-byte values");
        }
        check_len("gather output", o.len(), rows, width)?;
    }
    if planes.is_empty() || rows == 0 {
        return Ok(());
    }
    let (i, n64) = (idx.ptr(), rows as u64);
    for arg in Planes::groups(planes, out) {
        launch!(
            q,
            "columns.cu",
            "gather_planes",
            blocks(rows, BLOCK_THREADS * GATHER_ITEMS),
            arg,
            i,
            n64
        );
    }
    Ok(())
}

/// `out[i] = i` for `rows` u32 values.
pub(crate) fn row_positions(q: &CudaBackend, rows: usize, out: &mut DeviceBuffer) -> Result<()> {
    check_len("row positions", out.len(), rows, 4)?;
    let (n64, o) = (rows as u64, out.ptr_mut());
    launch!(
        q,
        "columns.cu",
        "row_positions",
        blocks(rows, BLOCK_THREADS),
        n64,
        o
    );
    Ok(())
}

/// `out[i] = idx[i] != NO_ROW` for `rows` positions.
pub(crate) fn present(
    q: &CudaBackend,
    idx: &DeviceBuffer,
    rows: usize,
    out: &mut DeviceBuffer,
) -> Result<()> {
    check_len("present idx", idx.len(), rows, 4)?;
    check_len("present output", out.len(), rows, 1)?;
    let (i, n64, o) = (idx.ptr(), rows as u64, out.ptr_mut());
    launch!(
        q,
        "columns.cu",
        "present",
        blocks(rows, BLOCK_THREADS),
        i,
        n64,
        o
    );
    Ok(())
}

/// One byte (0 or 1) per bit of an LSB-first bitmap of `rows` bits.
pub(crate) fn unpack_bits(
    q: &CudaBackend,
    bits: &DeviceBuffer,
    rows: usize,
    out: &mut DeviceBuffer,
) -> Result<()> {
    check_len("unpack_bits", bits.len(), rows.div_ceil(8), 1)?;
    check_len("unpack_bits output", out.len(), rows, 1)?;
    let (b, n64, o) = (bits.ptr(), rows as u64, out.ptr_mut());
    launch!(
        q,
        "columns.cu",
        "unpack_bits",
        blocks(rows, BLOCK_THREADS),
        b,
        n64,
        o
    );
    Ok(())
}

/// An LSB-first bitmap (whole u32 words) of `rows` bytes.
pub(crate) fn pack_bits(
    q: &CudaBackend,
    bytes: &DeviceBuffer,
    rows: usize,
    out: &mut DeviceBuffer,
) -> Result<()> {
    check_len("pack_bits", bytes.len(), rows, 1)?;
    check_len("pack_bits output", out.len(), rows.div_ceil(32), 4)?;
    let (b, n64, o) = (bytes.ptr(), rows as u64, out.ptr_mut());
    launch!(
        q,
        "columns.cu",
        "pack_bits",
        blocks(rows, BLOCK_THREADS),
        b,
        n64,
        o
    );
    Ok(())
}

/// `rows` values of `width` bytes, each the frame's base plus an offset of `frame.width` bytes
/// of `packed`.
pub(crate) fn unframe(
    q: &CudaBackend,
    packed: &DeviceBuffer,
    rows: usize,
    width: usize,
    frame: &Frame,
    out: &mut DeviceBuffer,
) -> Result<()> {
    let name = match (width, frame.width) {
        (2, 1) => "unframe_w2_p1",
        (4, 1) => "unframe_w4_p1",
        (4, 2) => "unframe_w4_p2",
        (8, 1) => "unframe_w8_p1",
        (8, 2) => "unframe_w8_p2",
        (8, 4) => "unframe_w8_p4",
        (16, 1) => "unframe_w16_p1",
        (16, 2) => "unframe_w16_p2",
        (16, 4) => "unframe_w16_p4",
        (16, 8) => "unframe_w16_p8",
        (w, p) => return internal_err!("unframe: {p}-byte offsets into {w}-byte values"),
    };
    check_len("unframe", packed.len(), rows, frame.width)?;
    check_len("unframe output", out.len(), rows, width)?;
    let (lo, hi) = frame.base_words();
    let (p, n64, o) = (packed.ptr(), rows as u64, out.ptr_mut());
    launch!(
        q,
        "columns.cu",
        name,
        blocks(rows, BLOCK_THREADS),
        p,
        n64,
        lo,
        hi,
        o
    );
    Ok(())
}
