//! Host twin of `kernels/keys.cu` and of the hash functions of `kernels/common.cuh`.

use std::hash::Hash;

use arrow::datatypes::ArrowNativeType;

use super::{typed, typed_mut};
use crate::backend::{
    KEY_CHECK_BYTES, KeyColumnEncoding, KeyType, PARTITION_MUL_U32, PARTITION_MUL_U64,
    checked_hash, float_key_bits,
};

/// An encoded key type (u32 or u64) with the hash functions of `kernels/common.cuh`.
pub(crate) trait EncodedKey: ArrowNativeType + Eq + Hash {
    const SENTINEL: Self;
    /// The top `bits` bits (0 to 32) of the multiplicative partition hash.
    fn partition_of(self, bits: u32) -> u32;
    /// The key's route: the top `bits` bits (0 to 8) of `slot_hash` (murmur3's finalizer).
    fn route_of(self, bits: u32) -> u32;
}

impl EncodedKey for u32 {
    const SENTINEL: Self = u32::MAX;
    fn partition_of(self, bits: u32) -> u32 {
        if bits == 0 {
            0
        } else {
            ((self.wrapping_mul(PARTITION_MUL_U32) as u64) >> (32 - bits)) as u32
        }
    }

    fn route_of(self, bits: u32) -> u32 {
        if bits == 0 {
            return 0;
        }
        let mut k = self;
        k ^= k >> 16;
        k = k.wrapping_mul(0x85EB_CA6B);
        k ^= k >> 13;
        k = k.wrapping_mul(0xC2B2_AE35);
        k ^= k >> 16;
        k >> (32 - bits)
    }
}

impl EncodedKey for u64 {
    const SENTINEL: Self = u64::MAX;
    fn partition_of(self, bits: u32) -> u32 {
        if bits == 0 {
            0
        } else {
            (self.wrapping_mul(PARTITION_MUL_U64) >> (64 - bits)) as u32
        }
    }

    fn route_of(self, bits: u32) -> u32 {
        if bits == 0 {
            return 0;
        }
        let mut k = self;
        k ^= k >> 33;
        k = k.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
        k ^= k >> 33;
        k = k.wrapping_mul(0xC4CE_B9FE_1A85_EC53);
        k ^= k >> 33;
        (k as u32) >> (32 - bits)
    }
}

/// The first `rows` values of a key column, widened to 64 bits (sign-extended if signed; a
/// float's bits, `-0.0` as `+0.0`), `None` where a 16-byte integer does not fit an `i64` (its
/// high word is not its low word's sign extension): outside every range.
fn widened(values: &[u8], ty: KeyType, rows: usize) -> Vec<Option<u64>> {
    fn each<T: ArrowNativeType>(
        values: &[u8],
        rows: usize,
        f: impl Fn(T) -> u64,
    ) -> Vec<Option<u64>> {
        typed::<T>(values, rows)
            .iter()
            .map(|&v| Some(f(v)))
            .collect()
    }
    let float = |v: u64| float_key_bits(v, ty.bytes());
    match ty {
        KeyType::I8 => each::<i8>(values, rows, |v| v as i64 as u64),
        KeyType::I16 => each::<i16>(values, rows, |v| v as i64 as u64),
        KeyType::I32 => each::<i32>(values, rows, |v| v as i64 as u64),
        KeyType::I64 => each::<i64>(values, rows, |v| v as u64),
        KeyType::U8 => each::<u8>(values, rows, u64::from),
        KeyType::U16 => each::<u16>(values, rows, u64::from),
        KeyType::U32 => each::<u32>(values, rows, u64::from),
        KeyType::U64 => each::<u64>(values, rows, |v| v),
        KeyType::F16 => each::<u16>(values, rows, |v| float(v.into())),
        KeyType::F32 => each::<u32>(values, rows, |v| float(v.into())),
        KeyType::F64 => each::<u64>(values, rows, float),
        KeyType::I128 => typed::<i128>(values, rows)
            .iter()
            .map(|&v| i64::try_from(v).ok().map(|v| v as u64))
            .collect(),
    }
}

/// Encodes one key column into `out` (keys of type `K`); `first`: `out` starts the key.
pub(crate) fn encode<K: EncodedKey>(
    values: &[u8],
    validity: Option<&[u8]>,
    rows: usize,
    enc: &KeyColumnEncoding,
    first: bool,
    out: &mut [u8],
) {
    let values = widened(values, enc.ty, rows);
    let out_keys = typed_mut::<K>(out, rows);
    for (i, (o, &v)) in out_keys.iter_mut().zip(&values).enumerate() {
        let valid = validity.is_none_or(|b| b[i] != 0);
        let prev = if first { K::usize_as(0) } else { *o };
        let digit = match (valid, enc.null_digit) {
            (true, _) if v.is_some_and(|v| enc.in_range(v)) => v.map(|v| v.wrapping_sub(enc.min)),
            (false, Some(null)) => Some(null),
            _ => None,
        };
        *o = if prev == K::SENTINEL {
            K::SENTINEL
        } else if let Some(digit) = digit {
            let d = digit.wrapping_mul(enc.stride);
            // Truncation as in the kernel's `(K)(d * stride)`; the encoder guarantees it fits.
            let add = K::usize_as(d as usize);
            K::usize_as(prev.as_usize().wrapping_add(add.as_usize()))
        } else {
            K::SENTINEL
        };
    }
}

/// The hashes of checked keys (`out`: u64 a row, as many rows as fit) from their check bytes
/// (a slice of 16 bytes a row per word) and length classes, as `hash_checked` in
/// `kernels/keys.cu`.
pub(crate) fn hash_checked(check: &[&[u8]], classes: &[u8], mask: u64, out: &mut [u8]) {
    let words: Vec<&[[u8; KEY_CHECK_BYTES]]> = check.iter().map(|w| w.as_chunks().0).collect();
    let (out, _) = out.as_chunks_mut::<8>();
    let mut row = Vec::with_capacity(words.len());
    for (i, (o, &class)) in out.iter_mut().zip(classes).enumerate() {
        row.clear();
        row.extend(
            words
                .iter()
                .map(|w| w.get(i).map_or(0, |b| u128::from_le_bytes(*b))),
        );
        *o = checked_hash(&row, class, mask).to_le_bytes();
    }
}
