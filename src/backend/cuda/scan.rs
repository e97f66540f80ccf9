//! Launch wrappers of `kernels/scan.cu`: device-wide exclusive prefix sums of u32 or u64 values,
//! and reading one value (a scan's total) back to the host.

use datafusion::common::Result;

use super::CudaBackend;
use super::launch::{blocks, launch};
use crate::backend::{Backend, check_len};
use crate::device::{self, BLOCK_THREADS, DeviceBuffer, HostBlock, SCAN_ITEMS};

/// Items one block of the scan kernels covers.
const SCAN_TILE: usize = BLOCK_THREADS * SCAN_ITEMS;

/// The element type of a scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ScanType {
    U32,
    U64,
}

impl ScanType {
    fn bytes(self) -> usize {
        match self {
            Self::U32 => 4,
            Self::U64 => 8,
        }
    }

    fn reduce(self) -> &'static str {
        match self {
            Self::U32 => "scan_reduce_u32",
            Self::U64 => "scan_reduce_u64",
        }
    }

    fn tiles(self) -> &'static str {
        match self {
            Self::U32 => "scan_tiles_u32",
            Self::U64 => "scan_tiles_u64",
        }
    }
}

/// Enqueues `dst[0..8]` = u64 element `index` of `src`: a kernel stores it into `dst` directly
/// when `dst` is pinned memory of this device (a copy on this queue would wait behind the
/// download queue's copies on the device-to-host copy engine), else a copy.
pub(crate) fn read_u64(
    q: &CudaBackend,
    src: &DeviceBuffer,
    index: usize,
    dst: &mut HostBlock,
) -> Result<()> {
    check_len("read_u64 source", src.len(), index + 1, 8)?;
    let Some(to) = device::mapped_address(q.stream(), dst, 0, 8)? else {
        return device::device_to_host(q.stream(), src, index * 8, dst, 0, 8);
    };
    let from = src.ptr() + index as u64 * 8;
    launch!(q, "scan.cu", "store_u64", 1, from, to);
    device::fence_after(q.stream(), dst)
}

/// `out[i]` = sum of `values[..i]` for `i` in `0..=n` (so `out[n]` is the total).
pub(crate) fn exclusive_scan(
    q: &CudaBackend,
    values: &DeviceBuffer,
    n: usize,
    ty: ScanType,
    out: &mut DeviceBuffer,
) -> Result<()> {
    let w = ty.bytes();
    check_len("scan input", values.len(), n, w)?;
    check_len("scan output", out.len(), n + 1, w)?;
    let n64 = n as u64;
    let input = values.ptr();
    let output = out.ptr_mut();
    if n == 0 {
        return crate::device::zero(q.stream(), out);
    }
    let tiles = blocks(n, SCAN_TILE);
    if tiles == 1 {
        let no_carry = 0u64;
        launch!(q, "scan.cu", ty.tiles(), 1, input, n64, no_carry, output);
        return Ok(());
    }
    // Phase 1: per-tile sums; phase 2: their scan (recursively); phase 3: tiles with carries.
    let mut sums = q.alloc(tiles * w)?;
    let sums_ptr = sums.ptr_mut();
    launch!(q, "scan.cu", ty.reduce(), tiles, input, n64, sums_ptr);
    let mut carry = q.alloc((tiles + 1) * w)?;
    exclusive_scan(q, &sums, tiles, ty, &mut carry)?;
    let carry_ptr = carry.ptr();
    launch!(
        q,
        "scan.cu",
        ty.tiles(),
        tiles,
        input,
        n64,
        carry_ptr,
        output
    );
    Ok(())
}
