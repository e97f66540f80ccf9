//! The rule's choice of where a join runs, against what this machine has: with
//! `gpu_join.backend = auto` and no usable GPU, a join stays DataFusion's unless
//! `gpu_join.min_build_rows = 0` forces it onto the host backend; `backend = host` always
//! replaces it; with a GPU, `auto` puts it there.

use datafusion::common::Result;

use crate::harness::{Options, Outcome, Suite, TestResult, block_on};

/// The join line of `EXPLAIN` for a small join after `settings`.
async fn join_line(options: &Options, settings: &[&str]) -> Result<String> {
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
        .sql("EXPLAIN SELECT count(*) FROM a JOIN b ON a.k = b.k")
        .await?
        .collect()
        .await?;
    let text = arrow::util::pretty::pretty_format_batches(&plan)?.to_string();
    Ok(text
        .lines()
        .find(|l| l.contains("JoinExec"))
        .unwrap_or("no join in the plan")
        .to_string())
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

pub fn register(suite: &mut Suite) {
    let options = suite.options.clone();
    suite.add(
        "rule::backend_choice_follows_the_machine",
        move || -> TestResult {
            if options.require_cuda && !options.cuda_present() {
                return Err("--require-cuda, but no usable CUDA device".into());
            }
            check(&options)?;
            Ok(Outcome::Passed)
        },
    );
}
