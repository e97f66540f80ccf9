//! Compiled filters against DataFusion's own evaluation: every pair of a small build and probe
//! side, with nulls, NaN, -0.0 and the integer extremes, through SQL filters over both sides.

use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, Date32Array, Decimal128Array, Float32Array,
    Float64Array, Int16Array, Int32Array, Int64Array, RecordBatch, UInt8Array,
};
use arrow::compute::take;
use arrow::datatypes::{DataType, Field, Schema};
use datafusion::common::{DFSchema, JoinSide};
use datafusion::physical_plan::joins::utils::{ColumnIndex, JoinFilter};
use datafusion::prelude::SessionContext;
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};

use super::{FilterColumn, compile};

const ROWS: usize = 40;

/// One side's columns: `{prefix}_{type}`, random values with nulls and edge cases.
fn side(prefix: &str, rng: &mut SmallRng) -> RecordBatch {
    let null = |rng: &mut SmallRng| rng.random_ratio(1, 6);
    let pick = |rng: &mut SmallRng, edges: &[i64]| -> i64 {
        match rng.random_range(0..4) {
            0 => edges[rng.random_range(0..edges.len())],
            _ => rng.random_range(-20..20),
        }
    };
    let i64s: Vec<Option<i64>> = (0..ROWS)
        .map(|_| (!null(rng)).then(|| pick(rng, &[i64::MIN, i64::MAX, -1, 0])))
        .collect();
    let i32s: Vec<Option<i32>> = (0..ROWS)
        .map(|_| (!null(rng)).then(|| pick(rng, &[i32::MIN as i64, i32::MAX as i64]) as i32))
        .collect();
    let i16s: Vec<Option<i16>> = (0..ROWS)
        .map(|_| (!null(rng)).then(|| pick(rng, &[i16::MIN as i64, i16::MAX as i64]) as i16))
        .collect();
    let u8s: Vec<Option<u8>> = (0..ROWS)
        .map(|_| (!null(rng)).then(|| rng.random_range(0..=255u8)))
        .collect();
    let floats = [f64::NAN, -0.0, 0.0, f64::INFINITY, f64::NEG_INFINITY, 1e300];
    let f64s: Vec<Option<f64>> = (0..ROWS)
        .map(|_| {
            (!null(rng)).then(|| match rng.random_range(0..3) {
                0 => floats[rng.random_range(0..floats.len())],
                _ => rng.random_range(-8..8) as f64 / 4.0,
            })
        })
        .collect();
    let f32s: Vec<Option<f32>> = f64s.iter().map(|v| v.map(|v| v as f32 * 1.5)).collect();
    let bools: Vec<Option<bool>> = (0..ROWS)
        .map(|_| (!null(rng)).then(|| rng.random()))
        .collect();
    let decs: Vec<Option<i128>> = (0..ROWS)
        .map(|_| (!null(rng)).then(|| pick(rng, &[i64::MAX]) as i128 * 1_000_003))
        .collect();
    let dates: Vec<Option<i32>> = i32s.iter().map(|v| v.map(|v| v % 1000)).collect();
    let columns: Vec<(&str, ArrayRef)> = vec![
        ("i64", Arc::new(Int64Array::from(i64s))),
        ("i32", Arc::new(Int32Array::from(i32s))),
        ("i16", Arc::new(Int16Array::from(i16s))),
        ("u8", Arc::new(UInt8Array::from(u8s))),
        ("f64", Arc::new(Float64Array::from(f64s))),
        ("f32", Arc::new(Float32Array::from(f32s))),
        ("bool", Arc::new(BooleanArray::from(bools))),
        (
            "dec",
            Arc::new(
                Decimal128Array::from(decs)
                    .with_precision_and_scale(38, 3)
                    .unwrap(),
            ),
        ),
        ("date", Arc::new(Date32Array::from(dates))),
        (
            "s",
            Arc::new(arrow::array::StringArray::from(vec!["x"; ROWS])),
        ),
    ];
    let fields: Vec<Field> = columns
        .iter()
        .map(|(n, a)| Field::new(format!("{prefix}_{n}"), a.data_type().clone(), true))
        .collect();
    let arrays = columns.into_iter().map(|(_, a)| a).collect();
    RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).unwrap()
}

/// A column as the device holds it: values (booleans a byte each) and a validity byte per row.
fn device_bytes(a: &ArrayRef) -> (Vec<u8>, Option<Vec<u8>>) {
    let values = match a.data_type() {
        DataType::Boolean => a.as_boolean().values().iter().map(u8::from).collect(),
        _ => {
            let data = a.to_data();
            let w = a.data_type().primitive_width().unwrap();
            data.buffers()[0].as_slice()[data.offset() * w..(data.offset() + a.len()) * w].to_vec()
        }
    };
    let validity = a
        .logical_nulls()
        .map(|n| n.iter().map(u8::from).collect::<Vec<u8>>());
    (values, validity)
}

/// The filter's view of columns held as [`device_bytes`].
fn view(b: &[(Vec<u8>, Option<Vec<u8>>)]) -> Vec<FilterColumn<'_>> {
    b.iter()
        .map(|(v, n)| FilterColumn {
            values: v,
            validity: n.as_deref(),
        })
        .collect()
}

/// Compiles `sql` (over columns `l_*` and `r_*`) as a join filter; `Err`: why not.
fn check(ctx: &SessionContext, sql: &str, l: &RecordBatch, r: &RecordBatch) -> Result<(), String> {
    // The intermediate schema: every column of both sides.
    let mut fields: Vec<Field> = vec![];
    let mut indices = vec![];
    for (batch, side) in [(l, JoinSide::Left), (r, JoinSide::Right)] {
        for (i, f) in batch.schema().fields().iter().enumerate() {
            fields.push(f.as_ref().clone());
            indices.push(ColumnIndex { index: i, side });
        }
    }
    let schema = Arc::new(Schema::new(fields));
    let df_schema = DFSchema::try_from(Arc::clone(&schema)).unwrap();
    let expr = ctx.parse_sql_expr(sql, &df_schema).unwrap();
    let physical = ctx.create_physical_expr(expr, &df_schema).unwrap();
    let filter = JoinFilter::new(Arc::clone(&physical), indices, Arc::clone(&schema));
    let compiled = compile(&filter)?;
    // Every pair: build row i (of l), probe row j (of r), in one intermediate batch.
    let (li, ri): (Vec<u32>, Vec<u32>) = (0..ROWS as u32)
        .flat_map(|i| (0..ROWS as u32).map(move |j| (i, j)))
        .unzip();
    let (li, ri) = (
        arrow::array::UInt32Array::from(li),
        arrow::array::UInt32Array::from(ri),
    );
    let mut arrays: Vec<ArrayRef> = l
        .columns()
        .iter()
        .map(|a| take(a, &li, None).unwrap())
        .collect();
    arrays.extend(r.columns().iter().map(|a| take(a, &ri, None).unwrap()));
    let pairs = RecordBatch::try_new(schema, arrays).unwrap();
    let expected = physical
        .evaluate(&pairs)
        .unwrap()
        .into_array(pairs.num_rows())
        .unwrap();
    let expected = expected.as_boolean();
    let bytes = |batch: &RecordBatch, columns: &[(usize, super::Ty)]| {
        columns
            .iter()
            .map(|&(c, _)| device_bytes(batch.column(c)))
            .collect::<Vec<_>>()
    };
    let (lb, rb) = (
        bytes(l, &compiled.build_columns),
        bytes(r, &compiled.probe_columns),
    );
    let (lv, rv) = (view(&lb), view(&rb));
    for p in 0..pairs.num_rows() {
        let (i, j) = (p / ROWS, p % ROWS);
        let want = expected.is_valid(p) && expected.value(p);
        let got = compiled.eval(&lv, &rv, i, j);
        if got != want {
            let row = pairs.slice(p, 1);
            let shown = arrow::util::pretty::pretty_format_batches(&[row]).unwrap();
            panic!(
                "{sql}: build row {i}, probe row {j}: compiled {got}, DataFusion {want}\n{shown}"
            );
        }
    }
    Ok(())
}

#[test]
fn compiled_filters_equal_datafusion() {
    let ctx = SessionContext::new();
    let mut rng = SmallRng::seed_from_u64(7);
    let compiled = [
        "l_i32 < r_i32 + 1",
        "l_i64 * r_i64 > l_i64 - r_i64",
        "-l_i64 < r_i64 / 7",
        "l_i16 % 3 <> r_i16 % -2",
        "(l_f64 * 2.0 >= r_f64 OR r_i64 IS NULL)",
        "l_f64 = r_f64",
        "l_f32 / r_f32 > 1 AND l_f32 - r_f32 <= 0.5",
        "l_f64 + r_f64 < l_f64 * r_f64",
        "NOT (l_bool AND r_bool)",
        "l_bool < r_bool OR l_bool IS NOT NULL",
        "CASE WHEN l_i16 > 0 THEN r_f64 > 0 ELSE l_u8 BETWEEN 10 AND 200 END",
        "CASE l_i16 WHEN 1 THEN r_i32 WHEN 2 THEN NULL ELSE l_i32 END > 0",
        "CAST(l_i32 AS BIGINT) IN (1, 2, 3, r_i64)",
        "r_i32 NOT IN (1, NULL, l_i32)",
        "CAST(l_u8 AS DOUBLE) > r_f64",
        "l_dec > r_dec OR l_dec = 3",
        "l_date < r_date",
        "l_i64 + r_i32 > 0",
        "l_bool IS DISTINCT FROM r_bool",
        "(l_f64 IS NOT DISTINCT FROM r_f64) OR (l_i16 IS DISTINCT FROM r_i16)",
        "l_u8 + r_u8 > 100",
    ];
    for sql in compiled {
        for _ in 0..3 {
            let (l, r) = (side("l", &mut rng), side("r", &mut rng));
            check(&ctx, sql, &l, &r).unwrap_or_else(|e| panic!("{sql} did not compile: {e}"));
        }
    }
    let (l, r) = (side("l", &mut rng), side("r", &mut rng));
    for sql in [
        "l_i32 / r_i32 > 1",
        "l_i32 % 0 = 1",
        "CAST(l_f64 AS INT) > 1",
        "CAST(l_i64 AS INT) > 1",
        "l_s < r_s",
        "l_dec + r_dec > 0",
    ] {
        assert!(check(&ctx, sql, &l, &r).is_err(), "{sql} compiled");
    }
}
