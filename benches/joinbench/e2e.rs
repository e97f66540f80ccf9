//! End to end through SQL: the kernel-level tables as in-memory tables (Arrow batches in host
//! memory, one partition per core) in a `SessionContext`, `SELECT count(*), sum(...) FROM r
//! JOIN s ON r.k = s.k` over every payload with the rule on and off in the same run. Reports
//! both times, the speed-up, the operator's per-phase metrics, and the PCIe floor: the bytes it
//! uploaded and downloaded over the pinned copy bandwidth measured in this run (also with the
//! two directions overlapped). Phases and bytes are the last run's. Cases: the wide
//! workload at each `--e2e-log2-r` size, the narrow one and a small-build one (|R| = |S|/128)
//! at `--log2-r`, and the largest wide case again at each `--e2e-chunks` chunk size. Also the
//! process's peak resident memory over the rule-on and the rule-off runs (Linux `VmHWM`,
//! reset before each). `gpu_join.min_build_rows` is 0 here, so every case runs on the GPU path.
//! With `--e2e-devices`, every case also runs (rule on) with `gpu_join.devices` set, and its
//! row shows the device lanes started.

use std::sync::Arc;

use arrow::array::RecordBatch;
use datafusion::common::{DataFusionError, Result};
use datafusion::datasource::MemTable;
use datafusion::physical_plan::metrics::MetricsSet;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpu_join::device::CopyBandwidth;
use datafusion_gpu_join::{GpuJoinConfig, gpu_session_context};
use serde_json::json;

use crate::Device;
use crate::args::Args;
use crate::report::{Report, progress};
use crate::sql::{find, rows, run_timed, set_rule};
use crate::workload::{Tables, Workload, generate};

/// Deals batches round-robin into `parts` partitions.
pub fn partitions(batches: Vec<RecordBatch>, parts: usize) -> Vec<Vec<RecordBatch>> {
    let mut out = vec![vec![]; parts.max(1)];
    for (i, b) in batches.into_iter().enumerate() {
        out[i % parts.max(1)].push(b);
    }
    out
}

/// A session over R and S as in-memory tables of `cores` partitions, with the rule on for every
/// join (`gpu_join.min_build_rows = 0`) on `device`'s backend, and chunks of `chunk_rows` if given.
pub fn context(
    device: &Device,
    chunk_rows: Option<usize>,
    t: Tables,
    cores: usize,
) -> Result<SessionContext> {
    let mut gpu = GpuJoinConfig::default();
    gpu.backend = device.backend().parse()?;
    gpu.min_build_rows = 0;
    if let Some(rows) = chunk_rows {
        gpu.probe_chunk_rows = rows;
    }
    let ctx = gpu_session_context(
        SessionConfig::new()
            .with_target_partitions(cores)
            .with_option_extension(gpu),
    );
    for (name, batches) in [("r", t.r), ("s", t.s)] {
        let schema = batches[0].schema();
        let table = MemTable::try_new(schema, partitions(batches, cores))?;
        ctx.register_table(name, Arc::new(table))?;
    }
    Ok(ctx)
}

/// A metric of the operator summed over its partitions (times in ns, counts as is).
fn metric(m: &MetricsSet, name: &str) -> usize {
    m.sum_by_name(name).map_or(0, |v| v.as_usize())
}

/// Resets the process's peak resident memory (Linux), so that the next [`peak_rss`] covers
/// only what runs after.
fn reset_peak_rss() {
    let _ = std::fs::write("/proc/self/clear_refs", "5");
}

/// The process's peak resident memory in bytes since the last reset (Linux `VmHWM`).
fn peak_rss() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmHWM:"))?;
    Some(line.split_whitespace().nth(1)?.parse::<usize>().ok()? * 1024)
}

/// What one end-to-end case measured: the JSON record of the report.
struct Figures<'a> {
    sql: &'a str,
    w: &'a Workload,
    chunk_rows: Option<usize>,
    /// `gpu_join.devices` of the rule-on run (`None`: the default, one device).
    devices: Option<&'a str>,
    on_s: f64,
    off_s: f64,
    metrics: &'a MetricsSet,
    bandwidth: Option<CopyBandwidth>,
    host_peaks: (Option<usize>, Option<usize>),
}

impl Figures<'_> {
    fn json(&self, device: &Device, args: &Args, cores: usize) -> serde_json::Value {
        let m = self.metrics;
        // Over n devices, each link carries the build side and its share of the probe side
        // and output: the floor is that of one link's bytes.
        let links = metric(m, "device_lanes").max(1);
        let (up, down) = (metric(m, "bytes_uploaded"), metric(m, "bytes_downloaded"));
        let (up_s, down_s) = match self.bandwidth {
            Some(b) => (
                Some((up / links) as f64 / b.host_to_device),
                Some((down / links) as f64 / b.device_to_host),
            ),
            None => (None, None),
        };
        // The issue's floor: every byte over PCIe one after another; and the lower bound
        // when uploads and downloads overlap (PCIe is full duplex).
        let floor = up_s.zip(down_s).map(|(u, d)| u + d);
        let overlapped = up_s.zip(down_s).map(|(u, d)| u.max(d));
        let phase = |name| metric(m, name) as f64 / 1e9;
        let (on_s, off_s, w) = (self.on_s, self.off_s, self.w);
        json!({
            "query": self.sql, "r_rows": w.r_rows, "s_rows": w.s_rows, "payloads": w.payloads,
            "backend": device.name(), "partitions": cores, "runs": args.e2e_runs,
            "probe_chunk_rows": self.chunk_rows, "devices": self.devices,
            "device_lanes": metric(m, "device_lanes"),
            "rule_on_s": on_s, "rule_off_s": off_s, "speedup": off_s / on_s,
            "upload_s": phase("upload_time"), "transform_s": phase("transform_time"),
            "match_s": phase("match_time"), "materialize_s": phase("materialize_time"),
            "download_s": phase("download_time"),
            "bytes_uploaded": up, "bytes_downloaded": down,
            "upload_bytes_saved": metric(m, "upload_bytes_saved"),
            "pcie_floor_s": floor, "over_floor": floor.map(|f| on_s / f),
            "pcie_floor_overlapped_s": overlapped,
            "peak_device_bytes": metric(m, "peak_device_memory"),
            "host_peak_on_bytes": self.host_peaks.0, "host_peak_off_bytes": self.host_peaks.1,
            "chunks": metric(m, "probe_chunks"),
        })
    }
}

/// Prints `EXPLAIN ANALYZE` of `sql` (one more run), headed by `what`.
pub async fn explain(
    ctx: &datafusion::prelude::SessionContext,
    sql: &str,
    what: &str,
) -> Result<()> {
    let batches = ctx
        .sql(&format!("EXPLAIN ANALYZE {sql}"))
        .await?
        .collect()
        .await?;
    let text = arrow::util::pretty::pretty_format_batches(&batches)?;
    println!("EXPLAIN ANALYZE, {what}: {sql}\n{text}");
    Ok(())
}

/// `sql` timed, with the peak resident memory of its runs.
async fn measured(
    ctx: &datafusion::prelude::SessionContext,
    sql: &str,
    runs: usize,
) -> Result<(crate::sql::Timed, Option<usize>)> {
    reset_peak_rss();
    let timed = run_timed(ctx, sql, runs).await?;
    Ok((timed, peak_rss()))
}

pub async fn run(
    device: &Device,
    args: &Args,
    bandwidth: Option<CopyBandwidth>,
    report: &mut Report,
) -> Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut workloads: Vec<Workload> = args
        .e2e_sizes
        .iter()
        .map(|&n| Workload::standard(n, 2))
        .collect();
    workloads.push(Workload::standard(args.log2_r, 1));
    // A small build side and a large probe side (a star join's shape).
    workloads.push(Workload {
        r_rows: 1 << args.log2_r.saturating_sub(6),
        ..Workload::standard(args.log2_r, 2)
    });
    let bar = progress(workloads.len() as u64, "end to end");
    for w in &workloads {
        bar.set_message(format!("2^{} rows: generating", w.r_rows.ilog2()));
        let t = generate(w);
        let ctx = context(device, args.probe_chunk_rows, t, cores)?;
        if !args.pack_uploads {
            ctx.sql("SET gpu_join.pack_uploads = false")
                .await?
                .collect()
                .await?;
        }
        ctx.sql(&format!("SET gpu_join.algorithm = '{}'", args.algorithm))
            .await?
            .collect()
            .await?;
        let sums: Vec<String> = (0..w.payloads)
            .flat_map(|i| [format!("sum(r.p{i})"), format!("sum(s.p{i})")])
            .collect();
        let sql = format!(
            "SELECT count(*), {} FROM r JOIN s ON r.k = s.k",
            sums.join(", ")
        );
        bar.set_message(format!("2^{} rows: rule on", w.r_rows.ilog2()));
        let (on, peak_on) = measured(&ctx, &sql, args.e2e_runs).await?;
        let Some(join) = find(&on.plan, "GpuJoinExec") else {
            return Err(DataFusionError::Execution(format!(
                "the rule did not replace the join of `{sql}`"
            )));
        };
        let m = join.metrics().unwrap_or_default();
        if args.e2e_explain {
            explain(&ctx, &sql, "rule on").await?;
        }
        // The same on several devices.
        let spread = match &args.e2e_devices {
            Some(devices) => {
                bar.set_message(format!("2^{} rows: devices {devices}", w.r_rows.ilog2()));
                let set = |v: &str| format!("SET gpu_join.devices = '{v}'");
                ctx.sql(&set(devices)).await?.collect().await?;
                let measured = measured(&ctx, &sql, args.e2e_runs).await?;
                if args.e2e_explain {
                    explain(&ctx, &sql, &format!("rule on, devices {devices}")).await?;
                }
                ctx.sql(&set("")).await?.collect().await?;
                Some((devices.as_str(), measured))
            }
            None => None,
        };
        set_rule(&ctx, false).await?;
        bar.set_message(format!("2^{} rows: rule off", w.r_rows.ilog2()));
        let (off, peak_off) = measured(&ctx, &sql, args.e2e_runs).await?;
        if args.e2e_explain {
            explain(&ctx, &sql, "rule off").await?;
        }
        if find(&off.plan, "HashJoinExec").is_none() || rows(&on.batches)? != rows(&off.batches)? {
            return Err(DataFusionError::Execution(format!(
                "`{sql}`: results differ between rule on and off"
            )));
        }
        let (on_s, off_s) = (on.time.as_secs_f64(), off.time.as_secs_f64());
        let figures = Figures {
            sql: &sql,
            w,
            chunk_rows: args.probe_chunk_rows,
            devices: None,
            on_s,
            off_s,
            metrics: &m,
            bandwidth,
            host_peaks: (peak_on, peak_off),
        };
        report.e2e.push(figures.json(device, args, cores));
        // A rule-on run again (other devices, other chunks): its rows checked against the
        // rule-off run's, and the join's metrics.
        let again = |on: &crate::sql::Timed, what: &str| -> Result<MetricsSet> {
            if rows(&on.batches)? != rows(&off.batches)? {
                return Err(DataFusionError::Execution(format!(
                    "`{sql}` {what}: results differ"
                )));
            }
            Ok(find(&on.plan, "GpuJoinExec")
                .and_then(|j| j.metrics())
                .unwrap_or_default())
        };
        if let Some((devices, (on, peak))) = spread {
            let m = again(&on, &format!("on devices {devices}"))?;
            let figures = Figures {
                devices: Some(devices),
                on_s: on.time.as_secs_f64(),
                metrics: &m,
                host_peaks: (peak, peak_off),
                ..figures
            };
            report.e2e.push(figures.json(device, args, cores));
        }
        // The largest wide case again with other chunk sizes (rule on; rule off as above).
        let largest = args.e2e_sizes.iter().max().copied();
        if w.payloads == 2 && Some(w.r_rows.ilog2()) == largest && w.s_rows == 2 * w.r_rows {
            set_rule(&ctx, true).await?;
            for &c in &args.e2e_chunks {
                bar.set_message(format!("2^{} rows: chunks of 2^{c}", w.r_rows.ilog2()));
                ctx.sql(&format!("SET gpu_join.probe_chunk_rows = {}", 1usize << c))
                    .await?
                    .collect()
                    .await?;
                let (on, peak) = measured(&ctx, &sql, args.e2e_runs).await?;
                let m = again(&on, &format!("with chunks of 2^{c}"))?;
                let figures = Figures {
                    chunk_rows: Some(1 << c),
                    on_s: on.time.as_secs_f64(),
                    metrics: &m,
                    host_peaks: (peak, peak_off),
                    ..figures
                };
                report.e2e.push(figures.json(device, args, cores));
            }
        }
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(())
}
