//! Joins spread over several devices (`gpu_join.devices = '0,1'`): on two GPUs where the
//! suite runs on CUDA (skipped, with the reason, on a machine with one), and as two lanes of
//! the host twin on the host backend (CI):
//!
//! - inner, right, right semi and right anti joins — one with a residual filter and a string
//!   view column the devices carry — give DataFusion's answers, start a lane per device
//!   (EXPLAIN ANALYZE's `device_lanes`), and EXPLAIN shows both devices;
//! - left, full, left semi, left anti and left mark joins (which output build rows after the
//!   probe side) too, with the build-row marks of both devices merged (one left join's filter
//!   runs on the host, whose marks are merged instead);
//! - a join whose probe side has one partition, and one whose build side is larger than its
//!   probe side, run on the first device alone;
//! - a join on the first device building on a join over both copies its build batches off
//!   the output pages of either device;
//! - nothing is left behind;
//! - on the host backend, 40 lanes whose build blocks share the host's 64 staging pages finish
//!   (the build side once hung there);
//! - a grace join's groups spread over both GPUs (on the host backend, whose lanes share one
//!   budget, each group runs on one lane), with DataFusion's answer;
//! - a cancelled query and a failed one leave nothing on either device.

use std::sync::Arc;

use datafusion::common::DataFusionError;
use datafusion::logical_expr::JoinType;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_plan::{ExecutionPlan, displayable};
use datafusion::prelude::SessionContext;

use datafusion_gpu_join::device::Devices;
use datafusion_gpu_join::exec::{GpuJoinExec, JoinBackend};

use crate::engine::{B_P_JOINS, find_join, metric, run, run_plan, session, text, wait_idle_on};
use crate::harness::{Options, Outcome, Suite, TestResult, block_on};

const TABLES: &[&str] = &[
    "CREATE TABLE b AS SELECT value AS k, value * 3 AS v, \
     arrow_cast(concat('build string number ', value), 'Utf8View') AS s \
     FROM generate_series(1, 100000)",
    "CREATE TABLE p AS SELECT value % 150000 AS k, value AS w FROM generate_series(1, 400000)",
];
const SETTINGS: &[&str] = &[
    "SET gpu_join.devices = '0,1'",
    "SET datafusion.execution.target_partitions = 4",
];

/// Queries besides `B_P_JOINS`: (name, query).
const MORE_QUERIES: &[(&str, &str)] = &[
    (
        "inner, filtered, a string view carried",
        "SELECT count(*), sum(p.w), min(b.s), max(b.s) FROM b JOIN p \
         ON b.k = p.k AND b.v + p.w > 300000",
    ),
    (
        "full",
        "SELECT count(*), count(p.w), count(b.v), sum(b.v) FROM b FULL JOIN p ON b.k = p.k",
    ),
    (
        "left, filtered on the host (the host's marks merged)",
        "SELECT count(*), count(p.w), sum(b.v) FROM b LEFT JOIN p \
         ON b.k = p.k AND b.s <> concat('build string number ', p.w % 7)",
    ),
    (
        "left semi",
        "SELECT count(*), sum(b.v) FROM b WHERE EXISTS \
         (SELECT 1 FROM p WHERE p.k = b.k AND p.w > 200000)",
    ),
    (
        "left anti",
        "SELECT count(*), sum(b.v) FROM b WHERE NOT EXISTS \
         (SELECT 1 FROM p WHERE p.k = b.k AND p.w > 200000)",
    ),
    (
        "left mark",
        "SELECT count(*), sum(b.v) FROM b WHERE EXISTS (SELECT 1 FROM p WHERE p.k = b.k) \
         OR b.v < 3000",
    ),
];

/// The backend EXPLAIN shows for a join on both devices, and on the first alone.
fn shown_backends(options: &Options) -> (&'static str, &'static str) {
    match options.backend() {
        "cuda" => ("backend=cuda:0,1,", "backend=cuda:0,"),
        _ => ("backend=host:0,1,", "backend=host,"),
    }
}

/// A session with the rule on and `settings`, and one with the rule off and `partitions` (its
/// `target_partitions` setting), both holding `tables`.
async fn sessions(
    options: &Options,
    settings: &[&str],
    partitions: &str,
    tables: &[&str],
) -> datafusion::common::Result<(SessionContext, SessionContext)> {
    let ctx = session(options, settings).await?;
    let cpu = crate::slt::session(options, false);
    run(&cpu, partitions).await?;
    for t in tables {
        run(&ctx, t).await?;
        run(&cpu, t).await?;
    }
    Ok((ctx, cpu))
}

/// The rows `plan` gives.
async fn row_count(
    plan: &Arc<dyn ExecutionPlan>,
    ctx: &datafusion::prelude::SessionContext,
) -> datafusion::common::Result<usize> {
    let batches = datafusion::physical_plan::collect(Arc::clone(plan), ctx.task_ctx()).await?;
    Ok(batches.iter().map(|b| b.num_rows()).sum())
}

/// `GpuJoinExec` of `left` (build) and `right` on their columns `k`, on both devices.
fn join_on_k(
    options: &Options,
    left: Arc<dyn ExecutionPlan>,
    right: Arc<dyn ExecutionPlan>,
    join_type: JoinType,
) -> Result<Arc<dyn ExecutionPlan>, String> {
    let e = |e: DataFusionError| e.to_string();
    let key = |p: &Arc<dyn ExecutionPlan>| -> Result<Arc<dyn PhysicalExpr>, String> {
        Ok(Arc::new(
            Column::new_with_schema("k", &p.schema()).map_err(e)?,
        ))
    };
    let on = vec![(key(&left)?, key(&right)?)];
    let join = GpuJoinExec::builder(left, right, on)
        .with_join_type(join_type)
        .with_backend(backend(options)?)
        .build()
        .map_err(e)?;
    Ok(Arc::new(join))
}

/// The backend of both devices.
fn backend(options: &Options) -> Result<JoinBackend, String> {
    let devices = Devices::of([0, 1]).map_err(|e| e.to_string())?;
    Ok(match options.backend() {
        "cuda" => JoinBackend::Cuda(devices),
        _ => JoinBackend::Host(devices),
    })
}

fn shown(plan: &Arc<dyn ExecutionPlan>) -> String {
    displayable(plan.as_ref()).indent(true).to_string()
}

fn spread_joins(options: &Options) -> TestResult {
    if let Some(skipped) = needs_two_gpus(options)? {
        return Ok(skipped);
    }
    let e = |e: DataFusionError| e.to_string();
    let (both, first) = shown_backends(options);
    block_on(async {
        let (ctx, cpu) = sessions(options, SETTINGS, SETTINGS[1], TABLES)
            .await
            .map_err(e)?;
        let check = |name: &str, got, want, plan: &Arc<dyn ExecutionPlan>, lanes: usize| {
            let join = find_join(plan).ok_or(format!("{name}: no GpuJoinExec"))?;
            let shown = shown(&join);
            if got != want {
                return Err(format!("{name}: got\n{got}\nwant\n{want}\n{shown}"));
            }
            let backend = if lanes == 2 { both } else { first };
            let started = metric(&join, "device_lanes");
            if !shown.contains(backend) || started != lanes {
                return Err(format!(
                    "{name}: expected {backend} and {lanes} lanes, {started} probed:\n{shown}"
                ));
            }
            Ok(())
        };
        // Every join spreads: those that output build rows after the probe side merge the
        // marks of both devices.
        let queries = B_P_JOINS.iter().map(|&(name, sql, _)| (name, sql));
        for (name, sql) in queries.chain(MORE_QUERIES.iter().copied()) {
            let (got, plan) = run_plan(&ctx, sql).await.map_err(e)?;
            let want = run(&cpu, sql).await.map_err(e)?;
            let (got, want) = (text(&got).map_err(e)?, text(&want).map_err(e)?);
            check(name, got, want, &plan, 2)?;
        }
        // A probe side of one partition feeds one lane.
        let one = [
            "SET datafusion.execution.target_partitions = 1",
            "CREATE TABLE p1 AS SELECT value % 150000 AS k, value AS w \
             FROM generate_series(1, 400000)",
        ];
        for s in one {
            run(&ctx, s).await.map_err(e)?;
            run(&cpu, s).await.map_err(e)?;
        }
        let name = "inner over one partition";
        let sql = "SELECT count(*), sum(b.v), sum(p.w) FROM b JOIN p1 AS p ON b.k = p.k";
        let (got, plan) = run_plan(&ctx, sql).await.map_err(e)?;
        let want = run(&cpu, sql).await.map_err(e)?;
        let (got, want) = (text(&got).map_err(e)?, text(&want).map_err(e)?);
        let join = find_join(&plan).ok_or("no GpuJoinExec")?;
        let started = metric(&join, "device_lanes");
        if got != want || started != 1 {
            return Err(format!(
                "{name}: {started} lanes, got\n{got}\nwant\n{want}\n{}",
                shown(&plan)
            ));
        }
        // A build side larger than the probe side stays on one device (each would hold all
        // of it): b (100,000 rows) built against 1,000 probe rows in 4 partitions.
        let small = "CREATE TABLE small AS SELECT value * 7 AS k FROM generate_series(1, 1000)";
        // In batches of 100 rows, which the probe's round robin deals to every partition.
        for s in [
            SETTINGS[1],
            "SET datafusion.execution.batch_size = 100",
            small,
        ] {
            run(&ctx, s).await.map_err(e)?;
        }
        let input = |t: &'static str| {
            let ctx = &ctx;
            async move {
                let plan = ctx.table(t).await?.create_physical_plan().await?;
                let dealt = datafusion::physical_plan::repartition::RepartitionExec::try_new(
                    plan,
                    datafusion::physical_plan::Partitioning::RoundRobinBatch(4),
                )?;
                Ok::<Arc<dyn ExecutionPlan>, DataFusionError>(Arc::new(dealt))
            }
        };
        // A fresh plan for every use: a repartition is executed once.
        let (b, small) = (
            input("b").await.map_err(e)?,
            input("small").await.map_err(e)?,
        );
        let join = join_on_k(options, b, small, JoinType::Inner)?;
        let rows = row_count(&join, &ctx).await.map_err(e)?;
        let started = metric(&join, "device_lanes");
        // Keys 7, 14, ..., 7000: those up to 100,000 match once.
        if rows != 1000 || started != 1 {
            return Err(format!(
                "a build side larger than the probe: {rows} rows, {started} lanes\n{}",
                shown(&join)
            ));
        }
        // A join on the first device alone (a left semi join whose probe side is smaller than
        // its build side) building on a join over both: the
        // batches it collects are copied off the output pages of either device, so that the
        // lower join's lanes get their pages back while the upper join holds its build side.
        let (b, p, small) = (
            input("b").await.map_err(e)?,
            input("p").await.map_err(e)?,
            input("small").await.map_err(e)?,
        );
        let lower = join_on_k(options, b, p, JoinType::Inner)?;
        let upper = join_on_k(options, Arc::clone(&lower), small, JoinType::LeftSemi)?;
        let rows = row_count(&upper, &ctx).await.map_err(e)?;
        // The lower join's 300,000 rows (each b.k meets 3 probe rows) carry four 8-byte
        // columns on the pages (b.k, b.v, p.k, p.w; b.s's views, which the device carries,
        // are copied off them as its arrays are made).
        let (lanes, copied) = (
            metric(&lower, "device_lanes"),
            metric(&upper, "build_copied_bytes"),
        );
        if rows != 3000 || lanes != 2 || copied < 300_000 * 32 {
            return Err(format!(
                "a left semi join over a join on both devices: {rows} rows, the lower join on \
                 {lanes} lanes, {copied} bytes copied off output pages\n{}",
                shown(&upper)
            ));
        }
        Ok::<_, String>(())
    })?;
    wait_idle_on(backend(options)?, "joins on two devices")?;
    Ok(Outcome::Passed)
}

/// A test that needs two GPUs under CUDA.
type TwoGpuTest = fn(&Options) -> TestResult;

/// Skipped where the suite runs on CUDA with fewer than two GPUs.
fn needs_two_gpus(options: &Options) -> Result<Option<Outcome>, String> {
    if options.backend() != "cuda" {
        return Ok(None);
    }
    let count = datafusion_gpu_join::device::device_count().map_err(|e| e.to_string())?;
    Ok((count < 2).then(|| Outcome::Skipped(format!("needs two GPUs; this machine has {count}"))))
}

/// A grace join (a build side of 200,000 rows under a 4 MiB limit: about 10 groups, each
/// against a tenth of 1,000,000 probe rows) over both devices gives DataFusion's answer in
/// several groups, each of whose joins spreads as a join of its size would: on two GPUs, each
/// with a budget of its own, groups take both (`device_lanes`, summed over the groups' joins,
/// exceeds the groups); host lanes share one budget, which a group's build side mostly fills,
/// so there the second lane is usually left out and each group runs on at least one (on a busy
/// host some groups count two: a join that finds the memory free as it starts, or that runs
/// again for a partition that comes to its group late; 14 lanes for 12 groups, say).
fn grace_groups_spread(options: &Options) -> TestResult {
    if let Some(skipped) = needs_two_gpus(options)? {
        return Ok(skipped);
    }
    let e = |e: DataFusionError| e.to_string();
    let settings = [
        SETTINGS[0],
        SETTINGS[1],
        "SET gpu_join.memory_limit = '4MiB'",
    ];
    let tables = [
        "CREATE TABLE b AS SELECT value AS k, value * 3 AS v FROM generate_series(1, 200000)",
        "CREATE TABLE p AS SELECT value % 250000 AS k, value AS w FROM generate_series(1, 1000000)",
    ];
    let sql = B_P_JOINS[0].1;
    block_on(async {
        let (ctx, cpu) = sessions(options, &settings, SETTINGS[1], &tables)
            .await
            .map_err(e)?;
        let (got, plan) = run_plan(&ctx, sql).await.map_err(e)?;
        let want = run(&cpu, sql).await.map_err(e)?;
        let (got, want) = (text(&got).map_err(e)?, text(&want).map_err(e)?);
        let join = find_join(&plan).ok_or("no GpuJoinExec")?;
        let shown = shown(&join);
        let groups = crate::grace::groups(&shown).unwrap_or(0);
        let lanes = metric(&join, "device_lanes");
        let spread = match options.backend() {
            "cuda" => lanes > groups,
            _ => lanes >= groups,
        };
        if got != want || groups < 2 || !spread {
            return Err(format!(
                "{groups} groups on {lanes} lanes; got\n{got}\nwant\n{want}\n{shown}"
            ));
        }
        Ok::<_, String>(())
    })?;
    wait_idle_on(backend(options)?, "a grace join on two devices")?;
    Ok(Outcome::Passed)
}

/// A query cancelled mid-way and a query whose probe input fails, each over both devices,
/// leave nothing on either (`engine::cancelled_and_failed_queries_leave_nothing` on one).
fn cancel_and_fail(options: &Options) -> TestResult {
    if let Some(skipped) = needs_two_gpus(options)? {
        return Ok(skipped);
    }
    crate::engine::cancel_and_fail_with(options, SETTINGS, backend(options)?)?;
    Ok(Outcome::Passed)
}

/// Many host lanes (40) against few staging tasks: every lane's build blocks come from the
/// host's one pool of 64 staging pages, more than the tasks could hold at once if each kept a
/// partly filled page per lane (the build side once hung that way). Host backend, every machine.
fn many_host_lanes(options: &Options) -> TestResult {
    let e = |e: DataFusionError| e.to_string();
    let lanes = (0..40).map(|o| o.to_string()).collect::<Vec<_>>().join(",");
    let settings = [
        "SET gpu_join.backend = 'host'".to_string(),
        format!("SET gpu_join.devices = '{lanes}'"),
        "SET datafusion.execution.target_partitions = 40".to_string(),
        "SET datafusion.execution.batch_size = 1024".to_string(),
    ];
    let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
    let sql = "SELECT count(*), sum(b.v), sum(p.w) FROM b JOIN p ON b.k = p.k";
    block_on(async {
        let (ctx, cpu) = sessions(options, &settings, settings[2], TABLES)
            .await
            .map_err(e)?;
        let ran = tokio::time::timeout(std::time::Duration::from_secs(120), run_plan(&ctx, sql));
        let (got, plan) = ran
            .await
            .map_err(|_| "the join on 40 host lanes did not finish in 120 s".to_string())?
            .map_err(e)?;
        let want = run(&cpu, sql).await.map_err(e)?;
        let (got, want) = (text(&got).map_err(e)?, text(&want).map_err(e)?);
        let join = find_join(&plan).ok_or("no GpuJoinExec")?;
        let probed = metric(&join, "device_lanes");
        if got != want || probed < 2 {
            return Err(format!(
                "40 host lanes: {probed} probed, got\n{got}\nwant\n{want}\n{}",
                shown(&join)
            ));
        }
        Ok::<_, String>(())
    })?;
    let all = Devices::of(0..40).map_err(|e| e.to_string())?;
    wait_idle_on(JoinBackend::Host(all), "a join on 40 host lanes")?;
    Ok(Outcome::Passed)
}

pub fn register(suite: &mut Suite) {
    let many = suite.options.clone();
    suite.add(
        "devices::many_host_lanes_share_the_staging_pages",
        move || many_host_lanes(&many),
    );
    let tests: [(&str, TwoGpuTest); 3] = [
        ("joins_spread_over_two_devices", spread_joins),
        (
            "cancelled_and_failed_queries_on_two_devices_leave_nothing",
            cancel_and_fail,
        ),
        ("grace_groups_spread_over_two_devices", grace_groups_spread),
    ];
    for (name, test) in tests {
        let options = suite.options.clone();
        suite.add(format!("devices::{name}"), move || {
            if options.require_cuda && !options.cuda_present() {
                return Err("--require-cuda, but no usable CUDA device".into());
            }
            test(&options)
        });
    }
}
