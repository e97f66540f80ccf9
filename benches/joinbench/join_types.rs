//! Join types end to end through SQL: the standard workload made 50 % matching (|R| =
//! 2^`--types-log2-r`, |S| = 2|R|, two 4-byte payloads a side, in host memory, one partition per
//! core), joined as inner, left, right and full outer, semi and anti joins from either side,
//! and a null-aware anti join (`NOT IN`), with the rule on and off in the same run. Reports both times, the speed-up, and each join's
//! time over the inner join's with the rule on (the targets: a left outer join within
//! 1.3x of the inner join, semi and anti joins faster than it). Then residual filters that
//! keep half the pairs of equal keys, compiled for the device (`(r.p0 + s.p1) % 4 < 2`) and,
//! for the same pairs, left to the host (`& 3`, outside the compiled subset), and a join
//! without equal keys (a nested loop join on a `BETWEEN`, |R| / 2^12 ⋈ |S| / 2^9 rows, about
//! one match a probe row); each query's plan is checked to put its filter where it says.
//! `gpu_join.min_build_rows` is 0 here. The report shows the join type each query was planned
//! as (the plan may swap inputs).

use std::sync::Arc;

use datafusion::common::{DataFusionError, Result};
use serde_json::json;

use crate::Device;
use crate::args::Args;
use crate::e2e::context;
use crate::report::{Report, progress};
use crate::sql::{find, rows, run_timed, set_rule};
use crate::workload::{Workload, generate};

/// The queries, by the join type they ask for; the plan may swap the inputs (DataFusion's
/// `JoinSelection`), and the report shows the join type it planned.
const QUERIES: [(&str, &str); 13] = [
    (
        "Inner",
        "SELECT count(*), sum(r.p0), sum(r.p1), sum(s.p0), sum(s.p1) FROM r JOIN s ON r.k = s.k",
    ),
    (
        "Left",
        "SELECT count(*), sum(r.p0), sum(r.p1), sum(s.p0), sum(s.p1) FROM r LEFT JOIN s ON r.k = s.k",
    ),
    (
        "Right",
        "SELECT count(*), sum(r.p0), sum(r.p1), sum(s.p0), sum(s.p1) FROM r RIGHT JOIN s ON r.k = s.k",
    ),
    (
        "Full",
        "SELECT count(*), sum(r.p0), sum(r.p1), sum(s.p0), sum(s.p1) FROM r FULL JOIN s ON r.k = s.k",
    ),
    (
        "LeftSemi",
        "SELECT count(*), sum(r.p0), sum(r.p1) FROM r WHERE EXISTS (SELECT 1 FROM s WHERE s.k = r.k)",
    ),
    (
        "LeftAnti",
        "SELECT count(*), sum(r.p0), sum(r.p1) FROM r WHERE NOT EXISTS (SELECT 1 FROM s WHERE s.k = r.k)",
    ),
    (
        // `nullif` makes the subquery's key nullable (it is never null), so that DataFusion
        // plans a null-aware anti join.
        "LeftAnti (NOT IN)",
        "SELECT count(*), sum(r.p0), sum(r.p1) FROM r WHERE r.k NOT IN (SELECT nullif(s.k, -1) FROM s)",
    ),
    (
        "RightSemi",
        "SELECT count(*), sum(s.p0), sum(s.p1) FROM s WHERE EXISTS (SELECT 1 FROM r WHERE r.k = s.k)",
    ),
    (
        "RightAnti",
        "SELECT count(*), sum(s.p0), sum(s.p1) FROM s WHERE NOT EXISTS (SELECT 1 FROM r WHERE r.k = s.k)",
    ),
    (
        "Inner, filter=device",
        "SELECT count(*), sum(r.p0), sum(r.p1), sum(s.p0), sum(s.p1) FROM r JOIN s ON r.k = s.k AND (r.p0 + s.p1) % 4 < 2",
    ),
    (
        "Inner, filter=host",
        "SELECT count(*), sum(r.p0), sum(r.p1), sum(s.p0), sum(s.p1) FROM r JOIN s ON r.k = s.k AND ((r.p0 + s.p1) & 3) < 2",
    ),
    (
        "Left, filter=device",
        "SELECT count(*), sum(r.p0), sum(r.p1), sum(s.p0), sum(s.p1) FROM r LEFT JOIN s ON r.k = s.k AND (r.p0 + s.p1) % 4 < 2",
    ),
    (
        "RightAnti, filter=device",
        "SELECT count(*), sum(s.p0), sum(s.p1) FROM s WHERE NOT EXISTS (SELECT 1 FROM r WHERE r.k = s.k AND (r.p0 + s.p1) % 4 < 2)",
    ),
];

/// A join without equal keys over the first |R| / 2^12 keys of R and |S| / 2^9 rows of S:
/// DataFusion plans a nested loop join; every probe row matches about one build row.
fn nested_loop_query(log2_r: u32) -> (String, String) {
    let (a, b) = (
        1u64 << log2_r.saturating_sub(12),
        1u64 << log2_r.saturating_sub(8),
    );
    (
        "Inner, no keys, filter=device".into(),
        format!(
            "SELECT count(*), sum(a.p0), sum(b.p1) FROM (SELECT * FROM r WHERE k < {a}) a \
             JOIN (SELECT * FROM s WHERE k < {b}) b ON a.p0 * 16 BETWEEN b.p1 AND b.p1 + 15"
        ),
    )
}

/// The join type of the first `node` (a join) in `plan`, as its one-line display shows it.
fn planned_join_type(
    plan: &Arc<dyn datafusion::physical_plan::ExecutionPlan>,
    node: &str,
) -> Option<String> {
    let join = find(plan, node)?;
    let line = datafusion::physical_plan::displayable(join.as_ref())
        .one_line()
        .to_string();
    let from = line.find("join_type=")? + "join_type=".len();
    let len = line[from..].find(',')?;
    Some(line[from..from + len].to_string())
}

pub async fn run(device: &Device, args: &Args, report: &mut Report) -> Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let w = Workload {
        match_ratio: 0.5,
        ..Workload::standard(args.types_log2_r, 2)
    };
    let bar = progress(QUERIES.len() as u64 + 1, "join types");
    bar.set_message("generating");
    let t = generate(&w);
    let ctx = context(device, None, t, cores)?;
    let mut inner_on = None;
    let queries = QUERIES
        .iter()
        .map(|&(a, q)| (a.to_string(), q.to_string()))
        .chain([nested_loop_query(args.types_log2_r)]);
    for (join_type, sql) in queries {
        let sql = sql.as_str();
        bar.set_message(format!("{join_type}: rule on"));
        set_rule(&ctx, true).await?;
        let on = run_timed(&ctx, sql, args.e2e_runs).await?;
        let Some(planned) = planned_join_type(&on.plan, "GpuJoinExec") else {
            return Err(DataFusionError::Execution(format!(
                "`{sql}` ({join_type}) did not run on GpuJoinExec"
            )));
        };
        // The filter runs where the query's name says.
        if let Some((_, place)) = join_type.split_once("filter=") {
            let join = find(&on.plan, "GpuJoinExec").expect("found above");
            let line = datafusion::physical_plan::displayable(join.as_ref())
                .one_line()
                .to_string();
            if !line.contains(&format!("filter={place}:")) {
                return Err(DataFusionError::Execution(format!(
                    "`{sql}`: the filter does not run on the {place}: {line}"
                )));
            }
        }
        set_rule(&ctx, false).await?;
        bar.set_message(format!("{join_type}: rule off"));
        let off = run_timed(&ctx, sql, args.e2e_runs).await?;
        let cpu = planned_join_type(&off.plan, "HashJoinExec")
            .or_else(|| planned_join_type(&off.plan, "NestedLoopJoinExec"));
        if cpu.as_deref() != Some(planned.as_str()) || rows(&on.batches)? != rows(&off.batches)? {
            return Err(DataFusionError::Execution(format!(
                "`{sql}`: results differ between rule on and off"
            )));
        }
        let (on_s, off_s) = (on.time.as_secs_f64(), off.time.as_secs_f64());
        let inner_s = *inner_on.get_or_insert(on_s);
        report.join_types.push(json!({
            "join_type": planned, "asked": join_type, "query": sql, "r_rows": w.r_rows, "s_rows": w.s_rows,
            "match_ratio": w.match_ratio, "backend": device.name(), "partitions": cores,
            "runs": args.e2e_runs, "rule_on_s": on_s, "rule_off_s": off_s,
            "speedup": off_s / on_s, "over_inner": on_s / inner_s,
        }));
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(())
}
