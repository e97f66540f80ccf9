//! Join-key encoding: one or more key columns of integers (or types stored as integers: dates,
//! times, timestamps, durations, decimals of 4, 8 and 16 bytes, year-month intervals; day-time
//! intervals as their 8 bytes), booleans (0 or 1, the byte a
//! row they are unpacked to on the device) or floats (their bits, `-0.0` read as `+0.0`) become one unsigned key per row (u32 where it fits, else u64), exact — no
//! hashing, so no false matches. A 16-byte decimal key is encoded where the build side's values
//! all fit 64 bits.
//!
//! The encoder is fitted to the build side: each key column c spans `[min_c, max_c]` there, so
//! a composite key is the mixed-radix number `sum((v_c - min_c) * stride_c)` with
//! `stride_c = prod(span_j, j < c)`. Probe values outside a build column's range cannot match
//! and are encoded as the sentinel, like nulls. Example: build keys (a, b) with a in [10, 12]
//! and b in [0, 99]: spans 3 and 100, strides 1 and 3, so (11, 5) -> 1 + 5 * 3 = 16.
//! If the product of the spans does not fit below the u64 sentinel, the encoder cannot be
//! built and the join runs on the CPU. Where nulls equal nulls (`IS NOT DISTINCT FROM`), each
//! column's span has one more digit, `span_c`, which its nulls take on both sides.
//!
//! A *direct* encoder ([`KeyEncoder::direct`], for DIRECT, the join without a hash) writes the
//! same number `k` as `(k << (32 - bits)) * M^-1` (mod 2^32), where `M` is the multiplier of
//! the partition hash of 32-bit keys and `2^bits` covers every encoding: the hash,
//! `(key * M) >> (32 - bits)`, then gives back `k` itself, so bucketing by it puts every value
//! in a bucket of its own, in key order. The map is one to one, so equal keys stay equal, and
//! it never makes the sentinel (all ones is odd; `k << (32 - bits)` times the odd `M` is even).
//! The strides are multiplied by `2^(32 - bits) * M^-1`, so the kernels encode it unchanged.

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, make_array};
use arrow::datatypes::{self as adt, ArrowPrimitiveType, DataType, IntervalUnit};
use datafusion::common::{Result, ScalarValue, internal_err};

use crate::backend::{
    Backend, KeyColumnEncoding, KeyType, KeyWidth, PARTITION_MUL_U32, float_key_bits,
};

/// The physical key type of `dt`, or `None` if it cannot be an exactly encoded GPU join key.
/// Every type here is equal where its stored value is (floats once `-0.0` is read as `+0.0`),
/// as DataFusion's hash join compares keys of one type.
pub fn key_type(dt: &DataType) -> Option<KeyType> {
    use DataType::*;
    Some(match dt {
        Int8 => KeyType::I8,
        Int16 => KeyType::I16,
        Int32 | Date32 | Time32(_) | Decimal32(_, _) | Interval(IntervalUnit::YearMonth) => {
            KeyType::I32
        }
        // Two i32s (days, milliseconds), equal where both are: equal where their bits are.
        Interval(IntervalUnit::DayTime) => KeyType::U64,
        Int64 | Date64 | Time64(_) | Timestamp(_, _) | Duration(_) | Decimal64(_, _) => {
            KeyType::I64
        }
        Decimal128(_, _) => KeyType::I128,
        // A boolean key is read as the byte (0 or 1) each row takes on the device.
        UInt8 | Boolean => KeyType::U8,
        UInt16 => KeyType::U16,
        UInt32 => KeyType::U32,
        UInt64 => KeyType::U64,
        Float16 => KeyType::F16,
        Float32 => KeyType::F32,
        Float64 => KeyType::F64,
        _ => return None,
    })
}

/// Encodes the key columns of both sides the same way.
#[derive(Debug, Clone)]
pub struct KeyEncoder {
    columns: Vec<KeyColumnEncoding>,
    width: KeyWidth,
    /// How many encodings there are: keys are below it.
    span: u64,
    /// For a direct encoder, the bits of the buckets its keys are their own partition hash in.
    direct_bits: Option<u32>,
}

/// The inverse of an odd `a` modulo 2^32 (Newton's iteration: each step doubles the bits that
/// are right, from the 3 that `a` itself gets right).
const fn inverse_u32(a: u32) -> u32 {
    let mut x = a;
    let mut i = 0;
    while i < 5 {
        x = x.wrapping_mul(2u32.wrapping_sub(a.wrapping_mul(x)));
        i += 1;
    }
    x
}

/// Most bits a direct encoder's buckets take (one short of 32, so that no key is the sentinel).
pub const MAX_DIRECT_BITS: u32 = 31;

/// Min and max (widened to 64 bits) of the non-null values of a primitive array.
fn min_max<T: ArrowPrimitiveType>(
    a: &dyn Array,
    widen: impl Fn(T::Native) -> u64,
) -> Option<(u64, u64)> {
    let a = a.as_primitive::<T>();
    Some((
        widen(arrow::compute::min(a)?),
        widen(arrow::compute::max(a)?),
    ))
}

/// Min and max of the non-null values of a float array as the encoder reads them: bits, `-0.0`
/// as `+0.0`.
fn float_min_max<T: ArrowPrimitiveType>(
    a: &dyn Array,
    bits: impl Fn(T::Native) -> u64,
) -> Option<(u64, u64)> {
    let a = a.as_primitive::<T>();
    let bytes = std::mem::size_of::<T::Native>();
    let mut range: Option<(u64, u64)> = None;
    for v in a.iter().flatten() {
        let v = float_key_bits(bits(v), bytes);
        range = Some(range.map_or((v, v), |(lo, hi)| (lo.min(v), hi.max(v))));
    }
    range
}

/// The same values as the plain integer type that `ty` reads (dates, times, timestamps,
/// durations, decimals and intervals are reinterpreted, not converted).
fn as_integers(a: &ArrayRef, ty: KeyType) -> Result<ArrayRef> {
    let dt = match ty {
        KeyType::I32 => DataType::Int32,
        KeyType::I64 => DataType::Int64,
        KeyType::U64 => DataType::UInt64,
        _ => return Ok(Arc::clone(a)),
    };
    if a.data_type() == &dt {
        return Ok(Arc::clone(a));
    }
    Ok(make_array(
        a.to_data().into_builder().data_type(dt).build()?,
    ))
}

/// The range of one key column's non-null values, gathered batch by batch.
#[derive(Debug, Clone)]
pub struct KeyRange {
    data_type: DataType,
    ty: KeyType,
    /// Min and max, widened to 64 bits (sign-extended if the type is signed).
    range: Option<(u64, u64)>,
    /// Some value does not fit 64 bits (16-byte keys): no encoder fits this column.
    wide: bool,
}

impl KeyRange {
    /// An empty range for a key column of type `dt`.
    pub fn new(dt: &DataType) -> Result<Self> {
        let Some(ty) = key_type(dt) else {
            return internal_err!("not a key type: {dt}");
        };
        Ok(Self {
            data_type: dt.clone(),
            ty,
            range: None,
            wide: false,
        })
    }

    /// Widens the range to the non-null values of `a`.
    pub fn update(&mut self, a: &ArrayRef) -> Result<()> {
        if self.data_type == DataType::Boolean {
            let values = a.as_boolean();
            let (mut lo, mut hi) = (None, None);
            for v in values.iter().flatten() {
                let v = u64::from(v);
                lo = Some(lo.map_or(v, |l: u64| l.min(v)));
                hi = Some(hi.map_or(v, |h: u64| h.max(v)));
            }
            if let (Some(lo), Some(hi)) = (lo, hi) {
                self.merge_range((lo, hi));
            }
            return Ok(());
        }
        let a = as_integers(a, self.ty)?;
        let a = a.as_ref();
        let r = match self.ty {
            KeyType::I8 => min_max::<adt::Int8Type>(a, |v| v as i64 as u64),
            KeyType::I16 => min_max::<adt::Int16Type>(a, |v| v as i64 as u64),
            KeyType::I32 => min_max::<adt::Int32Type>(a, |v| v as i64 as u64),
            KeyType::I64 => min_max::<adt::Int64Type>(a, |v| v as u64),
            KeyType::U8 => min_max::<adt::UInt8Type>(a, |v| v as u64),
            KeyType::U16 => min_max::<adt::UInt16Type>(a, |v| v as u64),
            KeyType::U32 => min_max::<adt::UInt32Type>(a, |v| v as u64),
            KeyType::U64 => min_max::<adt::UInt64Type>(a, |v| v),
            KeyType::F16 => float_min_max::<adt::Float16Type>(a, |v| v.to_bits() as u64),
            KeyType::F32 => float_min_max::<adt::Float32Type>(a, |v| v.to_bits() as u64),
            KeyType::F64 => float_min_max::<adt::Float64Type>(a, |v| v.to_bits()),
            KeyType::I128 => {
                let a = a.as_primitive::<adt::Decimal128Type>();
                match (arrow::compute::min(a), arrow::compute::max(a)) {
                    (Some(lo), Some(hi)) => match (i64::try_from(lo), i64::try_from(hi)) {
                        (Ok(lo), Ok(hi)) => Some((lo as u64, hi as u64)),
                        _ => {
                            self.wide = true;
                            None
                        }
                    },
                    _ => None,
                }
            }
        };
        if let Some(r) = r {
            self.merge_range(r);
        }
        Ok(())
    }

    /// Widens the range to values `lo..=hi` (as the range holds them: widened to 64 bits).
    pub fn include(&mut self, lo: u64, hi: u64) {
        self.merge_range((lo, hi));
    }

    /// Widens the range to `other`'s (same key column, other batches).
    pub fn merge(&mut self, other: &KeyRange) {
        if let Some(r) = other.range {
            self.merge_range(r);
        }
        self.wide |= other.wide;
    }

    fn merge_range(&mut self, (lo, hi): (u64, u64)) {
        self.range = Some(match self.range {
            None => (lo, hi),
            Some((l, h)) if self.ty.signed() => (
                (l as i64).min(lo as i64) as u64,
                (h as i64).max(hi as i64) as u64,
            ),
            Some((l, h)) => (l.min(lo), h.max(hi)),
        });
    }

    /// How many values lie in the range of the column's values (max - min + 1), or `None`
    /// where that says nothing of how densely values fill it: no value, floats and other keys
    /// read as bits (whose range counts bit patterns), or values past 64 bits.
    pub fn value_span(&self) -> Option<u64> {
        if self.ty.float() || self.bits_only() || self.wide {
            return None;
        }
        self.values().map(|v| v.min(u128::from(u64::MAX)) as u64)
    }

    /// How many encodings lie in `[min, max]` (`None` without a value): the digits the
    /// encoder gives the column's values.
    fn values(&self) -> Option<u128> {
        let (min, max) = self.range?;
        Some(match self.ty.signed() {
            true => ((max as i64 as i128) - (min as i64 as i128) + 1) as u128,
            false => (max as u128) - (min as u128) + 1,
        })
    }

    /// Whether the column's values are read as bits whose order is not theirs (a day-time
    /// interval: two i32s).
    fn bits_only(&self) -> bool {
        self.data_type == DataType::Interval(IntervalUnit::DayTime)
    }

    /// Min and max as values of the column's own type, or `None` if it had no non-null value,
    /// some value does not fit 64 bits, its values are floats (whose bits' range is no range
    /// of values, and whose `-0.0` a bound compared in total order would wrongly exclude), or
    /// bits in another order ([`bits_only`](Self::bits_only)).
    pub fn bounds(&self) -> Result<Option<(ScalarValue, ScalarValue)>> {
        let ordered = !self.ty.float() && !self.wide && !self.bits_only();
        let Some((lo, hi)) = self.range.filter(|_| ordered) else {
            return Ok(None);
        };
        if self.data_type == DataType::Boolean {
            return Ok(Some((
                ScalarValue::Boolean(Some(lo != 0)),
                ScalarValue::Boolean(Some(hi != 0)),
            )));
        }
        let scalar = |v: u64| -> Result<ScalarValue> {
            // The value as the plain integer type the encoder reads, then reinterpreted as the
            // column's type (dates and timestamps are their integers).
            let ints: ArrayRef = match self.ty {
                KeyType::I8 => Arc::new(arrow::array::Int8Array::from(vec![v as i8])),
                KeyType::I16 => Arc::new(arrow::array::Int16Array::from(vec![v as i16])),
                KeyType::I32 => Arc::new(arrow::array::Int32Array::from(vec![v as i32])),
                KeyType::I64 => Arc::new(arrow::array::Int64Array::from(vec![v as i64])),
                KeyType::U8 => Arc::new(arrow::array::UInt8Array::from(vec![v as u8])),
                KeyType::U16 => Arc::new(arrow::array::UInt16Array::from(vec![v as u16])),
                KeyType::U32 => Arc::new(arrow::array::UInt32Array::from(vec![v as u32])),
                KeyType::U64 => Arc::new(arrow::array::UInt64Array::from(vec![v])),
                KeyType::I128 => {
                    Arc::new(arrow::array::Decimal128Array::from(vec![v as i64 as i128]))
                }
                KeyType::F16 | KeyType::F32 | KeyType::F64 => {
                    return internal_err!("bounds of float keys");
                }
            };
            let typed = make_array(
                ints.to_data()
                    .into_builder()
                    .data_type(self.data_type.clone())
                    .build()?,
            );
            ScalarValue::try_from_array(&typed, 0)
        };
        Ok(Some((scalar(lo)?, scalar(hi)?)))
    }
}

/// What fitting an encoder to the build side gave.
#[derive(Debug)]
pub enum Fitted {
    /// Keys can be encoded exactly.
    Encoder(KeyEncoder),
    /// Some key column has no non-null build value: nothing can match.
    NoMatches,
    /// The key ranges are too wide for 64 bits.
    TooWide,
}

impl KeyEncoder {
    /// Fits an encoder to the build side's key columns (each given as its batches' arrays);
    /// `nulls_equal`: a null key equals a null key.
    pub fn fit(key_columns: &[Vec<&ArrayRef>], nulls_equal: bool) -> Result<Fitted> {
        let mut ranges = Vec::with_capacity(key_columns.len());
        for arrays in key_columns {
            let Some(first) = arrays.first() else {
                return Ok(Fitted::NoMatches);
            };
            let mut range = KeyRange::new(first.data_type())?;
            for a in arrays {
                range.update(a)?;
            }
            ranges.push(range);
        }
        Ok(Self::from_ranges(&ranges, nulls_equal))
    }

    /// Fits an encoder to the ranges of the build side's key columns; `nulls_equal`: a null
    /// key equals a null key.
    pub fn from_ranges(ranges: &[KeyRange], nulls_equal: bool) -> Fitted {
        let mut columns = Vec::with_capacity(ranges.len());
        let mut stride: u128 = 1;
        for range in ranges {
            if range.wide {
                return Fitted::TooWide;
            }
            let ty = range.ty;
            let (min, max, values) = match (range.range, range.values()) {
                (Some((min, max)), Some(values)) => (min, max, values),
                // Only nulls: they match only other nulls, and only if nulls are equal.
                _ if nulls_equal => (1, 0, 0),
                _ => return Fitted::NoMatches,
            };
            // Nulls take the digit after the values'.
            let (null_digit, span) = if nulls_equal {
                (Some(values as u64), values + 1)
            } else {
                (None, values)
            };
            columns.push(KeyColumnEncoding {
                ty,
                min,
                max,
                stride: stride as u64,
                null_digit,
            });
            stride = match stride.checked_mul(span) {
                Some(s) if s <= u64::MAX as u128 => s,
                _ => return Fitted::TooWide,
            };
        }
        // `stride` is now the number of distinct encodings; the largest is stride - 1, which
        // must stay below the sentinel (all ones).
        let width = if stride < u32::MAX as u128 {
            KeyWidth::U32
        } else if stride < u64::MAX as u128 {
            KeyWidth::U64
        } else {
            return Fitted::TooWide;
        };
        Fitted::Encoder(Self {
            columns,
            width,
            span: stride as u64,
            direct_bits: None,
        })
    }

    /// Width of the encoded keys.
    pub fn width(&self) -> KeyWidth {
        self.width
    }

    /// How many distinct keys the encoder can write (the product of the columns' spans).
    pub fn span(&self) -> u64 {
        self.span
    }

    /// The same keys written so that the partition hash of `bits` bits (the fewest that cover
    /// the span) is the key itself (module doc), or `None` where there are no key columns or
    /// the span needs more than `MAX_DIRECT_BITS` (31) bits (a span that fits 31 bits is
    /// encoded in 32-bit keys).
    pub fn direct(&self) -> Option<Self> {
        // A span past 2^63 has no power of two in 64 bits (and needs more than 31 anyway).
        let bits = (self.span.max(2).checked_next_power_of_two()).map_or(64, u64::trailing_zeros);
        if self.columns.is_empty() || bits > MAX_DIRECT_BITS {
            return None;
        }
        let mul = (1u32 << (32 - bits)).wrapping_mul(inverse_u32(PARTITION_MUL_U32));
        let columns = self
            .columns
            .iter()
            .map(|c| KeyColumnEncoding {
                stride: u64::from((c.stride as u32).wrapping_mul(mul)),
                ..*c
            })
            .collect();
        Some(Self {
            columns,
            width: self.width,
            span: self.span,
            direct_bits: Some(bits),
        })
    }

    /// The type of each key column, in order.
    pub fn key_types(&self) -> impl Iterator<Item = KeyType> + '_ {
        self.columns.iter().map(|c| c.ty)
    }

    /// For a direct encoder, the bits of its buckets (one key value each).
    pub fn direct_bits(&self) -> Option<u32> {
        self.direct_bits
    }

    /// Encodes uploaded key columns (values and optional validity bytes) of `rows` rows.
    pub fn encode<B: Backend>(
        &self,
        backend: &B,
        columns: &[(&B::Buf, Option<&B::Buf>)],
        rows: usize,
    ) -> Result<B::Buf> {
        let mut acc = None;
        for (enc, (values, validity)) in self.columns.iter().zip(columns) {
            acc = Some(backend.encode_keys(values, *validity, rows, enc, self.width, acc)?);
        }
        match acc {
            Some(a) => Ok(a),
            // No key column (a cross or nested loop join): every row has the key 0.
            None => {
                let mut keys = backend.alloc(rows * self.width.bytes())?;
                backend.fill(&mut keys, 0)?;
                Ok(keys)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Int32Array, Int64Array};

    fn fit(cols: Vec<ArrayRef>) -> Fitted {
        let refs: Vec<Vec<&ArrayRef>> = cols.iter().map(|c| vec![c]).collect();
        KeyEncoder::fit(&refs, false).unwrap()
    }

    #[test]
    fn composite_keys_use_mixed_radix_strides() {
        let a: ArrayRef = Arc::new(Int32Array::from(vec![10, 12, 11]));
        let b: ArrayRef = Arc::new(Int64Array::from(vec![0, 99, 5]));
        let Fitted::Encoder(e) = fit(vec![a, b]) else {
            panic!("should encode")
        };
        assert_eq!(e.width(), KeyWidth::U32);
        assert_eq!(
            e.columns[0],
            KeyColumnEncoding {
                ty: KeyType::I32,
                min: 10,
                max: 12,
                stride: 1,
                null_digit: None
            }
        );
        assert_eq!(
            e.columns[1],
            KeyColumnEncoding {
                ty: KeyType::I64,
                min: 0,
                max: 99,
                stride: 3,
                null_digit: None
            }
        );
    }

    #[test]
    fn wide_ranges_use_u64_or_do_not_fit() {
        let a: ArrayRef = Arc::new(Int64Array::from(vec![0, 1 << 40]));
        let Fitted::Encoder(e) = fit(vec![Arc::clone(&a)]) else {
            panic!("should encode")
        };
        assert_eq!(e.width(), KeyWidth::U64);
        assert!(matches!(
            fit(vec![Arc::clone(&a), Arc::clone(&a)]),
            Fitted::TooWide
        ));
        let full: ArrayRef = Arc::new(Int64Array::from(vec![i64::MIN, i64::MAX]));
        assert!(matches!(fit(vec![full]), Fitted::TooWide));
    }

    #[test]
    fn value_spans_count_values_where_the_range_is_of_values() {
        let span = |a: ArrayRef| {
            let mut r = KeyRange::new(a.data_type()).unwrap();
            r.update(&a).unwrap();
            r.value_span()
        };
        assert_eq!(span(Arc::new(Int64Array::from(vec![-5, 7, 0]))), Some(13));
        assert_eq!(
            span(Arc::new(Int32Array::from(vec![Some(3), None]))),
            Some(1)
        );
        let unsigned = arrow::array::UInt64Array::from(vec![u64::MAX - 9, u64::MAX]);
        assert_eq!(span(Arc::new(unsigned)), Some(10));
        // No value, and floats (bit patterns, not values): nothing to tell.
        assert_eq!(span(Arc::new(Int32Array::from(vec![None, None]))), None);
        let floats = arrow::array::Float64Array::from(vec![1.0, 1e6]);
        assert_eq!(span(Arc::new(floats)), None);
    }

    #[test]
    fn all_null_build_keys_match_nothing() {
        let a: ArrayRef = Arc::new(Int32Array::from(vec![None, None]));
        assert!(matches!(fit(vec![a]), Fitted::NoMatches));
    }

    #[test]
    fn equal_nulls_take_one_more_digit() {
        let a: ArrayRef = Arc::new(Int32Array::from(vec![Some(10), None, Some(12)]));
        let b: ArrayRef = Arc::new(Int32Array::from(vec![None, None, None]));
        let Ok(Fitted::Encoder(e)) = KeyEncoder::fit(&[vec![&a], vec![&b]], true) else {
            panic!("should encode")
        };
        // a: values 10..=12 are digits 0..=2, null is 3; b: only nulls, digit 0, stride 4.
        assert_eq!(e.columns[0].null_digit, Some(3));
        assert_eq!((e.columns[1].null_digit, e.columns[1].stride), (Some(0), 4));
        assert!(!e.columns[1].in_range(0) && !e.columns[1].in_range(1));
    }

    #[test]
    fn float_keys_are_their_bits_with_negative_zero_as_zero() {
        use crate::backend::HostBackend;
        use arrow::array::Float64Array;
        let build: ArrayRef = Arc::new(Float64Array::from(vec![
            Some(0.0),
            Some(f64::NAN),
            Some(2.5),
            None,
        ]));
        let probe: ArrayRef = Arc::new(Float64Array::from(vec![
            Some(-0.0),
            Some(f64::NAN),
            Some(2.5),
            Some(-2.5),
            Some(1.0),
        ]));
        let Fitted::Encoder(e) = KeyEncoder::fit(&[vec![&build]], false).unwrap() else {
            panic!("float keys encode")
        };
        let mut range = KeyRange::new(&DataType::Float64).unwrap();
        range.update(&probe).unwrap();
        // -0.0 is 0 for the range too, and float ranges publish no bounds.
        assert_eq!(range.range.unwrap().0, 0);
        assert!(range.bounds().unwrap().is_none());
        let b = HostBackend::default();
        let encode = |a: &ArrayRef| -> Vec<u64> {
            let bytes = a.to_data().buffers()[0].as_slice().to_vec();
            let values = b.upload(&bytes).unwrap();
            let keys = e.encode(&b, &[(&values, None)], a.len()).unwrap();
            let mut out = vec![0u8; a.len() * e.width().bytes()];
            b.download(&keys, &mut out).unwrap();
            match e.width() {
                KeyWidth::U32 => out
                    .chunks_exact(4)
                    .map(|c| u32::from_le_bytes(c.try_into().unwrap()) as u64)
                    .collect(),
                KeyWidth::U64 => out
                    .chunks_exact(8)
                    .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
                    .collect(),
            }
        };
        let (bk, pk) = (encode(&build), encode(&probe));
        let sentinel = e.width().sentinel();
        // -0.0 meets 0.0, NaN meets NaN, 2.5 meets 2.5; -2.5 (sign bit set) is outside the
        // range, and 1.0 inside it meets no build key.
        assert_eq!(&pk[..3], &bk[..3]);
        assert!(pk[3] == sentinel && !bk.contains(&pk[4]));
        assert!(bk[..3].iter().all(|&k| k != sentinel));
    }

    #[test]
    fn decimal128_keys_encode_where_the_build_side_fits_64_bits() {
        use crate::backend::HostBackend;
        use arrow::array::Decimal128Array;
        let dec = |v: Vec<Option<i128>>| -> ArrayRef {
            Arc::new(
                Decimal128Array::from(v)
                    .with_precision_and_scale(38, 2)
                    .unwrap(),
            )
        };
        let build = dec(vec![Some(-5), Some(7), None]);
        let probe = dec(vec![Some(7), Some(-5), Some((1i128 << 64) + 7), Some(8)]);
        let Fitted::Encoder(e) = KeyEncoder::fit(&[vec![&build]], false).unwrap() else {
            panic!("small decimals encode")
        };
        let b = HostBackend::default();
        let encode = |a: &ArrayRef| -> Vec<u32> {
            let values = b.upload(a.to_data().buffers()[0].as_slice()).unwrap();
            let keys = e.encode(&b, &[(&values, None)], a.len()).unwrap();
            let mut out = vec![0u8; a.len() * 4];
            b.download(&keys, &mut out).unwrap();
            out.chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                .collect()
        };
        assert_eq!(e.width(), KeyWidth::U32);
        let (bk, pk) = (encode(&build), encode(&probe));
        // 7 and -5 meet; 2^64 + 7 (whose low word is 7) and 8 (outside the range) do not.
        assert_eq!((pk[0], pk[1]), (bk[1], bk[0]));
        assert_eq!((pk[2], pk[3]), (u32::MAX, u32::MAX));
        // A build value beyond 64 bits fits no encoder, and gives no bounds.
        let mut range = KeyRange::new(build.data_type()).unwrap();
        range.update(&probe).unwrap();
        assert!(range.bounds().unwrap().is_none());
        assert!(matches!(
            KeyEncoder::from_ranges(&[range], false),
            Fitted::TooWide
        ));
        let mut fits = KeyRange::new(build.data_type()).unwrap();
        fits.update(&build).unwrap();
        let (lo, hi) = fits.bounds().unwrap().unwrap();
        assert_eq!(
            (lo, hi),
            (
                ScalarValue::Decimal128(Some(-5), 38, 2),
                ScalarValue::Decimal128(Some(7), 38, 2)
            )
        );
    }

    #[test]
    fn a_direct_encoder_makes_each_key_its_own_bucket_in_key_order() {
        use crate::backend::HostBackend;
        // Composite keys (a in [10, 12], b in [0, 4], nulls equal): spans 4 and 6 (a null
        // digit each), 24 keys.
        let a: ArrayRef = Arc::new(Int32Array::from(
            (0..20)
                .map(|i| (i % 4 < 3).then_some(10 + i % 4))
                .collect::<Vec<_>>(),
        ));
        let b_col: ArrayRef =
            Arc::new(Int64Array::from((0..20).map(|i| i / 4).collect::<Vec<_>>()));
        let Fitted::Encoder(plain) = KeyEncoder::fit(&[vec![&a], vec![&b_col]], true).unwrap()
        else {
            panic!("should encode")
        };
        assert_eq!(plain.span(), 24);
        let direct = plain.direct().expect("24 keys fit 5 bits");
        assert_eq!(direct.direct_bits(), Some(5));
        let b = HostBackend::default();
        let encode = |e: &KeyEncoder| -> Vec<u32> {
            let up = |c: &ArrayRef| {
                let values = b.upload(c.to_data().buffers()[0].as_slice()).unwrap();
                let valid: Vec<u8> = (0..c.len()).map(|i| u8::from(c.is_valid(i))).collect();
                (values, b.upload(&valid).unwrap())
            };
            let (av, an) = up(&a);
            let (bv, bn) = up(&b_col);
            let keys = e
                .encode(&b, &[(&av, Some(&an)), (&bv, Some(&bn))], 20)
                .unwrap();
            let mut out = vec![0u8; 80];
            b.download(&keys, &mut out).unwrap();
            out.chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                .collect()
        };
        let (pk, dk) = (encode(&plain), encode(&direct));
        // The plain keys are 0..20 (a's digit, with null the fourth, then b's times 4).
        assert_eq!(pk, (0..20).collect::<Vec<u32>>());
        // The partition hash of 5 bits gives each direct key back its plain number.
        let hash = |k: u32| (k.wrapping_mul(PARTITION_MUL_U32) as u64 >> (32 - 5)) as u32;
        assert_eq!(dk.iter().map(|&k| hash(k)).collect::<Vec<_>>(), pk);
        assert!(dk.iter().all(|&k| k != u32::MAX));
        assert_eq!(
            inverse_u32(PARTITION_MUL_U32).wrapping_mul(PARTITION_MUL_U32),
            1
        );
        // Too many encodings for 31 bits, or none to tell apart: no direct encoder.
        let mut wide = KeyRange::new(&DataType::Int64).unwrap();
        wide.include(0, 1 << 31);
        let Fitted::Encoder(wide) = KeyEncoder::from_ranges(&[wide], false) else {
            panic!("fits 64 bits")
        };
        assert!(wide.direct().is_none());
        // A span past 2^63 (most of a 64-bit key's range): none either, and no overflow.
        let mut whole = KeyRange::new(&DataType::UInt64).unwrap();
        whole.include(0, (1 << 63) + 5);
        let Fitted::Encoder(whole) = KeyEncoder::from_ranges(&[whole], false) else {
            panic!("fits 64 bits")
        };
        assert!(whole.span() > 1 << 63);
        assert!(whole.direct().is_none());
    }

    #[test]
    fn boolean_keys_are_the_bytes_they_unpack_to() {
        use crate::backend::HostBackend;
        use arrow::array::BooleanArray;
        let build: ArrayRef = Arc::new(BooleanArray::from(vec![Some(true), None, Some(true)]));
        let Fitted::Encoder(e) = KeyEncoder::fit(&[vec![&build]], false).unwrap() else {
            panic!("boolean keys encode")
        };
        let mut range = KeyRange::new(&DataType::Boolean).unwrap();
        range.update(&build).unwrap();
        assert_eq!(
            range.bounds().unwrap(),
            Some((
                ScalarValue::Boolean(Some(true)),
                ScalarValue::Boolean(Some(true))
            ))
        );
        // The device holds a boolean key as a byte a row, 0 or 1, validity apart.
        let b = HostBackend::default();
        let values = b.upload(&[0, 1, 0]).unwrap();
        let valid = b.upload(&[1, 1, 0]).unwrap();
        let keys = e.encode(&b, &[(&values, Some(&valid))], 3).unwrap();
        let mut out = vec![0u8; 12];
        b.download(&keys, &mut out).unwrap();
        let keys: Vec<u32> = out
            .chunks_exact(4)
            .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
            .collect();
        // false is outside the build range [true, true]; true is its only value; null never matches.
        assert_eq!(keys, vec![u32::MAX, 0, u32::MAX]);
    }

    #[test]
    fn interval_keys_are_their_stored_values() {
        use arrow::array::{IntervalDayTimeArray, IntervalYearMonthArray};
        use arrow::datatypes::IntervalDayTime;
        let ym: ArrayRef = Arc::new(IntervalYearMonthArray::from(vec![Some(3), Some(-2), None]));
        let mut range = KeyRange::new(ym.data_type()).unwrap();
        range.update(&ym).unwrap();
        assert_eq!(
            range.bounds().unwrap(),
            Some((
                ScalarValue::IntervalYearMonth(Some(-2)),
                ScalarValue::IntervalYearMonth(Some(3))
            ))
        );
        let dt: ArrayRef = Arc::new(IntervalDayTimeArray::from(vec![
            Some(IntervalDayTime::new(1, -5)),
            Some(IntervalDayTime::new(-1, 7)),
        ]));
        let mut range = KeyRange::new(dt.data_type()).unwrap();
        range.update(&dt).unwrap();
        // Bits in no interval order: a range for the encoder, no bounds for the filter.
        assert!(range.range.is_some() && range.bounds().unwrap().is_none());
        assert!(key_type(&DataType::Interval(IntervalUnit::MonthDayNano)).is_none());
    }
}
