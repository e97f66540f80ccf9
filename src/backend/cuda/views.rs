//! Launch wrappers of `kernels/views.cu`: a build side's view values gathered on the device,
//! each output window's into a buffer of its own (lengths → scan → copy).

use datafusion::common::Result;

use super::CudaBackend;
use super::launch::{blocks, launch};
use super::scan::{ScanType, exclusive_scan};
use crate::backend::{Backend, ViewData, check_len};
use crate::device::{BLOCK_THREADS, DeviceBuffer};

/// Checks `views` (and its bitmap) for `rows` rows, and `data`'s buffer starts; gives the
/// kernels' arguments for `data` besides its bytes: the starts, how many, the bytes' length.
fn checked(
    views: &DeviceBuffer,
    validity: Option<&DeviceBuffer>,
    rows: usize,
    data: &ViewData<'_, DeviceBuffer>,
) -> Result<(u64, u32, u64)> {
    check_len("views", views.len(), rows, 16)?;
    if let Some(v) = validity {
        check_len("views' validity", v.len(), rows.div_ceil(8), 1)?;
    }
    check_len("view buffer starts", data.starts.len(), data.buffers, 8)?;
    let buffers = u32::try_from(data.buffers).unwrap_or(u32::MAX);
    Ok((data.starts.ptr(), buffers, data.data.len() as u64))
}

/// `rows + 1` u64 offsets of the views' out-of-line bytes, the last their total.
pub(crate) fn view_offsets(
    q: &CudaBackend,
    views: &DeviceBuffer,
    validity: Option<&DeviceBuffer>,
    rows: usize,
    data: ViewData<'_, DeviceBuffer>,
) -> Result<DeviceBuffer> {
    let (starts, buffers, data_len) = checked(views, validity, rows, &data)?;
    let mut lengths = q.alloc(rows.max(1) * 8)?;
    let (v, valid, n64) = (views.ptr(), validity.map_or(0, |b| b.ptr()), rows as u64);
    let (max_copied, l) = (data.max_copied, lengths.ptr_mut());
    launch!(
        q,
        "views.cu",
        "view_lengths",
        blocks(rows, BLOCK_THREADS),
        v,
        valid,
        n64,
        starts,
        buffers,
        data_len,
        max_copied,
        l
    );
    let mut offsets = q.alloc((rows + 1) * 8)?;
    exclusive_scan(q, &lengths, rows, ScanType::U64, &mut offsets)?;
    Ok(offsets)
}

/// Copies the views' out-of-line values into `out` at their offsets and points the views there.
pub(crate) fn view_copy(
    q: &CudaBackend,
    views: &mut DeviceBuffer,
    validity: Option<&DeviceBuffer>,
    rows: usize,
    offsets: &DeviceBuffer,
    data: ViewData<'_, DeviceBuffer>,
    out: &mut DeviceBuffer,
) -> Result<()> {
    let (starts, buffers, data_len) = checked(views, validity, rows, &data)?;
    check_len("view offsets", offsets.len(), rows + 1, 8)?;
    // The total is read back only later, so the caller sizes `out` by a bound; a value past
    // `out` is not copied (its view becomes 0), and the host refuses the window by its total.
    let (v, valid, n64, o) = (
        views.ptr_mut(),
        validity.map_or(0, |b| b.ptr()),
        rows as u64,
        offsets.ptr(),
    );
    let (d, out_len, dst) = (data.data.ptr(), out.len() as u64, out.ptr_mut());
    let max_copied = data.max_copied;
    launch!(
        q,
        "views.cu",
        "view_copy",
        blocks(rows, BLOCK_THREADS),
        v,
        valid,
        n64,
        o,
        d,
        starts,
        buffers,
        data_len,
        max_copied,
        dst,
        out_len
    );
    Ok(())
}
