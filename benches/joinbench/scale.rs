//! Scale: joins past the engine's limits, checked against closed-form answers.
//!
//! - `output 8x memory limit`: a 2^22-row build side and a 2^29-row probe side streamed from
//!   `generate_series` (never materialized), every probe row matching once, two 8-byte output
//!   columns: 8 GiB of output under `gpu_join.memory_limit = 1GiB`, so in passes.
//! - `2^32-row probe`: 2^32 probe rows (sixteen `generate_series` ranges, read in parallel)
//!   against a 2^20-row build side; the output's 2^32 rows are counted and summed.
//!
//! - `build 4x memory limit`: a 2^24-row build side of two 8-byte columns (256 MiB as Arrow
//!   arrays, 1.76 GB on the device at the peak of bucketing) under `gpu_join.memory_limit =
//!   416MiB`, so joined in groups (`exec::grace`), against 2^26 probe
//!   rows held in a table of one partition, which DataFusion deals out to the cores (a grace
//!   join splits only a probe side without a declared order);
//!   then the same join under the default limit (`in memory`) and with the rule off
//!   (`DataFusion's join`, which is what ran before grace joins), for their times.
//!
//! `--quick` shrinks the first two by 2^10 (and the limit to 8 MiB), the last by 2^6 (and the
//! limit to 6.5 MiB).

use std::sync::Arc;
use std::time::Instant;

use arrow::array::{Array, Int64Array};
use datafusion::common::{DataFusionError, Result};
use datafusion::physical_plan::{ExecutionPlan, collect};
use datafusion::prelude::SessionConfig;
use datafusion_gpu_join::config::DeviceList;
use datafusion_gpu_join::{GpuJoinConfig, gpu_session_context};
use serde_json::json;

use crate::Device;
use crate::args::Args;
use crate::report::Report;
use crate::sql::find;

/// A metric of the join summed over its partitions.
fn metric(join: &Arc<dyn ExecutionPlan>, name: &str) -> usize {
    join.metrics()
        .and_then(|m| m.sum_by_name(name))
        .map_or(0, |v| v.as_usize())
}

/// `n` rows `0..n` as a union of `parts` `generate_series` ranges, projected by `select`
/// (over the column `value`).
fn series(n: u64, parts: u64, select: &str) -> String {
    let step = n.div_ceil(parts);
    (0..parts)
        .map(|i| {
            let (lo, hi) = (i * step, ((i + 1) * step).min(n));
            format!(
                "SELECT {select} FROM generate_series({lo}, {})",
                hi.max(lo + 1) - 1
            )
        })
        .collect::<Vec<_>>()
        .join(" UNION ALL ")
}

struct Case {
    name: String,
    /// `gpu_join.devices` (`None`: the default, one device).
    devices: Option<DeviceList>,
    /// Whether the build side must be joined in groups.
    split: bool,
    /// Whether the query runs once untimed before it is timed.
    warm: bool,
    build_rows: u64,
    probe_rows: u64,
    memory_limit: &'static str,
    /// Bytes of one output row.
    row_bytes: u64,
    query: &'static str,
    /// Whether the rule is on (off: DataFusion's own join, for its time).
    rule: bool,
    /// Whether the probe side is a table in memory (no declared order) rather than a view over
    /// `generate_series` (ordered, and streamed).
    probe_table: bool,
    /// count(*), and the sum the query computes.
    expect: (u64, i128),
}

pub async fn run(device: &Device, args: &Args, report: &mut Report) -> Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let shrink = if args.quick { 10 } else { 0 };
    let (b1, p1) = (1u64 << (22 - shrink), 1u64 << (29 - shrink));
    let (b2, p2) = (1u64 << (20 - shrink), 1u64 << (32 - shrink));
    // sum over the build side's keys 0..b of k, each met p/b times.
    let key_sum = |b: u64, p: u64| (p / b) as i128 * (b as i128 * (b as i128 - 1) / 2);
    let (b3, p3) = if args.quick {
        (1u64 << 18, 1u64 << 20)
    } else {
        (1u64 << 24, 1u64 << 26)
    };
    let grace = |name: &str, memory_limit: &'static str, rule, devices: Option<DeviceList>| Case {
        name: match devices {
            Some(d) => format!("{name}, devices {d}"),
            None => name.to_string(),
        },
        devices,
        split: memory_limit != "80%",
        warm: true,
        rule,
        build_rows: b3,
        probe_rows: p3,
        memory_limit,
        row_bytes: 16,
        query: "SELECT count(*), sum(b.v) + sum(p.w) FROM b JOIN p ON b.k = p.k",
        // A grace join does not keep an ordered probe side's order, so it splits only a join
        // over one that declares none.
        probe_table: true,
        expect: (
            p3,
            3 * key_sum(b3, p3) + (p3 as i128 * (p3 as i128 - 1) / 2),
        ),
    };
    let limit = if args.quick { "6.5MiB" } else { "416MiB" };
    let mut cases = vec![
        Case {
            name: "output 8x memory limit".into(),
            devices: None,
            split: false,
            warm: false,
            build_rows: b1,
            probe_rows: p1,
            memory_limit: if args.quick { "8MiB" } else { "1GiB" },
            row_bytes: 16,
            query: "SELECT count(*), sum(b.v) + sum(p.w) FROM b JOIN p ON b.k = p.k",
            probe_table: false,
            rule: true,
            // v = 3k; w = the probe row number.
            expect: (
                p1,
                3 * key_sum(b1, p1) + (p1 as i128 * (p1 as i128 - 1) / 2),
            ),
        },
        Case {
            name: "2^32-row probe".into(),
            devices: None,
            split: false,
            warm: false,
            build_rows: b2,
            probe_rows: p2,
            memory_limit: "80%",
            row_bytes: 8,
            query: "SELECT count(*), sum(b.v) FROM b JOIN p ON b.k = p.k",
            probe_table: false,
            rule: true,
            expect: (p2, 3 * key_sum(b2, p2)),
        },
        grace("build 4x memory limit", limit, true, None),
        grace("build 4x memory limit, in memory", "80%", true, None),
        grace(
            "build 4x memory limit, DataFusion's join",
            "80%",
            false,
            None,
        ),
    ];
    if let Some(devices) = args.scale_devices {
        cases.push(grace("build 4x memory limit", limit, true, Some(devices)));
        cases.push(grace(
            "build 4x memory limit, in memory",
            "80%",
            true,
            Some(devices),
        ));
    }
    for case in cases {
        let mut gpu = GpuJoinConfig::default();
        gpu.backend = device.backend().parse()?;
        gpu.min_build_rows = 0;
        gpu.memory_limit = case.memory_limit.parse()?;
        gpu.enabled = case.rule;
        if let Some(devices) = case.devices {
            gpu.devices = devices;
        }
        let ctx = gpu_session_context(
            SessionConfig::new()
                .with_target_partitions(cores)
                .with_option_extension(gpu),
        );
        ctx.sql(&format!(
            "CREATE TABLE b AS {}",
            series(case.build_rows, cores as u64, "value AS k, value * 3 AS v")
        ))
        .await?
        .collect()
        .await?;
        // A table from one range (DataFusion deals its batches out to the cores); a view from
        // one range per core, read in parallel.
        let ranges = if case.probe_table { 1 } else { cores as u64 };
        let probe = series(
            case.probe_rows,
            ranges,
            &format!("value % {} AS k, value AS w", case.build_rows),
        );
        let kind = if case.probe_table { "TABLE" } else { "VIEW" };
        ctx.sql(&format!("CREATE {kind} p AS {probe}"))
            .await?
            .collect()
            .await?;
        if case.warm {
            // Once untimed: the first join on a device opens it (its context, kernels and
            // 4 GiB of pinned pages), which the one-device cases paid in the cases before;
            // the cases of one build side compared are each run once first alike.
            ctx.sql(case.query).await?.collect().await?;
        }
        let start = Instant::now();
        let plan = ctx.sql(case.query).await?.create_physical_plan().await?;
        let batches = collect(Arc::clone(&plan), ctx.task_ctx()).await?;
        let secs = start.elapsed().as_secs_f64();
        let operator = if case.rule {
            "GpuJoinExec"
        } else {
            "HashJoinExec"
        };
        let join = find(&plan, operator).ok_or_else(|| {
            DataFusionError::Execution(format!("{}: the join is not on {operator}", case.name))
        })?;
        let value = |c: usize| -> i128 {
            let a = batches[0].column(c);
            match a.as_any().downcast_ref::<Int64Array>() {
                Some(v) if !v.is_null(0) => v.value(0) as i128,
                _ => match a.as_any().downcast_ref::<arrow::array::Decimal128Array>() {
                    Some(v) => v.value(0),
                    None => -1,
                },
            }
        };
        let got = (value(0) as u64, value(1));
        let shown = datafusion::physical_plan::displayable(join.as_ref())
            .one_line()
            .to_string();
        let groups = shown
            .split("grace=[")
            .nth(1)
            .and_then(|s| s.split(' ').next())
            .and_then(|n| n.parse::<usize>().ok())
            .unwrap_or(0);
        let correct = got == case.expect;
        report.scale.push(json!({
            "case": case.name, "build_rows": case.build_rows, "probe_rows": case.probe_rows,
            "output_bytes": case.probe_rows * case.row_bytes,
            "memory_limit": case.memory_limit,
            "seconds": secs, "chunks": metric(&join, "probe_chunks"),
            "passes": metric(&join, "output_passes"),
            "bytes_downloaded": metric(&join, "bytes_downloaded"),
            "peak_device_bytes": metric(&join, "peak_device_memory"),
            "grace_groups": groups,
            "device_lanes": metric(&join, "device_lanes"),
            "correct": correct,
        }));
        if !correct {
            return Err(DataFusionError::Execution(format!(
                "{}: got (count, sum) = {got:?}, expected {:?}",
                case.name, case.expect
            )));
        }
        if case.split && groups < 2 {
            return Err(DataFusionError::Execution(format!(
                "{}: the build side was not joined in groups: {shown}",
                case.name
            )));
        }
    }
    Ok(())
}
