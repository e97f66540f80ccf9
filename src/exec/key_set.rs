//! [`KeySetExpr`]: `probe_key IN (the build side's keys)` as one expression over one child, the
//! membership test a join publishes in its dynamic filter where few probe rows are expected to
//! match (`exec::filter`).
//!
//! DataFusion's `InListExpr` holds one literal child per value, and a dynamic filter rewrites
//! its expression's children every time it is evaluated (to the columns of the node that
//! evaluates it), so an IN list of thousands of values would cost a tree of thousands of nodes
//! per batch. This expression keeps the set out of the tree: its one child is the probe key, as
//! the child of `HashJoinExec`'s `HashTableLookupExpr` is. It displays as `key IN (n build
//! keys)`, not as its values.
//!
//! Keys that are integers once widened to 64 bits (integers but `UInt64`, dates, times,
//! timestamps, durations) are tested against a bitmap of their range where it is small enough
//! for the cache or dense enough for its size ([`BITMAP_SMALL_BITS`], [`BITMAP_BITS_PER_KEY`],
//! at most [`BITMAP_MAX_BITS`]), else against a hash set of their values; any other type
//! against the hashed set of an `InListExpr` (DataFusion's static filter), which cost about
//! 20 ns a row on TPC-H's `lineitem`.

use std::collections::HashSet;
use std::fmt;
use std::hash::{BuildHasherDefault, Hash, Hasher};
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, BooleanArray, RecordBatch, make_array};
use arrow::buffer::BooleanBuffer;
use arrow::datatypes::{DataType, Field, Int64Type, Schema, SchemaRef};
use datafusion::common::Result;
use datafusion::logical_expr::ColumnarValue;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{Column, InListExpr, lit};
use datafusion::physical_expr_common::physical_expr::proto_encode::PhysicalExprEncodeCtx;
use datafusion_proto::protobuf;

/// Widest range of integer keys tested against a bitmap (8 MiB of bits); wider ranges are
/// hashed.
const BITMAP_MAX_BITS: u64 = 1 << 26;

/// Bits a key may bring a bitmap beyond [`BITMAP_SMALL_BITS`]: sparser keys are hashed, in a
/// table that stays in the cache where their bitmap would not.
const BITMAP_BITS_PER_KEY: u64 = 512;

/// Bits any bitmap may take (256 KiB, a core's L2 cache), however few its keys.
const BITMAP_SMALL_BITS: u64 = 1 << 21;

/// The set of a build side's keys, and the probe key tested against it.
#[derive(Debug)]
pub(crate) struct KeySetExpr {
    /// The probe key (a column of the node that evaluates it).
    key: Arc<dyn PhysicalExpr>,
    /// The set, shared by the expression's remapped copies.
    set: Arc<Members>,
    /// How many keys the set was built from (for display).
    keys: usize,
}

/// How a set holds its keys.
#[derive(Debug)]
enum Members {
    /// Integer keys over a range small or dense enough: bit `v - base` is set for each.
    Bits {
        base: i64,
        span: u64,
        bits: Vec<u64>,
    },
    /// Integer keys over a wider or sparser range.
    Hashed(HashSet<i64, BuildHasherDefault<MixHasher>>),
    /// Keys of other types: an `IN` list over column 0 of `one`, whose static filter hashes
    /// the values.
    InList {
        list: Arc<InListExpr>,
        one: SchemaRef,
    },
}

impl Members {
    fn of(values: ArrayRef) -> Result<Self> {
        if let Some(ints) = widened(&values)? {
            let ints = ints.as_primitive::<Int64Type>().values();
            if let (Some(&min), Some(&max)) = (ints.iter().min(), ints.iter().max()) {
                let span = (i128::from(max) - i128::from(min) + 1) as u128;
                let dense = (ints.len() as u64)
                    .saturating_mul(BITMAP_BITS_PER_KEY)
                    .clamp(BITMAP_SMALL_BITS, BITMAP_MAX_BITS);
                if span <= u128::from(dense) {
                    let span = span as u64;
                    let mut bits = vec![0u64; span.div_ceil(64) as usize];
                    for &v in ints {
                        let at = (v - min) as u64;
                        bits[(at / 64) as usize] |= 1 << (at % 64);
                    }
                    return Ok(Self::Bits {
                        base: min,
                        span,
                        bits,
                    });
                }
            }
            return Ok(Self::Hashed(ints.iter().copied().collect()));
        }
        let one = Arc::new(Schema::new(vec![Field::new(
            "key",
            values.data_type().clone(),
            true,
        )]));
        let list =
            InListExpr::try_new_from_array(Arc::new(Column::new("key", 0)), values, false, &one)?;
        Ok(Self::InList {
            list: Arc::new(list),
            one,
        })
    }

    /// Whether each of `keys` is in the set (null where a key is null).
    fn test(&self, keys: ArrayRef) -> Result<ColumnarValue> {
        let ints = || widened(&keys)?.ok_or_else(|| type_changed(&keys));
        match self {
            Self::Bits { base, span, bits } => Ok(contains(ints()?, |v| {
                v.checked_sub(*base)
                    .filter(|&at| at >= 0 && (at as u64) < *span)
                    .is_some_and(|at| bits[at as usize / 64] >> (at % 64) & 1 == 1)
            })),
            Self::Hashed(set) => Ok(contains(ints()?, |v| set.contains(&v))),
            Self::InList { list, one } => {
                let one = RecordBatch::try_new(Arc::clone(one), vec![keys])?;
                list.evaluate(&one)
            }
        }
    }
}

/// Whether each of `ints` (`Int64`) is a member (null where it is null).
fn contains(ints: ArrayRef, member: impl Fn(i64) -> bool) -> ColumnarValue {
    let ints = ints.as_primitive::<Int64Type>();
    let values = ints.values();
    let found = BooleanBuffer::collect_bool(values.len(), |i| member(values[i]));
    let out = BooleanArray::new(found, ints.nulls().cloned());
    ColumnarValue::Array(Arc::new(out))
}

fn type_changed(keys: &ArrayRef) -> datafusion::common::DataFusionError {
    datafusion::common::internal_datafusion_err!(
        "KeySetExpr: a probe key of type {} against a set of integers",
        keys.data_type()
    )
}

/// `values` as `Int64` where each value is an integer that `Int64` holds (integers but
/// `UInt64`, and the types stored as such: dates, times, timestamps, durations); `None` for
/// other types.
fn widened(values: &ArrayRef) -> Result<Option<ArrayRef>> {
    use DataType::*;
    let stored = match values.data_type() {
        Int8 | Int16 | Int32 | Int64 | UInt8 | UInt16 | UInt32 => None,
        Date32 | Time32(_) => Some(Int32),
        Date64 | Time64(_) | Timestamp(_, _) | Duration(_) => Some(Int64),
        _ => return Ok(None),
    };
    let ints = match stored {
        // The same buffers read as the integers they store.
        Some(t) => make_array(values.to_data().into_builder().data_type(t).build()?),
        None => Arc::clone(values),
    };
    Ok(Some(arrow::compute::cast(&ints, &Int64)?))
}

/// A hasher for 64-bit keys: SplitMix64's finalizer, whose low bits (where a hash table
/// starts looking) depend on every bit of the key.
#[derive(Default)]
struct MixHasher(u64);

impl Hasher for MixHasher {
    fn finish(&self) -> u64 {
        let mut x = self.0;
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_i64(&mut self, v: i64) {
        self.0 = v as u64;
    }
}

impl KeySetExpr {
    /// The set of `values`' non-null values (the build side's keys, of the probe key's type),
    /// tested against `key`.
    pub fn try_new(key: Arc<dyn PhysicalExpr>, values: ArrayRef) -> Result<Self> {
        let values = match values.null_count() {
            0 => values,
            _ => arrow::compute::filter(&values, &arrow::compute::is_not_null(&values)?)?,
        };
        let keys = values.len();
        Ok(Self {
            key,
            set: Arc::new(Members::of(values)?),
            keys,
        })
    }
}

impl fmt::Display for KeySetExpr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} IN ({} build keys)", self.key, self.keys)
    }
}

impl Hash for KeySetExpr {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.key.hash(state);
        // The set by identity: each execution builds its own, as HashJoinExec's lookup
        // expression compares its hash table by pointer.
        Arc::as_ptr(&self.set).hash(state);
    }
}

impl PartialEq for KeySetExpr {
    fn eq(&self, other: &Self) -> bool {
        self.key.eq(&other.key) && Arc::ptr_eq(&self.set, &other.set)
    }
}

impl Eq for KeySetExpr {}

impl PhysicalExpr for KeySetExpr {
    fn data_type(&self, _input_schema: &Schema) -> Result<DataType> {
        Ok(DataType::Boolean)
    }

    fn nullable(&self, input_schema: &Schema) -> Result<bool> {
        self.key.nullable(input_schema)
    }

    fn evaluate(&self, batch: &RecordBatch) -> Result<ColumnarValue> {
        let keys = self.key.evaluate(batch)?.into_array(batch.num_rows())?;
        self.set.test(keys)
    }

    fn children(&self) -> Vec<&Arc<dyn PhysicalExpr>> {
        vec![&self.key]
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn PhysicalExpr>>,
    ) -> Result<Arc<dyn PhysicalExpr>> {
        let [key] = <[_; 1]>::try_from(children).map_err(|c| {
            datafusion::common::internal_datafusion_err!(
                "KeySetExpr takes one child, got {}",
                c.len()
            )
        })?;
        Ok(Arc::new(Self {
            key,
            set: Arc::clone(&self.set),
            keys: self.keys,
        }))
    }

    fn fmt_sql(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{self}")
    }

    /// Sent as `true`, as DataFusion sends `HashJoinExec`'s lookup expression: the set lives in
    /// this process, and a dynamic filter only prunes (every row passes `true`).
    fn try_to_proto(
        &self,
        ctx: &PhysicalExprEncodeCtx<'_>,
    ) -> Result<Option<protobuf::PhysicalExprNode>> {
        ctx.encode_child(&lit(true)).map(Some)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Date32Array, Int32Array, Int64Array, StringArray, UInt64Array};

    /// Each way of holding a set, against the keys it must and must not find (a sliced probe
    /// array with a null among them).
    #[test]
    fn every_way_of_holding_a_set_finds_exactly_its_keys() {
        let wide = [i64::MIN, -5, 0, 7, i64::MAX];
        let cases: Vec<(&str, ArrayRef, ArrayRef, Vec<Option<bool>>)> = vec![
            (
                "bits",
                Arc::new(Int32Array::from(vec![
                    Some(-3),
                    None,
                    Some(1_000_000),
                    Some(5),
                ])),
                Arc::new(Int32Array::from(vec![
                    9, -3, 5, -4, 1_000_000, 1_000_001, 6,
                ])),
                vec![Some(true), Some(true), Some(false), Some(true), Some(false)],
            ),
            (
                "hashed",
                Arc::new(Int64Array::from(wide.to_vec())),
                Arc::new(Int64Array::from(vec![
                    0,
                    i64::MIN,
                    -6,
                    7,
                    i64::MAX,
                    i64::MAX - 1,
                    1,
                ])),
                vec![Some(true), Some(false), Some(true), Some(true), Some(false)],
            ),
            (
                "bits (dates)",
                Arc::new(Date32Array::from(vec![19_000, 19_010])),
                Arc::new(Date32Array::from(vec![
                    0, 19_000, 19_001, 19_010, -19_000, 19_010, 1,
                ])),
                vec![Some(true), Some(false), Some(true), Some(false), Some(true)],
            ),
            (
                "in list (UInt64)",
                Arc::new(UInt64Array::from(vec![u64::MAX, 3])),
                Arc::new(UInt64Array::from(vec![
                    0,
                    u64::MAX,
                    4,
                    3,
                    1,
                    u64::MAX - 1,
                    2,
                ])),
                vec![
                    Some(true),
                    Some(false),
                    Some(true),
                    Some(false),
                    Some(false),
                ],
            ),
            (
                "in list (Utf8)",
                Arc::new(StringArray::from(vec!["a", "bb"])),
                Arc::new(StringArray::from(vec!["z", "bb", "b", "a", "", "a", "q"])),
                vec![Some(true), Some(false), Some(true), Some(false), Some(true)],
            ),
        ];
        for (name, build, probe, want) in cases {
            let expr = KeySetExpr::try_new(Arc::new(Column::new("k", 0)), build).unwrap();
            let held = match *expr.set {
                Members::Bits { .. } => "bits",
                Members::Hashed(_) => "hashed",
                Members::InList { .. } => "in list",
            };
            assert!(name.starts_with(held), "{name} held as {held}");
            // Rows 1 to 5 of the probe keys, the third made null.
            let probe = probe.slice(1, 5);
            let nulls = arrow::buffer::NullBuffer::from(vec![true, true, false, true, true]);
            let probe = make_array(
                probe
                    .to_data()
                    .into_builder()
                    .nulls(Some(nulls))
                    .build()
                    .unwrap(),
            );
            let schema = Arc::new(Schema::new(vec![Field::new(
                "k",
                probe.data_type().clone(),
                true,
            )]));
            let batch = RecordBatch::try_new(schema, vec![probe]).unwrap();
            let out = expr.evaluate(&batch).unwrap().into_array(5).unwrap();
            let out = out.as_boolean();
            for (row, want) in want.iter().enumerate() {
                // A null key matches nothing: null or false both drop the row.
                let got = out.is_valid(row).then(|| out.value(row));
                let ok = match row {
                    2 => got != Some(true),
                    _ => got == *want,
                };
                assert!(ok, "{name}, row {row}: {got:?}, want {want:?}");
            }
        }
    }

    #[test]
    fn tests_membership_of_a_remapped_key_and_displays_its_count() {
        let values: ArrayRef = Arc::new(Int64Array::from(vec![Some(3), None, Some(7), Some(3)]));
        let expr = Arc::new(KeySetExpr::try_new(Arc::new(Column::new("k", 0)), values).unwrap());
        assert_eq!(expr.to_string(), "k@0 IN (3 build keys)");
        // The key moved to column 1, as a dynamic filter remaps it for the node below.
        let moved = Arc::clone(&expr)
            .with_new_children(vec![Arc::new(Column::new("k", 1))])
            .unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("x", DataType::Int64, true),
            Field::new("k", DataType::Int64, true),
        ]));
        let batch = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(vec![7, 7, 7, 7])),
                Arc::new(Int64Array::from(vec![Some(3), Some(4), None, Some(7)])),
            ],
        )
        .unwrap();
        let out = moved.evaluate(&batch).unwrap().into_array(4).unwrap();
        let out = out.as_boolean();
        // A null key matches nothing: null or false both drop the row.
        assert!(out.value(0));
        assert!(out.is_valid(1) && !out.value(1));
        assert!(out.is_null(2) || !out.value(2));
        assert!(out.value(3));
    }
}
