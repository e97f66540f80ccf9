//! Frame-of-reference packing of staged columns: fewer bytes over PCIe.
//!
//! Where every value of a staged integer column (integers, dates, times, timestamps, durations,
//! decimals, year-month intervals) lies within a narrow range, the block holds each value as
//! its offset from the range's minimum in 1, 2, 4 or 8 bytes — the fewest that hold the range,
//! and fewer than the value's own width — and the device adds the minimum back after the copy
//! ([`Backend::unframe`](crate::backend::Backend::unframe)), before anything reads the column.
//! The widths are whole bytes so that packing on the host is a copy that narrows each value, as
//! fast as the plain copy it replaces; bit-level packing would cost the host, which bounds the
//! engine's throughput, more than PCIe gains (reasoned, not measured).
//!
//! The range is taken over every slot, null or not, so that each slot comes back with the bits
//! it had. A scan ([`span_of`]) stops early where the range already exceeds what half the width
//! can hold (no packing would pay), so columns that do not pack cost little. Packing
//! ([`pack_values`]) checks every offset as it writes it, so a frame fitted to other values
//! (earlier rows: [`Frame::around`]) is safe: a value outside it is refused, never mangled.
//!
//! ```text
//!  Int64 values  1000, 1003, 1001, null(0)  ──►  range 0..=1003: 2 bytes, base 0
//!  Int64 values  1000, 1003, 1001           ──►  base 1000, 1 byte: 0, 3, 1
//!  device:       1000 + offset, as 8-byte values again
//! ```

use arrow::array::{Array, ArrayRef};
use arrow::datatypes::{DataType, IntervalUnit};

use super::fixed::{ColumnKind, value_bytes};

/// A column staged as offsets from `base` of `width` bytes each.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Frame {
    /// The smallest value, as a signed or unsigned integer of the column's width (its low
    /// bits are what the device adds back, wrapping).
    pub base: i128,
    /// Bytes of each offset: 1, 2, 4 or 8, less than the column's width.
    pub width: usize,
}

impl Frame {
    /// The frame that packs values within `span` of a `width`-byte column into the fewest
    /// bytes, if that is fewer than `width`.
    pub fn fit(span: ValueSpan, width: usize) -> Option<Self> {
        let ValueSpan::Within { min, max } = span else {
            return None;
        };
        let range = max.checked_sub(min)?;
        [1usize, 2, 4, 8]
            .into_iter()
            .take_while(|&w| w < width)
            .find(|&w| range < 1i128 << (8 * w))
            .map(|w| Self {
                base: min,
                width: w,
            })
    }

    /// The frame for values expected near `span` (those staged before): [`fit`](Self::fit), with
    /// its base lowered by half the room the width leaves, so that values a little below or
    /// above the span still fit.
    pub fn around(span: ValueSpan, width: usize) -> Option<Self> {
        let frame = Self::fit(span, width)?;
        let ValueSpan::Within { min, max } = span else {
            return None;
        };
        let room = (1i128 << (8 * frame.width)) - 1 - (max - min);
        Some(Self {
            base: min.checked_sub(room / 2).unwrap_or(min),
            ..frame
        })
    }

    /// The base's low and high 64 bits, as the device adds them.
    pub fn base_words(&self) -> (u64, u64) {
        (self.base as u64, (self.base >> 64) as u64)
    }
}

/// The values of some rows of a column, as far as packing cares.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ValueSpan {
    /// No rows.
    Empty,
    /// Every value within `min..=max` (read as the column's type reads them).
    Within { min: i128, max: i128 },
    /// Too wide to pack, or a column that is never packed.
    Wide,
}

impl ValueSpan {
    /// The span of both.
    pub fn union(self, other: ValueSpan) -> ValueSpan {
        match (self, other) {
            (ValueSpan::Empty, s) | (s, ValueSpan::Empty) => s,
            (ValueSpan::Within { min: a, max: b }, ValueSpan::Within { min: c, max: d }) => {
                ValueSpan::Within {
                    min: a.min(c),
                    max: b.max(d),
                }
            }
            _ => ValueSpan::Wide,
        }
    }
}

/// Whether columns of `dt` are packed, and if so whether their values are read as signed.
fn packed_as(dt: &DataType) -> Option<bool> {
    use DataType::*;
    match dt {
        Int16
        | Int32
        | Int64
        | Date32
        | Date64
        | Time32(_)
        | Time64(_)
        | Timestamp(_, _)
        | Duration(_)
        | Decimal32(_, _)
        | Decimal64(_, _)
        | Decimal128(_, _)
        | Interval(IntervalUnit::YearMonth) => Some(true),
        UInt16 | UInt32 | UInt64 => Some(false),
        _ => None,
    }
}

/// Values scanned between checks of whether the span is already too wide.
const SCAN_STEP: usize = 1024;

/// Min and max of the little-endian `$t` values of `$bytes`, [`SCAN_STEP`] values at a time
/// (each step folded in `$t`, which the compiler vectorizes), `Wide` once they span `$limit`
/// or more.
macro_rules! scan {
    ($bytes:expr, $limit:expr, $t:ty) => {{
        const W: usize = std::mem::size_of::<$t>();
        let (mut min, mut max) = (i128::MAX, i128::MIN);
        let mut span = ValueSpan::Empty;
        for step in $bytes.chunks(SCAN_STEP * W) {
            let (lo, hi) = step
                .chunks_exact(W)
                .map(|b| <$t>::from_le_bytes(b.try_into().unwrap_or([0; W])))
                .fold((<$t>::MAX, <$t>::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
            min = min.min(lo as i128);
            max = max.max(hi as i128);
            span = match max.checked_sub(min) {
                Some(range) if range < $limit => ValueSpan::Within { min, max },
                _ => return ValueSpan::Wide,
            };
        }
        span
    }};
}

/// The span of every slot of `array` (nulls included), `Wide` for a type that is not packed
/// or as soon as the values span more than half the width could hold.
pub fn span_of(array: &ArrayRef) -> ValueSpan {
    let Some(signed) = packed_as(array.data_type()) else {
        return ValueSpan::Wide;
    };
    let Some(ColumnKind::Fixed(width)) = ColumnKind::of(array.data_type()) else {
        return ValueSpan::Wide;
    };
    if array.is_empty() {
        return ValueSpan::Empty;
    }
    let data = array.to_data();
    let bytes = value_bytes(&data, width);
    // The widest range that can still pack: half the width.
    let limit = 1i128 << (4 * width).min(64);
    match (width, signed) {
        (2, true) => scan!(bytes, limit, i16),
        (2, false) => scan!(bytes, limit, u16),
        (4, true) => scan!(bytes, limit, i32),
        (4, false) => scan!(bytes, limit, u32),
        (8, true) => scan!(bytes, limit, i64),
        (8, false) => scan!(bytes, limit, u64),
        (16, _) => scan!(bytes, limit, i128),
        _ => ValueSpan::Wide,
    }
}

/// Writes `$n`-byte offsets from `$base` (an `i128`) of the little-endian `$t` values of `$src`
/// into `$dst`, wrapping at the width of `$t`; evaluates to whether every offset fits `$n`
/// bytes (their bits OR-ed, which the compiler vectorizes, where a min and max would not be).
macro_rules! pack {
    ($src:expr, $dst:expr, $base:expr, $t:ty, $n:literal) => {{
        const W: usize = std::mem::size_of::<$t>();
        let base = $base as $t;
        let mut bits: $t = 0;
        for (v, d) in $src.chunks_exact(W).zip($dst.chunks_exact_mut($n)) {
            let offset = <$t>::from_le_bytes(v.try_into().unwrap_or([0; W])).wrapping_sub(base);
            bits |= offset;
            d.copy_from_slice(&offset.to_le_bytes()[..$n]);
        }
        (bits as u128) >> (8 * $n) == 0
    }};
}

/// Writes the values of `array`, a column of `width`-byte values, into `dst` as offsets from
/// `frame`'s base of `frame.width` bytes each; returns whether every value lies within the
/// frame (where one does not, what `dst` holds is not meaningful), `false` for widths it does
/// not pack. Offsets are taken modulo the values' width, as the device adds them back, so a
/// value is packed exactly wherever its offset fits.
pub fn pack_values(array: &ArrayRef, width: usize, frame: &Frame, dst: &mut [u8]) -> bool {
    let data = array.to_data();
    let src = value_bytes(&data, width);
    let dst = &mut dst[..array.len() * frame.width];
    match (width, frame.width) {
        (2, 1) => pack!(src, dst, frame.base, u16, 1),
        (4, 1) => pack!(src, dst, frame.base, u32, 1),
        (4, 2) => pack!(src, dst, frame.base, u32, 2),
        (8, 1) => pack!(src, dst, frame.base, u64, 1),
        (8, 2) => pack!(src, dst, frame.base, u64, 2),
        (8, 4) => pack!(src, dst, frame.base, u64, 4),
        (16, 1) => pack!(src, dst, frame.base, u128, 1),
        (16, 2) => pack!(src, dst, frame.base, u128, 2),
        (16, 4) => pack!(src, dst, frame.base, u128, 4),
        (16, 8) => pack!(src, dst, frame.base, u128, 8),
        _ => false,
    }
}

/// The value the `frame.width`-byte offset `packed` stands for, as `width` bytes.
fn unpack_one(packed: &[u8], width: usize, frame: &Frame, out: &mut [u8]) {
    let mut offset = [0u8; 16];
    offset[..frame.width].copy_from_slice(&packed[..frame.width]);
    let v = (frame.base as u128).wrapping_add(u128::from_le_bytes(offset));
    out[..width].copy_from_slice(&v.to_le_bytes()[..width]);
}

/// The values of `rows` offsets of `frame.width` bytes, each added to the frame's base, as
/// `width`-byte values: what packing wrote them from (the host twin of the device's unpacking).
pub fn unpack_values(packed: &[u8], rows: usize, width: usize, frame: &Frame, out: &mut [u8]) {
    for (p, o) in packed[..rows * frame.width]
        .chunks_exact(frame.width)
        .zip(out[..rows * width].chunks_exact_mut(width))
    {
        unpack_one(p, width, frame, o);
    }
}

/// Widens `rows` offsets packed in `frame` at the start of `bytes` into `width`-byte values in
/// the same place, last row first (row i's value overlaps only offsets of rows at or after it,
/// each read before it is overwritten).
pub fn widen_in_place(bytes: &mut [u8], rows: usize, width: usize, frame: &Frame) {
    let p = frame.width;
    let mut value = [0u8; 16];
    for i in (0..rows).rev() {
        unpack_one(&bytes[i * p..(i + 1) * p], width, frame, &mut value);
        bytes[i * width..(i + 1) * width].copy_from_slice(&value[..width]);
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Decimal128Array, Int16Array, Int32Array, Int64Array, UInt32Array};

    use super::*;

    fn round_trip(array: ArrayRef, width: usize) -> Option<Frame> {
        let frame = Frame::fit(span_of(&array), width)?;
        let mut packed = vec![0u8; array.len() * frame.width];
        assert!(pack_values(&array, width, &frame, &mut packed));
        let mut out = vec![0u8; array.len() * width];
        unpack_values(&packed, array.len(), width, &frame, &mut out);
        let mut in_place = packed.clone();
        in_place.resize(array.len() * width, 0xAA);
        widen_in_place(&mut in_place, array.len(), width, &frame);
        assert_eq!(in_place, out, "widened in place");
        assert_eq!(out, value_bytes(&array.to_data(), width), "{array:?}");
        Some(frame)
    }

    #[test]
    fn narrow_ranges_pack_into_the_fewest_bytes_and_come_back_bit_for_bit() {
        let a: ArrayRef = Arc::new(Int64Array::from(vec![1000, 1003, 1001]));
        assert_eq!(
            round_trip(a, 8),
            Some(Frame {
                base: 1000,
                width: 1
            })
        );
        // Negative values, and a null whose slot holds 0: the span covers it.
        let a: ArrayRef = Arc::new(Int32Array::from(vec![Some(-300), None, Some(-5)]));
        assert_eq!(
            round_trip(a, 4),
            Some(Frame {
                base: -300,
                width: 2
            })
        );
        let a: ArrayRef = Arc::new(Int64Array::from(vec![-(1 << 40), (1 << 40) + 7]));
        assert_eq!(round_trip(a, 8), None, "2^41 needs more than 4 bytes");
        let a: ArrayRef = Arc::new(Int64Array::from(vec![-(1 << 30), 1 << 30]));
        assert_eq!(round_trip(a, 8).map(|f| f.width), Some(4));
        let a: ArrayRef = Arc::new(
            Decimal128Array::from(vec![i128::from(i64::MIN), i128::from(i64::MAX)])
                .with_precision_and_scale(38, 2)
                .unwrap(),
        );
        assert_eq!(round_trip(a, 16).map(|f| f.width), Some(8));
        let a: ArrayRef = Arc::new(Decimal128Array::from(vec![-(1i128 << 100), 5]));
        assert_eq!(round_trip(a, 16), None);
        let a: ArrayRef = Arc::new(UInt32Array::from(vec![u32::MAX, u32::MAX - 200]));
        assert_eq!(
            round_trip(a, 4),
            Some(Frame {
                base: i128::from(u32::MAX - 200),
                width: 1
            })
        );
        let a: ArrayRef = Arc::new(Int16Array::from(vec![i16::MIN, i16::MIN + 255]));
        assert_eq!(round_trip(a, 2).map(|f| f.width), Some(1));
        let a: ArrayRef = Arc::new(Int16Array::from(vec![i16::MIN, i16::MIN + 256]));
        assert_eq!(round_trip(a, 2), None);
        // A sliced array packs only its own rows.
        let a: ArrayRef = Arc::new(Int64Array::from(vec![i64::MIN, 7, 9, i64::MAX]));
        assert_eq!(
            round_trip(a.slice(1, 2), 8),
            Some(Frame { base: 7, width: 1 })
        );
    }

    #[test]
    fn frames_around_earlier_values_leave_room_and_values_outside_are_refused() {
        let frame = Frame::around(
            ValueSpan::Within {
                min: 1000,
                max: 1100,
            },
            8,
        )
        .unwrap();
        assert_eq!(frame.width, 1);
        assert_eq!(frame.base, 1000 - (255 - 100) / 2);
        let inside: ArrayRef = Arc::new(Int64Array::from(vec![923, 1178]));
        let mut packed = vec![0u8; 2];
        assert!(pack_values(&inside, 8, &frame, &mut packed));
        for outside in [922, 1179, -1000, i64::MAX] {
            let a: ArrayRef = Arc::new(Int64Array::from(vec![1000, outside]));
            assert!(!pack_values(&a, 8, &frame, &mut packed), "{outside}");
        }
        assert_eq!(Frame::around(ValueSpan::Wide, 8), None);
        // At the bottom of an i128, the base stays at the smallest value.
        let low = ValueSpan::Within {
            min: i128::MIN,
            max: i128::MIN + 3,
        };
        assert_eq!(Frame::around(low, 16).map(|f| f.base), Some(i128::MIN));
    }

    #[test]
    fn spans_join_and_wide_columns_stop_early() {
        let wide: Vec<i32> = (0..10_000).map(|i| i * 100_000).collect();
        assert_eq!(
            span_of(&(Arc::new(Int32Array::from(wide)) as ArrayRef)),
            ValueSpan::Wide
        );
        let a = span_of(&(Arc::new(Int64Array::from(vec![5, 9])) as ArrayRef));
        let b = span_of(&(Arc::new(Int64Array::from(vec![-2])) as ArrayRef));
        assert_eq!(a.union(b), ValueSpan::Within { min: -2, max: 9 });
        assert_eq!(a.union(ValueSpan::Empty), a);
        assert_eq!(a.union(ValueSpan::Wide), ValueSpan::Wide);
        let floats: ArrayRef = Arc::new(arrow::array::Float64Array::from(vec![1.0, 2.0]));
        assert_eq!(span_of(&floats), ValueSpan::Wide, "floats are not packed");
    }
}
