//! The build cache (`gpu_join.cache_bytes`): a join whose build input is the same plan over the
//! same data as one a query of the session collected joins the batches kept, without reading
//! its input; a changed table, another filter, a volatile function, a plan that cannot be
//! identified or a cache too small keeps nothing stale. Every answer is DataFusion's.

use std::sync::Arc;

use arrow::array::{ArrayRef, AsArray, Int64Array};
use arrow::compute::kernels::numeric;
use arrow::datatypes::{DataType, Int64Type};
use datafusion::common::{DataFusionError, ScalarValue};
use datafusion::logical_expr::{
    Accumulator, ColumnarValue, ScalarUDF, Volatility, create_udaf, create_udf,
};
use datafusion::physical_plan::{ExecutionPlan, displayable};
use datafusion::prelude::SessionContext;
use datafusion_gpu_join::GpuJoinExec;

use crate::engine::{answers, find_join, run, session, wait_idle};
use crate::harness::{Options, Suite, block_on};

/// A dimension `d` (5,000 keys) and a fact table `f` (100,000 rows, 20 a key).
const TABLES: [&str; 2] = [
    "CREATE TABLE d AS SELECT value AS k, value * 3 AS v FROM generate_series(1, 5000)",
    "CREATE TABLE f AS SELECT value % 5000 + 1 AS k, value AS x FROM generate_series(0, 99999)",
];

/// DataFusion's session, and one whose joins keep build sides (`gpu_join.cache_bytes`, 64 MiB).
async fn sessions(options: &Options) -> Result<(SessionContext, SessionContext), String> {
    let ctx = session(options, &["SET gpu_join.cache_bytes = '64MiB'"])
        .await
        .map_err(|e| e.to_string())?;
    Ok((crate::slt::session(options, false), ctx))
}

/// A second dimension `e` over `d`'s keys.
const E: &str =
    "CREATE TABLE e AS SELECT value AS k, value % 1000 AS w FROM generate_series(1, 5000)";

/// Runs each of `statements` in each of `sessions`.
async fn run_in(sessions: &[&SessionContext], statements: &[&str]) -> Result<(), String> {
    for ctx in sessions {
        for sql in statements {
            run(ctx, sql).await.map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// The build cache of `ctx`'s session.
fn cache_of(ctx: &SessionContext) -> Result<Arc<datafusion_gpu_join::BuildCache>, String> {
    datafusion_gpu_join::build_cache(ctx.state().config())
        .ok_or_else(|| "the session has no build cache".to_string())
}

/// The query, its build side `d` filtered by `filter`.
fn query(filter: &str) -> String {
    format!("SELECT count(*), sum(f.x), sum(d.v) FROM d JOIN f ON d.k = f.k WHERE {filter}")
}

/// Runs `sql` in `ctx` and in DataFusion's `cpu`; fails unless the answers are equal and the
/// join shows `cache=[{want}...` (or no `cache=` where `want` is `None`). Gives the join.
async fn check(
    ctx: &SessionContext,
    cpu: &SessionContext,
    sql: &str,
    want: Option<&str>,
) -> Result<Arc<dyn ExecutionPlan>, String> {
    let (got, expected, plan) = answers(ctx, cpu, sql).await?;
    if got != expected {
        return Err(format!("{sql}:\n{got}\nDataFusion:\n{expected}"));
    }
    let join = find_join(&plan).ok_or_else(|| format!("{sql}: no GpuJoinExec"))?;
    let line = displayable(join.as_ref()).one_line().to_string();
    let ok = match want {
        Some(w) => line.contains(&format!("cache=[{w}")),
        None => !line.contains("cache="),
    };
    if !ok {
        return Err(format!("{sql}: expected cache={want:?}:\n{line}"));
    }
    Ok(join)
}

/// Rows the build input of `join` put out (0: it was not read).
fn build_rows_read(join: &Arc<dyn ExecutionPlan>) -> usize {
    join.children()[0]
        .metrics()
        .and_then(|m| m.output_rows())
        .unwrap_or(0)
}

fn repeated_queries_join_kept_build_sides(options: &Options) -> Result<(), String> {
    let e = |e: DataFusionError| e.to_string();
    block_on(async {
        let (cpu, ctx) = sessions(options).await?;
        let off = session(options, &[]).await.map_err(e)?;
        run_in(&[&cpu, &ctx, &off], &TABLES).await?;
        let cache = cache_of(&ctx)?;
        let q1 = query("d.v % 7 = 1");
        // Off by default.
        check(&off, &cpu, &q1, None).await?;
        // Collected and kept, then joined again without reading `d`.
        let first = check(&ctx, &cpu, &q1, Some("stored")).await?;
        if build_rows_read(&first) == 0 || cache.len() != 1 {
            return Err(format!(
                "the first run read {} build rows and kept {} build sides",
                build_rows_read(&first),
                cache.len()
            ));
        }
        let again = check(&ctx, &cpu, &q1, Some("hit")).await?;
        if build_rows_read(&again) != 0 {
            return Err(format!(
                "a hit read {} rows of its build input",
                build_rows_read(&again)
            ));
        }
        // (The executed plans hold the tables' batches.)
        drop((first, again));
        // Another filter is another build side.
        let q2 = query("d.v % 7 = 2");
        check(&ctx, &cpu, &q2, Some("stored")).await?;
        check(&ctx, &cpu, &q2, Some("hit")).await?;
        // A row added to `d`: its batches are others, and the answer counts the new row.
        run_in(&[&cpu, &ctx], &["INSERT INTO d VALUES (4999, 15)"]).await?;
        check(&ctx, &cpu, &q1, Some("stored")).await?;
        check(&ctx, &cpu, &q1, Some("hit")).await?;
        // `d` made again with other values: a plan alike to the last, over other batches.
        let replace = "CREATE OR REPLACE TABLE d AS SELECT value AS k, value * 5 AS v \
                       FROM generate_series(1, 5000)";
        run_in(&[&cpu, &ctx], &[replace]).await?;
        check(&ctx, &cpu, &q1, Some("stored")).await?;
        if cache.len() != 1 {
            return Err(format!(
                "{} build sides kept where the tables of all but one are gone",
                cache.len()
            ));
        }
        check(&ctx, &cpu, &q1, Some("hit")).await?;
        // Nothing volatile, nothing the plan cannot identify, is kept.
        let volatile = query("d.v % 7 = 1 AND random() < 2.0");
        check(
            &ctx,
            &cpu,
            &volatile,
            Some("not kept: a function whose value may change"),
        )
        .await?;
        let sorted = "SELECT count(*), sum(f.x), sum(d.v) FROM \
                      (SELECT * FROM d ORDER BY v LIMIT 3000) d JOIN f ON d.k = f.k";
        check(
            &ctx,
            &cpu,
            sorted,
            Some("not kept: SortPreservingMergeExec with a limit"),
        )
        .await?;
        // Least recently used out first: room for about one build side.
        let one = cache.bytes() / cache.len().max(1);
        let room = format!("SET gpu_join.cache_bytes = {}", one * 3 / 2);
        run(&ctx, &room).await.map_err(e)?;
        // `q2` was used before `q1` over the latest `d`: it went first.
        check(&ctx, &cpu, &q2, Some("stored")).await?;
        if cache.len() != 1 {
            return Err(format!("{} build sides kept in room for one", cache.len()));
        }
        check(&ctx, &cpu, &q2, Some("hit")).await?;
        check(&ctx, &cpu, &q1, Some("stored")).await?;
        check(&ctx, &cpu, &q2, Some("stored")).await?;
        // Too large for the cache.
        run(&ctx, "SET gpu_join.cache_bytes = 1000")
            .await
            .map_err(e)?;
        check(&ctx, &cpu, &q1, Some("not stored: its ")).await?;
        // Turned off: what was kept goes.
        run(&ctx, "SET gpu_join.cache_bytes = 0").await.map_err(e)?;
        check(&ctx, &cpu, &q1, None).await?;
        if !cache.is_empty() || cache.bytes() != 0 {
            return Err(format!(
                "{} build sides ({} bytes) still kept with the cache off",
                cache.len(),
                cache.bytes()
            ));
        }
        // Files: kept by path, size and modification time.
        let dir = std::env::temp_dir().join(format!("gpu-join-cache-{}", std::process::id()));
        let path = dir.join("d.parquet");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let copy = format!(
            "COPY (SELECT * FROM d WHERE k <= 4000) TO '{}' STORED AS PARQUET",
            path.display()
        );
        run(&cpu, &copy).await.map_err(e)?;
        let table = format!(
            "CREATE EXTERNAL TABLE dp STORED AS PARQUET LOCATION '{}'",
            path.display()
        );
        run(&ctx, "SET gpu_join.cache_bytes = '64MiB'")
            .await
            .map_err(e)?;
        run_in(&[&cpu, &ctx], &[&table]).await?;
        let q3 = "SELECT count(*), sum(f.x), sum(dp.v) FROM dp JOIN f ON dp.k = f.k \
                  WHERE dp.v % 5 = 0";
        check(&ctx, &cpu, q3, Some("stored")).await?;
        let again = check(&ctx, &cpu, q3, Some("hit")).await?;
        if build_rows_read(&again) != 0 {
            return Err("a hit read its Parquet build input".into());
        }
        // A directory's files, as DataFusion's list-files cache lists them: it keeps a file's
        // size and modification time after the file is written again (here with the same
        // size), so the key of that listing is the first query's; the file is read again.
        let sub = dir.join("t");
        std::fs::create_dir_all(&sub).map_err(|e| e.to_string())?;
        let write = |add: i64| {
            format!(
                "COPY (SELECT k, v * 10 + {add} AS v FROM d WHERE k <= 4000) TO '{}' \
                 STORED AS PARQUET OPTIONS (compression 'uncompressed')",
                sub.join("d.parquet").display()
            )
        };
        run(&cpu, &write(0)).await.map_err(e)?;
        let table = format!(
            "CREATE EXTERNAL TABLE dq STORED AS PARQUET LOCATION '{}/'",
            sub.display()
        );
        run_in(&[&cpu, &ctx], &[&table]).await?;
        let q4 = "SELECT count(*), sum(f.x), sum(dq.v) FROM dq JOIN f ON dq.k = f.k \
                  WHERE dq.v % 5 = 0";
        check(&ctx, &cpu, q4, Some("stored")).await?;
        run(&cpu, &write(5)).await.map_err(e)?;
        check(&ctx, &cpu, q4, Some("not kept: ")).await?;
        let _ = std::fs::remove_dir_all(&dir);
        Ok::<(), String>(())
    })?;
    wait_idle(options, "build cache")
}

/// The EXPLAIN lines of every `GpuJoinExec` of `plan`, each with whether its build input holds
/// a join.
fn join_lines(plan: &Arc<dyn ExecutionPlan>) -> Vec<(String, bool)> {
    let mut lines = vec![];
    if plan.is::<GpuJoinExec>() {
        let build = plan.children()[0];
        let on_join = !join_lines(build).is_empty() || holds(build, "Join");
        lines.push((displayable(plan.as_ref()).one_line().to_string(), on_join));
    }
    for c in plan.children() {
        lines.extend(join_lines(c));
    }
    lines
}

/// Whether a node under `plan` (itself included) has `name` in its name.
fn holds(plan: &Arc<dyn ExecutionPlan>, name: &str) -> bool {
    plan.name().contains(name) || plan.children().into_iter().any(|c| holds(c, name))
}

/// The joins of `sql`'s plan, run in `ctx`, whose answer must be DataFusion's (`cpu`).
async fn joins_of(
    ctx: &SessionContext,
    cpu: &SessionContext,
    sql: &str,
) -> Result<(Vec<(String, bool)>, String), String> {
    let (got, expected, plan) = answers(ctx, cpu, sql).await?;
    if got != expected {
        return Err(format!("{sql}:\n{got}\nDataFusion:\n{expected}"));
    }
    let shown = displayable(plan.as_ref()).indent(true).to_string();
    Ok((join_lines(&plan), shown))
}

/// A build side that is itself a join is kept (the dynamic filters its own joins make drop
/// only rows those joins drop); one under which a join above pushed its dynamic filter is not
/// (the rows it reads depend on that join's build side).
fn joins_under_the_build_side(options: &Options) -> Result<(), String> {
    block_on(async {
        let (cpu, ctx) = sessions(options).await?;
        let a = "CREATE TABLE a AS SELECT value * 7 AS x FROM generate_series(1, 300)";
        run_in(&[&cpu, &ctx], &[TABLES[0], TABLES[1], E, a]).await?;
        // The join of `d` and `e` (few rows) built, `f` probed.
        let kept = "SELECT count(*), sum(f.x), sum(de.v) FROM \
                    (SELECT d.k, d.v FROM d JOIN e ON d.k = e.k WHERE e.w < 50) de \
                    JOIN f ON de.k = f.k";
        for want in ["stored", "hit"] {
            let (joins, shown) = joins_of(&ctx, &cpu, kept).await?;
            let piece = format!("cache=[{want}]");
            if !joins
                .iter()
                .any(|(l, on_join)| *on_join && l.contains(&piece))
            {
                return Err(format!(
                    "{kept}: no join over a join shows {piece}:\n{shown}"
                ));
            }
        }
        // `a`'s values, as `d.v`, filter `d` under the join of `d` and `f`: that join's build
        // side (`d`) reads what `a` lets through, and is not kept, run after run (the join
        // above it keeps `a`).
        let above = "SELECT count(*), sum(f.x) FROM d JOIN f ON d.k = f.k JOIN a ON a.x = d.v";
        for _ in 0..2 {
            let (joins, shown) = joins_of(&ctx, &cpu, above).await?;
            let filtered = joins
                .iter()
                .any(|(l, _)| l.contains("cache=[not kept: a dynamic filter of a join above"));
            if !filtered {
                return Err(format!(
                    "{above}: no join refused a build side under a dynamic filter from \
                     above:\n{shown}"
                ));
            }
        }
        Ok::<(), String>(())
    })?;
    wait_idle(options, "build cache over joins")
}

/// Build inputs that EXPLAIN prints alike but whose rows differ get keys of their own: a join
/// filter over the other side's columns, a filter over another column of the same name, a
/// session time zone that changes what an expression computes; a CSV scan (whose read options
/// the key cannot see) is not kept; and the memory pool counts a kept build side once.
fn inputs_that_print_alike_are_told_apart(options: &Options) -> Result<(), String> {
    let e = |e: DataFusionError| e.to_string();
    block_on(async {
        let (cpu, ctx) = sessions(options).await?;
        let dir = std::env::temp_dir().join(format!("gpu-join-alike-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
        let csv = dir.join("c.csv");
        let mut text = String::from("k,s\n");
        for k in 1..=2000 {
            text += &format!("{k},{}\n", if k % 3 == 0 { "'x'" } else { "v" });
        }
        std::fs::write(&csv, text).map_err(|e| e.to_string())?;
        let tables = [
            "CREATE TABLE t1 AS SELECT value AS k, value % 10 AS x FROM generate_series(1, 2000)"
                .to_string(),
            "CREATE TABLE t3 AS SELECT value AS k, (value * 7) % 10 AS x \
             FROM generate_series(1, 2000)"
                .to_string(),
            "CREATE TABLE t2 AS SELECT value % 2000 + 1 AS k, value % 7 AS x, value % 7 AS y \
             FROM generate_series(1, 40000)"
                .to_string(),
            "CREATE TABLE f AS SELECT value % 2000 + 1 AS k, value AS x \
             FROM generate_series(0, 99999)"
                .to_string(),
            "CREATE TABLE d2 AS SELECT value AS k, '2024-01-01T00:00:00' AS s \
             FROM generate_series(1, 2000)"
                .to_string(),
            format!(
                "CREATE EXTERNAL TABLE c1 (k BIGINT, s VARCHAR) STORED AS CSV LOCATION '{}' \
                 OPTIONS ('format.has_header' 'true')",
                csv.display()
            ),
        ];
        let tables: Vec<&str> = tables.iter().map(String::as_str).collect();
        run_in(&[&cpu, &ctx], &tables).await?;
        // The same join filter text (`x@0 < x@1`) over the other side's columns.
        let a = "SELECT count(*), sum(f.x) FROM (SELECT t1.k FROM t1 JOIN t2 \
                 ON t1.k = t2.k AND t1.x < t2.x) s JOIN f ON s.k = f.k";
        let b = "SELECT count(*), sum(f.x) FROM (SELECT t1.k FROM t2 JOIN t1 \
                 ON t2.k = t1.k AND t2.x < t1.x) s JOIN f ON s.k = f.k";
        // `t1.x` and `t3.x`, both `x` in the join's left input.
        let named = |c: &str| {
            format!(
                "SELECT count(*), sum(f.x), sum(s.d) FROM (SELECT t1.k, t1.x - t3.x AS d \
                 FROM t1 JOIN t3 ON t1.k = t3.k JOIN t2 ON t1.k = t2.k AND {c} < t2.y) s \
                 JOIN f ON s.k = f.k"
            )
        };
        for sql in [a.to_string(), b.to_string(), named("t1.x"), named("t3.x")] {
            check(&ctx, &cpu, &sql, Some("stored")).await?;
            check(&ctx, &cpu, &sql, Some("hit")).await?;
        }
        // The time zone `to_unixtime` reads a string in.
        let zoned = "SELECT count(*), sum(f.x) FROM d2 JOIN f ON d2.k = f.k \
                     WHERE (to_unixtime(d2.s) / 3600) % 2 = 0";
        check(&ctx, &cpu, zoned, Some("stored")).await?;
        check(&ctx, &cpu, zoned, Some("hit")).await?;
        run_in(
            &[&cpu, &ctx],
            &["SET datafusion.execution.time_zone = '+01:00'"],
        )
        .await?;
        check(&ctx, &cpu, zoned, Some("stored")).await?;
        let quoted = "SELECT count(*), sum(f.x) FROM c1 JOIN f ON c1.k = f.k WHERE c1.s = 'x'";
        check(&ctx, &cpu, quoted, Some("not kept: a csv scan")).await?;
        let _ = std::fs::remove_dir_all(&dir);
        // A pool of 4 MiB and a build side of about 2 MB: kept once, the pool holding it once.
        let pooled = crate::engine::pool_session(options, 4 << 20, true, |_| {})?;
        run(&pooled, "SET gpu_join.cache_bytes = '64MiB'")
            .await
            .map_err(e)?;
        let big = "CREATE TABLE b AS SELECT value AS k, value AS v, value * 2 AS w \
                   FROM generate_series(1, 150000)";
        run_in(&[&cpu, &pooled], &[big]).await?;
        run_in(&[&pooled], &[tables[3]]).await?;
        let q = "SELECT count(*), sum(f.x), sum(b.v), sum(b.w) FROM b JOIN f ON b.k = f.k \
                 WHERE b.v % 2 = 0";
        check(&pooled, &cpu, q, Some("stored")).await?;
        check(&pooled, &cpu, q, Some("hit")).await?;
        let cache = cache_of(&pooled)?;
        let reserved = pooled.runtime_env().memory_pool.reserved();
        if cache.bytes() < 1 << 20 || reserved != cache.bytes() {
            return Err(format!(
                "the pool holds {reserved} bytes for {} bytes kept",
                cache.bytes()
            ));
        }
        // A new pool (each `SET datafusion.runtime.memory_limit` makes one): the entry's count
        // moves into it as the next query reads the entry.
        run(&pooled, "SET datafusion.runtime.memory_limit = '8M'")
            .await
            .map_err(e)?;
        if pooled.runtime_env().memory_pool.reserved() != 0 {
            return Err("a new pool holds bytes before any query".into());
        }
        check(&pooled, &cpu, q, Some("hit")).await?;
        let reserved = pooled.runtime_env().memory_pool.reserved();
        if reserved != cache.bytes() {
            return Err(format!(
                "the new pool holds {reserved} bytes for {} bytes kept",
                cache.bytes()
            ));
        }
        Ok::<(), String>(())
    })?;
    wait_idle(options, "build cache, inputs alike")
}

/// A count of rows, declared volatile (what it computes does not matter: a volatile
/// aggregate under a build side keeps it from being kept).
#[derive(Debug, Default)]
struct Rows(i64);

impl Accumulator for Rows {
    fn update_batch(&mut self, values: &[ArrayRef]) -> datafusion::common::Result<()> {
        self.0 += values[0].len() as i64;
        Ok(())
    }

    fn evaluate(&mut self) -> datafusion::common::Result<ScalarValue> {
        Ok(ScalarValue::Int64(Some(self.0)))
    }

    fn size(&self) -> usize {
        std::mem::size_of_val(self)
    }

    fn state(&mut self) -> datafusion::common::Result<Vec<ScalarValue>> {
        Ok(vec![ScalarValue::Int64(Some(self.0))])
    }

    fn merge_batch(&mut self, states: &[ArrayRef]) -> datafusion::common::Result<()> {
        let counts = states[0].as_primitive::<Int64Type>();
        self.0 += counts.iter().flatten().sum::<i64>();
        Ok(())
    }
}

/// `name(x) = x + add` over `BIGINT`, immutable.
fn plus(name: &str, add: i64) -> ScalarUDF {
    let f = move |args: &[ColumnarValue]| {
        let x = ColumnarValue::values_to_arrays(args)?;
        let sum = numeric::add(&x[0], &Int64Array::new_scalar(add))?;
        Ok(ColumnarValue::Array(sum))
    };
    create_udf(
        name,
        vec![DataType::Int64],
        DataType::Int64,
        Volatility::Immutable,
        Arc::new(f),
    )
}

/// What a kept build side holds is its own: a volatile aggregate, or a function registered
/// again under its name, is told apart; a kept column wrapping another join's output holds
/// none of that join's pinned pages; the entries of a table read whole go with the table.
fn kept_build_sides_hold_only_their_own(options: &Options) -> Result<(), String> {
    block_on(async {
        let (cpu, ctx) = sessions(options).await?;
        run_in(&[&cpu, &ctx], &[TABLES[0], TABLES[1], E]).await?;
        for c in [&cpu, &ctx] {
            c.register_udaf(create_udaf(
                "rows_volatile",
                vec![DataType::Int64],
                Arc::new(DataType::Int64),
                Volatility::Volatile,
                Arc::new(|_| Ok(Box::<Rows>::default())),
                Arc::new(vec![DataType::Int64]),
            ));
            c.register_udf(plus("g", 0));
        }
        let counted = "SELECT count(*), sum(a.c) FROM \
                       (SELECT k, rows_volatile(v) AS c FROM d GROUP BY k) a JOIN f ON a.k = f.k";
        check(
            &ctx,
            &cpu,
            counted,
            Some("not kept: a function whose value may change"),
        )
        .await?;
        // `g` registered again with another body: the same text, another function.
        let g = "SELECT count(*), sum(f.x) FROM d JOIN f ON d.k = f.k WHERE g(d.v) % 7 = 1";
        check(&ctx, &cpu, g, Some("stored")).await?;
        check(&ctx, &cpu, g, Some("hit")).await?;
        for c in [&cpu, &ctx] {
            c.register_udf(plus("g", 1));
        }
        check(&ctx, &cpu, g, Some("stored")).await?;
        check(&ctx, &cpu, g, Some("hit")).await?;
        // A struct over the output of the join of `d` and `e`, kept: the engine is idle (no
        // output page held) while the cache holds it.
        let wrapped = "SELECT count(*), sum(f.x), max(de.s), count(de.s) FROM \
                       (SELECT d.k, named_struct('v', d.v) AS s FROM d JOIN e ON d.k = e.k \
                       WHERE e.w < 500) de JOIN f ON de.k = f.k";
        let (joins, shown) = joins_of(&ctx, &cpu, wrapped).await?;
        if !joins
            .iter()
            .any(|(l, on_join)| *on_join && l.contains("cache=[stored]"))
        {
            return Err(format!("{wrapped}: its build side was not kept:\n{shown}"));
        }
        wait_idle(options, "a kept build side over a join's output")?;
        // `d` read whole (its batches are the table's own arrays), then dropped.
        let cache = cache_of(&ctx)?;
        cache.clear();
        let whole = "SELECT count(*), sum(f.x), sum(d.v) FROM d JOIN f ON d.k = f.k";
        check(&ctx, &cpu, whole, Some("stored")).await?;
        let again =
            "CREATE TABLE d AS SELECT value AS k, value * 11 AS v FROM generate_series(1, 5000)";
        run_in(&[&cpu, &ctx], &["DROP TABLE d", again]).await?;
        check(&ctx, &cpu, whole, Some("stored")).await?;
        if cache.len() != 1 {
            return Err(format!(
                "{} build sides kept where the table of all but one is gone",
                cache.len()
            ));
        }
        Ok::<(), String>(())
    })?;
    wait_idle(options, "build cache, its own")
}

pub fn register(suite: &mut Suite) {
    suite.add_gpu(
        "build_cache::kept_build_sides_hold_only_their_own",
        kept_build_sides_hold_only_their_own,
    );
    suite.add_gpu(
        "build_cache::inputs_that_print_alike_are_told_apart",
        inputs_that_print_alike_are_told_apart,
    );
    suite.add_gpu(
        "build_cache::joins_under_the_build_side",
        joins_under_the_build_side,
    );
    suite.add_gpu(
        "build_cache::repeated_queries_join_kept_build_sides",
        repeated_queries_join_kept_build_sides,
    );
}
