//! Descriptions of key encoding shared by both backends: the physical type of a key column,
//! the width of encoded keys, one column's place in a composite key, and the hash of a checked
//! key ([`checked_hash`], which `hash_checked` computes on either backend).

/// The physical type of a key column as the encoder reads it (dates, times, timestamps,
/// durations and decimals are their underlying integers; floats are their bits, with `-0.0`
/// read as `+0.0`). A 16-byte integer ([`I128`](Self::I128)) is read as an `i64` where it fits
/// one; one that does not is outside every range the encoder fits, so it matches nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyType {
    I8,
    I16,
    I32,
    I64,
    U8,
    U16,
    U32,
    U64,
    F16,
    F32,
    F64,
    I128,
}

impl KeyType {
    /// Bytes per value.
    pub fn bytes(self) -> usize {
        match self {
            Self::I8 | Self::U8 => 1,
            Self::I16 | Self::U16 | Self::F16 => 2,
            Self::I32 | Self::U32 | Self::F32 => 4,
            Self::I64 | Self::U64 | Self::F64 => 8,
            Self::I128 => 16,
        }
    }

    /// Whether values are signed integers (compared as such).
    pub fn signed(self) -> bool {
        matches!(
            self,
            Self::I8 | Self::I16 | Self::I32 | Self::I64 | Self::I128
        )
    }

    /// Whether values are floats: read as their bits (unsigned), `-0.0` as `+0.0`, so that two
    /// keys are equal exactly where DataFusion's hash join finds them equal (IEEE 754
    /// totalOrder once `-0.0` is normalized: `-0.0 = 0.0`, a NaN equals a NaN of the same
    /// bits).
    pub fn float(self) -> bool {
        matches!(self, Self::F16 | Self::F32 | Self::F64)
    }
}

/// The bits of a float key of `bytes` bytes as the encoder reads them: `-0.0` (the sign bit
/// alone) as `+0.0`.
pub fn float_key_bits(bits: u64, bytes: usize) -> u64 {
    let sign = 1u64 << (8 * bytes - 1);
    if bits == sign { 0 } else { bits }
}

/// Width of encoded keys.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyWidth {
    U32,
    U64,
}

impl KeyWidth {
    /// Bytes per encoded key.
    pub fn bytes(self) -> usize {
        match self {
            Self::U32 => 4,
            Self::U64 => 8,
        }
    }

    /// The sentinel (all ones) that never matches.
    pub fn sentinel(self) -> u64 {
        match self {
            Self::U32 => u32::MAX as u64,
            Self::U64 => u64::MAX,
        }
    }
}

/// How one key column enters the encoded key: values in `[min, max]` (compared as signed
/// integers if the type is signed) become `(v - min) * stride`; a null becomes
/// `null_digit * stride` where nulls equal nulls (`IS NOT DISTINCT FROM`), else the sentinel,
/// like values outside the range. `min` and `max` are the bits of the value widened to 64
/// bits (sign-extended if signed).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyColumnEncoding {
    pub ty: KeyType,
    pub min: u64,
    pub max: u64,
    pub stride: u64,
    /// The digit nulls take (one past the range's), or `None`: nulls never match.
    pub null_digit: Option<u64>,
}

impl KeyColumnEncoding {
    /// `null_digit` as the kernels take it: all ones for `None`.
    pub fn null_code(&self) -> u64 {
        self.null_digit.unwrap_or(u64::MAX)
    }

    /// Whether the widened value `v` lies in `[min, max]`.
    pub fn in_range(&self, v: u64) -> bool {
        if self.ty.signed() {
            (self.min as i64) <= (v as i64) && (v as i64) <= (self.max as i64)
        } else {
            self.min <= v && v <= self.max
        }
    }
}

/// Low bits of a checked key's hash that hold its length class (see `exec::key_check`): lengths
/// up to 64 bytes, a null key and a longer key.
pub const CLASS_BITS: u32 = 7;

/// The bits of a checked key's hash that hold its length class.
pub const CLASS_MASK: u64 = (1 << CLASS_BITS) - 1;

/// `hash` with its low bits replaced by the length class `class` (below 2^[`CLASS_BITS`]).
pub fn with_class(hash: u64, class: u64) -> u64 {
    (hash & !CLASS_MASK) | class
}

/// The murmur3 64-bit finalizer.
fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xFF51_AFD7_ED55_8CCD);
    h ^= h >> 33;
    h = h.wrapping_mul(0xC4CE_B9FE_1A85_EC53);
    h ^ (h >> 33)
}

/// The hash of a checked key from its check bytes (`words`: 16 bytes each, the key's bytes
/// zero-padded, as little-endian u128) and its length class (below 2^[`CLASS_BITS`]): the class
/// and each word's two halves mixed, the murmur3 finalizer between words and after the last,
/// `mask`ed, and the class in the low bits. Equal for equal keys that fit the words.
/// `kernels/keys.cu` computes the same (`hash_checked`).
pub fn checked_hash(words: &[u128], class: u8, mask: u64) -> u64 {
    let class = u64::from(class) & CLASS_MASK;
    let mut h = class.wrapping_mul(0x1656_67B1_9E37_79F9);
    for (j, &word) in words.iter().enumerate() {
        if j > 0 {
            h = fmix64(h);
        }
        let (lo, hi) = (word as u64, (word >> 64) as u64);
        h ^= lo.wrapping_mul(0x9E37_79B9_7F4A_7C15)
            ^ hi.rotate_left(29).wrapping_mul(0xC2B2_AE3D_27D4_EB4F);
    }
    with_class(fmix64(h) & mask, class)
}
