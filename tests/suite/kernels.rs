//! Every kernel file compiles under NVRTC for sm_80 and sm_90, and so does the bucket probe with
//! compiled residual filters that use every node and value type. Needs libnvrtc and the CUDA
//! headers (see `GPU_JOIN_CUDA_INCLUDE`), not a GPU; CI sets `GPU_JOIN_REQUIRE_NVRTC=1`.

use std::sync::Arc;

use arrow::datatypes::{DataType, Field, Schema, TimeUnit};
use datafusion::common::{DFSchema, JoinSide, Result};
use datafusion::physical_plan::joins::utils::{ColumnIndex, JoinFilter};
use datafusion::prelude::SessionContext;
use datafusion_gpu_join::device::{compile_filter_for_arch, compile_kernels_for_arch};
use datafusion_gpu_join::filter::{PairFilter, compile};

use crate::harness::{Outcome, Suite};

/// Filters over `l_*` (build) and `r_*` (probe) columns that use, together, every node and
/// value type of a compiled filter.
const FILTERS: &[&str] = &[
    "(l_i8 + r_i8 > 0 AND l_i16 - r_i16 < 0 AND l_i32 * r_i32 <> 0 OR NOT (l_i64 / 3 = r_i64 % 5)) \
     AND (l_u8 < r_u8 OR l_u16 <= r_u16 OR l_u32 >= r_u32 OR l_u64 = r_u64 \
     OR (l_i8 IS DISTINCT FROM r_i8) OR (l_i32 IS NOT DISTINCT FROM r_i32))",
    "(l_f32 / r_f32 > 0.5 OR -l_f64 % r_f64 < 1.0 OR l_f64 + r_f64 > l_f64 - r_f64) \
     AND (l_bool IS NULL OR r_bool IS NOT NULL) \
     AND CASE WHEN l_dec > r_dec THEN l_date < r_date WHEN r_bool THEN NULL ELSE l_ts >= r_ts END \
     AND CAST(l_i16 AS BIGINT) NOT IN (1, r_i64) AND CAST(l_i16 AS DOUBLE) > r_f64",
];

fn types() -> Vec<(&'static str, DataType)> {
    vec![
        ("i8", DataType::Int8),
        ("i16", DataType::Int16),
        ("i32", DataType::Int32),
        ("i64", DataType::Int64),
        ("u8", DataType::UInt8),
        ("u16", DataType::UInt16),
        ("u32", DataType::UInt32),
        ("u64", DataType::UInt64),
        ("f32", DataType::Float32),
        ("f64", DataType::Float64),
        ("bool", DataType::Boolean),
        ("dec", DataType::Decimal128(30, 2)),
        ("date", DataType::Date32),
        ("ts", DataType::Timestamp(TimeUnit::Microsecond, None)),
    ]
}

/// `sql` compiled as the filter of a join of two sides with a column of every type.
fn compiled(sql: &str) -> Result<PairFilter> {
    let types = types();
    compiled_over(sql, &types, &types)
}

/// `sql` compiled as the filter of a join whose left (build) side has columns `l_{name}` and
/// right (probe) side `r_{name}`, of the types given.
pub fn compiled_over(
    sql: &str,
    left: &[(&str, DataType)],
    right: &[(&str, DataType)],
) -> Result<PairFilter> {
    let mut fields = vec![];
    let mut indices = vec![];
    for (prefix, side, columns) in [("l", JoinSide::Left, left), ("r", JoinSide::Right, right)] {
        for (index, (name, dt)) in columns.iter().enumerate() {
            fields.push(Field::new(format!("{prefix}_{name}"), dt.clone(), true));
            indices.push(ColumnIndex { index, side });
        }
    }
    let schema = Arc::new(Schema::new(fields));
    let df_schema = DFSchema::try_from(Arc::clone(&schema))?;
    let ctx = SessionContext::new();
    let expr = ctx.create_physical_expr(ctx.parse_sql_expr(sql, &df_schema)?, &df_schema)?;
    compile(&JoinFilter::new(expr, indices, schema))
        .map_err(|e| datafusion::common::DataFusionError::Plan(format!("{sql}: {e}")))
}

pub fn register(suite: &mut Suite) {
    for arch in ["compute_80", "compute_90"] {
        suite.add(format!("kernels::compile_{arch}"), move || {
            nvrtc_outcome(compile_kernels_for_arch(arch).and_then(|()| {
                for sql in FILTERS {
                    compile_filter_for_arch(&compiled(sql)?, arch)?;
                }
                Ok(())
            }))
        });
    }
}

/// Passed, or skipped where libnvrtc is missing and not required.
fn nvrtc_outcome(result: Result<()>) -> std::result::Result<Outcome, String> {
    let required = std::env::var("GPU_JOIN_REQUIRE_NVRTC").is_ok_and(|v| v == "1");
    match result {
        Ok(()) => Ok(Outcome::Passed),
        Err(e) if !required && e.to_string().contains("libnvrtc could not be loaded") => {
            Ok(Outcome::Skipped("no libnvrtc on this machine".into()))
        }
        Err(e) => Err(e.to_string()),
    }
}
