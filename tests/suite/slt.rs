//! Runs `sqllogictests/*.slt` twice: with the rule on (label `gpu`, every join eligible,
//! `gpu_join.backend` as the harness chose) and with it off (label `cpu`). Results of both runs
//! must equal the files' expected output, so the GPU path and DataFusion agree.
//!
//! `GPU_JOIN_SLT_COMPLETE=1` rewrites the files' expected results from the rule-off run.
//! `GPU_JOIN_SLT_DIR` names the folder of the files (for a binary run away from its source
//! tree); a run that finds no file fails.
//!
//! `EXPLAIN` statements return only the plan lines that name a join operator, with the
//! backend written as `<backend>`, so that plan checks hold on every machine.

use std::path::PathBuf;
use std::sync::Arc;

use arrow::util::display::{ArrayFormatter, FormatOptions};
use async_trait::async_trait;
use datafusion::common::DataFusionError;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpu_join::gpu_session_context;
use sqllogictest::{AsyncDB, DBOutput, DefaultColumnType};

use crate::harness::{Options, Outcome, Suite, block_on};

/// A DataFusion session as a sqllogictest database.
pub struct Db {
    ctx: SessionContext,
}

#[derive(Debug)]
pub struct DbError(String);

impl std::fmt::Display for DbError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for DbError {}

impl From<DataFusionError> for DbError {
    fn from(e: DataFusionError) -> Self {
        Self(e.to_string())
    }
}

impl From<arrow::error::ArrowError> for DbError {
    fn from(e: arrow::error::ArrowError) -> Self {
        Self(e.to_string())
    }
}

/// Plan lines naming a join, with the backend normalized.
fn join_lines(plan: &str) -> Vec<String> {
    plan.lines()
        .map(str::trim)
        .filter(|l| l.contains("Join"))
        .map(|l| {
            l.replace("backend=host", "backend=<backend>")
                .replace("backend=cuda:0", "backend=<backend>")
        })
        .collect()
}

#[async_trait]
impl AsyncDB for Db {
    type Error = DbError;
    type ColumnType = DefaultColumnType;

    async fn run(&mut self, sql: &str) -> Result<DBOutput<DefaultColumnType>, DbError> {
        let df = self.ctx.sql(sql).await?;
        let is_explain = sql.trim_start().to_ascii_uppercase().starts_with("EXPLAIN");
        let schema = df.schema().clone();
        let batches = df.collect().await?;
        let options = FormatOptions::default().with_null("NULL");
        let mut rows = vec![];
        for batch in &batches {
            let formatters = batch
                .columns()
                .iter()
                .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
                .collect::<Result<Vec<_>, _>>()?;
            for r in 0..batch.num_rows() {
                // An empty string is written `(empty)`, as in DataFusion's own files.
                let row: Vec<String> = formatters
                    .iter()
                    .map(|f| match f.value(r).to_string() {
                        s if s.is_empty() => "(empty)".to_string(),
                        s => s,
                    })
                    .collect();
                if is_explain {
                    if row.first().is_some_and(|t| t == "physical_plan") {
                        rows.extend(join_lines(&row[1]).into_iter().map(|l| vec![l]));
                    }
                } else {
                    rows.push(row);
                }
            }
        }
        let width = if is_explain { 1 } else { schema.fields().len() };
        Ok(DBOutput::Rows {
            types: vec![DefaultColumnType::Any; width],
            rows,
        })
    }

    async fn shutdown(&mut self) {}

    fn engine_name(&self) -> &str {
        "datafusion-gpu-join"
    }
}

/// The `.slt` files: in `GPU_JOIN_SLT_DIR` if set (a bundle on another host), else in the
/// crate's `sqllogictests/`. None found is an error, not an empty suite.
fn slt_files() -> Result<Vec<PathBuf>, String> {
    let dir = std::env::var_os("GPU_JOIN_SLT_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("sqllogictests"));
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map_err(|e| format!("cannot read {}: {e} (set GPU_JOIN_SLT_DIR)", dir.display()))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|e| e == "slt"))
        .collect();
    if files.is_empty() {
        return Err(format!("no .slt files in {}", dir.display()));
    }
    files.sort();
    Ok(files)
}

/// A session for one run: the rule on (with `options`' backend) or off.
pub fn session(options: &Options, gpu: bool) -> SessionContext {
    let mut gpu_config = options.gpu_config();
    gpu_config.enabled = gpu;
    let config = SessionConfig::new()
        .with_target_partitions(4)
        .with_option_extension(gpu_config);
    gpu_session_context(config)
}

pub fn register(suite: &mut Suite) {
    let files = match slt_files() {
        Ok(files) => files,
        Err(e) => {
            suite.add("slt::files", move || Err(e));
            return;
        }
    };
    for file in files {
        let name = file
            .file_stem()
            .unwrap_or_default()
            .to_string_lossy()
            .to_string();
        for gpu in [true, false] {
            let options = suite.options.clone();
            let file = file.clone();
            let label = if gpu { "gpu" } else { "cpu" };
            suite.add(format!("slt::{name}::{label}"), move || {
                if gpu && options.require_cuda && !options.cuda_present() {
                    return Err("--require-cuda, but no usable CUDA device".into());
                }
                let ctx = Arc::new(session(&options, gpu));
                let mut runner = sqllogictest::Runner::new(move || {
                    let ctx = Arc::clone(&ctx);
                    async move {
                        Ok::<_, DbError>(Db {
                            ctx: (*ctx).clone(),
                        })
                    }
                });
                runner.add_label(label);
                runner.add_label(options.backend());
                if !gpu && std::env::var("GPU_JOIN_SLT_COMPLETE").is_ok_and(|v| v == "1") {
                    // Rewrites the file's expected results from DataFusion's own join.
                    block_on(runner.update_test_file(
                        &file,
                        " ",
                        sqllogictest::default_validator,
                        sqllogictest::default_normalizer,
                        sqllogictest::default_column_validator,
                    ))
                    .map_err(|e| e.to_string())?;
                    return Ok(Outcome::Passed);
                }
                block_on(runner.run_file_async(&file)).map_err(|e| e.display(true).to_string())?;
                Ok(Outcome::Passed)
            });
        }
    }
}
