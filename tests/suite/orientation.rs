//! Joins built on their smaller side (`gpu_join.orient_joins`): where DataFusion builds an inner
//! or left semi join on its left input because that side holds a join it cannot size, the rule
//! builds it on its right input where that is estimated smaller. A semi join's subquery keys
//! then prune the outer side's scans before its joins run; an inner join streams the larger
//! side instead of collecting it. The answers stay DataFusion's either way.

use std::sync::Arc;

use datafusion::common::DataFusionError;
use datafusion::physical_plan::{ExecutionPlan, displayable};
use datafusion_gpu_join::RuntimeFilterExec;

use crate::engine::{answers, metric, run, session, wait_idle};
use crate::harness::{Options, Suite, block_on};

/// TPC-H in small: `cu` 2,000 customers, `od` 20,000 orders, `li` 80,000 line items, four an
/// order, each order's four of the same quantity (1 to 50) and supplier (of `sp`'s 500, their
/// names as `Utf8`; `sv` holds them as views). The
/// quantities are decimals, as TPC-H's are: DataFusion estimates a filter on their sum (which
/// it cannot bound) to keep a fifth of the rows, where for an integer sum it estimates all of
/// them.
const TABLES: [&str; 5] = [
    "CREATE TABLE cu AS SELECT value AS id, concat('customer#', value) AS name \
     FROM generate_series(1, 2000)",
    "CREATE TABLE sp AS SELECT value AS id, concat('supplier#', value) AS name \
     FROM generate_series(1, 500)",
    "CREATE TABLE sv AS SELECT id, arrow_cast(name, 'Utf8View') AS name FROM sp",
    "CREATE TABLE od AS SELECT value AS k, value % 2000 + 1 AS c, value * 3 AS price \
     FROM generate_series(1, 20000)",
    "CREATE TABLE li AS SELECT value % 20000 + 1 AS k, \
     CAST(value % 50 + 1 AS DECIMAL(15, 2)) AS q, value % 500 + 1 AS s \
     FROM generate_series(0, 79999)",
];

/// How a query's join is built, with `gpu_join.orient_joins` on or off: some `GpuJoinExec`
/// line of the plan holds `line`, and its build (left) input holds a join or not; where
/// `prunes`, a `RuntimeFilterExec` takes at least 19,600 of `od`'s 20,000 rows.
#[derive(Clone, Copy)]
struct Built {
    line: &'static str,
    on_join: bool,
    prunes: bool,
}

const fn built(line: &'static str, on_join: bool, prunes: bool) -> Built {
    Built {
        line,
        on_join,
        prunes,
    }
}

struct Case {
    sql: &'static str,
    on: Built,
    off: Built,
}

const CASES: [Case; 9] = [
    // The orders whose quantities sum to over 196 (400 of them) against the join of all three:
    // built on the 400, whose set prunes `od` to them before the joins above it, under the
    // query's limit (which no filter from above crosses).
    Case {
        sql: "SELECT cu.name, od.k, od.price, sum(li.q) FROM cu, od, li \
              WHERE od.k IN (SELECT k FROM li GROUP BY k HAVING sum(q) > 196) \
              AND cu.id = od.c AND od.k = li.k \
              GROUP BY cu.name, od.k, od.price ORDER BY od.k LIMIT 300",
        on: built("join_type=RightSemi", false, true),
        off: built("join_type=LeftSemi", true, false),
    },
    // The subquery (`li`, 80,000 rows) is estimated larger than the join's largest input
    // (`od`): built where DataFusion built it.
    Case {
        sql: "SELECT count(*), sum(od.price), min(cu.name) FROM cu, od \
              WHERE od.k IN (SELECT k FROM li) AND cu.id = od.c",
        on: built("join_type=LeftSemi", true, false),
        off: built("join_type=LeftSemi", true, false),
    },
    // A filtered dimension makes the join's size unknown (it may keep one customer's ten
    // orders): built where DataFusion built it, whose keys then prune the subquery's `li`.
    Case {
        sql: "SELECT count(*), sum(od.price) FROM cu JOIN od ON cu.id = od.c \
              WHERE cu.name = 'customer#7' \
              AND od.k IN (SELECT k FROM li GROUP BY k HAVING sum(q) > 10)",
        on: built("join_type=LeftSemi", true, false),
        off: built("join_type=LeftSemi", true, false),
    },
    // `sp ⋈ li` (80,000 rows, which DataFusion estimates at `sp`'s 500) joined with `od`
    // (20,000): DataFusion builds on the join, the rule on `od`, with the same columns in the
    // same order. (An order's four `li` rows are alike, so ordering by `od.k` orders every row.)
    Case {
        sql: "SELECT od.k, sp.id, li.q, od.price FROM sp JOIN li ON sp.id = li.s \
              JOIN od ON li.k = od.k ORDER BY od.k",
        on: built("join_type=Inner, on=[(k@", false, false),
        off: built("join_type=Inner, on=[(k@", true, false),
    },
    // The same carrying a string column of the join's, as a view (`sv`) or with offsets
    // (`sp`): built, it would travel on the device; probed, it would be gathered on the host.
    // Built where DataFusion built it.
    Case {
        sql: "SELECT od.k, sv.name, li.q, od.price FROM sv JOIN li ON sv.id = li.s \
              JOIN od ON li.k = od.k ORDER BY od.k",
        on: built("join_type=Inner, on=[(k@", true, false),
        off: built("join_type=Inner, on=[(k@", true, false),
    },
    Case {
        sql: "SELECT od.k, sp.name, li.q, od.price FROM sp JOIN li ON sp.id = li.s \
              JOIN od ON li.k = od.k ORDER BY od.k",
        on: built("join_type=Inner, on=[(k@", true, false),
        off: built("join_type=Inner, on=[(k@", true, false),
    },
    // Every column but the name: built on `od`.
    Case {
        sql: "SELECT sp.id, li.*, od.* FROM sp JOIN li ON sp.id = li.s JOIN od ON li.k = od.k \
              ORDER BY od.k",
        on: built("join_type=Inner, on=[(k@", false, false),
        off: built("join_type=Inner, on=[(k@", true, false),
    },
    // `od` sorted (under a limit, which keeps the sort): built on the join, the join keeps
    // `od`'s order, which the `ORDER BY` above it uses.
    Case {
        sql: "SELECT od.k, sp.id, li.q, od.price FROM sp JOIN li ON sp.id = li.s \
              JOIN (SELECT * FROM od ORDER BY k LIMIT 20000) od ON li.k = od.k ORDER BY od.k",
        on: built("join_type=Inner, on=[(k@", true, false),
        off: built("join_type=Inner, on=[(k@", true, false),
    },
    // Every column with `sp` filtered: how many rows the join keeps is unknown (a filtered
    // dimension may keep few of `li`'s), and it stays built as DataFusion built it.
    Case {
        sql: "SELECT sp.id, li.*, od.* FROM sp JOIN li ON sp.id = li.s JOIN od ON li.k = od.k \
              WHERE sp.name LIKE 'supplier#1%' ORDER BY od.k",
        on: built("join_type=Inner, on=[(k@", true, false),
        off: built("join_type=Inner, on=[(k@", true, false),
    },
];

/// The `GpuJoinExec` lines of `plan`, each with whether its build input holds a join, and the
/// rows its `RuntimeFilterExec`s pruned.
fn joins_and_pruned(plan: &Arc<dyn ExecutionPlan>) -> (Vec<(String, bool)>, usize) {
    let (mut joins, mut pruned) = (vec![], 0);
    if plan.is::<RuntimeFilterExec>() {
        pruned += metric(plan, "pruned_rows");
    }
    let line = displayable(plan.as_ref()).one_line().to_string();
    if line.starts_with("GpuJoinExec: ") {
        let build = plan.children()[0];
        joins.push((line, !joins_and_pruned(build).0.is_empty()));
    }
    for c in plan.children() {
        let (j, p) = joins_and_pruned(c);
        joins.extend(j);
        pruned += p;
    }
    (joins, pruned)
}

fn joins_built_on_their_smaller_side(options: &Options) -> Result<(), String> {
    let e = |e: DataFusionError| e.to_string();
    block_on(async {
        let cpu = crate::slt::session(options, false);
        for t in TABLES {
            run(&cpu, t).await.map_err(e)?;
        }
        for orient in [true, false] {
            let setting = format!("SET gpu_join.orient_joins = {orient}");
            let ctx = session(options, &[setting.as_str()]).await.map_err(e)?;
            for t in TABLES {
                run(&ctx, t).await.map_err(e)?;
            }
            for case in &CASES {
                let sql = case.sql;
                let (got, want, plan) = answers(&ctx, &cpu, sql).await?;
                if got != want {
                    return Err(format!("orient_joins = {orient}, {sql}:\n{got}\n{want}"));
                }
                let (joins, pruned) = joins_and_pruned(&plan);
                let want = if orient { case.on } else { case.off };
                let found = joins
                    .iter()
                    .any(|(line, on_join)| line.contains(want.line) && *on_join == want.on_join);
                // Built on the 400 orders, the set prunes 19,600 of `od`'s 20,000 rows.
                if !found || (want.prunes && pruned < 19_600) {
                    let shown = displayable(plan.as_ref()).indent(true).to_string();
                    return Err(format!(
                        "orient_joins = {orient}, {sql}: no GpuJoinExec with `{}` built on \
                         {} join, or {pruned} rows pruned where 19,600 should be ({})\n{shown}",
                        want.line,
                        if want.on_join { "a" } else { "no" },
                        want.prunes
                    ));
                }
            }
        }
        Ok::<(), String>(())
    })?;
    wait_idle(options, "oriented joins")
}

pub fn register(suite: &mut Suite) {
    suite.add_gpu(
        "orientation::joins_built_on_their_smaller_side",
        joins_built_on_their_smaller_side,
    );
}
