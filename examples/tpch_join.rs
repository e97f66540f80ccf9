//! TPC-H tables generated in memory, one join query through SQL on the GPU (or its host twin),
//! and the same query on DataFusion's CPU hash join for comparison.
//!
//! ```text
//! cargo run --release --example tpch_join -- [--scale SF] [--backend auto|cuda|host]
//! ```

use std::sync::Arc;
use std::time::Instant;

use arrow::array::RecordBatch;
use arrow::util::pretty::pretty_format_batches;
use datafusion::common::Result;
use datafusion::datasource::MemTable;
use datafusion::physical_plan::displayable;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpu_join::{GpuJoinConfig, gpu_session_context};
use tpchgen::generators::{CustomerGenerator, LineItemGenerator, OrderGenerator};
use tpchgen_arrow::{CustomerArrow, LineItemArrow, OrderArrow};

const QUERY: &str = "SELECT c_nationkey, count(*) AS lineitems, sum(l_extendedprice) AS revenue \
                     FROM customer JOIN orders ON c_custkey = o_custkey \
                     JOIN lineitem ON o_orderkey = l_orderkey \
                     GROUP BY c_nationkey ORDER BY c_nationkey";

fn arg(name: &str, default: &str) -> String {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
        .unwrap_or_else(|| default.to_string())
}

fn register(ctx: &SessionContext, name: &str, batches: Vec<RecordBatch>) -> Result<()> {
    let schema = batches[0].schema();
    ctx.register_table(name, Arc::new(MemTable::try_new(schema, vec![batches])?))?;
    Ok(())
}

/// Prints the plan, runs the query once to warm up (kernel compilation, pinned buffers), then
/// times a second run.
async fn run(ctx: &SessionContext, label: &str) -> Result<Vec<RecordBatch>> {
    let df = ctx.sql(QUERY).await?;
    let plan = df.clone().create_physical_plan().await?;
    println!(
        "-- {label}: physical plan\n{}",
        displayable(plan.as_ref()).indent(false)
    );
    df.collect().await?;
    let start = Instant::now();
    let out = ctx.sql(QUERY).await?.collect().await?;
    println!(
        "-- {label}: {:.3} s (second run)\n",
        start.elapsed().as_secs_f64()
    );
    Ok(out)
}

#[tokio::main]
async fn main() -> Result<()> {
    let scale: f64 = arg("--scale", "0.1").parse().unwrap_or(0.1);
    let mut gpu = GpuJoinConfig::default();
    gpu.backend = arg("--backend", "auto").parse()?;
    // Put every eligible join on the GPU path, however small its build side: this example
    // shows the path; by default joins with small build sides stay on the faster CPU join.
    gpu.min_build_rows = 0;
    let config = SessionConfig::new().with_option_extension(gpu);
    let ctx = gpu_session_context(config);
    println!("generating TPC-H scale factor {scale} in memory");
    let t = Instant::now();
    register(
        &ctx,
        "customer",
        CustomerArrow::new(CustomerGenerator::new(scale, 1, 1))
            .collect::<std::result::Result<Vec<_>, _>>()?,
    )?;
    register(
        &ctx,
        "orders",
        OrderArrow::new(OrderGenerator::new(scale, 1, 1))
            .collect::<std::result::Result<Vec<_>, _>>()?,
    )?;
    register(
        &ctx,
        "lineitem",
        LineItemArrow::new(LineItemGenerator::new(scale, 1, 1))
            .collect::<std::result::Result<Vec<_>, _>>()?,
    )?;
    println!("generated in {:.1} s\n", t.elapsed().as_secs_f64());

    let on = run(&ctx, "gpu_join on").await?;
    ctx.sql("SET gpu_join.enabled = false")
        .await?
        .collect()
        .await?;
    let off = run(&ctx, "gpu_join off (DataFusion HashJoinExec)").await?;
    println!("{}", pretty_format_batches(&on)?);
    let same = pretty_format_batches(&on)?.to_string() == pretty_format_batches(&off)?.to_string();
    println!("results equal with the rule on and off: {same}");
    if !same {
        return Err(datafusion::common::DataFusionError::Execution(
            "results differ".into(),
        ));
    }
    Ok(())
}
