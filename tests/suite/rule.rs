//! The rule's choice of where a join runs, against what this machine has: with
//! `gpu_join.backend = auto` and no usable GPU, a join stays DataFusion's unless
//! `gpu_join.min_build_rows = 0` forces it onto the host backend; `backend = host` always
//! replaces it; with a GPU, `auto` puts it there. A plan for a distributed engine's executors
//! (`gpu_join.distributed`) places joins wherever the gates pass, GPU or not. At run time, a
//! build side found smaller than the gate runs DataFusion's join, and a fallback's build side
//! of view columns is handed over in buffers of its own.

use datafusion::common::Result;

use crate::harness::{Options, Outcome, Suite, TestResult, block_on};

/// The join line of `EXPLAIN` for a small join after `settings`.
async fn join_line(options: &Options, settings: &[&str]) -> Result<String> {
    let text = plan_text(
        options,
        settings,
        "SELECT count(*) FROM a JOIN b ON a.k = b.k",
    )
    .await?;
    Ok(text
        .lines()
        .find(|l| l.contains("JoinExec"))
        .unwrap_or("no join in the plan")
        .to_string())
}

/// `EXPLAIN`'s text for `query` over two small tables `a` and `b`, after `settings`.
async fn plan_text(options: &Options, settings: &[&str], query: &str) -> Result<String> {
    let ctx = crate::slt::session(options, true);
    for sql in [
        "CREATE TABLE a AS SELECT value AS k FROM generate_series(1, 100)",
        "CREATE TABLE b AS SELECT value AS k FROM generate_series(1, 1000)",
    ]
    .iter()
    .chain(settings)
    {
        ctx.sql(sql).await?.collect().await?;
    }
    let plan = ctx
        .sql(&format!("EXPLAIN {query}"))
        .await?
        .collect()
        .await?;
    Ok(arrow::util::pretty::pretty_format_batches(&plan)?.to_string())
}

/// A plan for a distributed engine's executors (`gpu_join.distributed`) places joins without
/// a GPU where it is planned, asks for both inputs hash-partitioned on their keys, and leaves
/// joins that output build rows after the probe to DataFusion.
fn check_distributed(options: &Options) -> Result<(), String> {
    let settings = [
        "SET gpu_join.backend = 'auto'",
        "SET gpu_join.min_build_rows = 1",
        "SET gpu_join.min_input_rows = 0",
        "SET gpu_join.distributed = true",
        "SET datafusion.execution.target_partitions = 4",
    ];
    let run = |query| block_on(plan_text(options, &settings, query)).map_err(|e| e.to_string());
    // Inputs of two partitions each (a table holds one, which any partitioning satisfies).
    let inner = run(
        "SELECT count(*) FROM (SELECT k FROM a UNION ALL SELECT k FROM a) x \
                     JOIN (SELECT k FROM b UNION ALL SELECT k FROM b) y ON x.k = y.k",
    )?;
    let lines: Vec<&str> = inner.lines().collect();
    let Some(at) = lines
        .iter()
        .position(|l| l.contains("GpuJoinExec") && l.contains(", distributed"))
    else {
        return Err(format!(
            "the inner join should be GpuJoinExec, marked distributed:\n{inner}"
        ));
    };
    let repartitions = lines[at..]
        .iter()
        .filter(|l| l.contains("RepartitionExec: partitioning=Hash([k@0], 4)"))
        .count();
    if repartitions != 2 {
        return Err(format!(
            "both inputs should be hash-partitioned on the key under the join:\n{inner}"
        ));
    }
    let full = run("SELECT count(*) FROM a FULL JOIN b ON a.k = b.k")?;
    if full.contains("GpuJoinExec") || !full.contains("HashJoinExec") {
        return Err(format!("the full join should stay DataFusion's:\n{full}"));
    }
    Ok(())
}

fn check(options: &Options) -> Result<(), String> {
    let gpu = options.cuda_present();
    let cases: [(&[&str], &str); 3] = [
        (
            &[
                "SET gpu_join.backend = 'auto'",
                "SET gpu_join.min_build_rows = 1",
                "SET gpu_join.min_input_rows = 0",
            ],
            if gpu {
                "GpuJoinExec: join_type=Inner, on=[(k@0, k@0)], backend=cuda:0"
            } else {
                "HashJoinExec"
            },
        ),
        (
            &[
                "SET gpu_join.backend = 'auto'",
                "SET gpu_join.min_build_rows = 0",
            ],
            if gpu {
                "GpuJoinExec: join_type=Inner, on=[(k@0, k@0)], backend=cuda:0"
            } else {
                "GpuJoinExec: join_type=Inner, on=[(k@0, k@0)], backend=host"
            },
        ),
        (
            &[
                "SET gpu_join.backend = 'host'",
                "SET gpu_join.min_build_rows = 1",
                "SET gpu_join.min_input_rows = 0",
            ],
            "GpuJoinExec: join_type=Inner, on=[(k@0, k@0)], backend=host",
        ),
    ];
    for (settings, want) in cases {
        let line = block_on(join_line(options, settings)).map_err(|e| e.to_string())?;
        if !line.contains(want) {
            return Err(format!(
                "with {settings:?} (GPU: {gpu}) the join should be `{want}`, the plan has: {line}"
            ));
        }
    }
    Ok(())
}

/// A build side that DataFusion estimates large enough for the GPU but that turns out smaller
/// than `gpu_join.min_build_rows` when collected runs DataFusion's join over it, and EXPLAIN
/// ANALYZE says so; with the gate at 1 the same join runs on `GpuJoinExec` to the end. Both
/// answers are DataFusion's.
fn check_small_build_at_run_time(options: &Options) -> Result<(), String> {
    let e = |e: datafusion::error::DataFusionError| e.to_string();
    let tables = [
        "CREATE TABLE a AS SELECT value AS k, value * 3 AS v FROM generate_series(1, 10000)",
        "CREATE TABLE b AS SELECT value % 20000 AS k, value AS w FROM generate_series(1, 100000)",
    ];
    // 5 rows of `a` pass its filter; DataFusion estimates 20 % of 10,000.
    let sql = "SELECT count(*), sum(a.v), sum(b.w) FROM a JOIN b ON a.k = b.k \
               WHERE a.k % 2000 = 0";
    block_on(async {
        let cpu = crate::slt::session(options, false);
        for t in tables {
            crate::engine::run(&cpu, t).await.map_err(e)?;
        }
        for gate in [1000, 1] {
            let ctx = crate::slt::session(options, true);
            for t in tables.iter().map(|t| t.to_string()).chain([
                format!("SET gpu_join.min_build_rows = {gate}"),
                "SET gpu_join.min_input_rows = 0".to_string(),
            ]) {
                crate::engine::run(&ctx, &t).await.map_err(e)?;
            }
            let (got, want, plan) = crate::engine::answers(&ctx, &cpu, sql).await?;
            if got != want {
                return Err(format!("gate {gate}: got\n{got}\nDataFusion gives\n{want}"));
            }
            let shown = datafusion::physical_plan::displayable(plan.as_ref())
                .indent(true)
                .to_string();
            let Some(join) = shown.lines().find(|l| l.contains("GpuJoinExec")) else {
                return Err(format!(
                    "gate {gate}: the join should be GpuJoinExec:\n{shown}"
                ));
            };
            let fell_back = join.contains(
                "fallback=[HashJoinExec: the build side has 5 rows, fewer than \
                 gpu_join.min_build_rows = 1000]",
            );
            if fell_back != (gate == 1000) || (gate == 1 && join.contains("fallback=")) {
                return Err(format!(
                    "gate {gate}: DataFusion's join should run only under the gate of 1000:\n{join}"
                ));
            }
        }
        Ok(())
    })
}

/// A build side handed to DataFusion's join in a fallback (here a left join's, too large for
/// the memory limit and not one a grace join splits), a view column in many small slices of
/// one table (each listing all of the table's data buffers), gets buffers of its own first:
/// concatenated as they were, every output array listed each buffer once per slice
/// (differential seed 7006344 ran out of 20 GB).
fn check_fallback_build_views(options: &Options) -> Result<(), String> {
    use arrow::array::{AsArray, Int64Array, RecordBatch, StringViewBuilder};
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::datasource::MemTable;
    use std::sync::Arc;
    let e = |e: datafusion::error::DataFusionError| e.to_string();
    let rows = 10_000;
    let mut views = StringViewBuilder::new().with_fixed_block_size(4096);
    for i in 0..rows {
        views.append_value(format!("a string longer than twelve bytes, row {i}"));
    }
    let views = views.finish();
    let buffers = views.data_buffers().len();
    let schema = Arc::new(Schema::new(vec![
        Field::new("k", DataType::Int64, false),
        Field::new("s", DataType::Utf8View, false),
    ]));
    let table = RecordBatch::try_new(
        Arc::clone(&schema),
        vec![
            Arc::new(Int64Array::from_iter_values(0..rows as i64)),
            Arc::new(views),
        ],
    )
    .map_err(|e| e.to_string())?;
    let slices: Vec<RecordBatch> = (0..rows / 7).map(|i| table.slice(7 * i, 7)).collect();
    // What the slices list together (DataFusion's own join, at these batch sizes, lists tens
    // of thousands of buffers in an output array too; the fallback listed all of these).
    let listed_by_slices = slices.len() * buffers;
    let sql = "SELECT a.s, b.w FROM a LEFT JOIN b ON a.k = b.k";
    block_on(async {
        let ctx = crate::slt::session(options, true);
        let a = MemTable::try_new(Arc::clone(&schema), vec![slices]).map_err(e)?;
        ctx.register_table("a", Arc::new(a)).map_err(e)?;
        for t in [
            "CREATE TABLE b AS SELECT value AS k, value * 3 AS w FROM generate_series(0, 99999)",
            "SET gpu_join.memory_limit = '64KiB'",
            "SET datafusion.execution.batch_size = 7",
            // `a`, its build side as written: its statistics count every slice's buffers.
            "SET datafusion.optimizer.join_reordering = false",
            "SET gpu_join.orient_joins = false",
        ] {
            crate::engine::run(&ctx, t).await.map_err(e)?;
        }
        let (got, plan) = crate::engine::run_plan(&ctx, sql).await.map_err(e)?;
        let shown = datafusion::physical_plan::displayable(plan.as_ref())
            .indent(true)
            .to_string();
        if !shown.contains("fallback=[HashJoinExec: ") {
            return Err(format!(
                "DataFusion's join should run over the build side:\n{shown}"
            ));
        }
        let out: usize = got.iter().map(|b| b.num_rows()).sum();
        let listed = got
            .iter()
            .map(|b| b.column(0).as_string_view().data_buffers().len())
            .max()
            .unwrap_or(0);
        if out != rows / 7 * 7 || listed * 10 >= listed_by_slices {
            return Err(format!(
                "{out} rows ({} expected), an output array listing {listed} buffers (the \
                 slices list {listed_by_slices}):\n{shown}",
                rows / 7 * 7
            ));
        }
        Ok(())
    })
}

/// A join that falls back to DataFusion's join at a small batch size keeps its output's
/// buffers small: arrow's coalescer gave every 7-row output batch of a view column a buffer of
/// its own, up to 1 MiB each (differential seeds 8004391, 8010613 and 8013260 ran out of 20
/// GB), where DataFusion's join now makes batches of 8192 rows, cut into batches with buffers
/// of their own.
fn check_fallback_batch_size(options: &Options) -> Result<(), String> {
    use arrow::array::AsArray;
    use std::collections::HashMap;
    let e = |e: datafusion::error::DataFusionError| e.to_string();
    let tables = [
        "CREATE TABLE a AS SELECT value AS v, value % 7 AS k, \
         arrow_cast('a string longer than twelve bytes, row ' || value, 'Utf8View') AS s \
         FROM generate_series(0, 9999)",
        "CREATE TABLE b AS SELECT value % 7 AS k, value AS w FROM generate_series(0, 139)",
    ];
    // 500 rows of `a` pass its filter (DataFusion estimates 20 % of 10,000), about 70 a key:
    // each 7-row probe batch makes about 500 rows, which the coalescer cut into 7-row batches.
    let sql = "SELECT a.s, b.w FROM a JOIN b ON a.k = b.k WHERE a.v % 20 = 0";
    block_on(async {
        let settings = [
            "SET gpu_join.min_build_rows = 1000",
            "SET gpu_join.min_input_rows = 0",
            "SET datafusion.execution.batch_size = 7",
            "SET datafusion.optimizer.join_reordering = false",
            "SET gpu_join.orient_joins = false",
        ];
        let (ctx, cpu) = sessions(options, &tables, &settings).await.map_err(e)?;
        let (got, plan) = crate::engine::run_plan(&ctx, sql).await.map_err(e)?;
        let (want, _) = crate::engine::run_plan(&cpu, sql).await.map_err(e)?;
        let shown = datafusion::physical_plan::displayable(plan.as_ref())
            .indent(true)
            .to_string();
        if !shown.contains("fallback=[HashJoinExec: the build side has 500 rows") {
            return Err(format!("DataFusion's join should run:\n{shown}"));
        }
        let rows = |b: &[arrow::array::RecordBatch]| b.iter().map(|b| b.num_rows()).sum::<usize>();
        let widest = got.iter().map(|b| b.num_rows()).max().unwrap_or(0);
        // The bytes of the distinct data buffers the output's strings lie in.
        let mut buffers = HashMap::new();
        for b in &got {
            for buffer in b.column(0).as_string_view().data_buffers() {
                buffers.insert(buffer.as_ptr() as usize, buffer.capacity());
            }
        }
        let bytes: usize = buffers.values().sum();
        if rows(&got) != rows(&want) || rows(&got) < 7_000 || widest > 7 || bytes > 1 << 24 {
            return Err(format!(
                "{} rows (DataFusion's {}), batches of up to {widest} rows (7 at most), {} \
                 distinct data buffers of {bytes} bytes:\n{shown}",
                rows(&got),
                rows(&want),
                buffers.len()
            ));
        }
        Ok(())
    })
}

/// A null-aware anti join (`x NOT IN (subquery)`) that falls back to DataFusion's join for
/// want of memory hands it the build rows whose key is null too, which the device's plan sets
/// aside: with an empty subquery every outer row is kept, a null `x` included.
fn check_null_aware_fallback(options: &Options) -> Result<(), String> {
    let e = |e: datafusion::error::DataFusionError| e.to_string();
    let tables = [
        "CREATE TABLE a AS SELECT CASE WHEN value % 10 = 0 THEN NULL ELSE value END AS x \
         FROM generate_series(1, 10000)",
        "CREATE TABLE b AS SELECT value AS y FROM generate_series(1, 20000)",
    ];
    let sql = "SELECT count(*), count(a.x) FROM a \
               WHERE a.x NOT IN (SELECT b.y FROM b WHERE b.y > 100000000)";
    block_on(async {
        let settings = [
            "SET gpu_join.memory_limit = '64KiB'",
            "SET datafusion.optimizer.join_reordering = false",
            "SET gpu_join.orient_joins = false",
        ];
        let (ctx, cpu) = sessions(options, &tables, &settings).await.map_err(e)?;
        let (got, want, plan) = crate::engine::answers(&ctx, &cpu, sql).await?;
        let shown = datafusion::physical_plan::displayable(plan.as_ref())
            .indent(true)
            .to_string();
        let fell_back = shown.lines().any(|l| {
            l.contains("GpuJoinExec")
                && l.contains("null_aware")
                && l.contains("fallback=[HashJoinExec")
        });
        if !fell_back {
            return Err(format!("the null-aware join should fall back:\n{shown}"));
        }
        if got != want {
            return Err(format!("got\n{got}\nDataFusion gives\n{want}"));
        }
        Ok(())
    })
}

/// A rule-on and a rule-off session, each with `tables` made, the rule-on one with
/// `settings` too.
async fn sessions(
    options: &Options,
    tables: &[&str],
    settings: &[&str],
) -> Result<(
    datafusion::prelude::SessionContext,
    datafusion::prelude::SessionContext,
)> {
    let ctx = crate::slt::session(options, true);
    let cpu = crate::slt::session(options, false);
    for t in tables {
        crate::engine::run(&ctx, t).await?;
        crate::engine::run(&cpu, t).await?;
    }
    for t in settings {
        crate::engine::run(&ctx, t).await?;
    }
    Ok((ctx, cpu))
}

pub fn register(suite: &mut Suite) {
    suite.add_gpu("rule::backend_choice_follows_the_machine", check);
    suite.add_gpu(
        "rule::a_build_side_found_small_runs_datafusions_join",
        check_small_build_at_run_time,
    );
    suite.add_gpu(
        "rule::a_fallbacks_build_views_get_buffers_of_their_own",
        check_fallback_build_views,
    );
    suite.add_gpu(
        "rule::a_fallback_at_a_small_batch_size_keeps_its_buffers_small",
        check_fallback_batch_size,
    );
    suite.add_gpu(
        "rule::a_null_aware_fallback_keeps_the_null_keys",
        check_null_aware_fallback,
    );
    let options = suite.options.clone();
    suite.add(
        "rule::distributed_plans_are_placed_for_the_executors",
        move || -> TestResult {
            check_distributed(&options)?;
            Ok(Outcome::Passed)
        },
    );
}
