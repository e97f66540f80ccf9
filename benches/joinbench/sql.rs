//! Running SQL for the end-to-end and TPC-H parts: timed runs that keep the executed plan (for
//! its metrics), finding operators in a plan, and comparing two results row for row.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use arrow::util::pretty::pretty_format_batches;
use datafusion::common::Result;
use datafusion::physical_plan::{ExecutionPlan, collect};
use datafusion::prelude::SessionContext;

use crate::report::median;

/// A query's median time over `runs` runs after a warm-up, its last result and executed plan.
pub struct Timed {
    pub time: Duration,
    pub batches: Vec<RecordBatch>,
    pub plan: Arc<dyn ExecutionPlan>,
}

/// Plans and runs `sql` `runs + 1` times; the first run is not timed.
pub async fn run_timed(ctx: &SessionContext, sql: &str, runs: usize) -> Result<Timed> {
    let mut timed = run_timed_in_turn(&[ctx], sql, runs).await?;
    Ok(timed.pop().expect("one session, one result"))
}

/// Plans and runs `sql` in each of `sessions` (say rule on, rule off) `runs + 1` times, the
/// sessions taking turns and each round starting with the next one (`a`, `b`, then `b`, `a`,
/// ...) so that all see the machine alike (caches, memory, other work); the first run of each
/// is not timed. One result per session, in order.
pub async fn run_timed_in_turn(
    sessions: &[&SessionContext],
    sql: &str,
    runs: usize,
) -> Result<Vec<Timed>> {
    let n = sessions.len();
    let mut times = vec![vec![]; n];
    let mut last = vec![None; n];
    for run in 0..=runs {
        for i in (0..n).map(|k| (run + k) % n) {
            let ctx = sessions[i];
            let start = Instant::now();
            let plan = ctx.sql(sql).await?.create_physical_plan().await?;
            let batches = collect(Arc::clone(&plan), ctx.task_ctx()).await?;
            if run > 0 {
                times[i].push(start.elapsed());
            }
            last[i] = Some((batches, plan));
        }
    }
    Ok(times
        .into_iter()
        .zip(last)
        .map(|(times, last)| {
            let (batches, plan) = last.expect("0..=runs is never empty");
            Timed {
                time: median(times),
                batches,
                plan,
            }
        })
        .collect())
}

/// Turns the rule on or off for the session's next queries.
pub async fn set_rule(ctx: &SessionContext, enabled: bool) -> Result<()> {
    ctx.sql(&format!("SET gpu_join.enabled = {enabled}"))
        .await?
        .collect()
        .await?;
    Ok(())
}

/// The first operator named `name` in `plan`, depth first.
pub fn find(plan: &Arc<dyn ExecutionPlan>, name: &str) -> Option<Arc<dyn ExecutionPlan>> {
    if plan.name() == name {
        return Some(Arc::clone(plan));
    }
    plan.children().into_iter().find_map(|c| find(c, name))
}

/// How many operators of `plan` `pick` holds for.
pub fn count(plan: &Arc<dyn ExecutionPlan>, pick: &dyn Fn(&dyn ExecutionPlan) -> bool) -> usize {
    usize::from(pick(plan.as_ref()))
        + plan
            .children()
            .into_iter()
            .map(|c| count(c, pick))
            .sum::<usize>()
}

/// Metric `metric` of every operator of `plan` named `name`, summed over operators and their
/// partitions.
pub fn sum_metric(plan: &Arc<dyn ExecutionPlan>, name: &str, metric: &str) -> usize {
    let own = match plan.name() == name {
        true => plan
            .metrics()
            .and_then(|m| m.sum_by_name(metric))
            .map_or(0, |v| v.as_usize()),
        false => 0,
    };
    own + plan
        .children()
        .into_iter()
        .map(|c| sum_metric(c, name, metric))
        .sum::<usize>()
}

/// The rows of a result as sorted text lines: equal for equal multisets of rows.
pub fn rows(batches: &[RecordBatch]) -> Result<Vec<String>> {
    let text = pretty_format_batches(batches)?.to_string();
    let mut lines: Vec<String> = text.lines().map(str::to_string).collect();
    lines.sort_unstable();
    Ok(lines)
}
