//! Kernel level: joins of relations already on the device, as in the paper — per-phase times
//! (transform, match, materialize) of PHJ-OM (and, in the `sort-merge` sweep, of SMJ-OM; in
//! `phj-um` and `smj-um`, of PHJ-UM and SMJ-UM, which gather from the untransformed
//! relations; in `inlj`, of the index nested loop join), the
//! median of `runs` runs after a warm-up whose
//! output is checked, and the peak device memory of the case. Sweeps: size, payload columns,
//! |R|:|S|, match ratio, Zipf skew, 4- vs 8-byte values, and join sequences over a star schema
//! whose intermediate results stay on the device (by PHJ-OM, and by the streaming engine's
//! DIRECT join with each intermediate result probing whole, in its row order); `keys`, the streaming engine's HASH join
//! on 8-byte integer keys against the same join on 16-byte string keys, each as the engine
//! stages it (a string key as its check bytes and length class, hashed on the device); and
//! `joins`, the HASH join of every join type but the mark joins on the standard workload made
//! 50 % matching, each as the engine runs it on one chunk (probe rows marking the build rows
//! they match, then the build rows the join keeps).

use std::sync::Arc;
use std::time::Duration;

use std::time::Instant;

use arrow::array::{ArrayRef, AsArray, FixedSizeBinaryArray, RecordBatch, UInt8Array};
use arrow::datatypes::{DataType, Field, Int32Type, Int64Type, Schema};
use datafusion::common::{DataFusionError, Result};
use datafusion::logical_expr::JoinType;
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, Time};
use datafusion_gpu_join::backend::{
    Backend, CLASS_MASK, CudaBackend, HostBackend, KEY_CHECK_BYTES, ProbeEmit,
};
use datafusion_gpu_join::columns::{
    DeviceColumn, DeviceRelation, Fitted, KeyEncoder, KeyRange, upload_column,
};
use datafusion_gpu_join::join::hash::{
    BucketTable, Source, count, encode_probe, materialize, total_index,
};
use datafusion_gpu_join::join::smj::{sort_merge_join, sort_merge_join_untransformed};
use datafusion_gpu_join::join::{
    Algorithm, BuildSide, Chain, ChainColumn, CheckedKeys, Emission, OutputColumn, OutputLayout,
    Phases, algorithm, hash_checked_keys, index_nested_loop_join, join_on_device,
    join_untransformed,
};
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

/// The algorithm that joins relations on the device in the `payloads`, `sort-merge`, `phj-um`,
/// `smj-um` and `inlj` sweeps (and the others of the standard workload: PHJ-OM).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OnDevice {
    PhjOm,
    PhjUm,
    SmjOm,
    SmjUm,
    Inlj,
}

impl OnDevice {
    /// The algorithm of `sweep`: PHJ-OM but for the sweeps named after another.
    fn of(sweep: &str) -> Self {
        match sweep {
            "sort-merge" => Self::SmjOm,
            "phj-um" => Self::PhjUm,
            "smj-um" => Self::SmjUm,
            "inlj" => Self::Inlj,
            _ => Self::PhjOm,
        }
    }

    fn name(self) -> &'static str {
        match self {
            Self::PhjOm => ALGORITHM,
            Self::PhjUm => "PHJ-UM",
            Self::SmjOm => "SMJ-OM",
            Self::SmjUm => "SMJ-UM",
            Self::Inlj => "INLJ",
        }
    }
}

/// One kernel-level measurement.
pub struct Case {
    /// Which sweep it belongs to.
    pub sweep: &'static str,
    /// The swept parameter's value.
    pub x: f64,
    pub input: Input,
}

pub enum Input {
    /// The workload joined by `by`.
    PkFk { w: Workload, by: OnDevice },
    /// A fact table of `fact_rows` joined with `k` dimensions of `dim_rows` rows in turn, by
    /// `by`.
    Sequence {
        fact_rows: usize,
        dim_rows: usize,
        k: usize,
        by: SequenceBy,
    },
    /// The HASH join of the workload (8-byte keys) on its integer keys, or on 16-byte string
    /// keys made of [`KEY_PREFIX`] and each key's 8 bytes; or (`direct`) the DIRECT join on
    /// its integer keys.
    Keys {
        w: Workload,
        strings: bool,
        direct: bool,
    },
    /// The HASH join of the workload as a join of type `join`.
    Joins { w: Workload, join: JoinType },
}

/// How the `sequence` sweep joins its chains.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SequenceBy {
    /// PHJ-OM, each join's output (every column it carries) probing the next.
    PhjOm,
    /// The streaming engine's DIRECT join, each join's output probing the next whole.
    Direct,
    /// LOOKUP's late-materializing [`Chain`] over DIRECT's tables.
    Lookup,
}

impl SequenceBy {
    const ALL: [Self; 3] = [Self::PhjOm, Self::Direct, Self::Lookup];

    fn name(self) -> &'static str {
        match self {
            Self::PhjOm => ALGORITHM,
            Self::Direct => "DIRECT",
            Self::Lookup => "LOOKUP",
        }
    }
}

/// The join types of the `joins` sweep: all but the mark joins, in the order
/// [`check_join_rows`] reads their output rows.
pub const JOIN_TYPES: [JoinType; 8] = [
    JoinType::Inner,
    JoinType::Left,
    JoinType::Right,
    JoinType::Full,
    JoinType::LeftSemi,
    JoinType::LeftAnti,
    JoinType::RightSemi,
    JoinType::RightAnti,
];

/// The fixed first 8 bytes of the `keys` sweep's string keys.
const KEY_PREFIX: &[u8; 8] = b"gpu-join";

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
            input: Input::PkFk {
                w,
                by: OnDevice::of(sweep),
            },
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
            "sort-merge" => (0..=4).for_each(|p| add("sort-merge", p as f64, std(p))),
            "phj-um" => (0..=4).for_each(|p| add("phj-um", p as f64, std(p))),
            "smj-um" => (0..=4).for_each(|p| add("smj-um", p as f64, std(p))),
            "inlj" => (0..=4).for_each(|p| add("inlj", p as f64, std(p))),
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
    if args.sweeps.iter().any(|s| s == "keys") {
        for strings in [false, true] {
            cases.push(Case {
                sweep: "keys",
                x: if strings { 16.0 } else { 8.0 },
                input: Input::Keys {
                    w: Workload {
                        wide: true,
                        ..std(2)
                    },
                    strings,
                    direct: false,
                },
            });
        }
    }
    if args.sweeps.iter().any(|s| s == "algorithms") {
        // Each workload twice, HASH (x even) and DIRECT (x odd): the standard workload with S
        // shuffled and in key order, R's keys filling 1/2 to 1/16 of their range, S's keys
        // skewed, half of them missing, and two smaller sizes.
        let workloads = [
            std(2),
            Workload {
                sorted_probe: true,
                ..std(2)
            },
            Workload {
                key_spread: 2,
                ..std(2)
            },
            Workload {
                key_spread: 4,
                ..std(2)
            },
            Workload {
                key_spread: 8,
                ..std(2)
            },
            Workload {
                key_spread: 16,
                ..std(2)
            },
            Workload {
                zipf: 1.0,
                ..std(2)
            },
            Workload {
                match_ratio: 0.5,
                ..std(2)
            },
            Workload::standard(n.saturating_sub(6).max(4), 2),
            Workload::standard(n.saturating_sub(3).max(4), 2),
        ];
        for (i, w) in workloads.into_iter().enumerate() {
            for direct in [false, true] {
                cases.push(Case {
                    sweep: "algorithms",
                    x: (2 * i + usize::from(direct)) as f64,
                    input: Input::Keys {
                        w: w.clone(),
                        strings: false,
                        direct,
                    },
                });
            }
        }
    }
    if args.sweeps.iter().any(|s| s == "joins") {
        for (i, join) in JOIN_TYPES.into_iter().enumerate() {
            cases.push(Case {
                sweep: "joins",
                x: i as f64,
                input: Input::Joins {
                    w: Workload {
                        match_ratio: 0.5,
                        ..std(2)
                    },
                    join,
                },
            });
        }
    }
    if args.sweeps.iter().any(|s| s == "sequence") {
        // Each k's cases one after another, so that they share its generated tables.
        for k in 1..=args.max_sequence {
            for by in SequenceBy::ALL {
                cases.push(Case {
                    sweep: "sequence",
                    x: k as f64,
                    input: Input::Sequence {
                        fact_rows: 2 << n,
                        dim_rows: (2 << n) / 8,
                        k,
                        by,
                    },
                });
            }
        }
    }
    cases
}

/// Runs every case on `device`, adding one record per case to `report`.
pub fn run(device: &Device, args: &Args, report: &mut Report) -> Result<()> {
    let cases = cases(args);
    let bar = progress(cases.len() as u64, "kernel level");
    // The star schema of the last sequence case, kept for the next of the same shape.
    let mut stars: Option<((usize, usize, usize), Star)> = None;
    for case in &cases {
        let (label, tuples, measured, fields, algorithm) = match &case.input {
            Input::PkFk { w, by } => {
                bar.set_message(format!("{} {}: generating", case.sweep, case.x));
                let tables = generate(w);
                bar.set_message(format!("{} {}: joining", case.sweep, case.x));
                let m = on_backend!(device, b => pk_fk(b, &tables, w.payloads, *by, args.runs))?;
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
                (label, w.r_rows + w.s_rows, m, fields, by.name())
            }
            Input::Keys { w, strings, direct } => {
                bar.set_message(format!("{} {}: generating", case.sweep, case.x));
                let tables = generate(w);
                bar.set_message(format!("{} {}: joining", case.sweep, case.x));
                let m =
                    on_backend!(device, b => bucket(b, &tables, w, *strings, *direct, args.runs))?;
                let bytes = w.value_bytes();
                let keys = match strings {
                    true => "16-byte string keys (checked)".to_string(),
                    false => format!("{bytes}-byte integer keys"),
                };
                let mut shape = String::new();
                if w.sorted_probe {
                    shape += ", S in key order";
                }
                if w.key_spread > 1 && !w.wide {
                    shape += &format!(", R's keys fill 1/{} of their range", w.key_spread);
                }
                if w.zipf > 0.0 {
                    shape += &format!(", zipf {}", w.zipf);
                }
                if w.match_ratio < 1.0 {
                    shape += &format!(", match {}", w.match_ratio);
                }
                if case.sweep == "algorithms" {
                    shape += &format!(" (auto: {})", auto_choice(&tables)?);
                }
                let label = format!(
                    "{} ⋈ {}, {p},{p} {bytes}-byte payloads, {keys}{shape}",
                    pow2(w.r_rows),
                    pow2(w.s_rows),
                    p = w.payloads
                );
                let fields = json!({"r_rows": w.r_rows, "s_rows": w.s_rows, "payloads": w.payloads,
                    "value_bytes": bytes, "string_keys": strings,
                    "sorted_probe": w.sorted_probe, "key_spread": w.key_spread,
                    "zipf": w.zipf, "match_ratio": w.match_ratio});
                let algorithm = if *direct { "DIRECT" } else { "HASH" };
                (label, w.r_rows + w.s_rows, m, fields, algorithm)
            }
            Input::Joins { w, join } => {
                bar.set_message(format!("joins {join}: generating"));
                let tables = generate(w);
                bar.set_message(format!("joins {join}: joining"));
                let (m, rows) = on_backend!(device, b => {
                    if case.x == 0.0 {
                        // The first case checks every type's output rows against the others'.
                        let rows = JOIN_TYPES
                            .into_iter()
                            .map(|t| Ok(joins(b, &tables, w.payloads, t, 0)?.1))
                            .collect::<Result<Vec<_>>>()?;
                        check_join_rows(&rows, &tables, w)?;
                    }
                    joins(b, &tables, w.payloads, *join, args.runs)
                })?;
                let label = format!(
                    "{} ⋈ {}, {p},{p} {}-byte payloads, 50 % of S matching, {}",
                    pow2(w.r_rows),
                    pow2(w.s_rows),
                    w.value_bytes(),
                    join,
                    p = w.payloads
                );
                let fields = json!({"r_rows": w.r_rows, "s_rows": w.s_rows, "payloads": w.payloads,
                    "value_bytes": w.value_bytes(), "match_ratio": w.match_ratio,
                    "join_type": join.to_string(), "output_rows": rows});
                (label, w.r_rows + w.s_rows, m, fields, "HASH")
            }
            Input::Sequence {
                fact_rows,
                dim_rows,
                k,
                by,
            } => {
                let shape = (*fact_rows, *dim_rows, *k);
                if stars.as_ref().is_none_or(|(at, _)| *at != shape) {
                    bar.set_message(format!("sequence {k}: generating"));
                    // The last star's memory goes before the next is made.
                    drop(stars.take());
                    stars = Some((shape, star(*fact_rows, *dim_rows, *k)));
                }
                let s = &stars.as_ref().expect("generated").1;
                bar.set_message(format!("sequence {k}: joining by {}", by.name()));
                let m = match by {
                    SequenceBy::PhjOm => on_backend!(device, b => sequence(b, s, args.runs))?,
                    SequenceBy::Direct => {
                        on_backend!(device, b => sequence_direct(b, s, args.runs))?
                    }
                    SequenceBy::Lookup => {
                        on_backend!(device, b => sequence_lookup(b, s, args.runs))?
                    }
                };
                let algorithm = by.name();
                let label = format!(
                    "fact {} ⋈ {k} dims of {}",
                    pow2(*fact_rows),
                    pow2(*dim_rows)
                );
                let fields = json!({"fact_rows": fact_rows, "dim_rows": dim_rows, "joins": k});
                (label, fact_rows + k * dim_rows, m, fields, algorithm)
            }
        };
        let total = measured.total.as_secs_f64();
        // Each case as it ends, on stderr: a run cut short still leaves what it measured.
        eprintln!(
            "kernel {} {}: {label}, {algorithm}: {:.2} ms (transform {:.2}, match {:.2}, \
             materialize {:.2})",
            case.sweep,
            case.x,
            total * 1e3,
            ms(measured.transform),
            ms(measured.matching),
            ms(measured.materialize)
        );
        let mut record = json!({
            "sweep": case.sweep, "x": case.x, "case": label, "algorithm": algorithm,
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

/// Runs `once` (a join timed by phase: transform, match, materialize) once checking its output
/// (`once(true)`), then `runs` times; medians per phase.
fn phase_medians<B: Backend>(
    b: &B,
    runs: usize,
    mut once: impl FnMut(bool) -> Result<[Duration; 3]>,
) -> Result<Measured> {
    once(true)?;
    let samples: Vec<[Duration; 3]> = (0..runs).map(|_| once(false)).collect::<Result<_>>()?;
    let med = |i: usize| median(samples.iter().map(|p| p[i]).collect());
    Ok(Measured {
        transform: med(0),
        matching: med(1),
        materialize: med(2),
        total: median(samples.iter().map(|p| p.iter().sum()).collect()),
        peak: Some(b.tracker().peak()),
    })
}

pub fn fail(msg: String) -> DataFusionError {
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
pub fn encoder(batches: &[RecordBatch]) -> Result<KeyEncoder> {
    let keys = vec![batches.iter().map(|b| b.column(0)).collect()];
    match KeyEncoder::fit(&keys, false)? {
        Fitted::Encoder(e) => Ok(e),
        _ => Err(fail("keys do not encode".into())),
    }
}

/// The u64 at `at` of `offsets` (a count's total), read back to the host.
fn read_total<B: Backend>(b: &B, offsets: &B::Buf, at: usize) -> Result<u64> {
    let mut block = match b.scalars().try_take(8)? {
        Some(block) => block,
        None => b.scalars().take_unpooled(8)?,
    };
    b.read_u64(offsets, at, &mut block)?;
    b.synchronize()?;
    Ok(u64::from_le_bytes(
        block.bytes()?[..8].try_into().expect("8 bytes"),
    ))
}

/// The output layout of a join on column 0 of both sides (the workload's integer key), with
/// no check bytes and no filter.
fn key_layout(fields: Vec<Field>, columns: Vec<OutputColumn>) -> OutputLayout {
    OutputLayout {
        schema: Arc::new(Schema::new(fields)),
        columns,
        build_keys: vec![0],
        probe_keys: vec![0],
        check: None,
        filter: None,
    }
}

/// The layout of R ⋈ S on the key: output R.k, R's payloads, S's payloads.
pub fn pk_fk_layout(t: &Tables, payloads: usize) -> OutputLayout {
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
    let mut columns: Vec<OutputColumn> = (0..=payloads).map(OutputColumn::Build).collect();
    columns.extend((1..=payloads).map(OutputColumn::Probe));
    key_layout(fields, columns)
}

/// Checks the output of R ⋈ S (in the layout of [`pk_fk_layout`]): its rows, the sum of its
/// keys, and S's first payload (a copy of S's key) equal to R's key on every row.
pub fn check_pk_fk(batches: &[RecordBatch], t: &Tables, payloads: usize) -> Result<()> {
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    let key_sum: i128 = batches.iter().map(|b| column_sum(b.column(0))).sum();
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
}

/// R ⋈ S on the device by `by`; output R.k, R's payloads, S's payloads.
fn pk_fk<B: Backend>(
    b: &B,
    t: &Tables,
    payloads: usize,
    by: OnDevice,
    runs: usize,
) -> Result<Measured> {
    let all: Vec<usize> = (0..=payloads).collect();
    let layout = pk_fk_layout(t, payloads);
    let enc = encoder(&t.r)?;
    let r = DeviceRelation::upload(b, &t.r, &all)?;
    let s = DeviceRelation::upload(b, &t.s, &all)?;
    measure(
        b,
        runs,
        |phases| match by {
            OnDevice::SmjOm => sort_merge_join(b, &r, &s, &layout, &enc, phases),
            OnDevice::PhjUm => join_untransformed(b, &r, &s, &layout, &enc, phases),
            OnDevice::SmjUm => sort_merge_join_untransformed(b, &r, &s, &layout, &enc, phases),
            OnDevice::Inlj => index_nested_loop_join(b, &r, &s, &layout, &enc, phases),
            OnDevice::PhjOm => {
                let build = BuildSide::from_device(b, &r, &layout, enc.clone(), phases)?;
                join_on_device(b, &build, &s, &layout, phases)
            }
        },
        |out| check_pk_fk(&out.download(b, &layout.schema, 1 << 20)?, t, payloads),
    )
}

/// The layout of each join of a sequence over `star`, following the columns' names: each
/// join outputs its probe side's columns but the foreign key it used, then the dimension's
/// payload. Also the last join's column names.
fn sequence_layouts(star: &Star) -> (Vec<OutputLayout>, Vec<String>) {
    let mut names: Vec<String> = (star.fact[0].schema().fields().iter())
        .map(|f| f.name().clone())
        .collect();
    let mut layouts = vec![];
    for d in 0..star.dims.len() {
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
            filter: None,
        });
    }
    (layouts, names)
}

/// Checks a sequence's output `out` (of the last of `layouts`, whose columns are `names`):
/// every fact row, and each dimension's payloads summing to its foreign key's sum.
fn check_sequence<B: Backend>(
    b: &B,
    star: &Star,
    layouts: &[OutputLayout],
    names: &[String],
    out: &DeviceRelation<B::Buf>,
) -> Result<()> {
    let last = layouts.last().ok_or_else(|| fail("no joins".into()))?;
    let batches = out.download(b, &last.schema, 1 << 20)?;
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    let fact_rows: usize = star.fact.iter().map(|b| b.num_rows()).sum();
    for d in 0..star.dims.len() {
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
}

/// The fact table joined with each dimension in turn on the device by PHJ-OM: each join's
/// output probes the next.
fn sequence<B: Backend>(b: &B, star: &Star, runs: usize) -> Result<Measured> {
    let fact = fact_on_device(b, star)?;
    let dims = star
        .dims
        .iter()
        .map(|d| Ok((DeviceRelation::upload(b, d, &[0, 1])?, encoder(d)?)))
        .collect::<Result<Vec<_>>>()?;
    let (layouts, names) = sequence_layouts(star);
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
        |out| check_sequence(b, star, &layouts, &names, out),
    )
}

/// Every column of `star`'s fact table on the device.
fn fact_on_device<B: Backend>(b: &B, star: &Star) -> Result<DeviceRelation<B::Buf>> {
    let columns: Vec<usize> = (0..star.fact[0].num_columns()).collect();
    DeviceRelation::upload(b, &star.fact, &columns)
}

/// Each dimension of `star` on the device (key and payload) with its direct encoder.
fn direct_dims<B: Backend>(
    b: &B,
    star: &Star,
) -> Result<Vec<(DeviceRelation<B::Buf>, KeyEncoder)>> {
    (star.dims.iter())
        .map(|d| {
            let e = encoder(d)?.direct();
            let e = e.ok_or_else(|| fail("a dimension's keys have no direct encoder".into()))?;
            Ok((DeviceRelation::upload(b, d, &[0, 1])?, e))
        })
        .collect()
}

/// The same sequence by the streaming engine's DIRECT join: each dimension bucketed by key
/// value (its keys fill their range), the intermediate result probing it whole as one chunk,
/// unpartitioned, so that each join's output keeps its probe rows' order and gathers the
/// columns it carries in that order. Phases: bucketing the dimension and encoding the probe
/// keys (transform), counting (match), writing the output (materialize), summed over the
/// joins.
fn sequence_direct<B: Backend>(b: &B, star: &Star, runs: usize) -> Result<Measured> {
    let fact = fact_on_device(b, star)?;
    let dims = direct_dims(b, star)?;
    let (layouts, names) = sequence_layouts(star);
    let once = |verify: bool| -> Result<[Duration; 3]> {
        let mut phases = [Duration::ZERO; 3];
        let mut current: Option<DeviceRelation<B::Buf>> = None;
        b.synchronize()?;
        for ((dim, enc), layout) in dims.iter().zip(&layouts) {
            let start = Instant::now();
            let table = BucketTable::build(b, dim, layout, enc.clone())?;
            let probe = current.as_ref().unwrap_or(&fact);
            let keys = encode_probe(b, &table, probe, layout)?;
            b.synchronize()?;
            let transformed = Instant::now();
            let source = Source::Probe {
                chunk: probe,
                keys: &keys,
                emit: ProbeEmit::Pairs,
            };
            let offsets = count(b, &table, source, None)?;
            let total = read_total(b, &offsets, total_index(&table, &source))?;
            let matched = Instant::now();
            let out = materialize(b, &table, source, &offsets, 0..total, layout)?;
            b.synchronize()?;
            let done = Instant::now();
            for (p, d) in
                phases
                    .iter_mut()
                    .zip([transformed - start, matched - transformed, done - matched])
            {
                *p += d;
            }
            let rows = out.rows;
            let columns = (out.columns.into_iter().enumerate())
                .map(|(i, c)| {
                    let column = DeviceColumn {
                        kind: c.kind,
                        values: c.values,
                        validity: c.validity,
                        rows,
                    };
                    (i, column)
                })
                .collect();
            current = Some(DeviceRelation { columns, rows });
        }
        if verify {
            let out = current.as_ref().ok_or_else(|| fail("no joins".into()))?;
            check_sequence(b, star, &layouts, &names, out)?;
        }
        Ok(phases)
    };
    phase_medians(b, runs, once)
}

/// The same sequence by LOOKUP: each dimension bucketed by key value as DIRECT's table, then
/// one [`Chain`] over the fact table, each join looking its foreign key up in one pass and
/// taking the dimension's payload; the fact table's columns are copied once, at the end, for
/// the rows every join kept (all of them). Phases: bucketing the dimensions (transform), the
/// joins (match: encoding, lookup, gathering the payload), the output's columns from the fact
/// table (materialize).
fn sequence_lookup<B: Backend>(b: &B, star: &Star, runs: usize) -> Result<Measured> {
    let fact_names: Vec<String> = (star.fact[0].schema().fields().iter())
        .map(|f| f.name().clone())
        .collect();
    let fact = fact_on_device(b, star)?;
    let dims = direct_dims(b, star)?;
    let (layouts, names) = sequence_layouts(star);
    let base = |name: &str| -> Result<usize> {
        (fact_names.iter().position(|n| n == name))
            .ok_or_else(|| fail(format!("no fact column {name}")))
    };
    // Join d takes dimension d's payload as the chain's joined column d.
    let output = (names.iter())
        .map(|n| match n.strip_prefix('d').map(str::parse::<usize>) {
            Some(Ok(d)) => Ok(ChainColumn::Joined(d)),
            _ => Ok(ChainColumn::Base(base(n)?)),
        })
        .collect::<Result<Vec<_>>>()?;
    let foreign_keys = (0..star.dims.len())
        .map(|d| base(&format!("f{d}")))
        .collect::<Result<Vec<_>>>()?;
    let once = |verify: bool| -> Result<[Duration; 3]> {
        b.synchronize()?;
        let start = Instant::now();
        let tables = (dims.iter().zip(&layouts))
            .map(|((dim, enc), layout)| BucketTable::build(b, dim, layout, enc.clone()))
            .collect::<Result<Vec<_>>>()?;
        b.synchronize()?;
        let built = Instant::now();
        let mut chain = Chain::new(&fact);
        for (table, &fk) in tables.iter().zip(&foreign_keys) {
            if !chain.join(b, table, &[ChainColumn::Base(fk)], &[1])? {
                return Err(fail("a dimension's keys repeat: no lookup".into()));
            }
        }
        b.synchronize()?;
        let joined = Instant::now();
        let out = chain.finish(b, &output)?;
        b.synchronize()?;
        let done = Instant::now();
        if verify {
            check_sequence(b, star, &layouts, &names, &out)?;
        }
        Ok([built - start, joined - built, done - joined])
    };
    phase_medians(b, runs, once)
}

/// `batches` (key `k` Int64 first) with two more columns: each key as the engine stages a
/// 16-byte string key — its length class (16) and its check bytes ([`KEY_PREFIX`] and the
/// key's 8 little-endian bytes).
fn with_string_keys(batches: &[RecordBatch]) -> Result<Vec<RecordBatch>> {
    batches
        .iter()
        .map(|b| {
            let keys = b.column(0).as_primitive::<Int64Type>();
            let rows = keys.values().iter().map(|k| {
                let mut row = [0u8; KEY_CHECK_BYTES];
                row[..8].copy_from_slice(KEY_PREFIX);
                row[8..].copy_from_slice(&k.to_le_bytes());
                row
            });
            let check: ArrayRef = Arc::new(FixedSizeBinaryArray::try_from_iter(rows)?);
            let classes: ArrayRef = Arc::new(UInt8Array::from(vec![16u8; b.num_rows()]));
            let mut fields: Vec<Field> = b
                .schema()
                .fields()
                .iter()
                .map(|f| f.as_ref().clone())
                .collect();
            fields.push(Field::new("class", DataType::UInt8, false));
            fields.push(Field::new("check", check.data_type().clone(), false));
            let mut columns = b.columns().to_vec();
            columns.extend([classes, check]);
            Ok(RecordBatch::try_new(
                Arc::new(Schema::new(fields)),
                columns,
            )?)
        })
        .collect()
}

/// What `gpu_join.algorithm = auto` runs for R's keys.
fn auto_choice(t: &Tables) -> Result<String> {
    let rows = t.r.iter().map(|b| b.num_rows()).sum();
    Ok(algorithm::choose(Algorithm::Auto, encoder(&t.r)?, rows).shown)
}

/// R ⋈ S with HASH (or, `direct`, DIRECT), the streaming engine's join, on the device: R
/// bucketed (transform, with the probe keys' encoding), S probed in one chunk (match: count
/// and the total), every output column gathered in one pass (materialize); on the integer
/// keys, or on string keys as the engine stages them, hashed on the device within the
/// transform. Output R.k, R's payloads, S's payloads.
fn bucket<B: Backend>(
    b: &B,
    t: &Tables,
    w: &Workload,
    strings: bool,
    direct: bool,
    runs: usize,
) -> Result<Measured> {
    let payloads = w.payloads;
    let (rb, sb) = match strings {
        true => (with_string_keys(&t.r)?, with_string_keys(&t.s)?),
        false => (t.r.clone(), t.s.clone()),
    };
    let field = |side: &str, f: &Field| f.clone().with_name(format!("{side}_{}", f.name()));
    let mut fields: Vec<Field> = (0..=payloads)
        .map(|c| field("r", t.r[0].schema().field(c)))
        .collect();
    fields.extend((1..=payloads).map(|c| field("s", t.s[0].schema().field(c))));
    let mut columns: Vec<OutputColumn> = (0..=payloads).map(OutputColumn::Build).collect();
    columns.extend((1..=payloads).map(OutputColumn::Probe));
    // A string key: its classes are column `key`, its check bytes column `key + 1`.
    let key = payloads + 1;
    let (keys, check, encoder) = match strings {
        true => {
            let mask = (1u64 << 62) - 1;
            let mut range = KeyRange::new(&DataType::UInt64)?;
            range.include(0, mask | CLASS_MASK);
            let Fitted::Encoder(e) = KeyEncoder::from_ranges(&[range], false) else {
                return Err(fail("checked hashes do not encode".into()));
            };
            let check = CheckedKeys {
                build: key + 1,
                probe: key + 1,
                words: 1,
                mask,
            };
            (vec![key], Some(check), e)
        }
        false if direct => {
            let e = encoder(&t.r)?.direct();
            (
                vec![0],
                None,
                e.ok_or_else(|| fail("R's keys have no direct encoder".into()))?,
            )
        }
        false => (vec![0], None, encoder(&t.r)?),
    };
    let layout = OutputLayout {
        schema: Arc::new(Schema::new(fields)),
        columns,
        build_keys: keys.clone(),
        probe_keys: keys,
        check,
        filter: None,
    };
    let mut r = DeviceRelation::upload(b, &rb, &layout.build_needed())?;
    let mut s = DeviceRelation::upload(b, &sb, &layout.probe_needed())?;
    // A string key's classes, uploaded afresh for every run (each run hashes them in place).
    let classes = |batches: &[RecordBatch]| -> Vec<ArrayRef> {
        match strings {
            true => batches.iter().map(|b| Arc::clone(b.column(key))).collect(),
            false => vec![],
        }
    };
    let (r_classes, s_classes) = (classes(&rb), classes(&sb));
    let once = |verify: bool| -> Result<[Duration; 3]> {
        let mut keep = vec![];
        if strings {
            let up = |a: &[ArrayRef]| upload_column(b, &a.iter().collect::<Vec<_>>());
            r.columns.insert(key, up(&r_classes)?);
            s.columns.insert(key, up(&s_classes)?);
        }
        b.synchronize()?;
        let start = Instant::now();
        hash_checked_keys(b, &layout, true, &mut r, &mut keep)?;
        hash_checked_keys(b, &layout, false, &mut s, &mut keep)?;
        let table = BucketTable::build(b, &r, &layout, encoder.clone())?;
        let probe_keys = encode_probe(b, &table, &s, &layout)?;
        b.synchronize()?;
        let transformed = Instant::now();
        let source = Source::Probe {
            chunk: &s,
            keys: &probe_keys,
            emit: ProbeEmit::Pairs,
        };
        let offsets = count(b, &table, source, None)?;
        let total = read_total(b, &offsets, total_index(&table, &source))?;
        let matched = Instant::now();
        let out = materialize(b, &table, source, &offsets, 0..total, &layout)?;
        b.synchronize()?;
        let done = Instant::now();
        if verify {
            let rows = out.rows;
            let width = w.value_bytes();
            let column = |c: usize| -> Result<Vec<i64>> {
                let mut bytes = vec![0u8; rows * width];
                b.download(&out.columns[c].values, &mut bytes)?;
                Ok(bytes
                    .chunks_exact(width)
                    .map(|v| match width {
                        8 => i64::from_le_bytes(v.try_into().expect("8 bytes")),
                        _ => i64::from(i32::from_le_bytes(v.try_into().expect("4 bytes"))),
                    })
                    .collect())
            };
            let r_keys = column(0)?;
            let key_sum: i128 = r_keys.iter().map(|&k| k as i128).sum();
            // S's first payload is a copy of S's key, which must equal R's key.
            let aligned = payloads == 0 || r_keys == column(payloads + 1)?;
            if rows != t.matches || key_sum != t.key_sum || !aligned {
                return Err(fail(format!(
                    "wrong bucketed join: {rows} rows (expected {}), key sum {key_sum} (expected {}), keys aligned: {aligned}",
                    t.matches, t.key_sum
                )));
            }
        }
        Ok([transformed - start, matched - transformed, done - matched])
    };
    phase_medians(b, runs, once)
}

/// The output rows of every join type ([`JOIN_TYPES`], in order) agree with each other and
/// with the workload: a PK-FK join, so each S row matches at most one R row.
fn check_join_rows(rows: &[usize], t: &Tables, w: &Workload) -> Result<()> {
    let [
        inner,
        left,
        right,
        full,
        left_semi,
        left_anti,
        right_semi,
        right_anti,
    ] = rows
        .try_into()
        .map_err(|_| fail("a row count per join type".into()))?;
    let ok = inner == t.matches
        && left == inner + left_anti
        && right == inner + right_anti
        && full == inner + left_anti + right_anti
        && left_semi + left_anti == w.r_rows
        && right_semi == inner
        && right_semi + right_anti == w.s_rows
        && left_anti > 0
        && right_anti > 0;
    if !ok {
        return Err(fail(format!(
            "join types disagree: rows {rows:?} (inner, left, right, full, left semi, left \
             anti, right semi, right anti), {} matches of {} ⋈ {} rows",
            t.matches, w.r_rows, w.s_rows
        )));
    }
    Ok(())
}

/// R ⋈ S on the device as a join of type `join`, the way the engine runs it on one chunk: the
/// table built on R, S's keys encoded (transform); S counted, marking the R rows it matches,
/// then the R rows the join keeps counted by their marks (match); both written and their
/// columns gathered (materialize). Output: R's key and payloads and S's payloads, those of the
/// sides the join type outputs. Runs once, then `runs` timed times; returns the medians and
/// the output rows.
fn joins<B: Backend>(
    b: &B,
    t: &Tables,
    payloads: usize,
    join: JoinType,
    runs: usize,
) -> Result<(Measured, usize)> {
    // What each probe row emits, and the build rows kept after the probe side by their marks,
    // as the engine runs the join type.
    let Emission {
        probe: emit,
        build: build_rows,
    } = Emission::of(join);
    let field = |side: &str, f: &Field| f.clone().with_name(format!("{side}_{}", f.name()));
    let mut fields: Vec<Field> = vec![];
    let mut columns: Vec<OutputColumn> = vec![];
    if !matches!(join, JoinType::RightSemi | JoinType::RightAnti) {
        fields.extend((0..=payloads).map(|c| field("r", t.r[0].schema().field(c))));
        columns.extend((0..=payloads).map(OutputColumn::Build));
    }
    if !matches!(join, JoinType::LeftSemi | JoinType::LeftAnti) {
        fields.extend((1..=payloads).map(|c| field("s", t.s[0].schema().field(c))));
        columns.extend((1..=payloads).map(OutputColumn::Probe));
    }
    let layout = key_layout(fields, columns);
    let encoder = encoder(&t.r)?;
    let r = DeviceRelation::upload(b, &t.r, &layout.build_needed())?;
    let s = DeviceRelation::upload(b, &t.s, &layout.probe_needed())?;
    let once = || -> Result<([Duration; 3], usize)> {
        b.synchronize()?;
        let start = Instant::now();
        let table = BucketTable::build(b, &r, &layout, encoder.clone())?;
        let probe_keys = encode_probe(b, &table, &s, &layout)?;
        let mut visited = match build_rows {
            Some(_) => {
                let mut v = b.alloc(table.rows())?;
                b.fill(&mut v, 0)?;
                Some(v)
            }
            None => None,
        };
        b.synchronize()?;
        let transformed = Instant::now();
        let probe = Source::Probe {
            chunk: &s,
            keys: &probe_keys,
            emit,
        };
        let probe_offsets = count(b, &table, probe, visited.as_mut())?;
        let probe_rows = read_total(b, &probe_offsets, total_index(&table, &probe))?;
        let kept = match (build_rows, visited.as_ref()) {
            (Some(keep), Some(visited)) => {
                let source = Source::Build { visited, keep };
                let offsets = count(b, &table, source, None)?;
                let rows = read_total(b, &offsets, total_index(&table, &source))?;
                Some((source, offsets, rows))
            }
            _ => None,
        };
        let matched = Instant::now();
        let mut outputs = vec![];
        if probe_rows > 0 && emit != ProbeEmit::Nothing {
            outputs.push(materialize(
                b,
                &table,
                probe,
                &probe_offsets,
                0..probe_rows,
                &layout,
            )?);
        }
        if let Some((source, offsets, rows)) = &kept
            && *rows > 0
        {
            outputs.push(materialize(b, &table, *source, offsets, 0..*rows, &layout)?);
        }
        b.synchronize()?;
        let done = Instant::now();
        let rows = outputs.iter().map(|o| o.rows).sum();
        Ok((
            [transformed - start, matched - transformed, done - matched],
            rows,
        ))
    };
    let (_, rows) = once()?;
    let samples: Vec<[Duration; 3]> = (0..runs)
        .map(|_| once().map(|s| s.0))
        .collect::<Result<_>>()?;
    let med = |i: usize| median(samples.iter().map(|p| p[i]).collect());
    let measured = Measured {
        transform: med(0),
        matching: med(1),
        materialize: med(2),
        total: median(samples.iter().map(|p| p.iter().sum()).collect()),
        peak: Some(b.tracker().peak()),
    };
    Ok((measured, rows))
}
