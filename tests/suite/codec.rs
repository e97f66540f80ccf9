//! `GpuJoinCodec`: plans holding `GpuJoinExec` sent through DataFusion's protobuf
//! (`datafusion-proto`) and run where they are decoded. Each query's plan, with every join on
//! `GpuJoinExec`, goes to bytes and back; the decoded plan's joins must read as the encoded
//! ones did (keys, join type, filter, projection, settings), and its rows must equal
//! DataFusion's own join's. Decoded in a session with `gpu_join.backend = auto` and the
//! default gate, a join lands on the GPU where there is one and on DataFusion's join where
//! there is none.

use std::sync::Arc;

use datafusion::common::Result;
use datafusion::physical_plan::display::DisplayableExecutionPlan;
use datafusion::physical_plan::{ExecutionPlan, collect, displayable};
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpu_join::config::Algorithm;
use datafusion_gpu_join::{GpuJoinCodec, GpuJoinConfig, gpu_session_context};
use datafusion_proto::bytes::{
    physical_plan_from_bytes_with_extension_codec, physical_plan_from_bytes_with_proto_converter,
    physical_plan_to_bytes_with_extension_codec, physical_plan_to_bytes_with_proto_converter,
};
use datafusion_proto::physical_plan::{DeduplicatingProtoConverter, DefaultPhysicalExtensionCodec};

use crate::differential::sorted_rows;
use crate::harness::{Options, Suite, block_on};

const TABLES: [&str; 2] = [
    "CREATE TABLE r AS SELECT value AS k, value % 7 AS g, CAST(value AS VARCHAR) AS s, \
     CASE WHEN value % 5 = 0 THEN NULL ELSE value END AS n FROM generate_series(1, 3000)",
    "CREATE TABLE t AS SELECT value % 2000 AS k, value % 3 AS g, CAST(value % 2500 AS VARCHAR) AS s, \
     CASE WHEN value % 11 = 0 THEN NULL ELSE value % 2000 END AS n FROM generate_series(1, 6000)",
];

/// Joins of every kind the node carries: filters compiled for the device and left to the
/// host, string keys, outer, semi, null-aware anti, null-equal (`INTERSECT`), cross and
/// nested loop joins, a pushed-down `LIMIT`, and (with `prefer_hash_join = false`) a
/// replaced sort-merge join.
const QUERIES: [(&str, bool); 11] = [
    (
        "SELECT r.k, t.g FROM r JOIN t ON r.k = t.k AND r.g < t.g",
        true,
    ),
    (
        "SELECT r.k, t.s FROM r LEFT JOIN t ON r.k = t.k AND t.s LIKE '1%'",
        true,
    ),
    ("SELECT r.k, t.k FROM r JOIN t ON r.s = t.s", true),
    (
        "SELECT k FROM r WHERE EXISTS (SELECT 1 FROM t WHERE t.k = r.k AND t.g = 1)",
        true,
    ),
    ("SELECT k FROM r WHERE n NOT IN (SELECT n FROM t)", true),
    ("SELECT r.k, t.k FROM r FULL JOIN t ON r.k = t.k", true),
    ("SELECT n FROM r INTERSECT SELECT n FROM t", true),
    (
        "SELECT a.k, b.k FROM (SELECT k FROM r WHERE k < 60) a JOIN (SELECT k FROM t WHERE k < 60) b ON a.k < b.k",
        true,
    ),
    ("SELECT r.k, t.k FROM r JOIN t ON r.k = t.k LIMIT 5", true),
    (
        "SELECT r.k, t.g, t.s FROM r RIGHT JOIN t ON r.k = t.k",
        false,
    ),
    // A probe side aggregated by the key: a RuntimeFilterExec above its scan, with the join's
    // dynamic filter.
    (
        "SELECT x.k, a.c FROM (SELECT k FROM t WHERE g = 1 AND k < 100) x \
         JOIN (SELECT k, count(*) AS c FROM r GROUP BY k) a ON x.k = a.k",
        true,
    ),
];

/// A session with every join on `GpuJoinExec` (`gpu: true`) or DataFusion's (`false`).
async fn session(options: &Options, gpu: bool, hash: bool) -> Result<SessionContext> {
    let mut config = options.gpu_config();
    config.enabled = gpu;
    session_with(config, hash).await
}

async fn session_with(gpu: GpuJoinConfig, hash: bool) -> Result<SessionContext> {
    let mut config = SessionConfig::new()
        .with_target_partitions(4)
        .with_option_extension(gpu);
    config.options_mut().optimizer.prefer_hash_join = hash;
    let ctx = gpu_session_context(config);
    for sql in TABLES {
        ctx.sql(sql).await?.collect().await?;
    }
    Ok(ctx)
}

/// The physical plan of `sql` in `ctx`.
async fn plan_of(ctx: &SessionContext, sql: &str) -> Result<Arc<dyn ExecutionPlan>, String> {
    let df = ctx.sql(sql).await.map_err(|e| e.to_string())?;
    df.create_physical_plan().await.map_err(|e| e.to_string())
}

/// The plan's join lines, and its `RuntimeFilterExec` lines.
fn joins(plan: &Arc<dyn ExecutionPlan>) -> Vec<String> {
    displayable(plan.as_ref())
        .indent(true)
        .to_string()
        .lines()
        .filter(|l| l.contains("JoinExec") || l.contains("RuntimeFilterExec"))
        .map(|l| l.trim().to_string())
        .collect()
}

async fn roundtrip(options: &Options) -> Result<(), String> {
    let codec = GpuJoinCodec::new(Arc::new(DefaultPhysicalExtensionCodec {}));
    let err = |e: datafusion::common::DataFusionError| e.to_string();
    for (i, (sql, hash)) in QUERIES.into_iter().enumerate() {
        // Every other plan asks for DIRECT, views gathered on the host and view values
        // gathered on the host, which travel with its joins.
        let mut config = options.gpu_config();
        if i % 2 == 1 {
            config.algorithm = Algorithm::Direct;
            config.views_on_device = false;
            config.view_bytes_on_device = false;
        }
        let on = session_with(config, hash).await.map_err(err)?;
        let off = session(options, false, hash).await.map_err(err)?;
        let plan = plan_of(&on, sql).await?;
        let before = joins(&plan);
        let runtime = before
            .iter()
            .filter(|l| l.starts_with("RuntimeFilterExec"))
            .count();
        if before.is_empty()
            || before
                .iter()
                .any(|l| !l.starts_with("GpuJoinExec") && !l.starts_with("RuntimeFilterExec"))
            || (runtime > 0) != sql.contains("GROUP BY")
        {
            return Err(format!(
                "{sql}: every join should be on GpuJoinExec: {before:?}"
            ));
        }
        if i % 2 == 1
            && before.iter().any(|l| {
                l.starts_with("GpuJoinExec")
                    && (!l.contains("algorithm=DIRECT")
                        || !l.contains("views_on_device=false")
                        || !l.contains("view_bytes_on_device=false"))
            })
        {
            return Err(format!(
                "{sql}: every join should ask for DIRECT, views on the host: {before:?}"
            ));
        }
        let bytes = physical_plan_to_bytes_with_extension_codec(Arc::clone(&plan), &codec)
            .map_err(|e| format!("{sql}: encoding: {e}"))?;
        let decoded = physical_plan_from_bytes_with_extension_codec(&bytes, &on.task_ctx(), &codec)
            .map_err(|e| format!("{sql}: decoding: {e}"))?;
        let after = joins(&decoded);
        if after != before {
            return Err(format!(
                "{sql}: joins before {before:?}, after decoding {after:?}"
            ));
        }
        let got = collect(decoded, on.task_ctx()).await.map_err(err)?;
        let want = off
            .sql(sql)
            .await
            .map_err(err)?
            .collect()
            .await
            .map_err(err)?;
        let (got, want) = (sorted_rows(&got), sorted_rows(&want));
        // A LIMIT without ORDER BY may take any rows: their number must match.
        let equal = match sql.contains("LIMIT") {
            true => got.len() == want.len(),
            false => got == want,
        };
        if !equal {
            return Err(format!(
                "{sql}: decoded plan gave {} rows, DataFusion's join {}",
                got.len(),
                want.len()
            ));
        }
    }
    Ok(())
}

/// Decoded where `gpu_join.backend = auto` with the default gate: on the GPU where there is
/// one, else DataFusion's join; the rows are the same.
async fn decoded_where_it_lands(options: &Options) -> Result<(), String> {
    let codec = GpuJoinCodec::new(Arc::new(DefaultPhysicalExtensionCodec {}));
    let err = |e: datafusion::common::DataFusionError| e.to_string();
    let on = session(options, true, true).await.map_err(err)?;
    let mut auto = GpuJoinConfig::default();
    auto.backend = "auto".parse().map_err(err)?;
    let there = session_with(auto, true).await.map_err(err)?;
    let off = session(options, false, true).await.map_err(err)?;
    for (sql, _) in &QUERIES[..2] {
        let plan = plan_of(&on, sql).await?;
        let bytes = physical_plan_to_bytes_with_extension_codec(plan, &codec).map_err(err)?;
        let decoded =
            physical_plan_from_bytes_with_extension_codec(&bytes, &there.task_ctx(), &codec)
                .map_err(|e| format!("{sql}: decoding: {e}"))?;
        let lines = joins(&decoded);
        let want = match options.cuda_present() {
            true => "GpuJoinExec",
            false => "HashJoinExec",
        };
        if lines.is_empty() || lines.iter().any(|l| !l.starts_with(want)) {
            return Err(format!("{sql}: decoded joins should be {want}: {lines:?}"));
        }
        // The codec counts them where they landed.
        let counted = codec.decoded();
        let decoded_so_far = match options.cuda_present() {
            true => counted.gpu,
            false => counted.datafusion,
        };
        if counted.gpu + counted.host + counted.datafusion != decoded_so_far
            || decoded_so_far < lines.len()
        {
            return Err(format!(
                "{sql}: {} {want} lines, but the codec counted {counted:?}",
                lines.len()
            ));
        }
        same_rows(decoded, &there, &off, sql).await?;
    }
    // A join without keys that took a LIMIT (DataFusion then drops the limit above it), decoded
    // where DataFusion's join runs it: its nested loop join has no limit of its own, so one
    // goes above it (every row of the join came back before).
    let one = session(options, true, true).await.map_err(err)?;
    for sql in [
        "SET datafusion.execution.target_partitions = 1",
        "CREATE TABLE r1 AS SELECT value AS k FROM generate_series(1, 2000)",
        "CREATE TABLE t1 AS SELECT value AS k FROM generate_series(1, 3000)",
    ] {
        crate::engine::run(&one, sql).await.map_err(err)?;
    }
    let sql = "SELECT r1.k, t1.k FROM r1 JOIN t1 ON r1.k < t1.k LIMIT 3";
    let plan = plan_of(&one, sql).await?;
    let bytes = physical_plan_to_bytes_with_extension_codec(plan, &codec).map_err(err)?;
    let decoded = physical_plan_from_bytes_with_extension_codec(&bytes, &there.task_ctx(), &codec)
        .map_err(|e| format!("{sql}: decoding: {e}"))?;
    let rows: usize = (datafusion::physical_plan::collect(decoded, there.task_ctx()).await)
        .map_err(err)?
        .iter()
        .map(|b| b.num_rows())
        .sum();
    if rows != 3 {
        return Err(format!("{sql}: decoded, it gave {rows} rows"));
    }
    // Another plan's nodes pass through to the wrapped codec: a query without a join.
    let plan = on
        .sql("SELECT g, count(*) FROM t GROUP BY g")
        .await
        .map_err(err)?
        .create_physical_plan()
        .await
        .map_err(err)?;
    let bytes = physical_plan_to_bytes_with_extension_codec(plan, &codec).map_err(err)?;
    physical_plan_from_bytes_with_extension_codec(&bytes, &there.task_ctx(), &codec)
        .map_err(err)?;
    Ok(())
}

/// The dynamic filter travels as DataFusion's `HashJoinExec`'s does: decoded through a
/// converter that deduplicates expressions, the join fills the filter its Parquet probe scan
/// holds, and the scan prunes the row groups outside the build side's keys.
async fn dynamic_filter_travels(options: &Options) -> Result<(), String> {
    let err = |e: datafusion::common::DataFusionError| e.to_string();
    let dir = std::env::temp_dir().join(format!("gpu_join_codec_{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let file = dir.join("probe.parquet");
    let out = async {
        let ctx = session(options, true, true).await.map_err(err)?;
        for sql in [
            format!(
                "COPY (SELECT value AS k, value * 3 AS w FROM generate_series(0, 99999) ORDER BY value) \
                 TO '{}' STORED AS PARQUET OPTIONS ('format.max_row_group_size' '10000')",
                file.display()
            ),
            format!("CREATE EXTERNAL TABLE p STORED AS PARQUET LOCATION '{}'", file.display()),
            "CREATE TABLE b AS SELECT value AS k FROM generate_series(42000, 42999)".into(),
        ] {
            ctx.sql(&sql).await.map_err(err)?.collect().await.map_err(err)?;
        }
        let sql = "SELECT count(*), sum(p.w) FROM b JOIN p ON b.k = p.k";
        let plan = plan_of(&ctx, sql).await?;
        let codec = GpuJoinCodec::default();
        let converter = DeduplicatingProtoConverter {};
        let bytes = physical_plan_to_bytes_with_proto_converter(plan, &codec, &converter).map_err(err)?;
        let decoded =
            physical_plan_from_bytes_with_proto_converter(&bytes, &ctx.task_ctx(), &codec, &converter)
                .map_err(|e| format!("decoding: {e}"))?;
        let rows = collect(Arc::clone(&decoded), ctx.task_ctx()).await.map_err(err)?;
        let shown = DisplayableExecutionPlan::with_metrics(decoded.as_ref())
            .indent(true)
            .to_string();
        Ok::<_, String>((sorted_rows(&rows), shown))
    }
    .await;
    let _ = std::fs::remove_dir_all(&dir);
    let (rows, shown) = out?;
    if rows != ["1000|127498500"] {
        return Err(format!("wrong result: {rows:?}"));
    }
    let scan = shown
        .lines()
        .find(|l| l.contains("DataSourceExec") && l.contains("parquet"))
        .ok_or_else(|| format!("no parquet scan in\n{shown}"))?;
    if !scan.contains("row_groups_pruned_statistics=10 total → 1 matched") {
        return Err(format!(
            "the decoded plan's scan did not prune 9 of 10 row groups: {scan}"
        ));
    }
    Ok(())
}

/// A plan for a distributed engine's executors (`gpu_join.distributed`) decodes node for node:
/// its joins land on the GPU where there is one, and where there is none on DataFusion's hash
/// join joining partition with partition of the key-partitioned inputs, with no node added
/// (engines match the plan they sent to the one their executors run, node by node).
async fn distributed_plans_decode_node_for_node(options: &Options) -> Result<(), String> {
    let codec = GpuJoinCodec::default();
    let err = |e: datafusion::common::DataFusionError| e.to_string();
    let mut planner = GpuJoinConfig::default();
    planner.backend = "auto".parse().map_err(err)?;
    planner.min_build_rows = 1;
    planner.min_input_rows = 0;
    planner.distributed = true;
    let planned = session_with(planner, true).await.map_err(err)?;
    let mut auto = GpuJoinConfig::default();
    auto.backend = "auto".parse().map_err(err)?;
    let there = session_with(auto, true).await.map_err(err)?;
    let off = session(options, false, true).await.map_err(err)?;
    let sql = "SELECT r.k, t.g, t.s FROM r JOIN t ON r.k = t.k";
    let plan = plan_of(&planned, sql).await?;
    let sent = joins(&plan);
    if sent.len() != 1 || !sent[0].starts_with("GpuJoinExec") {
        return Err(format!("the planned join should be GpuJoinExec: {sent:?}"));
    }
    let bytes =
        physical_plan_to_bytes_with_extension_codec(Arc::clone(&plan), &codec).map_err(err)?;
    let decoded = physical_plan_from_bytes_with_extension_codec(&bytes, &there.task_ctx(), &codec)
        .map_err(err)?;
    let nodes = |p: &Arc<dyn ExecutionPlan>| {
        displayable(p.as_ref())
            .indent(false)
            .to_string()
            .lines()
            .count()
    };
    if nodes(&plan) != nodes(&decoded) {
        return Err(format!(
            "decoding changed the plan's shape:\n{}\n{}",
            displayable(plan.as_ref()).indent(false),
            displayable(decoded.as_ref()).indent(false)
        ));
    }
    let got = joins(&decoded);
    let want = match options.cuda_present() {
        true => "GpuJoinExec",
        false => "HashJoinExec: mode=Partitioned",
    };
    if !got[0].starts_with(want) {
        return Err(format!("the decoded join should be {want}: {got:?}"));
    }
    same_rows(decoded, &there, &off, sql).await
}

/// Fails unless `decoded`, run in `there`, gives the rows `sql` gives in `off` (DataFusion's
/// joins).
async fn same_rows(
    decoded: Arc<dyn ExecutionPlan>,
    there: &SessionContext,
    off: &SessionContext,
    sql: &str,
) -> Result<(), String> {
    let err = |e: datafusion::common::DataFusionError| e.to_string();
    let got = sorted_rows(&collect(decoded, there.task_ctx()).await.map_err(err)?);
    let want = sorted_rows(
        &off.sql(sql)
            .await
            .map_err(err)?
            .collect()
            .await
            .map_err(err)?,
    );
    if got != want {
        return Err(format!(
            "{sql}: {} rows decoded, {} from DataFusion's join",
            got.len(),
            want.len()
        ));
    }
    Ok(())
}

pub fn register(suite: &mut Suite) {
    suite.add_gpu("codec::distributed_plans_decode_node_for_node", |o| {
        block_on(distributed_plans_decode_node_for_node(o))
    });
    suite.add_gpu("codec::plans_with_gpu_joins_survive_protobuf", |o| {
        block_on(roundtrip(o))
    });
    suite.add_gpu("codec::decoded_joins_run_where_they_land", |o| {
        block_on(decoded_where_it_lands(o))
    });
    suite.add_gpu("codec::the_dynamic_filter_travels", |o| {
        block_on(dynamic_filter_travels(o))
    });
}
