//! Devices: the kernel-level join on several devices. R ⋈ S (the standard wide workload, 2,2
//! 4-byte payloads, |S| = 2|R|, data on the devices) runs by PHJ-OM on one device; then, with
//! R and S each split evenly over every device (as rows arriving on several devices would be),
//! they are dealt out by key and PHJ-OM joins each device's shares, one host thread per device,
//! in three orders:
//! - dealt out by route (`join::exchange_sets`), the exchange waited for, then the joins (so the
//!   join's time is that of inputs already dealt out);
//! - by route, pipelined (each device transforms its share of R while S's copies are in
//!   flight);
//! - by partition (`join::exchange_partitioned`): each device partitions its rows of S, then of
//!   R, for the join, with as many partition bits as one device would use, while the copy
//!   queues send S's partitions to their devices; each device then matches its partitions:
//!   waited for, then joined (the join's time is matching and materializing alone), and
//!   pipelined (every set's keys copied first, matched while the columns are in flight).
//!
//! For reference, partitioning alone is timed too: every device partitions its rows of S and R
//! as the exchange by partition does, all devices at once, with nothing copied.
//!
//! Times are wall clock, until the last device is done; the median of `runs` runs after a
//! warm-up whose output (every device's, together) is checked. On the host backend the
//! "devices" are two host backends. The first two GPUs' peer copy bandwidth is measured in the
//! same run.

use std::sync::Arc;
use std::time::{Duration, Instant};

use arrow::array::RecordBatch;
use datafusion::common::Result;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use datafusion_gpu_join::backend::{Backend, CudaBackend, HostBackend};
use datafusion_gpu_join::columns::DeviceRelation;
use datafusion_gpu_join::columns::KeyEncoder;
use datafusion_gpu_join::device::{cuda_device, device_count};
use datafusion_gpu_join::join::{
    BuildSide, DeviceShares, ExchangeSet, OutputLayout, Phases, TransformedRelation,
    exchange_partitioned, exchange_sets, join_on_device, join_transformed, materialize,
    partition_bits, transform,
};
use serde_json::json;

use crate::Device;
use crate::args::Args;
use crate::kernel::{check_pk_fk, encoder, fail, pk_fk_layout};
use crate::report::{Report, median, progress};
use crate::workload::{Tables, Workload, generate};

/// Payload columns per side (the standard wide workload).
const PAYLOADS: usize = 2;

/// Runs the join on one device and over every device, adding a record of each to `report`.
pub fn run(device: &Device, args: &Args, report: &mut Report) -> Result<()> {
    let w = Workload::standard(args.devices_log2_r, PAYLOADS);
    let bar = progress(2, "devices");
    bar.set_message("generating");
    let t = generate(&w);
    match device {
        Device::Cuda(_) => {
            let backends = (0..device_count()?)
                .map(|o| CudaBackend::new(cuda_device(o)?, Arc::default()))
                .collect::<Result<Vec<_>>>()?;
            let peer = match backends.len() {
                1 => None,
                _ => Some(peer_bandwidth(&backends[..2], 1 << 30)?),
            };
            bar.set_message("one device");
            report
                .devices
                .extend(records(&w, &t, &backends[..1], args.runs, None)?);
            bar.inc(1);
            if backends.len() > 1 {
                bar.set_message("every device");
                report
                    .devices
                    .extend(records(&w, &t, &backends, args.runs, peer)?);
            }
        }
        Device::Host => {
            let backends = vec![HostBackend::default(); 2];
            bar.set_message("one backend");
            report
                .devices
                .extend(records(&w, &t, &backends[..1], args.runs, None)?);
            bar.inc(1);
            bar.set_message("two backends");
            report
                .devices
                .extend(records(&w, &t, &backends, args.runs, None)?);
        }
    }
    bar.finish_and_clear();
    Ok(())
}

/// Rows `[i * n / k, (i + 1) * n / k)` of `batches` (n rows in all): the `i`th of `k` shares.
fn share(batches: &[RecordBatch], i: usize, k: usize) -> Vec<RecordBatch> {
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    let (lo, hi) = (i * rows / k, (i + 1) * rows / k);
    let mut at = 0;
    let mut out = vec![];
    for b in batches {
        let (start, end) = (lo.max(at), hi.min(at + b.num_rows()));
        if start < end {
            out.push(b.slice(start - at, end - start));
        }
        at += b.num_rows();
    }
    out
}

/// How the runs over several devices order the exchange and the joins.
#[derive(Debug, Clone, Copy, PartialEq)]
enum Order {
    /// The exchange, waited for on every device, then the joins: the join's time is that of
    /// inputs already dealt out by key.
    Staged,
    /// R and S exchanged in one pipeline; each device transforms its share of R while S's
    /// copies are in flight.
    Pipelined,
    /// S, then R, dealt out by partition; each device partitions its rows of R while S's
    /// partitions are copied, then matches its partitions' keys while R's columns arrive.
    ByPartition,
    /// The same exchange, waited for on every device, then the joins: the join's time is that
    /// of matching partitions already dealt out, and materializing.
    ByPartitionStaged,
}

/// The join over `backends` (one: no exchange), measured; its records (over several devices,
/// one per [`Order`]).
fn records<B: Backend + Clone>(
    w: &Workload,
    t: &Tables,
    backends: &[B],
    runs: usize,
    peer: Option<(f64, f64)>,
) -> Result<Vec<serde_json::Value>> {
    let n = backends.len();
    let all: Vec<usize> = (0..=PAYLOADS).collect();
    let upload = |batches: &[RecordBatch]| {
        backends
            .iter()
            .enumerate()
            .map(|(i, b)| DeviceRelation::upload(b, &share(batches, i, n), &all))
            .collect::<Result<Vec<_>>>()
    };
    let (r, s) = (upload(&t.r)?, upload(&t.s)?);
    for b in backends {
        b.synchronize()?;
    }
    let layout = pk_fk_layout(t, PAYLOADS);
    let enc = encoder(&t.r)?;
    // Dealt out by partition: as many bits as one device partitions the whole join into.
    let bits = partition_bits(w.r_rows);
    // One run: the time until the exchange is waited for (nothing where pipelined) and the
    // rest, the time until the exchange returned (its partitioning done, its last copies
    // enqueued; by partition), and R's rows on each device.
    let once = |check: bool, order: Order| -> Result<([Duration; 3], Vec<usize>)> {
        let start = Instant::now();
        let mut returned = Duration::ZERO;
        let sets = [
            ExchangeSet {
                parts: &r,
                keys: &[0],
                columns: &all,
            },
            ExchangeSet {
                parts: &s,
                keys: &[0],
                columns: &all,
            },
        ];
        let inputs: Vec<Input<'_, B>> = match (n, order) {
            (1, _) => vec![Input::Whole(&r[0], &s[0])],
            (_, Order::ByPartition | Order::ByPartitionStaged) => {
                // S first: its copies run while the devices partition R.
                // S's key column is not carried: the join matches on its encoded keys, and
                // outputs R's key column.
                let sets = [
                    ExchangeSet {
                        parts: &s,
                        keys: &[0],
                        columns: &all[1..],
                    },
                    ExchangeSet {
                        parts: &r,
                        keys: &[0],
                        columns: &all,
                    },
                ];
                let shares = exchange_partitioned(backends, &sets, &enc, bits)?;
                returned = start.elapsed();
                match order {
                    Order::ByPartitionStaged => {
                        let mut taken = vec![];
                        for mut d in shares {
                            let r = d.take_partitioned(1)?;
                            taken.push(Input::PartitionsTaken(r, d.take_partitioned(0)?));
                        }
                        for b in backends {
                            b.synchronize()?;
                        }
                        taken
                    }
                    _ => shares.into_iter().map(Input::Partitioned).collect(),
                }
            }
            (_, Order::Pipelined) => exchange_sets(backends, &sets, &enc)?
                .into_iter()
                .map(Input::Dealt)
                .collect(),
            (_, Order::Staged) => {
                let mut taken = vec![];
                for mut d in exchange_sets(backends, &sets, &enc)? {
                    taken.push(Input::Taken(d.take(0)?, d.take(1)?));
                }
                for b in backends {
                    b.synchronize()?;
                }
                taken
            }
        };
        let exchanged = start.elapsed();
        let outputs = std::thread::scope(|scope| {
            let joins: Vec<_> = backends
                .iter()
                .zip(inputs)
                .map(|(b, input)| {
                    let (layout, enc) = (&layout, &enc);
                    scope.spawn(move || join_input(b, input, layout, enc))
                })
                .collect();
            joins
                .into_iter()
                .map(|j| {
                    j.join()
                        .map_err(|_| fail("a device's join panicked".into()))?
                })
                .collect::<Result<Vec<_>>>()
        })?;
        let total = start.elapsed();
        if check {
            let mut batches = vec![];
            for (b, (out, _)) in backends.iter().zip(&outputs) {
                batches.extend(out.download(b, &layout.schema, 1 << 20)?);
            }
            check_pk_fk(&batches, t, PAYLOADS)?;
        }
        let shares = outputs.iter().map(|(_, rows)| *rows).collect();
        Ok(([exchanged, total - exchanged, returned], shares))
    };
    // What dealing out by partition costs beyond partitioning: every device partitions its rows
    // of S, then of R, as the exchange does, all devices at once, with nothing copied.
    let alone = || -> Result<Duration> {
        let start = Instant::now();
        let mut kept = vec![];
        for (b, (r, s)) in backends.iter().zip(r.iter().zip(&s)) {
            kept.push(transform(b, s, &[0], &all[1..], &enc, bits)?);
            kept.push(transform(b, r, &[0], &all, &enc, bits)?);
        }
        for b in backends {
            b.synchronize()?;
        }
        Ok(start.elapsed())
    };
    let alone_ms = match n {
        1 => None,
        _ => {
            alone()?;
            let samples = (0..runs).map(|_| alone()).collect::<Result<Vec<_>>>()?;
            Some(median(samples).as_secs_f64() * 1e3)
        }
    };
    let orders = match n {
        1 => vec![Order::Staged],
        _ => vec![
            Order::Staged,
            Order::Pipelined,
            Order::ByPartitionStaged,
            Order::ByPartition,
        ],
    };
    let mut out = vec![];
    for order in orders {
        let shares = once(true, order)?.1;
        let samples = (0..runs)
            .map(|_| Ok(once(false, order)?.0))
            .collect::<Result<Vec<_>>>()?;
        let med = |i: usize| median(samples.iter().map(|p| p[i]).collect());
        let total = median(samples.iter().map(|p| p[0] + p[1]).collect());
        let ms = |d: Duration| d.as_secs_f64() * 1e3;
        let tuples = w.r_rows + w.s_rows;
        let (exchange_ms, join_ms) = match (n, order) {
            (1, _) => (None, Some(ms(total))),
            (_, Order::Staged | Order::ByPartitionStaged) => (Some(ms(med(0))), Some(ms(med(1)))),
            (_, Order::Pipelined | Order::ByPartition) => (None, None),
        };
        out.push(json!({
            "case": format!("2^{} ⋈ 2^{}, {PAYLOADS},{PAYLOADS} 4-byte payloads", w.r_rows.ilog2(), w.s_rows.ilog2()),
            "backend": backends[0].name(), "devices": n, "runs": runs,
            "order": match (n, order) { (1, _) => "one device", (_, Order::Staged) => "exchange, then join", (_, Order::Pipelined) => "pipelined", (_, Order::ByPartition) => "by partition", (_, Order::ByPartitionStaged) => "by partition, then join" },
            "r_rows": w.r_rows, "s_rows": w.s_rows, "payloads": PAYLOADS,
            "exchange_ms": exchange_ms, "join_ms": join_ms, "total_ms": ms(total),
            "partitioned_ms": (order == Order::ByPartitionStaged).then(|| ms(med(2))),
            "partitioning_alone_ms": alone_ms.filter(|_| order == Order::ByPartitionStaged),
            "gtuples_per_s": tuples as f64 / total.as_secs_f64() / 1e9,
            "share_r_rows": shares,
            "peer_gbps": peer.map(|p| p.0), "peer_both_ways_gbps": peer.map(|p| p.1),
        }));
    }
    Ok(out)
}

/// What one device joins.
enum Input<'a, B: Backend> {
    /// The whole relations (over one device: nothing exchanged).
    Whole(&'a DeviceRelation<B::Buf>, &'a DeviceRelation<B::Buf>),
    /// Its shares of R and S, taken once the exchange was waited for.
    Taken(DeviceRelation<B::Buf>, DeviceRelation<B::Buf>),
    /// Its shares, taken as the join needs them: S's after R's is transformed.
    Dealt(DeviceShares<B>),
    /// Its shares of S (set 0) and R (set 1), dealt out by partition.
    Partitioned(DeviceShares<B>),
    /// Its shares of R and S dealt out by partition, taken once the exchange was waited for.
    PartitionsTaken(TransformedRelation<B>, TransformedRelation<B>),
}

/// R ⋈ S by PHJ-OM on `b` over `input`, waited for; the output and R's rows.
fn join_input<B: Backend + Clone>(
    b: &B,
    input: Input<'_, B>,
    layout: &OutputLayout,
    enc: &KeyEncoder,
) -> Result<(DeviceRelation<B::Buf>, usize)> {
    let phases = Phases::new(&ExecutionPlanMetricsSet::new());
    let build =
        |r: &DeviceRelation<B::Buf>| BuildSide::from_device(b, r, layout, enc.clone(), &phases);
    let probe = |build: &BuildSide<B>, s: &DeviceRelation<B::Buf>| -> Result<_> {
        let out = join_on_device(b, build, s, layout, &phases)?;
        b.synchronize()?;
        Ok(out)
    };
    let match_partitions = |r: TransformedRelation<B>, s| -> Result<_> {
        let rows = r.rows();
        let built = BuildSide::from_transformed(r, layout, enc.clone())?;
        let out = join_transformed(b, &built, s, layout, &phases)?;
        b.synchronize()?;
        Ok((out, rows))
    };
    match input {
        Input::Whole(r, s) => Ok((probe(&build(r)?, s)?, r.rows)),
        Input::Taken(r, s) => Ok((probe(&build(&r)?, &s)?, r.rows)),
        Input::Dealt(mut shares) => {
            let r = shares.take(0)?;
            let built = build(&r)?;
            let s = shares.take(1)?;
            Ok((probe(&built, &s)?, r.rows))
        }
        Input::Partitioned(mut shares) => {
            // The keys are matched while R's columns are still in flight.
            let (r, s) = (shares.take_keys(1)?, shares.take_keys(0)?);
            let matches = b.hash_join(r.keys(), s.keys(), enc.width())?;
            let built = BuildSide::from_transformed(r.ready()?, layout, enc.clone())?;
            let s = s.ready()?;
            let out = materialize(b, &built, &s, &matches, layout, &phases)?;
            b.synchronize()?;
            Ok((out, built.rows()))
        }
        Input::PartitionsTaken(r, s) => match_partitions(r, s),
    }
}

/// GB/s of a `bytes` copy from the first to the second backend's device, alone and (per
/// direction) with the reverse copy at the same time; the median of 5 each.
fn peer_bandwidth(backends: &[CudaBackend], bytes: usize) -> Result<(f64, f64)> {
    let (a, b) = (&backends[0], &backends[1]);
    let (src_a, mut dst_b) = (a.alloc(bytes)?, b.alloc(bytes)?);
    let (src_b, mut dst_a) = (b.alloc(bytes)?, a.alloc(bytes)?);
    // Both sides' allocations exist before either queue copies into the other's.
    let ready = [a.record()?, b.record()?];
    a.wait(&ready[1])?;
    b.wait(&ready[0])?;
    let mut one = vec![];
    let mut both = vec![];
    for run in 0..6 {
        let start = Instant::now();
        a.copy_to_peer(&src_a, 0, b, &mut dst_b, 0, bytes)?;
        a.synchronize()?;
        let alone = start.elapsed();
        let start = Instant::now();
        a.copy_to_peer(&src_a, 0, b, &mut dst_b, 0, bytes)?;
        b.copy_to_peer(&src_b, 0, a, &mut dst_a, 0, bytes)?;
        a.synchronize()?;
        b.synchronize()?;
        // The first run warms the link up.
        if run > 0 {
            one.push(alone);
            both.push(start.elapsed());
        }
    }
    let gbps = |d: Duration| bytes as f64 / d.as_secs_f64() / 1e9;
    Ok((gbps(median(one)), gbps(median(both))))
}
