//! TPC-H: the eight tables generated in memory with `tpchgen-arrow` (one partition per core),
//! the 22 queries (`tpch/qNN.sql`) with the rule on and off; each pair of results must hold the
//! same rows, and a mismatch fails the run. Reports the time per query, the total, the
//! speed-up, and how many joins ran on the GPU. `--tpch-sort-merge` turns DataFusion's
//! `prefer_hash_join` off in both sessions, so that it plans sort-merge joins. `--tpch-cache`
//! keeps build sides across the rule-on session's queries (`gpu_join.cache_bytes`) and times
//! each query's first run (cache emptied) against its repeated runs.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use arrow::error::ArrowError;
use datafusion::common::{DataFusionError, Result};
use datafusion::datasource::MemTable;
use datafusion::physical_plan::{ExecutionPlan, displayable};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpu_join::{GpuJoinConfig, gpu_session_context};
use serde_json::json;
use tpchgen::generators::{
    CustomerGenerator, LineItemGenerator, NationGenerator, OrderGenerator, PartGenerator,
    PartSuppGenerator, RegionGenerator, SupplierGenerator,
};
use tpchgen_arrow::{
    CustomerArrow, LineItemArrow, NationArrow, OrderArrow, PartArrow, PartSuppArrow, RegionArrow,
    SupplierArrow,
};

use crate::Device;
use crate::args::Args;
use crate::report::{Report, progress};
use crate::sql::{Timed, count, rows, run_timed_in_turn, sum_metric};

const QUERIES: [&str; 22] = [
    include_str!("tpch/q01.sql"),
    include_str!("tpch/q02.sql"),
    include_str!("tpch/q03.sql"),
    include_str!("tpch/q04.sql"),
    include_str!("tpch/q05.sql"),
    include_str!("tpch/q06.sql"),
    include_str!("tpch/q07.sql"),
    include_str!("tpch/q08.sql"),
    include_str!("tpch/q09.sql"),
    include_str!("tpch/q10.sql"),
    include_str!("tpch/q11.sql"),
    include_str!("tpch/q12.sql"),
    include_str!("tpch/q13.sql"),
    include_str!("tpch/q14.sql"),
    include_str!("tpch/q15.sql"),
    include_str!("tpch/q16.sql"),
    include_str!("tpch/q17.sql"),
    include_str!("tpch/q18.sql"),
    include_str!("tpch/q19.sql"),
    include_str!("tpch/q20.sql"),
    include_str!("tpch/q21.sql"),
    include_str!("tpch/q22.sql"),
];

/// The median time of `sql` in `ctx` with the session's build cache emptied before each of
/// `runs` runs, after one such run untimed (the build sides of the last are kept after; a join
/// may still hit within a run, where the query builds on the same input twice), and each run's
/// rows.
async fn first_runs(
    ctx: &SessionContext,
    sql: &str,
    runs: usize,
) -> Result<(Duration, Vec<Vec<String>>)> {
    let cache = datafusion_gpu_join::build_cache(ctx.state().config())
        .ok_or_else(|| DataFusionError::Internal("the session has no build cache".into()))?;
    let (mut times, mut answers) = (vec![], vec![]);
    for run in 0..=runs {
        cache.clear();
        let start = Instant::now();
        let batches = ctx.sql(sql).await?.collect().await?;
        if run > 0 {
            times.push(start.elapsed());
        }
        answers.push(rows(&batches)?);
    }
    Ok((crate::report::median(times), answers))
}

/// Whether `node` is a `GpuJoinExec` whose EXPLAIN line holds `piece`.
fn join_shows(node: &dyn ExecutionPlan, piece: &str) -> bool {
    let line = displayable(node).one_line().to_string();
    line.starts_with("GpuJoinExec") && line.contains(piece)
}

/// Generates one table in `parts` parts on as many threads; one partition per part.
fn table<I>(parts: usize, make: impl Fn(i32, i32) -> I + Sync) -> Result<Arc<MemTable>>
where
    I: Iterator<Item = std::result::Result<RecordBatch, ArrowError>>,
{
    let partitions: Vec<Vec<RecordBatch>> = std::thread::scope(|s| {
        let handles: Vec<_> = (1..=parts as i32)
            .map(|p| {
                let make = &make;
                s.spawn(move || make(p, parts as i32).collect::<std::result::Result<Vec<_>, _>>())
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("generator thread"))
            .collect::<std::result::Result<_, _>>()
    })?;
    let schema = partitions
        .iter()
        .flatten()
        .next()
        .map(|b| b.schema())
        .ok_or_else(|| DataFusionError::Execution("empty TPC-H table".into()))?;
    Ok(Arc::new(MemTable::try_new(schema, partitions)?))
}

/// The eight TPC-H tables at scale factor `sf`, registered in every context of `ctxs`.
fn register(ctxs: &[&SessionContext], sf: f64, parts: usize) -> Result<()> {
    let tables = [
        (
            "nation",
            table(1, |_, _| NationArrow::new(NationGenerator::new(sf, 1, 1)))?,
        ),
        (
            "region",
            table(1, |_, _| RegionArrow::new(RegionGenerator::new(sf, 1, 1)))?,
        ),
        (
            "part",
            table(parts, |p, n| PartArrow::new(PartGenerator::new(sf, p, n)))?,
        ),
        (
            "supplier",
            table(parts, |p, n| {
                SupplierArrow::new(SupplierGenerator::new(sf, p, n))
            })?,
        ),
        (
            "partsupp",
            table(parts, |p, n| {
                PartSuppArrow::new(PartSuppGenerator::new(sf, p, n))
            })?,
        ),
        (
            "customer",
            table(parts, |p, n| {
                CustomerArrow::new(CustomerGenerator::new(sf, p, n))
            })?,
        ),
        (
            "orders",
            table(parts, |p, n| OrderArrow::new(OrderGenerator::new(sf, p, n)))?,
        ),
        (
            "lineitem",
            table(parts, |p, n| {
                LineItemArrow::new(LineItemGenerator::new(sf, p, n))
            })?,
        ),
    ];
    for ctx in ctxs {
        for (name, t) in &tables {
            ctx.register_table(*name, Arc::clone(t) as _)?;
        }
    }
    Ok(())
}

pub async fn run(device: &Device, args: &Args, report: &mut Report) -> Result<()> {
    let cores = args
        .tpch_partitions
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let context = |enabled: bool| {
        let mut gpu = GpuJoinConfig::default();
        gpu.backend = device.backend().parse().unwrap_or_default();
        gpu.enabled = enabled;
        gpu.pack_uploads = args.pack_uploads;
        gpu.views_on_device = args.views_on_device;
        gpu.view_bytes_on_device = args.view_bytes_on_device;
        gpu.probe_columns = args.probe_columns;
        gpu.runtime_filters = args.runtime_filters;
        gpu.orient_joins = args.orient_joins;
        gpu.algorithm = args.algorithm;
        if let Some(devices) = args.tpch_devices {
            gpu.devices = devices;
        }
        if let Some(rows) = args.tpch_min_input_rows {
            gpu.min_input_rows = rows;
        }
        if let Some(rows) = args.tpch_min_build_rows {
            gpu.min_build_rows = rows;
        }
        if let (true, Some(bytes)) = (enabled, args.tpch_cache) {
            gpu.cache_bytes = bytes;
        }
        let mut config = SessionConfig::new()
            .with_target_partitions(cores)
            .with_option_extension(gpu);
        config.options_mut().optimizer.prefer_hash_join = !args.tpch_sort_merge;
        gpu_session_context(config)
    };
    let (on_ctx, off_ctx) = (context(true), context(false));
    let bar = progress(QUERIES.len() as u64, "TPC-H");
    bar.set_message(format!("generating SF {}", args.scale));
    register(&[&on_ctx, &off_ctx], args.scale, cores)?;
    let mut differ = vec![];
    for (i, sql) in QUERIES.iter().enumerate() {
        let q = i + 1;
        if !args.tpch_queries.is_empty() && !args.tpch_queries.contains(&q) {
            continue;
        }
        bar.set_message(format!("Q{q}"));
        let first = match args.tpch_cache {
            Some(_) => Some(first_runs(&on_ctx, sql, args.tpch_runs).await?),
            None => None,
        };
        let [on, off]: [Timed; 2] = run_timed_in_turn(&[&on_ctx, &off_ctx], sql, args.tpch_runs)
            .await?
            .try_into()
            .map_err(|_| DataFusionError::Internal("two sessions, two results".into()))?;
        if args.e2e_explain {
            crate::e2e::explain(&on_ctx, sql, &format!("Q{q}, rule on")).await?;
            crate::e2e::explain(&off_ctx, sql, &format!("Q{q}, rule off")).await?;
        }
        let want = rows(&off.batches)?;
        let first_equal = first
            .as_ref()
            .is_none_or(|(_, answers)| answers.iter().all(|a| *a == want));
        let equal = rows(&on.batches)? == want && first_equal;
        if !equal {
            differ.push(q);
        }
        let gpu_joins = count(&on.plan, &|n| n.name() == "GpuJoinExec");
        let cpu_joins = count(&on.plan, &|n| {
            n.name().contains("Join") && n.name() != "GpuJoinExec"
        });
        let (on_s, off_s) = (on.time.as_secs_f64(), off.time.as_secs_f64());
        report.tpch.push(json!({
            "query": q, "scale": args.scale, "min_build_rows": args.tpch_min_build_rows, "min_input_rows": args.tpch_min_input_rows, "sort_merge": args.tpch_sort_merge, "backend": device.name(), "partitions": cores,
            "runs": args.tpch_runs, "rule_on_s": on_s, "rule_off_s": off_s,
            "speedup": off_s / on_s, "gpu_joins": gpu_joins, "cpu_joins": cpu_joins,
            "rows": on.batches.iter().map(|b| b.num_rows()).sum::<usize>(), "equal": equal,
            "bytes_uploaded": sum_metric(&on.plan, "GpuJoinExec", "bytes_uploaded"),
            "upload_bytes_saved": sum_metric(&on.plan, "GpuJoinExec", "upload_bytes_saved"),
        }));
        if let Some((first, _)) = first {
            let record = report.tpch.last_mut().expect("just pushed");
            record["first_s"] = json!(first.as_secs_f64());
            record["cache_bytes"] = json!(args.tpch_cache.map(|b| b.0));
            record["builds_kept"] = json!(count(&on.plan, &|n| join_shows(n, "cache=[hit")));
            record["builds_unkept"] = json!(count(&on.plan, &|n| join_shows(n, "cache=[not")));
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    if differ.is_empty() {
        Ok(())
    } else {
        Err(DataFusionError::Execution(format!(
            "TPC-H results differ between rule on and off: queries {differ:?}"
        )))
    }
}
