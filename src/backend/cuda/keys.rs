//! Launch wrappers of `kernels/keys.cu`: encodes one key column into fixed-width keys, and
//! hashes checked keys.

use datafusion::common::Result;

use super::CudaBackend;
use super::launch::{blocks, launch};
use crate::backend::{KeyColumnEncoding, KeyType, KeyWidth, check_hash_checked, check_len};
use crate::device::{BLOCK_THREADS, DeviceBuffer};

/// The kernel for a key column type and key width.
fn kernel(ty: KeyType, width: KeyWidth) -> &'static str {
    use KeyType as T;
    use KeyWidth as W;
    match (ty, width) {
        (T::I8, W::U32) => "encode_keys_i8_u32",
        (T::I8, W::U64) => "encode_keys_i8_u64",
        (T::I16, W::U32) => "encode_keys_i16_u32",
        (T::I16, W::U64) => "encode_keys_i16_u64",
        (T::I32, W::U32) => "encode_keys_i32_u32",
        (T::I32, W::U64) => "encode_keys_i32_u64",
        (T::I64, W::U32) => "encode_keys_i64_u32",
        (T::I64, W::U64) => "encode_keys_i64_u64",
        (T::U8, W::U32) => "encode_keys_u8_u32",
        (T::U8, W::U64) => "encode_keys_u8_u64",
        (T::U16, W::U32) => "encode_keys_u16_u32",
        (T::U16, W::U64) => "encode_keys_u16_u64",
        (T::U32, W::U32) => "encode_keys_u32_u32",
        (T::U32, W::U64) => "encode_keys_u32_u64",
        (T::U64, W::U32) => "encode_keys_u64_u32",
        (T::U64, W::U64) => "encode_keys_u64_u64",
        (T::F16, W::U32) => "encode_keys_f16_u32",
        (T::F16, W::U64) => "encode_keys_f16_u64",
        (T::F32, W::U32) => "encode_keys_f32_u32",
        (T::F32, W::U64) => "encode_keys_f32_u64",
        (T::F64, W::U32) => "encode_keys_f64_u32",
        (T::F64, W::U64) => "encode_keys_f64_u64",
        (T::I128, W::U32) => "encode_keys_i128_u32",
        (T::I128, W::U64) => "encode_keys_i128_u64",
    }
}

/// Encodes `rows` values of `enc.ty` into `out` (`first`: `out` starts the key; otherwise the
/// column is added to the partial keys already in `out`).
#[allow(clippy::too_many_arguments)]
pub(crate) fn encode_keys(
    q: &CudaBackend,
    values: &DeviceBuffer,
    validity: Option<&DeviceBuffer>,
    rows: usize,
    enc: &KeyColumnEncoding,
    width: KeyWidth,
    first: bool,
    out: &mut DeviceBuffer,
) -> Result<()> {
    check_len("encode_keys values", values.len(), rows, enc.ty.bytes())?;
    if let Some(v) = validity {
        check_len("encode_keys validity", v.len(), rows, 1)?;
    }
    check_len("encode_keys output", out.len(), rows, width.bytes())?;
    let (src, valid) = (values.ptr(), validity.map_or(0, |v| v.ptr()));
    let (n64, first) = (rows as u64, i32::from(first));
    let (min, max, stride, null_code) = (enc.min, enc.max, enc.stride, enc.null_code());
    let dst = out.ptr_mut();
    launch!(
        q,
        "keys.cu",
        kernel(enc.ty, width),
        blocks(rows, BLOCK_THREADS),
        src,
        valid,
        n64,
        min,
        max,
        stride,
        null_code,
        first,
        dst
    );
    Ok(())
}

/// Hashes `rows` checked keys from their check bytes and length classes into `out` (u64 a row).
pub(crate) fn hash_checked(
    q: &CudaBackend,
    check: &DeviceBuffer,
    classes: &DeviceBuffer,
    rows: usize,
    mask: u64,
    out: &mut DeviceBuffer,
) -> Result<()> {
    check_hash_checked(check.len(), classes.len(), rows)?;
    check_len("hash_checked output", out.len(), rows, 8)?;
    let (check, classes, n64, dst) = (check.ptr(), classes.ptr(), rows as u64, out.ptr_mut());
    launch!(
        q,
        "keys.cu",
        "hash_checked",
        blocks(rows, BLOCK_THREADS),
        check,
        classes,
        n64,
        mask,
        dst
    );
    Ok(())
}
