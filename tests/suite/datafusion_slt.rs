//! Runs DataFusion's own sqllogictest files — those the `datafusion-sqllogictest` crate (a
//! dev-dependency, at the version in `Cargo.lock`) publishes, set up by its own `TestContext`
//! and run through its own `DataFusion` driver, validators and normalizer — with
//! [`GpuJoinRule`](datafusion_gpu_join::GpuJoinRule) forced on (`min_build_rows = 0`, the
//! harness's backend).
//!
//! Every file runs once with the rule on. A file in which any statement planned a join runs
//! again with the rule off, on DataFusion's unchanged session: the baseline. Each record is
//! compared with the file's expected output in both runs, and a record that passes with the
//! rule off must pass with it on, unless [`KNOWN_DIFFERENCES`] names it with its reason. A
//! last test, `datafusion_slt::summary`, prints per file the records run, those passed with
//! the rule off and on, the statements that planned a join and those whose joins all ran on
//! `GpuJoinExec`, and why the others stayed on the CPU.
//!
//! The files are read where cargo unpacked the crate (`$CARGO_HOME/registry/src/*/`), or in
//! `GPU_JOIN_DF_SLT_DIR` (the crate's `test_files/` copied into a bundle); none found fails.
//! They run from a scratch folder whose `test_files/` links to the crate's entries, so the
//! files' own scratch output never writes into cargo's registry. As in DataFusion's runner,
//! `tpch/` (needs generated data) and the encrypted-Parquet file are left out.

use std::cell::RefCell;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::execution::SessionStateBuilder;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::prelude::SessionContext;
use datafusion_gpu_join::{GpuJoinConfig, GpuJoinRule, add_gpu_join_rules};
use datafusion_sqllogictest::{
    DFColumnType, DataFusion, TestContext, df_value_validator, setup_scratch_dir, value_normalizer,
};
use sqllogictest::{Record, RecordOutput};

use crate::harness::{Options, Outcome, Suite, block_on};

/// Records whose expected output the rule on cannot reproduce for a reason other than a wrong
/// join: `(file, line, reason)`. (`EXPLAIN` records, whose plan text names `GpuJoinExec`
/// instead of `HashJoinExec`, are counted and listed apart.)
const KNOWN_DIFFERENCES: &[(&str, u32, &str)] = &[
    (
        "join_limit_pushdown.slt",
        146,
        "LIMIT without ORDER BY over a left semi join: the build rows come out in the order \
         of GpuJoinExec's table, HashJoinExec's in the order of its collected build batches",
    ),
    (
        "limit.slt",
        765,
        "LIMIT without ORDER BY over a cross join: GpuJoinExec pairs each probe row with \
         every build row, CrossJoinExec each build row with every row of a probe batch",
    ),
    (
        "table_functions.slt",
        591,
        "a cross join (LATERAL) without ORDER BY: rows in probe-row-major order, CrossJoinExec \
         gives them build-row-major within a probe batch",
    ),
    (
        "table_functions.slt",
        271,
        "a cross join without ORDER BY: rows in probe-row-major order, CrossJoinExec gives \
         them build-row-major within a probe batch",
    ),
    (
        "string/string_literal.slt",
        1290,
        "a cross join without ORDER BY: rows in probe-row-major order, CrossJoinExec gives \
         them build-row-major within a probe batch",
    ),
    // join.slt.part:943, included by both files.
    (
        "join_only.slt",
        943,
        "a join whose ON has no equality (a cross join) without ORDER BY: rows in \
         probe-row-major order, CrossJoinExec gives them build-row-major within a probe batch",
    ),
    (
        "join_disable_repartition_joins.slt",
        943,
        "a join whose ON has no equality (a cross join) without ORDER BY: rows in \
         probe-row-major order, CrossJoinExec gives them build-row-major within a probe batch",
    ),
    // Sort-merge joins: DataFusion's outputs rows in key order; GpuJoinExec builds the smaller
    // input and outputs its rows without a match after the matched ones.
    (
        "sort_merge_join.slt",
        920,
        "a right join without ORDER BY: DataFusion's sort-merge join outputs rows in key \
         order, GpuJoinExec builds the smaller input (t1) and outputs its unmatched rows last",
    ),
    (
        "sort_merge_join.slt",
        927,
        "a left join without ORDER BY: DataFusion's sort-merge join outputs rows in key \
         order, GpuJoinExec builds the smaller input (t1) and outputs its unmatched rows last",
    ),
    // DataFusion's own expected rows here break the ORDER BY (`ORDER BY 1,2`, the second
    // column descending within the first): PiecewiseMergeJoinExec declares an order of its
    // output that the plan relies on to sort by the first column alone. GpuJoinExec declares
    // no such order, so the plan sorts by both columns and the rows come out as SQL asks.
    (
        "pwmj.slt",
        141,
        "DataFusion's expected rows break ORDER BY 1,2 (PiecewiseMergeJoinExec's declared \
         order); GpuJoinExec's come out sorted by both columns",
    ),
    (
        "pwmj.slt",
        232,
        "DataFusion's expected rows break ORDER BY 1,2 (PiecewiseMergeJoinExec's declared \
         order); GpuJoinExec's come out sorted by both columns",
    ),
];

/// The longest one record may run before it counts as failed (a hang must not stall CI).
const RECORD_TIMEOUT: Duration = Duration::from_secs(120);

/// Join operators that run on the CPU.
const CPU_JOINS: &[&str] = &[
    "HashJoinExec",
    "SortMergeJoinExec",
    "NestedLoopJoinExec",
    "CrossJoinExec",
    "SymmetricHashJoinExec",
    "PiecewiseMergeJoinExec",
];

/// The join nodes of the plans made while one record ran.
#[derive(Default, Debug, Clone)]
struct Joins {
    gpu: usize,
    cpu: usize,
    /// Why each CPU join stayed there: `<operator>: <reason>`.
    reasons: Vec<String>,
}

/// A physical optimizer rule, last in the list, that counts the join nodes of every plan.
#[derive(Debug)]
struct CountJoins(Arc<Mutex<Joins>>);

impl PhysicalOptimizerRule for CountJoins {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        options: &ConfigOptions,
    ) -> datafusion::common::Result<Arc<dyn ExecutionPlan>> {
        let mut joins = self.0.lock().unwrap();
        plan.apply(|node| {
            let name = node.name();
            if name == "GpuJoinExec" {
                joins.gpu += 1;
            } else if CPU_JOINS.contains(&name) {
                joins.cpu += 1;
                let reason = format!(
                    "{name}: {}",
                    GpuJoinRule::fallback_reason(node.as_ref(), options)
                        .unwrap_or_else(|| "not a join the rule replaces".into())
                );
                joins.reasons.push(reason);
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        Ok(plan)
    }

    fn name(&self) -> &str {
        "CountJoins"
    }

    fn schema_check(&self) -> bool {
        true
    }
}

/// One statement or query of a file, as run.
#[derive(Debug, Clone)]
struct RecordRun {
    line: u32,
    /// An `EXPLAIN` statement: its output is plan text.
    explain: bool,
    passed: bool,
    error: Option<String>,
    joins: Joins,
}

/// One file's two runs.
#[derive(Debug, Default)]
struct FileReport {
    records: usize,
    passed_off: Option<usize>,
    passed_on: usize,
    join_records: usize,
    gpu_records: usize,
    reasons: BTreeMap<String, usize>,
    /// Records that pass only with the rule off: `EXPLAIN`s (plan text), and known ones.
    plan_text: Vec<u32>,
    known: Vec<u32>,
}

/// The folder of DataFusion's `.slt` files.
fn test_files_dir() -> Result<PathBuf, String> {
    if let Some(dir) = std::env::var_os("GPU_JOIN_DF_SLT_DIR") {
        return Ok(PathBuf::from(dir));
    }
    let lock = include_str!("../../Cargo.lock");
    let version = lock
        .split("[[package]]")
        .find(|p| p.contains("name = \"datafusion-sqllogictest\""))
        .and_then(|p| p.lines().find_map(|l| l.strip_prefix("version = \"")))
        .map(|v| v.trim_end_matches('"').to_string())
        .ok_or("datafusion-sqllogictest is not in Cargo.lock")?;
    let home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo")))
        .ok_or("neither CARGO_HOME nor HOME is set (set GPU_JOIN_DF_SLT_DIR)")?;
    let registry = home.join("registry").join("src");
    let crate_dir = format!("datafusion-sqllogictest-{version}");
    std::fs::read_dir(&registry)
        .map_err(|e| {
            format!(
                "cannot read {}: {e} (set GPU_JOIN_DF_SLT_DIR)",
                registry.display()
            )
        })?
        .filter_map(|e| e.ok())
        .map(|e| e.path().join(&crate_dir).join("test_files"))
        .find(|p| p.is_dir())
        .ok_or_else(|| {
            format!(
                "no {crate_dir}/test_files under {} (set GPU_JOIN_DF_SLT_DIR)",
                registry.display()
            )
        })
}

/// The `.slt` files under `dir`, relative to it, as DataFusion's runner selects them.
fn slt_files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    fn walk(dir: &Path, base: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
        for entry in std::fs::read_dir(dir)? {
            let path = entry?.path();
            if path.is_dir() {
                walk(&path, base, out)?;
            } else if path.extension().is_some_and(|e| e == "slt") {
                out.push(path.strip_prefix(base).unwrap_or(&path).to_path_buf());
            }
        }
        Ok(())
    }
    let mut files = vec![];
    walk(dir, dir, &mut files).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    files.retain(|f| !f.starts_with("tpch") && !f.ends_with("encrypted_parquet.slt"));
    files.sort();
    if files.is_empty() {
        return Err(format!("no .slt files in {}", dir.display()));
    }
    Ok(files)
}

/// A scratch folder to run from: `test_files/` holds links to each entry of `source` (so the
/// files' relative paths resolve) and a real `scratch/` for what they write.
fn work_dir(source: &Path) -> Result<PathBuf, String> {
    let err = |e: std::io::Error| format!("setting up the scratch folder: {e}");
    let dir = std::env::temp_dir().join(format!("gpu-join-df-slt-{}", std::process::id()));
    let files = dir.join("test_files");
    if dir.exists() {
        std::fs::remove_dir_all(&dir).map_err(err)?;
    }
    std::fs::create_dir_all(files.join("scratch")).map_err(err)?;
    for entry in std::fs::read_dir(source).map_err(err)? {
        let entry = entry.map_err(err)?;
        if entry.file_name() != "scratch" {
            std::os::unix::fs::symlink(entry.path(), files.join(entry.file_name())).map_err(err)?;
        }
    }
    Ok(dir)
}

/// The session one run uses: the file's own `TestContext` session, with the rule on (the
/// `gpu_join` settings added, [`GpuJoinRule`]'s passes where `add_gpu_join_rules` puts them)
/// or unchanged, and [`CountJoins`] last.
fn session(
    test_ctx: &TestContext,
    gpu: Option<&GpuJoinConfig>,
    joins: &Arc<Mutex<Joins>>,
) -> SessionContext {
    let state = test_ctx.session_ctx().state();
    let mut rules = state.physical_optimizers().to_vec();
    let mut builder = SessionStateBuilder::new_from_existing(state);
    if let Some(config) = gpu {
        add_gpu_join_rules(&mut rules);
        if let Some(c) = builder.config() {
            c.options_mut().extensions.insert(config.clone());
        }
    }
    rules.push(Arc::new(CountJoins(Arc::clone(joins))));
    SessionContext::new_with_state(builder.with_physical_optimizer_rules(rules).build())
}

/// Runs one file (`relative` to `test_files/` under the current folder); `None` when its
/// `TestContext` says it cannot run in this build.
async fn run_file(
    relative: &Path,
    gpu: Option<&GpuJoinConfig>,
) -> Result<Option<Vec<RecordRun>>, String> {
    let Some(test_ctx) = TestContext::try_new_for_test_file(relative).await else {
        return Ok(None);
    };
    setup_scratch_dir(relative).map_err(|e| e.to_string())?;
    let joins = Arc::new(Mutex::new(Joins::default()));
    let ctx = session(&test_ctx, gpu, &joins);
    let relative_owned = relative.to_path_buf();
    let mut runner = sqllogictest::Runner::new(move || {
        let ctx = ctx.clone();
        let relative = relative_owned.clone();
        async move {
            Ok(DataFusion::new(
                ctx,
                relative,
                indicatif::ProgressBar::hidden(),
            ))
        }
    });
    runner.add_label("Datafusion");
    runner.with_column_validator(sqllogictest::strict_column_validator);
    runner.with_normalizer(value_normalizer);
    runner.with_validator(df_value_validator);

    let path = Path::new("test_files").join(relative);
    let records = sqllogictest::parse_file::<DFColumnType>(&path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    let mut runs = vec![];
    for record in records {
        let (line, explain) = match &record {
            Record::Halt { .. } => break,
            Record::Statement { loc, sql, .. } | Record::Query { loc, sql, .. } => (
                Some(loc.line()),
                sql.trim_start().to_ascii_uppercase().starts_with("EXPLAIN"),
            ),
            _ => (None, false),
        };
        *joins.lock().unwrap() = Joins::default();
        let result = tokio::time::timeout(RECORD_TIMEOUT, runner.run_async(record)).await;
        let Some(line) = line else { continue };
        let (passed, error) = match result {
            Ok(Ok(RecordOutput::Nothing)) => continue, // skipped by `skipif`/`onlyif`
            Ok(Ok(_)) => (true, None),
            Ok(Err(e)) => (false, Some(e.to_string())),
            Err(_) => (false, Some(format!("no answer within {RECORD_TIMEOUT:?}"))),
        };
        let joins = std::mem::take(&mut *joins.lock().unwrap());
        runs.push(RecordRun {
            line,
            explain,
            passed,
            error,
            joins,
        });
    }
    runner.shutdown_async().await;
    Ok(Some(runs))
}

/// Runs `relative` with the rule on and, if it planned a join, off; returns its report or the
/// records that regressed.
fn check_file(relative: &Path, options: &Options) -> Result<(FileReport, Vec<String>), String> {
    let gpu = options.gpu_config();
    let name = relative.to_string_lossy().to_string();
    let Some(on) = block_on(run_file(relative, Some(&gpu)))? else {
        return Ok((FileReport::default(), vec![]));
    };
    let mut report = FileReport {
        records: on.len(),
        passed_on: on.iter().filter(|r| r.passed).count(),
        ..Default::default()
    };
    for r in &on {
        if r.joins.gpu + r.joins.cpu > 0 {
            report.join_records += 1;
            if r.joins.cpu == 0 {
                report.gpu_records += 1;
            }
        }
        for reason in &r.joins.reasons {
            *report.reasons.entry(reason.clone()).or_default() += 1;
        }
    }
    let mut notes = vec![];
    if report.join_records == 0 {
        return Ok((report, notes));
    }
    let off = block_on(run_file(relative, None))?.ok_or("the rule-off run was skipped")?;
    report.passed_off = Some(off.iter().filter(|r| r.passed).count());
    if off.len() != on.len() {
        return Err(format!(
            "{name}: {} records ran with the rule on, {} with it off",
            on.len(),
            off.len()
        ));
    }
    let mut regressions = vec![];
    for (a, b) in on.iter().zip(&off) {
        if b.passed && !a.passed {
            let known = KNOWN_DIFFERENCES
                .iter()
                .find(|(f, l, _)| *f == name && *l == a.line);
            match known {
                _ if a.explain => report.plan_text.push(a.line),
                Some((_, _, why)) => {
                    report.known.push(a.line);
                    notes.push(format!("{name}:{} differs, known: {why}", a.line));
                }
                None => regressions.push(format!(
                    "{name}:{} passes with the rule off, fails with it on:\n{}",
                    a.line,
                    a.error.as_deref().unwrap_or("")
                )),
            }
        } else if a.passed && !b.passed {
            notes.push(format!("{name}:{} passes only with the rule on", a.line));
        }
    }
    if regressions.is_empty() {
        Ok((report, notes))
    } else {
        Err(regressions.join("\n\n"))
    }
}

pub fn register(suite: &mut Suite) {
    let (source, files) = match test_files_dir().and_then(|d| Ok((slt_files(&d)?, d))) {
        Ok((files, dir)) => (dir, files),
        Err(e) => {
            suite.add("datafusion_slt::files", move || Err(e));
            return;
        }
    };
    let reports: Rc<RefCell<BTreeMap<String, FileReport>>> = Rc::default();
    let work: Rc<RefCell<Option<Result<PathBuf, String>>>> = Rc::default();
    for file in files {
        let options = suite.options.clone();
        let reports = Rc::clone(&reports);
        let work = Rc::clone(&work);
        let source = source.clone();
        let name = file.to_string_lossy().to_string();
        suite.add(format!("datafusion_slt::{name}"), move || {
            if options.require_cuda && !options.cuda_present() {
                return Err("--require-cuda, but no usable CUDA device".into());
            }
            let dir = work
                .borrow_mut()
                .get_or_insert_with(|| work_dir(&source))
                .clone()?;
            let back = std::env::current_dir().map_err(|e| e.to_string())?;
            std::env::set_current_dir(&dir).map_err(|e| e.to_string())?;
            let result = check_file(&file, &options);
            std::env::set_current_dir(back).map_err(|e| e.to_string())?;
            let (report, notes) = result?;
            for note in notes {
                println!("    {note}");
            }
            reports.borrow_mut().insert(name, report);
            Ok(Outcome::Passed)
        });
    }
    suite.add("datafusion_slt::summary", move || {
        let reports = reports.borrow();
        if reports.is_empty() {
            return Ok(Outcome::Skipped(
                "no DataFusion file ran (filtered out)".into(),
            ));
        }
        print_summary(&reports);
        if let Some(Ok(dir)) = work.borrow().as_ref() {
            let _ = std::fs::remove_dir_all(dir);
        }
        Ok(Outcome::Passed)
    });
}

fn print_summary(reports: &BTreeMap<String, FileReport>) {
    println!(
        "\nDataFusion's sqllogictest files that plan a join, rule forced on:\n\
         {:<44} {:>7} {:>8} {:>7} {:>6} {:>6}",
        "file", "records", "pass off", "pass on", "joins", "on GPU"
    );
    let mut total = FileReport::default();
    let mut passed_off = 0;
    let mut files = 0;
    for (name, r) in reports {
        let Some(off) = r.passed_off else { continue };
        files += 1;
        println!(
            "{name:<44} {:>7} {off:>8} {:>7} {:>6} {:>6}",
            r.records, r.passed_on, r.join_records, r.gpu_records
        );
        total.records += r.records;
        passed_off += off;
        total.passed_on += r.passed_on;
        total.join_records += r.join_records;
        total.gpu_records += r.gpu_records;
        for (k, v) in &r.reasons {
            *total.reasons.entry(k.clone()).or_default() += v;
        }
    }
    println!(
        "{:<44} {:>7} {passed_off:>8} {:>7} {:>6} {:>6}",
        format!("all {files} files ({} run)", reports.len()),
        total.records,
        total.passed_on,
        total.join_records,
        total.gpu_records
    );
    println!(
        "statements planning a join: {}, all joins on GpuJoinExec: {} ({:.0} %)",
        total.join_records,
        total.gpu_records,
        100.0 * total.gpu_records as f64 / total.join_records.max(1) as f64
    );
    let listed = |pick: fn(&FileReport) -> &Vec<u32>| -> Vec<String> {
        reports
            .iter()
            .flat_map(|(name, r)| pick(r).iter().map(move |l| format!("{name}:{l}")))
            .collect()
    };
    let plan_text = listed(|r| &r.plan_text);
    println!(
        "records that pass only with the rule off: {} EXPLAIN (the plan names GpuJoinExec), {} \
         known (KNOWN_DIFFERENCES), 0 others",
        plan_text.len(),
        listed(|r| &r.known).len()
    );
    println!("  EXPLAIN: {}", plan_text.join(" "));
    println!("join nodes left on the CPU, by reason:");
    let mut reasons: Vec<_> = total.reasons.into_iter().collect();
    reasons.sort_by_key(|r| std::cmp::Reverse(r.1));
    for (reason, n) in reasons {
        println!("  {n:>5}  {reason}");
    }
}
