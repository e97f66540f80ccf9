//! `RuntimeFilterExec` (`gpu_join.runtime_filters`): a join's dynamic filter applied above
//! in-memory scans under its probe side, past an aggregate, a filter or another join — where
//! the rule places it, what it prunes, and that the answers stay DataFusion's.

use std::sync::Arc;

use datafusion::common::DataFusionError;
use datafusion::physical_plan::{ExecutionPlan, displayable};
use datafusion_gpu_join::RuntimeFilterExec;

use crate::engine::{answers, metric, run, session, wait_idle};
use crate::harness::{Options, Suite, block_on};

/// The `RuntimeFilterExec` nodes of a plan.
fn runtime_filters(plan: &Arc<dyn ExecutionPlan>) -> Vec<Arc<dyn ExecutionPlan>> {
    let mut found = vec![];
    if plan.is::<RuntimeFilterExec>() {
        found.push(Arc::clone(plan));
    }
    for c in plan.children() {
        found.extend(runtime_filters(c));
    }
    found
}

/// `b`: 3,000 build keys spread over 3 million values (a thousand apart); `p`: 300,000 probe
/// rows whose keys cover the same range, one in 67 of them a build key; `q`: 300,000 probe rows
/// whose keys are all build keys. `g` (0 or 1) is a second key column for `b` and `p`.
const TABLES: [&str; 3] = [
    "CREATE TABLE b AS SELECT value * 1000 AS k, value AS v, value % 2 AS g \
     FROM generate_series(1, 3000)",
    "CREATE TABLE p AS SELECT value * 10 + value % 7 AS k, value AS w, value % 2 AS g \
     FROM generate_series(1, 300000)",
    "CREATE TABLE q AS SELECT (value % 3000 + 1) * 1000 AS k, value AS w \
     FROM generate_series(1, 300000)",
];

/// What a query's `RuntimeFilterExec` nodes must do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Expect {
    /// A node prunes probe rows with the build keys' set.
    Prunes,
    /// A node applies the set, which prunes nothing, and drops it.
    Drops,
    /// No node.
    None,
}

/// (query, what its nodes do, how many there are with `gpu_join.runtime_filters` on)
const QUERIES: [(&str, Expect, usize); 9] = [
    // The probe side aggregated by the key: the aggregate sees only the rows of b's keys.
    (
        "SELECT count(*), sum(b.v), sum(a.s) FROM b JOIN \
         (SELECT k, sum(w) AS s, count(*) AS c FROM p GROUP BY k) a ON b.k = a.k",
        Expect::Prunes,
        1,
    ),
    // Under a filter of the probe scan.
    (
        "SELECT count(*), sum(p.w) FROM b JOIN p ON b.k = p.k WHERE p.w % 3 <> 1",
        Expect::Prunes,
        1,
    ),
    // A key of two columns: the set of the one whose build keys cover least of its range.
    (
        "SELECT count(*), sum(b.v), sum(a.s) FROM b JOIN \
         (SELECT k, g, sum(w) AS s FROM p GROUP BY k, g) a ON b.k = a.k AND b.g = a.g",
        Expect::Prunes,
        1,
    ),
    // A left join built on b drops probe rows without a match too.
    (
        "SELECT count(*), sum(b.v), sum(a.s) FROM b LEFT JOIN \
         (SELECT k, sum(w) AS s FROM p GROUP BY k) a ON b.k = a.k",
        Expect::Prunes,
        1,
    ),
    // Every probe row matches: the set prunes nothing, and each partition stops testing it.
    (
        "SELECT count(*), sum(b.v), sum(a.s) FROM b JOIN \
         (SELECT k, sum(w) AS s FROM q GROUP BY k) a ON b.k = a.k",
        Expect::Drops,
        1,
    ),
    // A right join keeps every probe row: nothing may be pruned.
    (
        "SELECT count(*), count(b.v), sum(a.s) FROM b RIGHT JOIN \
         (SELECT k, sum(w) AS s FROM p GROUP BY k) a ON b.k = a.k",
        Expect::None,
        0,
    ),
    // Neither may a null-aware anti join's.
    (
        "SELECT count(*), sum(a.s) FROM (SELECT k, sum(w) AS s FROM p GROUP BY k) a \
         WHERE a.k NOT IN (SELECT k FROM b)",
        Expect::None,
        0,
    ),
    // The probe scan read by the join directly: the join stages its keys; no node.
    (
        "SELECT count(*), sum(p.w) FROM b JOIN p ON b.k = p.k",
        Expect::None,
        0,
    ),
    // The upper join's set (1,500 keys) prunes the lower join's build side, past the lower
    // join; the lower join reads p directly, so no node goes there, not even for the upper
    // join's filter: one node.
    (
        "SELECT count(*), sum(x.v) FROM (SELECT b.k, b.v FROM b JOIN p ON b.k = p.k) x \
         JOIN b c ON x.k = c.k WHERE c.v % 2 = 0",
        Expect::Prunes,
        1,
    ),
];

fn runtime_filters_prune(options: &Options) -> Result<(), String> {
    let e = |e: DataFusionError| e.to_string();
    block_on(async {
        let cpu = crate::slt::session(options, false);
        for t in TABLES {
            run(&cpu, t).await.map_err(e)?;
        }
        for on in [true, false] {
            let settings = [
                format!("SET gpu_join.runtime_filters = {on}"),
                "SET datafusion.execution.batch_size = 4096".into(),
            ];
            let settings: Vec<&str> = settings.iter().map(String::as_str).collect();
            let ctx = session(options, &settings).await.map_err(e)?;
            for t in TABLES {
                run(&ctx, t).await.map_err(e)?;
            }
            for (sql, expect, count) in QUERIES {
                let (got, want, plan) = answers(&ctx, &cpu, sql).await?;
                if got != want {
                    return Err(format!("runtime_filters = {on}, {sql}:\n{got}\n{want}"));
                }
                let nodes = runtime_filters(&plan);
                let sum = |m: &str| nodes.iter().map(|n| metric(n, m)).sum::<usize>();
                let (pruned, dropped) = (sum("pruned_rows"), sum("filters_dropped"));
                let shown = displayable(plan.as_ref()).indent(true).to_string();
                // The bounds alone (1,000 to 3,000,000) keep nearly every probe row: a node
                // that prunes holds the build keys' set.
                let set = shown.contains("00 build keys)");
                let did = match (nodes.is_empty(), pruned > 0, dropped > 0) {
                    (true, _, _) => Expect::None,
                    (false, true, false) if set => Expect::Prunes,
                    (false, false, true) if set => Expect::Drops,
                    _ => {
                        return Err(format!(
                            "runtime_filters = {on}, {sql}: {} nodes, {pruned} rows pruned, \
                             {dropped} filters dropped\n{shown}",
                            nodes.len()
                        ));
                    }
                };
                let (want, count) = if on {
                    (expect, count)
                } else {
                    (Expect::None, 0)
                };
                if did != want || nodes.len() != count {
                    return Err(format!(
                        "runtime_filters = {on}, {sql}: {did:?} in {} nodes, not {want:?} in \
                         {count}\n{shown}",
                        nodes.len()
                    ));
                }
            }
        }
        Ok::<(), String>(())
    })?;
    wait_idle(options, "runtime filters")
}

/// A probe side with a column null in its early rows, for an aggregate's own dynamic filter.
const NULLS_EARLY: &str = "CREATE TABLE r AS SELECT value % 3000 + 1 AS k, value AS w, \
     CASE WHEN value < 250000 THEN NULL ELSE value END AS y FROM generate_series(1, 300000)";

/// Queries whose answers a filter applied in the wrong place would change: (query, whether
/// its answer is determined (a LIMIT without ORDER BY may keep any rows, so only where no
/// node goes is checked), whether a `RuntimeFilterExec` may appear in its plan).
const KEPT_ANSWERS: [(&str, bool, bool); 4] = [
    // The aggregate above the join pushes `w < min(w) OR y > max(y)` down, without the `y`
    // term while `max(y)` has seen only nulls: applied to rows, it would drop every `y`. A
    // node applies only the joins' own filters.
    (
        "SELECT min(r.w), max(r.y) FROM b JOIN r ON b.k = r.k WHERE r.w % 3 <> 1",
        true,
        true,
    ),
    // Rows pruned under ORDER BY ... LIMIT would change which rows it keeps: over a table in
    // key order, the limit goes into the filter (`FilterExec: ..., fetch=15000`), which
    // passes the join's filter on to the scan.
    (
        "SELECT count(*), sum(x.w) FROM b JOIN \
         (SELECT k, w FROM pc WHERE w % 3 <> 1 ORDER BY k LIMIT 15000) x ON b.k = x.k",
        true,
        false,
    ),
    // So would rows pruned under a join that stops at its LIMIT.
    (
        "SELECT count(*) FROM b JOIN \
         (SELECT p.k, p.w FROM p JOIN q ON p.k = q.k LIMIT 500) x ON b.k = x.k",
        false,
        false,
    ),
    // And under DISTINCT ... LIMIT (the first groups found).
    (
        "SELECT count(*) FROM b JOIN (SELECT DISTINCT k FROM p LIMIT 5000) x ON b.k = x.k",
        false,
        false,
    ),
];

fn runtime_filters_keep_answers(options: &Options) -> Result<(), String> {
    let e = |e: DataFusionError| e.to_string();
    block_on(async {
        let cpu = crate::slt::session(options, false);
        let settings = [
            "SET gpu_join.runtime_filters = true",
            "SET gpu_join.probe_chunk_rows = 4096",
            "SET datafusion.execution.target_partitions = 1",
        ];
        run(&cpu, "SET datafusion.execution.target_partitions = 1")
            .await
            .map_err(e)?;
        let ctx = session(options, &settings).await.map_err(e)?;
        // `pc`: p's rows in key order, in a Parquet file declared so.
        let dir = std::env::temp_dir().join(format!("gpu_join_runtime_{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let file = dir.join("pc.parquet");
        let ordered = [
            format!(
                "COPY (SELECT value * 10 + value % 7 AS k, value AS w FROM \
                 generate_series(1, 100000) ORDER BY k) TO '{}' STORED AS PARQUET",
                file.display()
            ),
            format!(
                "CREATE EXTERNAL TABLE pc STORED AS PARQUET LOCATION '{}' WITH ORDER (k ASC)",
                file.display()
            ),
        ];
        run(&cpu, &ordered[0]).await.map_err(e)?;
        for t in TABLES
            .iter()
            .chain([&NULLS_EARLY])
            .map(|t| t.to_string())
            .chain([ordered[1].clone()])
        {
            run(&cpu, &t).await.map_err(e)?;
            run(&ctx, &t).await.map_err(e)?;
        }
        for (sql, determined, node_allowed) in KEPT_ANSWERS {
            let (got, want, plan) = answers(&ctx, &cpu, sql).await?;
            let shown = displayable(plan.as_ref()).indent(true).to_string();
            if determined && got != want {
                return Err(format!("{sql}:\n{got}\n{want}\n{shown}"));
            }
            if !node_allowed && !runtime_filters(&plan).is_empty() {
                return Err(format!("a node under a limit, {sql}:\n{shown}"));
            }
            if shown.contains("RuntimeFilterExec") && shown.contains("OR y@") {
                return Err(format!("an aggregate's filter applied, {sql}:\n{shown}"));
            }
        }
        let _ = std::fs::remove_dir_all(&dir);
        Ok::<(), String>(())
    })?;
    wait_idle(options, "runtime filters under limits and aggregates")
}

pub fn register(suite: &mut Suite) {
    suite.add_gpu(
        "runtime_filter::runtime_filters_keep_answers_under_limits_and_aggregates",
        runtime_filters_keep_answers,
    );
    suite.add_gpu(
        "runtime_filter::runtime_filters_prune_probe_rows_below_other_work",
        runtime_filters_prune,
    );
}
