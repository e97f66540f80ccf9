//! The relations the library-level join tests (`exchange`, `sort_merge`) join, R ⋈ S on `k`
//! with output R.a and S.b, and what that join gives, counted with a hash map.

use std::collections::HashMap;
use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray, Int32Array, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Int32Type, Int64Type, Schema};

use crate::rng::Rng;

/// A relation of `rows` rows: a nullable Int64 key `k` (about one in eight null where `nulls`;
/// `spacing` times a value in `0..keys`, plus `shift`), an Int32 payload `a` and an Int64
/// payload `b`.
pub fn relation(
    rng: &mut Rng,
    rows: usize,
    keys: u64,
    nulls: bool,
    spacing: i64,
    shift: i64,
) -> RecordBatch {
    let k: Int64Array = (0..rows)
        .map(|_| (!(nulls && rng.chance(0.125))).then(|| rng.below(keys) as i64 * spacing + shift))
        .collect();
    let a: Int32Array = (0..rows).map(|_| rng.below(1000) as i32).collect();
    let b: Int64Array = (0..rows).map(|_| rng.next_u64() as i64 >> 8).collect();
    let schema = Schema::new(vec![
        Field::new("k", DataType::Int64, true),
        Field::new("a", DataType::Int32, false),
        Field::new("b", DataType::Int64, false),
    ]);
    let columns: Vec<ArrayRef> = vec![Arc::new(k), Arc::new(a), Arc::new(b)];
    RecordBatch::try_new(Arc::new(schema), columns).expect("batch")
}

/// Rows, and the sum of R.a + S.b, of joined output (columns R.a, S.b).
pub fn totals(batches: &[RecordBatch]) -> (usize, i128) {
    let mut rows = 0;
    let mut sum = 0i128;
    for batch in batches {
        rows += batch.num_rows();
        let a = batch.column(0).as_primitive::<Int32Type>();
        let sb = batch.column(1).as_primitive::<Int64Type>();
        sum += (0..batch.num_rows())
            .map(|i| i128::from(a.value(i)) + i128::from(sb.value(i)))
            .sum::<i128>();
    }
    (rows, sum)
}

/// The inner join R ⋈ S on k (nulls never match) counted with a hash map: rows, and the sum of
/// R.a + S.b.
pub fn expected_join(r: &[RecordBatch], s: &[RecordBatch]) -> (usize, i128) {
    let mut build: HashMap<i64, (usize, i128)> = HashMap::new();
    for batch in r {
        let k = batch.column(0).as_primitive::<Int64Type>();
        let a = batch.column(1).as_primitive::<Int32Type>();
        for i in (0..batch.num_rows()).filter(|&i| k.is_valid(i)) {
            let e = build.entry(k.value(i)).or_default();
            e.0 += 1;
            e.1 += i128::from(a.value(i));
        }
    }
    let (mut rows, mut sum) = (0, 0i128);
    for batch in s {
        let k = batch.column(0).as_primitive::<Int64Type>();
        let b = batch.column(2).as_primitive::<Int64Type>();
        for i in (0..batch.num_rows()).filter(|&i| k.is_valid(i)) {
            if let Some(&(n, a_sum)) = build.get(&k.value(i)) {
                rows += n;
                sum += a_sum + n as i128 * i128::from(b.value(i));
            }
        }
    }
    (rows, sum)
}
