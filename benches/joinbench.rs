//! `joinbench`: the standard PK-FK workload of the GFTR paper (../shared/ANCHORS.md) at kernel
//! level (per-phase times of PHJ-OM through the crate's join layer) and end to end through SQL
//! (rule on vs. DataFusion's CPU hash join, same process, same data).
//!
//! ```text
//! cargo bench --bench joinbench -- [--quick] [--log2-r N] [--payloads P] [--runs N] [--backend cuda|host]
//! ```
//! |R| = 2^N rows with keys 0..|R| shuffled, |S| = 2|R| rows (each R key twice, shuffled), every
//! payload column a copy of the key (4-byte integers). `--quick` is a small smoke run that
//! checks results, not times. The Markdown table is printed last.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::{ArrayRef, AsArray, Int32Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Int64Type, Schema};
use datafusion::common::{DataFusionError, Result};
use datafusion::datasource::MemTable;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpu_join::backend::{Backend, CudaBackend, HostBackend};
use datafusion_gpu_join::columns::{Fitted, KeyEncoder};
use datafusion_gpu_join::join::{BuildSide, OutputColumn, OutputLayout, Phases, join_chunk};
use datafusion_gpu_join::{GpuJoinConfig, gpu_session_context};

struct Args {
    log2_r: u32,
    payloads: usize,
    runs: usize,
    backend: String,
}

impl Args {
    fn parse() -> Self {
        let argv: Vec<String> = std::env::args().collect();
        let get = |name: &str| {
            argv.iter()
                .position(|a| a == name)
                .and_then(|i| argv.get(i + 1).cloned())
        };
        let quick = argv.iter().any(|a| a == "--quick");
        let cuda = datafusion_gpu_join::device::cuda_device(0).is_ok();
        Self {
            log2_r: get("--log2-r")
                .and_then(|v| v.parse().ok())
                .unwrap_or(if quick { 16 } else { 26 }),
            payloads: get("--payloads").and_then(|v| v.parse().ok()).unwrap_or(2),
            runs: get("--runs")
                .and_then(|v| v.parse().ok())
                .unwrap_or(if quick { 2 } else { 5 }),
            backend: get("--backend")
                .unwrap_or_else(|| if cuda { "cuda".into() } else { "host".into() }),
        }
    }
}

/// Fisher-Yates with a fixed xorshift seed.
fn shuffle(v: &mut [i32], mut seed: u64) {
    for i in (1..v.len()).rev() {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        v.swap(i, (seed % (i as u64 + 1)) as usize);
    }
}

/// A relation: key column `k` and `payloads` copies `p0..` as batches of `batch` rows, split
/// round-robin into `parts` partitions.
fn relation(
    keys: Vec<i32>,
    payloads: usize,
    parts: usize,
    batch: usize,
) -> (Arc<Schema>, Vec<Vec<RecordBatch>>) {
    let mut fields = vec![Field::new("k", DataType::Int32, false)];
    fields.extend((0..payloads).map(|i| Field::new(format!("p{i}"), DataType::Int32, false)));
    let schema = Arc::new(Schema::new(fields));
    let col: ArrayRef = Arc::new(Int32Array::from(keys));
    let whole = RecordBatch::try_new(Arc::clone(&schema), vec![Arc::clone(&col); payloads + 1])
        .expect("batch");
    let mut partitions = vec![vec![]; parts];
    for (i, at) in (0..whole.num_rows()).step_by(batch).enumerate() {
        partitions[i % parts].push(whole.slice(at, batch.min(whole.num_rows() - at)));
    }
    (schema, partitions)
}

fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    v[v.len() / 2]
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

struct KernelRow {
    phases: [Duration; 5],
    rows_out: usize,
    peak: Option<usize>,
}

/// One PHJ-OM run over the join layer: build R, probe with all of S as one chunk.
fn kernel_run<B: Backend>(
    b: &B,
    r: &[RecordBatch],
    s: &[RecordBatch],
    layout: &OutputLayout,
) -> Result<KernelRow> {
    let phases = Phases::new(&ExecutionPlanMetricsSet::new());
    let keys: Vec<Vec<&ArrayRef>> = vec![r.iter().map(|b| b.column(0)).collect()];
    let Fitted::Encoder(enc) = KeyEncoder::fit(&keys)? else {
        return Err(DataFusionError::Execution("keys do not encode".into()));
    };
    let build = BuildSide::new(b, r, layout, enc, &phases)?;
    let out = join_chunk(b, &build, s, layout, &phases, 8192)?;
    let t = |t: &datafusion::physical_plan::metrics::Time| Duration::from_nanos(t.value() as u64);
    Ok(KernelRow {
        phases: [
            t(&phases.upload),
            t(&phases.transform),
            t(&phases.matching),
            t(&phases.materialize),
            t(&phases.download),
        ],
        rows_out: out.iter().map(|b| b.num_rows()).sum(),
        peak: b.memory_use().map(|m| m.1),
    })
}

fn kernel_level<B: Backend>(
    b: &B,
    args: &Args,
    r: &[RecordBatch],
    s: &[RecordBatch],
    rows_s: usize,
) -> Result<(Vec<String>, f64)> {
    let p = args.payloads;
    let r_schema = r[0].schema();
    let mut fields: Vec<Field> = r_schema
        .fields()
        .iter()
        .map(|f| f.as_ref().clone().with_name(format!("r_{}", f.name())))
        .collect();
    fields.extend((1..=p).map(|i| Field::new(format!("s_p{}", i - 1), DataType::Int32, false)));
    let mut columns: Vec<OutputColumn> = (0..=p).map(OutputColumn::Build).collect();
    columns.extend((1..=p).map(OutputColumn::Probe));
    let layout = OutputLayout {
        schema: Arc::new(Schema::new(fields)),
        columns,
        build_keys: vec![0],
        probe_keys: vec![0],
    };
    kernel_run(b, r, s, &layout)?; // warm-up
    let mut runs = vec![];
    for _ in 0..args.runs {
        let row = kernel_run(b, r, s, &layout)?;
        if row.rows_out != rows_s {
            return Err(DataFusionError::Execution(format!(
                "join gave {} rows, expected {rows_s}",
                row.rows_out
            )));
        }
        runs.push(row);
    }
    let med = |i: usize| median(runs.iter().map(|r| r.phases[i]).collect());
    let kernel = median(
        runs.iter()
            .map(|r| r.phases[1] + r.phases[2] + r.phases[3])
            .collect(),
    );
    let tuples = (r.iter().map(|b| b.num_rows()).sum::<usize>() + rows_s) as f64;
    let peak = runs
        .last()
        .and_then(|r| r.peak)
        .map(|p| format!("{:.2} GB", p as f64 / 1e9))
        .unwrap_or("-".into());
    Ok((
        vec![
            format!("{:.2}", ms(med(1))),
            format!("{:.2}", ms(med(2))),
            format!("{:.2}", ms(med(3))),
            format!("{:.2}", ms(kernel)),
            format!("{:.1}", tuples / kernel.as_secs_f64() / 1e9),
            format!("{:.2}", ms(med(0))),
            format!("{:.2}", ms(med(4))),
            peak,
        ],
        ms(kernel),
    ))
}

async fn sql_time(
    ctx: &SessionContext,
    sql: &str,
    runs: usize,
) -> Result<(Duration, Vec<RecordBatch>)> {
    let mut times = vec![];
    let mut last = vec![];
    for i in 0..=runs {
        let start = Instant::now();
        last = ctx.sql(sql).await?.collect().await?;
        if i > 0 {
            times.push(start.elapsed());
        }
    }
    Ok((median(times), last))
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    let cores = std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1);
    let device = datafusion_gpu_join::device::cuda_device(0)
        .map(|d| d.name().to_string())
        .unwrap_or_else(|_| "no GPU".into());
    let rows_r = 1usize << args.log2_r;
    let rows_s = 2 * rows_r;
    println!(
        "joinbench: device {device}, backend {}, |R| = 2^{}, |S| = 2^{}, payloads {} per side, {cores} cores",
        args.backend,
        args.log2_r,
        args.log2_r + 1,
        args.payloads
    );
    let mut rk: Vec<i32> = (0..rows_r as i32).collect();
    shuffle(&mut rk, 1);
    let mut sk: Vec<i32> = (0..rows_s).map(|i| (i % rows_r) as i32).collect();
    shuffle(&mut sk, 2);
    let batch = 1 << 20;
    let (r_schema, r_parts) = relation(rk, args.payloads, cores, batch);
    let (s_schema, s_parts) = relation(sk, args.payloads, cores, batch);
    let r_all: Vec<RecordBatch> = r_parts.iter().flatten().cloned().collect();
    let s_all: Vec<RecordBatch> = s_parts.iter().flatten().cloned().collect();

    // Kernel level.
    let (kernel_cells, _) = if args.backend == "cuda" {
        let b = CudaBackend::new(
            datafusion_gpu_join::device::cuda_device(0)?,
            Default::default(),
        )?;
        kernel_level(&b, &args, &r_all, &s_all, rows_s)?
    } else {
        kernel_level(&HostBackend, &args, &r_all, &s_all, rows_s)?
    };

    // End to end through SQL.
    let mut gpu = GpuJoinConfig::default();
    gpu.backend = args.backend.clone();
    gpu.min_rows = 0;
    let ctx = gpu_session_context(
        SessionConfig::new()
            .with_target_partitions(cores)
            .with_option_extension(gpu),
    );
    ctx.register_table("r", Arc::new(MemTable::try_new(r_schema, r_parts)?))?;
    ctx.register_table("s", Arc::new(MemTable::try_new(s_schema, s_parts)?))?;
    let sums: Vec<String> = (0..args.payloads)
        .flat_map(|i| [format!("sum(r.p{i})"), format!("sum(s.p{i})")])
        .collect();
    let sql = format!(
        "SELECT count(*), {} FROM r JOIN s ON r.k = s.k",
        sums.join(", ")
    );
    let plan = ctx.sql(&format!("EXPLAIN {sql}")).await?.collect().await?;
    let plan_text = arrow::util::pretty::pretty_format_batches(&plan)?.to_string();
    if !plan_text.contains("GpuJoinExec") {
        return Err(DataFusionError::Execution(format!(
            "rule did not fire:\n{plan_text}"
        )));
    }
    let (on, on_rows) = sql_time(&ctx, &sql, args.runs.min(3)).await?;
    ctx.sql("SET gpu_join.enabled = false")
        .await?
        .collect()
        .await?;
    let (off, off_rows) = sql_time(&ctx, &sql, args.runs.min(3)).await?;
    let count = on_rows[0].column(0).as_primitive::<Int64Type>().value(0);
    if count as usize != rows_s
        || arrow::util::pretty::pretty_format_batches(&on_rows)?.to_string()
            != arrow::util::pretty::pretty_format_batches(&off_rows)?.to_string()
    {
        return Err(DataFusionError::Execution(
            "end-to-end results differ between rule on and off".into(),
        ));
    }

    println!(
        "\n### Kernel level: PHJ-OM, data on the {}, median of {} runs (ms)\n",
        args.backend, args.runs
    );
    println!(
        "| R rows | S rows | payloads | transform | match | materialize | total | G tuples/s | upload | download | peak device memory |"
    );
    println!("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |");
    println!(
        "| 2^{} | 2^{} | {p},{p} | {} |",
        args.log2_r,
        args.log2_r + 1,
        kernel_cells.join(" | "),
        p = args.payloads
    );
    println!(
        "\n### End to end through SQL, median of {} runs, {cores} partitions\n",
        args.runs.min(3)
    );
    println!(
        "| query | rule on ({}) | rule off (HashJoinExec) | speed-up |",
        args.backend
    );
    println!("| --- | --- | --- | --- |");
    println!(
        "| `{sql}` | {:.3} s | {:.3} s | {:.2}x |",
        on.as_secs_f64(),
        off.as_secs_f64(),
        off.as_secs_f64() / on.as_secs_f64()
    );
    Ok(())
}
