//! Semi joins built on their subquery (`gpu_join.orient_semi_joins`): where DataFusion builds a
//! left semi join on the side it outputs because that side holds a join it cannot size, the
//! rule builds it on the subquery's side, whose keys then prune the outer side's scans before
//! its joins run; the answers stay DataFusion's either way.

use std::sync::Arc;

use datafusion::common::DataFusionError;
use datafusion::physical_plan::{ExecutionPlan, displayable};
use datafusion_gpu_join::RuntimeFilterExec;

use crate::engine::{answers, metric, run, session, wait_idle};
use crate::harness::{Options, Suite, block_on};

/// TPC-H's Q18 in small: `cu` 2,000 customers, `od` 20,000 orders, `li` 80,000 line items, four
/// an order, each order's four of the same quantity (1 to 50). The quantities are decimals, as
/// TPC-H's are: DataFusion estimates a filter on their sum (which it cannot bound) to keep a
/// fifth of the rows, where for an integer sum it estimates all of them.
const TABLES: [&str; 3] = [
    "CREATE TABLE cu AS SELECT value AS id, concat('customer#', value) AS name \
     FROM generate_series(1, 2000)",
    "CREATE TABLE od AS SELECT value AS k, value % 2000 + 1 AS c, value * 3 AS price \
     FROM generate_series(1, 20000)",
    "CREATE TABLE li AS SELECT value % 20000 + 1 AS k, \
     CAST(value % 50 + 1 AS DECIMAL(15, 2)) AS q FROM generate_series(0, 79999)",
];

/// (query, whether the rule builds its semi join on the subquery)
const QUERIES: [(&str, bool); 3] = [
    // The orders whose quantities sum to over 196 (400 of them) against the join of all three:
    // built on the 400, whose set prunes `od` to them before the joins above it, under the
    // query's limit (which no filter from above crosses).
    (
        "SELECT cu.name, od.k, od.price, sum(li.q) FROM cu, od, li \
         WHERE od.k IN (SELECT k FROM li GROUP BY k HAVING sum(q) > 196) \
         AND cu.id = od.c AND od.k = li.k \
         GROUP BY cu.name, od.k, od.price ORDER BY od.k LIMIT 300",
        true,
    ),
    // The subquery (`li`, 80,000 rows) is estimated larger than the join's largest input
    // (`od`): built where DataFusion built it.
    (
        "SELECT count(*), sum(od.price), min(cu.name) FROM cu, od \
         WHERE od.k IN (SELECT k FROM li) AND cu.id = od.c",
        false,
    ),
    // A filtered dimension makes the join's size unknown (it may keep one customer's ten
    // orders): built where DataFusion built it, whose keys then prune the subquery's `li`.
    (
        "SELECT count(*), sum(od.price) FROM cu JOIN od ON cu.id = od.c \
         WHERE cu.name = 'customer#7' \
         AND od.k IN (SELECT k FROM li GROUP BY k HAVING sum(q) > 10)",
        false,
    ),
];

/// The plan's GPU joins' `join_type=` values, and the rows its `RuntimeFilterExec`s pruned.
fn joins_and_pruned(plan: &Arc<dyn ExecutionPlan>) -> (Vec<String>, usize) {
    let (mut types, mut pruned) = (vec![], 0);
    if plan.is::<RuntimeFilterExec>() {
        pruned += metric(plan, "pruned_rows");
    }
    let line = displayable(plan.as_ref()).one_line().to_string();
    if let Some(rest) = line.strip_prefix("GpuJoinExec: join_type=") {
        types.push(rest.split(',').next().unwrap_or_default().to_string());
    }
    for c in plan.children() {
        let (t, p) = joins_and_pruned(c);
        types.extend(t);
        pruned += p;
    }
    (types, pruned)
}

fn semi_joins_built_on_the_subquery(options: &Options) -> Result<(), String> {
    let e = |e: DataFusionError| e.to_string();
    block_on(async {
        let cpu = crate::slt::session(options, false);
        for t in TABLES {
            run(&cpu, t).await.map_err(e)?;
        }
        for orient in [true, false] {
            let setting = format!("SET gpu_join.orient_semi_joins = {orient}");
            let ctx = session(options, &[setting.as_str()]).await.map_err(e)?;
            for t in TABLES {
                run(&ctx, t).await.map_err(e)?;
            }
            for (sql, swapped) in QUERIES {
                let (got, want, plan) = answers(&ctx, &cpu, sql).await?;
                if got != want {
                    return Err(format!(
                        "orient_semi_joins = {orient}, {sql}:\n{got}\n{want}"
                    ));
                }
                let (types, pruned) = joins_and_pruned(&plan);
                let shown = displayable(plan.as_ref()).indent(true).to_string();
                let want_type = match orient && swapped {
                    true => "RightSemi",
                    false => "LeftSemi",
                };
                // Built on the 400 orders, the set prunes 19,600 of `od`'s 20,000 rows.
                let pruned_ok = match orient && swapped {
                    true => pruned >= 19_600,
                    false => true,
                };
                if !types.iter().any(|t| t == want_type) || !pruned_ok {
                    return Err(format!(
                        "orient_semi_joins = {orient}, {sql}: joins {types:?} (want a \
                         {want_type}), {pruned} rows pruned\n{shown}"
                    ));
                }
            }
        }
        Ok::<(), String>(())
    })?;
    wait_idle(options, "semi joins")
}

pub fn register(suite: &mut Suite) {
    suite.add_gpu(
        "semi_join::semi_joins_built_on_the_subquery_prune_the_outer_side",
        semi_joins_built_on_the_subquery,
    );
}
