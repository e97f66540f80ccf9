//! [`KeyHash`]: join keys the device cannot encode exactly — strings, binary, views,
//! dictionaries, floats, decimals, booleans, lists, structs, maps, or any mixture with
//! integers — join on a hash.
//!
//! Each side's batches get one more column as they arrive, `__key_hash`: a 62-bit hash of the
//! row's whole key (DataFusion's own `create_hashes`, the function its hash join uses, with a
//! fixed seed so both sides agree), null where a key column is null unless nulls are equal.
//! The device joins on that column like on any integer key. A hash says two keys *may* be
//! equal, so every candidate pair is verified on the host: the key equalities (`=`, or
//! `IS NOT DISTINCT FROM` for null-equal joins) are added to the join's residual filter
//! ([`Residual`](super::residual::Residual)), which decides each pair before any match flag is
//! set. A collision thus never makes a match, for any join type.
//!
//! Where the key is one string or binary column, its rows' hashes also hold their lengths and
//! the rows carry their first bytes in one to four words of 16 (`__key_check`, `__key_check1`,
//! ..., see [`key_check`](super::key_check)), from which the hashes are then computed: the
//! device matches keys that fit the words (up to 64 bytes) exactly, and the host verifies
//! nothing. Such a key is staged as its check bytes and length classes
//! (`__key_hash` holds the classes, a byte a row, until the device hashes them).

use std::ops::Range;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, RecordBatch, UInt64Array};
use arrow::buffer::NullBuffer;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::hash_utils::{RandomState, create_hashes};
use datafusion::common::{JoinSide, Result, internal_err, plan_err};
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{BinaryExpr, Column};
use datafusion::physical_plan::joins::utils::{ColumnIndex, JoinFilter, JoinOn};

use super::key_check;
use crate::columns::{BlockLayout, key_type, stage_validity, values_range};

/// Hash bits kept at most: a 62-bit key leaves the encoder room for a null digit.
const HASH_BITS: u32 = 62;
const HASH_MASK: u64 = (1 << HASH_BITS) - 1;

/// Whether a key column of type `dt` can be hashed and compared on the host (any type whose
/// equality DataFusion's hash join decides the same way).
fn hashable(dt: &DataType) -> bool {
    use DataType::*;
    match dt {
        Dictionary(_, values) => hashable(values),
        List(f)
        | LargeList(f)
        | FixedSizeList(f, _)
        | ListView(f)
        | LargeListView(f)
        | Map(f, _) => hashable(f.data_type()),
        Struct(fields) => fields.iter().all(|f| hashable(f.data_type())),
        Utf8 | LargeUtf8 | Utf8View | Binary | LargeBinary | BinaryView | FixedSizeBinary(_) => {
            true
        }
        Null | Boolean | Float16 | Float32 | Float64 => true,
        Decimal32(..) | Decimal64(..) | Decimal128(..) | Decimal256(..) => true,
        Time32(_) | Time64(_) | Duration(_) | Interval(_) => true,
        dt => dt.is_integer() || key_type(dt).is_some(),
    }
}

/// How a join's keys are hashed: whether nulls are equal, and whether the key is checked on the
/// device.
#[derive(Debug, Clone)]
pub struct KeyHash {
    nulls_equal: bool,
    /// The key is one column of bytes: its hashes hold their length classes.
    bytes_key: bool,
    /// The words of check bytes rows carry (`__key_check`, `__key_check1`, ...), which the
    /// device compares, so that the host verifies no key; only for a `bytes_key`, 0 where the
    /// host verifies keys.
    check: usize,
    /// The hash bits kept (fewer than [`HASH_BITS`] only to make collisions common in tests).
    mask: u64,
}

impl KeyHash {
    /// The hashing a join on `on` needs: `Ok(None)` if every key column has an exact device
    /// encoding (integers, dates, timestamps), an error if some key cannot be hashed.
    pub fn plan(
        on: &JoinOn,
        left: &SchemaRef,
        right: &SchemaRef,
        nulls_equal: bool,
    ) -> Result<Option<Self>> {
        let mut types = vec![];
        for (l, r) in key_columns(on)? {
            let (Some(lf), Some(rf)) = (left.fields().get(l), right.fields().get(r)) else {
                return plan_err!("a join key is not a column of its input");
            };
            let (l, r) = (lf.data_type(), rf.data_type());
            if l != r {
                return plan_err!("key types {l} and {r} are not supported yet");
            }
            types.push(l);
        }
        if types.iter().all(|t| key_type(t).is_some()) {
            return Ok(None);
        }
        if let Some(t) = types.iter().find(|t| !hashable(t)) {
            return plan_err!("key types {t} and {t} are not supported yet");
        }
        let bytes_key = types.len() == 1 && key_check::checkable(types[0]);
        // One word, or as many as a fixed-size key needs.
        let words = match types.first() {
            Some(DataType::FixedSizeBinary(n)) => key_check::words_for(*n as usize).unwrap_or(1),
            _ => 1,
        };
        Ok(Some(Self {
            nulls_equal,
            bytes_key,
            check: if bytes_key { words } else { 0 },
            mask: HASH_MASK,
        }))
    }

    /// The same hashing, keeping only `bits` bits of each hash (at most 62).
    pub fn with_bits(self, bits: u32) -> Self {
        Self {
            mask: (1u64 << bits.min(HASH_BITS)) - 1,
            ..self
        }
    }

    /// Whether a null key equals a null key.
    pub fn nulls_equal(&self) -> bool {
        self.nulls_equal
    }

    /// Whether rows carry check bytes that the device compares (no host verification).
    pub fn checked(&self) -> bool {
        self.check > 0
    }

    /// The words of check bytes rows carry (0 where keys are verified on the host).
    pub fn check_words(&self) -> usize {
        self.check
    }

    /// The same hashing, with every pair verified on the host instead of checked on the device
    /// (for build keys longer than the check bytes).
    pub fn verified_on_host(&self) -> Self {
        self.with_check_words(0)
    }

    /// The same hashing checked on the device with `words` words of check bytes (for build
    /// keys longer than one word).
    pub fn with_check_words(&self, words: usize) -> Self {
        Self {
            check: words,
            ..self.clone()
        }
    }

    /// The hashing an execution switches to if exact keys' value ranges need more than 64
    /// bits: `Some` where the key types' ranges together could (e.g. two `Int64` keys), `None`
    /// where they never can. `on`'s keys must all have exact encodings.
    pub fn for_wide_keys(on: &JoinOn, left: &SchemaRef, nulls_equal: bool) -> Result<Option<Self>> {
        // Encodings a key can take: every value of its type, and the null digit.
        let mut encodings: u128 = 1;
        for (l, _) in key_columns(on)? {
            let Some(t) = left.fields().get(l).and_then(|f| key_type(f.data_type())) else {
                return plan_err!("a join key is not an integer column of its input");
            };
            let span = 1u128
                .checked_shl(t.bytes() as u32 * 8)
                .unwrap_or(u128::MAX)
                .saturating_add(u128::from(nulls_equal));
            encodings = encodings.saturating_mul(span);
        }
        // The encoder's largest code must stay below the all-ones sentinel.
        Ok((encodings >= u64::MAX as u128).then_some(Self {
            nulls_equal,
            bytes_key: false,
            check: 0,
            mask: HASH_MASK,
        }))
    }

    /// The columns the join computes for `batch` over its key columns `keys`: the hash, and
    /// the check bytes if keys are checked (in the order of [`fields`](Self::fields)). Checked
    /// keys hash their check bytes, in one pass with making them.
    pub fn columns(&self, batch: &RecordBatch, keys: &[usize]) -> Result<Vec<ArrayRef>> {
        if !self.checked() {
            return Ok(vec![self.hash(batch, keys)?]);
        }
        let [k] = keys else {
            return plan_err!("checked keys of {} columns", keys.len());
        };
        let key = batch.column(*k);
        let (hashes, check) = key_check::checked(key, self.check, self.mask)?;
        let nulls = (!self.nulls_equal).then(|| key.logical_nulls()).flatten();
        let mut columns: Vec<ArrayRef> = vec![Arc::new(UInt64Array::new(hashes.into(), nulls))];
        columns.extend(check);
        Ok(columns)
    }

    /// The hash column of `batch` over its key columns `keys`: UInt64 values below 2^62, null
    /// where a key is null (unless nulls are equal); for a key of one column of bytes, the low
    /// bits hold the key's length class.
    fn hash(&self, batch: &RecordBatch, keys: &[usize]) -> Result<ArrayRef> {
        let arrays: Vec<&ArrayRef> = keys.iter().map(|&k| batch.column(k)).collect();
        let mut hashes = vec![0u64; batch.num_rows()];
        create_hashes(arrays.iter().copied(), &RandomState::default(), &mut hashes)?;
        for h in &mut hashes {
            *h &= self.mask;
        }
        if let (true, [key]) = (self.bytes_key, arrays.as_slice()) {
            for (h, class) in hashes.iter_mut().zip(key_check::length_classes(key, 1)?) {
                *h = key_check::with_class(*h, class);
            }
        }
        let nulls = match self.nulls_equal {
            true => None,
            false => arrays.iter().fold(None, |acc, a| {
                NullBuffer::union(acc.as_ref(), a.logical_nulls().as_ref())
            }),
        };
        Ok(Arc::new(UInt64Array::new(hashes.into(), nulls)))
    }

    /// Stages checked key column `key` into a block at row `at`: its length classes (a byte a
    /// row, null where the key is, unless nulls are equal) into column `hash` of `layout`, which
    /// the device turns into the hashes [`columns`] makes (`Backend::hash_checked`), and its
    /// words of check bytes into columns `check`, `check + 1`, .... Returns whether a class is
    /// null.
    ///
    /// [`columns`]: Self::columns
    pub fn stage_checked(
        &self,
        key: &ArrayRef,
        layout: &BlockLayout,
        (hash, check): (usize, usize),
        bytes: &mut [u8],
        at: usize,
    ) -> Result<bool> {
        let len = key.len();
        if self.check > key_check::KEY_CHECK_WORDS {
            return internal_err!("{} words of check bytes", self.check);
        }
        // The classes' region, then each word's; the words not carried empty, at the end.
        let end = bytes.len();
        let mut ranges: [Range<usize>; 1 + key_check::KEY_CHECK_WORDS] =
            std::array::from_fn(|_| end..end);
        ranges[0] = values_range(layout, hash, at, len)?;
        for (j, range) in ranges[1..=self.check].iter_mut().enumerate() {
            *range = values_range(layout, check + j, at, len)?;
        }
        let Ok([classes, mut words @ ..]) = bytes.get_disjoint_mut(ranges) else {
            return internal_err!("staged regions overlap or pass the block");
        };
        let mut rows = Vec::with_capacity(self.check);
        for region in words[..self.check].iter_mut() {
            let (words, []) = region.as_chunks_mut::<{ key_check::KEY_CHECK_BYTES }>() else {
                return internal_err!("a check column of another width");
            };
            rows.push(words);
        }
        if classes.len() != len {
            return internal_err!("a length class column of another width");
        }
        key_check::checked_into(key.as_ref(), &mut rows, classes)?;
        let nulls = (!self.nulls_equal).then(|| key.logical_nulls()).flatten();
        stage_validity(layout, hash, bytes, at, len, nulls.as_ref())
    }

    /// The hash bits kept: what the device masks checked keys' hashes with.
    pub fn mask(&self) -> u64 {
        self.mask
    }

    /// The least and greatest hash a checked key can have (what its build side's hashes span,
    /// without reading them).
    pub fn checked_range(&self) -> (u64, u64) {
        (0, self.mask | key_check::CLASS_MASK)
    }

    /// The fields of the columns [`columns`](Self::columns) computes: the hash, and the check
    /// bytes if keys are checked.
    pub fn fields(&self) -> Vec<Field> {
        let mut fields = vec![Field::new("__key_hash", DataType::UInt64, true)];
        fields.extend((0..self.check).map(|j| {
            let name = match j {
                0 => "__key_check".to_string(),
                j => format!("__key_check{j}"),
            };
            Field::new(
                name,
                DataType::FixedSizeBinary(key_check::KEY_CHECK_BYTES as i32),
                false,
            )
        }));
        fields
    }

    /// The key equalities of `on` and `filter` (if any), in that order, as one residual filter:
    /// what decides a candidate pair of equal hashes (`filter` is evaluated only over the
    /// pairs whose keys are equal, as DataFusion's join evaluates it: `Residual`).
    pub fn verification(
        &self,
        on: &JoinOn,
        filter: Option<&JoinFilter>,
        left: &SchemaRef,
        right: &SchemaRef,
    ) -> Result<JoinFilter> {
        let (user, mut indices, mut fields) = match filter {
            Some(f) => (
                Some(Arc::clone(f.expression())),
                f.column_indices().to_vec(),
                f.schema()
                    .fields()
                    .iter()
                    .map(|f| f.as_ref().clone())
                    .collect(),
            ),
            None => (None, vec![], vec![]),
        };
        let mut expr: Option<Arc<dyn PhysicalExpr>> = None;
        let op = match self.nulls_equal {
            true => Operator::IsNotDistinctFrom,
            false => Operator::Eq,
        };
        for (k, (l, r)) in key_columns(on)?.into_iter().enumerate() {
            let mut side = |side: JoinSide, index: usize, field: &Field, name: String| {
                indices.push(ColumnIndex { index, side });
                fields.push(field.clone().with_name(name.clone()));
                Arc::new(Column::new(&name, fields.len() - 1)) as Arc<dyn PhysicalExpr>
            };
            let a = side(JoinSide::Left, l, left.field(l), format!("__key_left_{k}"));
            let b = side(
                JoinSide::Right,
                r,
                right.field(r),
                format!("__key_right_{k}"),
            );
            let eq: Arc<dyn PhysicalExpr> = Arc::new(BinaryExpr::new(a, op, b));
            expr = Some(match expr {
                Some(e) => Arc::new(BinaryExpr::new(e, Operator::And, eq)),
                None => eq,
            });
        }
        let Some(keys) = expr else {
            return plan_err!("a hashed join without keys");
        };
        let expr = match user {
            Some(user) => Arc::new(BinaryExpr::new(keys, Operator::And, user)),
            None => keys,
        };
        Ok(JoinFilter::new(
            expr,
            indices,
            Arc::new(Schema::new(fields)),
        ))
    }
}

/// The column pairs of `on`.
pub fn key_columns(on: &JoinOn) -> Result<Vec<(usize, usize)>> {
    on.iter()
        .map(
            |(l, r)| match (l.downcast_ref::<Column>(), r.downcast_ref::<Column>()) {
                (Some(l), Some(r)) => Ok((l.index(), r.index())),
                _ => plan_err!("join keys must be plain columns"),
            },
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `ON k = k`, for schemas whose first column is `k`.
    fn on_k() -> JoinOn {
        let k = Arc::new(Column::new("k", 0)) as Arc<dyn PhysicalExpr>;
        vec![(Arc::clone(&k), k)]
    }
    use arrow::array::{AsArray, StringArray};
    use arrow::datatypes::UInt64Type;

    #[test]
    fn equal_keys_hash_equal_across_batches_and_nulls_follow_null_equality() {
        let a: ArrayRef = Arc::new(StringArray::from(vec![
            Some("x"),
            None,
            Some("long string!"),
        ]));
        let b: ArrayRef = Arc::new(StringArray::from(vec![Some("long string!"), Some("x")]));
        let one = RecordBatch::try_from_iter([("k", a)]).unwrap();
        let two = RecordBatch::try_from_iter([("k", b)]).unwrap();
        let h = KeyHash {
            nulls_equal: false,
            bytes_key: false,
            check: 0,
            mask: HASH_MASK,
        };
        let (x, y) = (h.hash(&one, &[0]).unwrap(), h.hash(&two, &[0]).unwrap());
        let (x, y) = (
            x.as_primitive::<UInt64Type>(),
            y.as_primitive::<UInt64Type>(),
        );
        assert_eq!((x.value(0), x.value(2)), (y.value(1), y.value(0)));
        assert!(x.is_null(1) && x.values().iter().all(|v| *v <= HASH_MASK));
        let equal = KeyHash {
            nulls_equal: true,
            ..h
        }
        .hash(&one, &[0])
        .unwrap();
        assert_eq!(equal.null_count(), 0);
    }

    #[test]
    fn a_bytes_key_hash_holds_its_length_class_and_rows_carry_check_bytes() {
        let s = Arc::new(Schema::new(vec![Field::new("k", DataType::Utf8View, true)]));
        let on = on_k();
        let h = KeyHash::plan(&on, &s, &s, true).unwrap().unwrap();
        assert!(h.checked() && !h.verified_on_host().checked());
        let keys: ArrayRef = Arc::new(arrow::array::StringViewArray::from(vec![
            Some("abc"),
            None,
            Some("a key longer than sixteen bytes"),
        ]));
        let batch = RecordBatch::try_new(Arc::clone(&s), vec![keys]).unwrap();
        let columns = h.columns(&batch, &[0]).unwrap();
        assert_eq!(columns.len(), h.fields().len());
        let hash = columns[0].as_primitive::<UInt64Type>();
        let low = key_check::CLASS_MASK;
        assert_eq!(hash.value(0) & low, 3);
        assert_eq!(hash.value(1) & low, key_check::NULL_CLASS);
        assert_eq!(hash.value(2) & low, key_check::LONG_CLASS);
        assert_eq!(
            columns[1].as_fixed_size_binary().value(0),
            b"abc\0\0\0\0\0\0\0\0\0\0\0\0\0"
        );
        assert_eq!(key_check::longest_key(batch.column(0)).unwrap(), 31);
        // The host-verified twin hashes whole keys, with the same length classes, and makes
        // no check bytes.
        let twin = h.verified_on_host().columns(&batch, &[0]).unwrap();
        let twin_hash = twin[0].as_primitive::<UInt64Type>();
        assert_eq!(twin.len(), 1);
        assert!((0..3).all(|i| twin_hash.value(i) & low == hash.value(i) & low));
    }

    #[test]
    fn checked_keys_staged_in_place_hash_on_a_backend_to_the_columns_they_stand_for() {
        use crate::backend::{Backend, HostBackend};
        use crate::columns::{BlockLayout, ColumnKind, block_arrays};
        let s = Arc::new(Schema::new(vec![Field::new("k", DataType::Utf8, true)]));
        let keys: ArrayRef = Arc::new(arrow::array::StringArray::from(vec![
            Some("skipped"),
            Some("abc"),
            None,
            Some("sixteen bytes..."),
            Some(""),
            Some("123e4567-e89b-12d3-a456-426614174000"),
        ]));
        let keys = keys.slice(1, 5);
        for (nulls_equal, words) in [(false, 1), (true, 1), (false, 3), (true, 4)] {
            let h = KeyHash::plan(&on_k(), &s, &s, nulls_equal)
                .unwrap()
                .unwrap()
                .with_bits(40)
                .with_check_words(words);
            let batch = RecordBatch::try_new(Arc::clone(&s), vec![Arc::clone(&keys)]).unwrap();
            let want = h.columns(&batch, &[0]).unwrap();
            assert_eq!(want.len(), 1 + words);
            let kinds = std::iter::once((ColumnKind::Fixed(1), true))
                .chain(std::iter::repeat_n((ColumnKind::Fixed(16), false), words));
            let layout = BlockLayout::new(kinds, 8);
            let mut block = arrow::buffer::MutableBuffer::from_len_zeroed(layout.bytes);
            // Whatever a reused block held: check bytes and classes are written whole.
            block.as_slice_mut().fill(0xA5);
            crate::columns::clear_bitmaps(&layout, block.as_slice_mut());
            let nulls = h
                .stage_checked(&keys, &layout, (0, 1), block.as_slice_mut(), 3)
                .unwrap();
            assert_eq!(nulls, !nulls_equal);
            let block = arrow::buffer::Buffer::from(block);
            let types: Vec<DataType> = want.iter().map(|w| w.data_type().clone()).collect();
            let types: Vec<&DataType> = std::iter::once(&DataType::UInt8)
                .chain(types.iter().skip(1))
                .collect();
            let nulls_of: Vec<bool> = std::iter::once(nulls)
                .chain(std::iter::repeat_n(false, words))
                .collect();
            let got = block_arrays(&layout, &block, &nulls_of, &types, 3, 5).unwrap();
            assert_eq!(&got[1..], &want[1..]);
            assert_eq!(got[0].logical_nulls(), want[0].logical_nulls());
            // The backend's hashes of the staged classes and check bytes are the reference's.
            let b = HostBackend::default();
            let check: Vec<_> = (got[1..].iter())
                .map(|w| b.upload(w.to_data().buffers()[0].as_slice()).unwrap())
                .collect();
            let classes = b.upload(got[0].to_data().buffers()[0].as_slice()).unwrap();
            let check: Vec<_> = check.iter().collect();
            let hashes = b.hash_checked(&check, &classes, 5, h.mask()).unwrap();
            let mut out = vec![0u8; 40];
            b.download(&hashes, &mut out).unwrap();
            let want_hashes: Vec<u8> = want[0]
                .as_primitive::<UInt64Type>()
                .values()
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect();
            assert_eq!(out, want_hashes);
        }
    }

    #[test]
    fn plans_hashing_only_where_keys_need_it() {
        let schema = |dt: DataType| Arc::new(Schema::new(vec![Field::new("k", dt, true)]));
        let on = on_k();
        let plan = |l: DataType, r: DataType| KeyHash::plan(&on, &schema(l), &schema(r), false);
        assert!(plan(DataType::Int64, DataType::Int64).unwrap().is_none());
        assert!(
            plan(DataType::Utf8View, DataType::Utf8View)
                .unwrap()
                .is_some()
        );
        // Floats, decimals of 4, 8 and 16 bytes, times, durations and booleans are encoded exactly.
        for exact in [
            DataType::Float32,
            DataType::Float64,
            DataType::Decimal64(10, 2),
            DataType::Decimal128(20, 2),
            DataType::Time32(arrow::datatypes::TimeUnit::Second),
            DataType::Duration(arrow::datatypes::TimeUnit::Nanosecond),
            DataType::Boolean,
        ] {
            assert!(plan(exact.clone(), exact).unwrap().is_none());
        }
        assert!(
            plan(DataType::Decimal256(40, 2), DataType::Decimal256(40, 2))
                .unwrap()
                .is_some()
        );
        assert!(plan(DataType::Utf8, DataType::Utf8View).is_err());
        assert!(plan(DataType::Int32, DataType::Int64).is_err());
    }

    #[test]
    fn wide_key_hashing_is_planned_where_exact_ranges_could_exceed_64_bits() {
        let schema = |types: &[DataType]| {
            Arc::new(Schema::new(
                types
                    .iter()
                    .enumerate()
                    .map(|(i, t)| Field::new(format!("k{i}"), t.clone(), true))
                    .collect::<Vec<_>>(),
            ))
        };
        let on = |n: usize| -> JoinOn {
            (0..n)
                .map(|i| {
                    let c = Arc::new(Column::new(&format!("k{i}"), i)) as Arc<dyn PhysicalExpr>;
                    (Arc::clone(&c), c)
                })
                .collect()
        };
        let wide = |types: &[DataType], nulls_equal| {
            KeyHash::for_wide_keys(&on(types.len()), &schema(types), nulls_equal)
                .unwrap()
                .is_some()
        };
        use DataType::*;
        assert!(wide(&[Int64], false));
        assert!(!wide(&[UInt32], true));
        assert!(wide(&[Int64], true));
        assert!(!wide(&[Int32, Int16], true));
        assert!(wide(&[Int32, Int32], false));
        assert!(wide(&[Int64, Int8], false));
        assert!(wide(&[Decimal128(20, 2)], false));
        assert!(KeyHash::for_wide_keys(&on(1), &schema(&[Utf8]), false).is_err());
    }

    #[test]
    fn verification_adds_the_key_equalities_to_the_filter() {
        let s = Arc::new(Schema::new(vec![Field::new("k", DataType::Utf8, true)]));
        let on = on_k();
        let f = KeyHash::plan(&on, &s, &s, true)
            .unwrap()
            .unwrap()
            .verification(&on, None, &s, &s)
            .unwrap();
        assert_eq!(
            f.expression().to_string(),
            "__key_left_0@0 IS NOT DISTINCT FROM __key_right_0@1"
        );
        assert_eq!(f.column_indices().len(), 2);
    }
}
