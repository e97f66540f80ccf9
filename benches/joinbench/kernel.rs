//! Kernel level: joins of relations already on the device, as in the paper — per-phase times
//! (transform, match, materialize) of PHJ-OM, the median of `runs` runs after a warm-up whose
//! output is checked, and the peak device memory of the case. Sweeps: size, payload columns,
//! |R|:|S|, match ratio, Zipf skew, 4- vs 8-byte values, and join sequences over a star schema
//! whose intermediate results stay on the device.

use std::sync::Arc;
use std::time::Duration;

use arrow::array::{ArrayRef, AsArray, RecordBatch};
use arrow::datatypes::{DataType, Field, Int32Type, Int64Type, Schema};
use datafusion::common::{DataFusionError, Result};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, Time};
use datafusion_gpu_join::backend::{Backend, CudaBackend, HostBackend};
use datafusion_gpu_join::columns::{DeviceRelation, Fitted, KeyEncoder};
use datafusion_gpu_join::join::{BuildSide, OutputColumn, OutputLayout, Phases, join_on_device};
use serde_json::json;

use crate::Device;
use crate::args::Args;
use crate::report::{Report, median, progress};
use crate::workload::{Star, Tables, Workload, generate, star};

/// Runs `$body` with `$b` bound to a fresh backend of `$device` (fresh: its own memory peak).
macro_rules! on_backend {
    ($device:expr, $b:ident => $body:expr) => {
        match $device {
            $crate::Device::Cuda(d) => {
                let $b = &CudaBackend::new(Arc::clone(d), Arc::default())?;
                $body
            }
            $crate::Device::Host => {
                let $b = &HostBackend::default();
                $body
            }
        }
    };
}

/// The join algorithms of the crate, as the reports name them.
const ALGORITHM: &str = "PHJ-OM";

/// One kernel-level measurement.
pub struct Case {
    /// Which sweep it belongs to.
    pub sweep: &'static str,
    /// The swept parameter's value.
    pub x: f64,
    pub input: Input,
}

pub enum Input {
    PkFk(Workload),
    /// A fact table of `fact_rows` joined with `k` dimensions of `dim_rows` rows in turn.
    Sequence {
        fact_rows: usize,
        dim_rows: usize,
        k: usize,
    },
}

/// Median phase times of one case and its peak device memory.
struct Measured {
    transform: Duration,
    matching: Duration,
    materialize: Duration,
    /// The median of the runs' totals (not the sum of the phase medians).
    total: Duration,
    peak: Option<usize>,
}

/// The cases of the sweeps named in `args`.
pub fn cases(args: &Args) -> Vec<Case> {
    let n = args.log2_r;
    let std = |p| Workload::standard(n, p);
    let mut cases = vec![];
    let mut add = |sweep, x: f64, w: Workload| {
        cases.push(Case {
            sweep,
            x,
            input: Input::PkFk(w),
        })
    };
    for sweep in &args.sweeps {
        match sweep.as_str() {
            "size" => {
                for p in [1, 2] {
                    for log2 in args.sizes.clone() {
                        add("size", log2 as f64, Workload::standard(log2, p));
                    }
                }
            }
            "standard" => add("standard", 2.0, std(2)),
            "payloads" => (0..=4).for_each(|p| add("payloads", p as f64, std(p))),
            "ratio" => {
                for ratio in [1, 2, 4, 8, 16] {
                    let w = Workload {
                        r_rows: (2 << n) / ratio,
                        ..std(2)
                    };
                    add("ratio", ratio as f64, w);
                }
            }
            "match" => {
                for m in [1.0, 0.75, 0.5, 0.25, 0.1, 0.01] {
                    add(
                        "match",
                        m,
                        Workload {
                            match_ratio: m,
                            ..std(2)
                        },
                    );
                }
            }
            "skew" => {
                for z in [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 1.75] {
                    add("skew", z, Workload { zipf: z, ..std(2) });
                }
            }
            "width" => {
                for wide in [false, true] {
                    let x = if wide { 8.0 } else { 4.0 };
                    add("width", x, Workload { wide, ..std(2) });
                }
            }
            _ => {}
        }
    }
    if args.sweeps.iter().any(|s| s == "sequence") {
        for k in 1..=args.max_sequence {
            cases.push(Case {
                sweep: "sequence",
                x: k as f64,
                input: Input::Sequence {
                    fact_rows: 2 << n,
                    dim_rows: (2 << n) / 8,
                    k,
                },
            });
        }
    }
    cases
}

/// Runs every case on `device`, adding one record per case to `report`.
pub fn run(device: &Device, args: &Args, report: &mut Report) -> Result<()> {
    let cases = cases(args);
    let bar = progress(cases.len() as u64, "kernel level");
    for case in &cases {
        let (label, tuples, measured, fields) = match &case.input {
            Input::PkFk(w) => {
                bar.set_message(format!("{} {}: generating", case.sweep, case.x));
                let tables = generate(w);
                bar.set_message(format!("{} {}: joining", case.sweep, case.x));
                let m = on_backend!(device, b => pk_fk(b, &tables, w.payloads, args.runs))?;
                let label = format!(
                    "{} ⋈ {}, {p},{p} payloads, {}-byte, match {}, zipf {}",
                    pow2(w.r_rows),
                    pow2(w.s_rows),
                    w.value_bytes(),
                    w.match_ratio,
                    w.zipf,
                    p = w.payloads
                );
                let fields = json!({"r_rows": w.r_rows, "s_rows": w.s_rows, "payloads": w.payloads,
                    "value_bytes": w.value_bytes(), "match_ratio": w.match_ratio, "zipf": w.zipf});
                (label, w.r_rows + w.s_rows, m, fields)
            }
            Input::Sequence {
                fact_rows,
                dim_rows,
                k,
            } => {
                bar.set_message(format!("sequence {k}: generating"));
                let s = star(*fact_rows, *dim_rows, *k);
                bar.set_message(format!("sequence {k}: joining"));
                let m = on_backend!(device, b => sequence(b, &s, args.runs))?;
                let label = format!(
                    "fact {} ⋈ {k} dims of {}",
                    pow2(*fact_rows),
                    pow2(*dim_rows)
                );
                let fields = json!({"fact_rows": fact_rows, "dim_rows": dim_rows, "joins": k});
                (label, fact_rows + k * dim_rows, m, fields)
            }
        };
        let total = measured.total.as_secs_f64();
        let mut record = json!({
            "sweep": case.sweep, "x": case.x, "case": label, "algorithm": ALGORITHM,
            "backend": device.name(), "runs": args.runs,
            "transform_ms": ms(measured.transform), "match_ms": ms(measured.matching),
            "materialize_ms": ms(measured.materialize), "total_ms": total * 1e3,
            "tuples": tuples, "gtuples_per_s": tuples as f64 / total / 1e9,
            "peak_device_bytes": measured.peak,
        });
        record
            .as_object_mut()
            .expect("object")
            .extend(fields.as_object().expect("object").clone());
        report.kernel.push(record);
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(())
}

/// `rows` as a power of two, e.g. `2^26`.
fn pow2(rows: usize) -> String {
    match rows.is_power_of_two() {
        true => format!("2^{}", rows.ilog2()),
        false => format!("2^{:.1}", (rows as f64).log2()),
    }
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn time(t: &Time) -> Duration {
    Duration::from_nanos(t.value() as u64)
}

/// Runs `join` once to warm up and check its output, then `runs` times; medians per phase.
fn measure<B: Backend>(
    b: &B,
    runs: usize,
    mut join: impl FnMut(&Phases) -> Result<DeviceRelation<B::Buf>>,
    check: impl FnOnce(&DeviceRelation<B::Buf>) -> Result<()>,
) -> Result<Measured> {
    let fresh = || Phases::new(&ExecutionPlanMetricsSet::new());
    check(&join(&fresh())?)?;
    let samples: Vec<Phases> = (0..runs)
        .map(|_| {
            let phases = fresh();
            join(&phases)?;
            Ok(phases)
        })
        .collect::<Result<_>>()?;
    let med = |f: fn(&Phases) -> &Time| median(samples.iter().map(|p| time(f(p))).collect());
    Ok(Measured {
        transform: med(|p| &p.transform),
        matching: med(|p| &p.matching),
        materialize: med(|p| &p.materialize),
        total: median(
            samples
                .iter()
                .map(|p| time(&p.transform) + time(&p.matching) + time(&p.materialize))
                .collect(),
        ),
        peak: Some(b.tracker().peak()),
    })
}

fn fail(msg: String) -> DataFusionError {
    DataFusionError::Execution(msg)
}

/// The sum of an Int32 or Int64 column.
fn column_sum(a: &ArrayRef) -> i128 {
    match a.data_type() {
        DataType::Int32 => a
            .as_primitive::<Int32Type>()
            .values()
            .iter()
            .map(|&v| v as i128)
            .sum(),
        _ => a
            .as_primitive::<Int64Type>()
            .values()
            .iter()
            .map(|&v| v as i128)
            .sum(),
    }
}

/// The encoder of column 0 of `batches`.
fn encoder(batches: &[RecordBatch]) -> Result<KeyEncoder> {
    let keys = vec![batches.iter().map(|b| b.column(0)).collect()];
    match KeyEncoder::fit(&keys, false)? {
        Fitted::Encoder(e) => Ok(e),
        _ => Err(fail("keys do not encode".into())),
    }
}

/// R ⋈ S on the device; output R.k, R's payloads, S's payloads.
fn pk_fk<B: Backend>(b: &B, t: &Tables, payloads: usize, runs: usize) -> Result<Measured> {
    let all: Vec<usize> = (0..=payloads).collect();
    let field = |side: &str, f: &Field| f.clone().with_name(format!("{side}_{}", f.name()));
    let mut fields: Vec<Field> = t.r[0]
        .schema()
        .fields()
        .iter()
        .map(|f| field("r", f))
        .collect();
    fields.extend(
        t.s[0]
            .schema()
            .fields()
            .iter()
            .skip(1)
            .map(|f| field("s", f)),
    );
    let mut columns: Vec<OutputColumn> = all.iter().map(|&c| OutputColumn::Build(c)).collect();
    columns.extend((1..=payloads).map(OutputColumn::Probe));
    let layout = OutputLayout {
        schema: Arc::new(Schema::new(fields)),
        columns,
        build_keys: vec![0],
        probe_keys: vec![0],
        check: None,
    };
    let enc = encoder(&t.r)?;
    let r = DeviceRelation::upload(b, &t.r, &all)?;
    let s = DeviceRelation::upload(b, &t.s, &all)?;
    measure(
        b,
        runs,
        |phases| {
            let build = BuildSide::from_device(b, &r, &layout, enc.clone(), phases)?;
            join_on_device(b, &build, &s, &layout, phases)
        },
        |out| {
            let batches = out.download(b, &layout.schema, 1 << 20)?;
            let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
            let key_sum: i128 = batches.iter().map(|b| column_sum(b.column(0))).sum();
            // S's first payload is a copy of S's key, which must equal R's key.
            let aligned = payloads == 0
                || batches
                    .iter()
                    .all(|b| b.column(0).as_ref() == b.column(payloads + 1).as_ref());
            if rows != t.matches || key_sum != t.key_sum || !aligned {
                return Err(fail(format!(
                    "wrong join: {rows} rows (expected {}), key sum {key_sum} (expected {}), keys aligned: {aligned}",
                    t.matches, t.key_sum
                )));
            }
            Ok(())
        },
    )
}

/// The fact table joined with each dimension in turn on the device: each join's output (the
/// fact's columns minus the used foreign key, plus the dimension's payload) probes the next.
fn sequence<B: Backend>(b: &B, star: &Star, runs: usize) -> Result<Measured> {
    let k = star.dims.len();
    let fact_schema = star.fact[0].schema();
    let fact_cols: Vec<usize> = (0..fact_schema.fields().len()).collect();
    let fact = DeviceRelation::upload(b, &star.fact, &fact_cols)?;
    let dims = star
        .dims
        .iter()
        .map(|d| Ok((DeviceRelation::upload(b, d, &[0, 1])?, encoder(d)?)))
        .collect::<Result<Vec<_>>>()?;
    // The layout of each join, following the columns' names through the sequence.
    let mut names: Vec<String> = fact_schema
        .fields()
        .iter()
        .map(|f| f.name().clone())
        .collect();
    let mut layouts = vec![];
    for d in 0..k {
        let fk = names
            .iter()
            .position(|n| *n == format!("f{d}"))
            .expect("foreign key present");
        let mut columns: Vec<OutputColumn> = (0..names.len())
            .filter(|&i| i != fk)
            .map(OutputColumn::Probe)
            .collect();
        columns.push(OutputColumn::Build(1));
        names.remove(fk);
        names.push(format!("d{d}"));
        let fields: Vec<Field> = names
            .iter()
            .map(|n| Field::new(n, DataType::Int32, false))
            .collect();
        layouts.push(OutputLayout {
            schema: Arc::new(Schema::new(fields)),
            columns,
            build_keys: vec![0],
            probe_keys: vec![fk],
            check: None,
        });
    }
    measure(
        b,
        runs,
        |phases| {
            let mut current: Option<DeviceRelation<B::Buf>> = None;
            for ((dim, enc), layout) in dims.iter().zip(&layouts) {
                let build = BuildSide::from_device(b, dim, layout, enc.clone(), phases)?;
                let probe = current.as_ref().unwrap_or(&fact);
                current = Some(join_on_device(b, &build, probe, layout, phases)?);
            }
            current.ok_or_else(|| fail("no joins".into()))
        },
        |out| {
            let last = layouts.last().expect("k >= 1");
            let batches = out.download(b, &last.schema, 1 << 20)?;
            let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
            let fact_rows: usize = star.fact.iter().map(|b| b.num_rows()).sum();
            for d in 0..k {
                let c = names
                    .iter()
                    .position(|n| *n == format!("d{d}"))
                    .expect("payload");
                let sum: i128 = batches.iter().map(|b| column_sum(b.column(c))).sum();
                if rows != fact_rows || sum != star.fk_sums[d] {
                    return Err(fail(format!(
                        "wrong join sequence: {rows} rows (expected {fact_rows}), dimension {d} sum {sum} (expected {})",
                        star.fk_sums[d]
                    )));
                }
            }
            Ok(())
        },
    )
}
