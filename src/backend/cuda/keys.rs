//! Launch wrappers of `kernels/keys.cu`: encodes one key column into fixed-width keys, and
//! hashes checked keys.

use cudarc::driver::DeviceRepr;
use datafusion::common::{Result, internal_err};

use super::CudaBackend;
use super::launch::{blocks, launch};
use crate::backend::{
    KEY_CHECK_WORDS, KeyColumnEncoding, KeyType, KeyWidth, check_hash_checked, check_len,
};
use crate::device::{BLOCK_THREADS, DeviceBuffer, ENCODE_ITEMS};

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
        blocks(rows, BLOCK_THREADS * ENCODE_ITEMS),
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

/// `CheckWords` of `kernels/common.cuh`: one side's words of check bytes, a buffer's address a
/// word (the first `words` used).
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct CheckWords {
    w: [u64; KEY_CHECK_WORDS],
    words: u32,
}

// SAFETY: `CheckWords` is `#[repr(C)]` plain data (u64 addresses and a u32) with the layout of
// the kernels' `CheckWords` (an array of GJ_CHECK_WORDS pointers, GJ_CHECK_WORDS being
// KEY_CHECK_WORDS through KERNEL_CONSTANTS, then a u32), so passing it by value as a kernel
// argument copies exactly what the kernel reads.
unsafe impl DeviceRepr for CheckWords {}

impl CheckWords {
    /// The words `check` (at most [`KEY_CHECK_WORDS`], lengths checked by the caller), each
    /// 16-byte aligned as the kernels read them; none for exact keys.
    pub(crate) fn of(check: &[&DeviceBuffer]) -> Result<Self> {
        let mut words = Self {
            w: [0; KEY_CHECK_WORDS],
            words: 0,
        };
        if check.len() > KEY_CHECK_WORDS {
            return internal_err!("{} words of check bytes", check.len());
        }
        for (slot, buf) in words.w.iter_mut().zip(check) {
            if buf.ptr() % 16 != 0 {
                return internal_err!("check bytes misaligned");
            }
            *slot = buf.ptr();
        }
        words.words = check.len() as u32;
        Ok(words)
    }
}

/// Hashes `rows` checked keys from their check bytes and length classes into `out` (u64 a row).
pub(crate) fn hash_checked(
    q: &CudaBackend,
    check: &[&DeviceBuffer],
    classes: &DeviceBuffer,
    rows: usize,
    mask: u64,
    out: &mut DeviceBuffer,
) -> Result<()> {
    let lens: Vec<usize> = check.iter().map(|c| c.len()).collect();
    check_hash_checked(&lens, classes.len(), rows)?;
    check_len("hash_checked output", out.len(), rows, 8)?;
    let check = CheckWords::of(check)?;
    let (classes, n64, dst) = (classes.ptr(), rows as u64, out.ptr_mut());
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
