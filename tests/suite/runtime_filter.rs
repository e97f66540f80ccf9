//! `RuntimeFilterExec` (`gpu_join.runtime_filters`): a join's dynamic filter applied above
//! in-memory scans under its probe side, past an aggregate, a filter or another join — where
//! the rule places it, what it prunes, and that the answers stay DataFusion's.

use std::sync::Arc;

use datafusion::common::DataFusionError;
use datafusion::physical_plan::{ExecutionPlan, displayable};
use datafusion_gpu_join::RuntimeFilterExec;

use crate::engine::{metric, run, run_plan, session, text, wait_idle};
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
/// rows whose keys cover the same range, one in 67 of them a build key.
const TABLES: [&str; 2] = [
    "CREATE TABLE b AS SELECT value * 1000 AS k, value AS v FROM generate_series(1, 3000)",
    "CREATE TABLE p AS SELECT value * 10 + value % 7 AS k, value AS w \
     FROM generate_series(1, 300000)",
];

/// (query, whether a `RuntimeFilterExec` must prune its probe rows)
const QUERIES: [(&str, bool); 6] = [
    // The probe side aggregated by the key: the aggregate sees only the rows of b's keys.
    (
        "SELECT count(*), sum(b.v), sum(a.s) FROM b JOIN \
         (SELECT k, sum(w) AS s, count(*) AS c FROM p GROUP BY k) a ON b.k = a.k",
        true,
    ),
    // Under a filter of the probe scan.
    (
        "SELECT count(*), sum(p.w) FROM b JOIN p ON b.k = p.k WHERE p.w % 3 <> 1",
        true,
    ),
    // A left join built on b drops probe rows without a match too.
    (
        "SELECT count(*), sum(b.v), sum(a.s) FROM b LEFT JOIN \
         (SELECT k, sum(w) AS s FROM p GROUP BY k) a ON b.k = a.k",
        true,
    ),
    // A right join keeps every probe row: nothing may be pruned.
    (
        "SELECT count(*), count(b.v), sum(a.s) FROM b RIGHT JOIN \
         (SELECT k, sum(w) AS s FROM p GROUP BY k) a ON b.k = a.k",
        false,
    ),
    // Neither may a null-aware anti join's.
    (
        "SELECT count(*), sum(a.s) FROM (SELECT k, sum(w) AS s FROM p GROUP BY k) a \
         WHERE a.k NOT IN (SELECT k FROM b)",
        false,
    ),
    // The probe scan read by the join directly: the join stages its keys; no node.
    (
        "SELECT count(*), sum(p.w) FROM b JOIN p ON b.k = p.k",
        false,
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
            for (sql, prunes) in QUERIES {
                let (got, plan) = run_plan(&ctx, sql).await.map_err(e)?;
                let want = run(&cpu, sql).await.map_err(e)?;
                let (got, want) = (text(&got).map_err(e)?, text(&want).map_err(e)?);
                if got != want {
                    return Err(format!("runtime_filters = {on}, {sql}:\n{got}\n{want}"));
                }
                let nodes = runtime_filters(&plan);
                let pruned: usize = nodes.iter().map(|n| metric(n, "pruned_rows")).sum();
                let shown = displayable(plan.as_ref()).indent(true).to_string();
                let expected = on && prunes;
                // A node that prunes holds the build keys' set: the bounds alone (1,000 to
                // 3,000,000) keep nearly every probe row.
                let set = shown.contains("IN (3000 build keys)");
                if expected != (pruned > 0) || expected != set || (!on && !nodes.is_empty()) {
                    return Err(format!(
                        "runtime_filters = {on}, {sql}: {} nodes, {pruned} rows pruned\n{shown}",
                        nodes.len()
                    ));
                }
                if !prunes && !nodes.is_empty() {
                    return Err(format!("a node where none belongs, {sql}:\n{shown}"));
                }
            }
        }
        Ok::<(), String>(())
    })?;
    wait_idle(options, "runtime filters")
}

pub fn register(suite: &mut Suite) {
    suite.add_gpu(
        "runtime_filter::runtime_filters_prune_probe_rows_below_other_work",
        runtime_filters_prune,
    );
}
