//! `join::exchange`: relations dealt out by key, by route (`exchange`, `exchange_sets`) and by
//! partition (`exchange_partitioned`), over two queues of one GPU and over two GPUs (peer
//! copies; skipped, with the reason, on a machine with one), give the host twin's shares byte
//! for byte (keys and partition bounds too where dealt out by partition); and PHJ-OM run on
//! each device's shares of two exchanged relations gives the join of the whole relations (rows,
//! and the sum of both payloads, counted in the test), on CUDA and on two host backends, and
//! the host twin's output rows in its order. The CUDA tests are skipped without a device,
//! failed with `--require-cuda`.

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::Schema;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use datafusion_gpu_join::backend::{Backend, CudaBackend, HostBackend};
use datafusion_gpu_join::columns::{DeviceRelation, Fitted, KeyEncoder};
use datafusion_gpu_join::device::{cuda_device, device_count};
use datafusion_gpu_join::join::{
    BuildSide, DeviceShares, ExchangeSet, OutputColumn, OutputLayout, Phases, exchange_partitioned,
    exchange_sets, join_on_device, materialize, partition_bits,
};

use crate::harness::{Outcome, Suite, TestResult};
use crate::keyed::{expected_join, relation, totals};
use crate::rng::Rng;

/// Rows of each source relation: (R's sources, S's sources), empty and uneven ones included.
const SHAPES: &[(&[usize], &[usize])] = &[
    (&[0, 0], &[0, 5]),
    (&[1, 0], &[3, 1]),
    (&[1000, 4097], &[65_537, 0]),
    (&[1 << 20, 12_345], &[1 << 20, 1 << 19]),
];

pub fn register(suite: &mut Suite) {
    suite.add("exchange::host_shares_join", || -> TestResult {
        check(&[HostBackend::default(), HostBackend::default()])?;
        Ok(Outcome::Passed)
    });
    let require = suite.options.require_cuda;
    suite.add("exchange::two_queues_match_host", move || -> TestResult {
        let device = match cuda_device(0) {
            Ok(d) => d,
            Err(e) if require => return Err(format!("--require-cuda, but: {e}")),
            Err(_) => return Ok(Outcome::Skipped("no CUDA device".into())),
        };
        let queues = (0..2)
            .map(|_| CudaBackend::new(Arc::clone(&device), Default::default()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        check(&queues)?;
        Ok(Outcome::Passed)
    });
    suite.add("exchange::two_devices_match_host", move || -> TestResult {
        let count = match device_count() {
            Ok(n) => n,
            Err(e) if require => return Err(format!("--require-cuda, but: {e}")),
            Err(_) => return Ok(Outcome::Skipped("no CUDA device".into())),
        };
        if count < 2 {
            return Ok(Outcome::Skipped(format!(
                "needs two CUDA devices, this machine has {count}"
            )));
        }
        let devices = (0..2)
            .map(|o| CudaBackend::new(cuda_device(o)?, Default::default()))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| e.to_string())?;
        check(&devices)?;
        Ok(Outcome::Passed)
    });
}

fn err(e: datafusion::common::DataFusionError) -> String {
    e.to_string()
}

/// How the tests deal relations out.
#[derive(Debug, Clone, Copy)]
enum Deal {
    Routes,
    /// By partition, into `2^bits` partitions.
    Partitions(u32),
}

/// Starts exchanging `sets` over `backends` as `deal` says.
fn deal_out<B: Backend + Clone>(
    backends: &[B],
    sets: &[ExchangeSet<'_, B::Buf>],
    encoder: &KeyEncoder,
    deal: Deal,
) -> Result<Vec<DeviceShares<B>>, String> {
    match deal {
        Deal::Routes => exchange_sets(backends, sets, encoder),
        Deal::Partitions(bits) => exchange_partitioned(backends, sets, encoder, bits),
    }
    .map_err(err)
}

/// A share, downloaded: its rows, and (dealt out by partition) its keys' and bounds' bytes.
type Downloaded = (Vec<RecordBatch>, Vec<u8>, Vec<u8>);

/// Takes share 0 of `shares` and downloads it (its keys of `key_bytes` each).
fn share_of<B: Backend + Clone>(
    b: &B,
    shares: &mut DeviceShares<B>,
    deal: Deal,
    schema: &Arc<Schema>,
    key_bytes: usize,
) -> Result<Downloaded, String> {
    // The first `len` bytes: a buffer of none may hold a byte that was never written.
    let bytes = |buf: &B::Buf, len: usize| -> Result<Vec<u8>, String> {
        let mut out = vec![0u8; len];
        b.download(buf, &mut out).map_err(err)?;
        Ok(out)
    };
    match deal {
        Deal::Routes => {
            let r = shares.take(0).map_err(err)?;
            Ok((r.download(b, schema, 1 << 30).map_err(err)?, vec![], vec![]))
        }
        Deal::Partitions(_) => {
            let t = shares.take_partitioned(0).map_err(err)?;
            let k = &t.keys;
            let keys = bytes(&k.keys, k.rows * key_bytes)?;
            let bounds = bytes(&k.bounds, k.segments * ((1 << k.bits) + 1) * 4)?;
            let r = DeviceRelation {
                columns: t.columns,
                rows: t.keys.rows,
            };
            Ok((r.download(b, schema, 1 << 30).map_err(err)?, keys, bounds))
        }
    }
}

/// Exchanges `sources` (one batch per backend) over `backends` and over as many host backends,
/// and checks that every share is the host's.
fn exchanged<B: Backend + Clone>(
    backends: &[B],
    sources: &[RecordBatch],
    encoder: &KeyEncoder,
    deal: Deal,
) -> Result<(), String> {
    let hosts = vec![HostBackend::default(); backends.len()];
    let on_dev = upload_all(backends, sources)?;
    let on_host = upload_all(&hosts, sources)?;
    let dev_set = ExchangeSet {
        parts: &on_dev,
        keys: &[0],
        columns: &[0, 1, 2],
    };
    let host_set = ExchangeSet {
        parts: &on_host,
        keys: &[0],
        columns: &[0, 1, 2],
    };
    let dev_shares = deal_out(backends, &[dev_set], encoder, deal)?;
    let host_shares = deal_out(&hosts, &[host_set], encoder, deal)?;
    let schema = sources[0].schema();
    for (d, ((b, mut ds), (h, mut hs))) in backends
        .iter()
        .zip(dev_shares)
        .zip(hosts.iter().zip(host_shares))
        .enumerate()
    {
        let key_bytes = encoder.width().bytes();
        let got = share_of(b, &mut ds, deal, &schema, key_bytes)?;
        let want = share_of(h, &mut hs, deal, &schema, key_bytes)?;
        for (what, same) in [
            ("rows", got.0 == want.0),
            ("keys", got.1 == want.1),
            ("bounds", got.2 == want.2),
        ] {
            if !same {
                let head = |b: &[u8]| b[..b.len().min(64)].to_vec();
                return Err(format!(
                    "{deal:?}: share {d}: its {what} differ from the host's: keys {:?} against \
                     {:?}, bounds {:?} against {:?}",
                    head(&got.1),
                    head(&want.1),
                    head(&got.2),
                    head(&want.2)
                ));
            }
        }
    }
    Ok(())
}

/// `parts[i]` uploaded to `backends[i]`, every column.
fn upload_all<B: Backend>(
    backends: &[B],
    parts: &[RecordBatch],
) -> Result<Vec<DeviceRelation<B::Buf>>, String> {
    backends
        .iter()
        .zip(parts)
        .map(|(b, p)| DeviceRelation::upload(b, std::slice::from_ref(p), &[0, 1, 2]))
        .collect::<Result<Vec<_>, _>>()
        .map_err(err)
}

/// Every shape: R and S exchanged as the host exchanges them, then joined share by share.
fn check<B: Backend + Clone>(backends: &[B]) -> Result<(), String> {
    for (i, (r_rows, s_rows)) in SHAPES.iter().enumerate() {
        let mut rng = Rng::new(i as u64 + 1);
        let keys = (r_rows.iter().sum::<usize>() as u64 / 2).max(1);
        let r: Vec<RecordBatch> = r_rows
            .iter()
            .enumerate()
            .map(|(s, &n)| relation(&mut rng, n, keys, s == 0, 1, 0))
            .collect();
        let s: Vec<RecordBatch> = s_rows
            .iter()
            .map(|&n| relation(&mut rng, n, keys, true, 1, 0))
            .collect();
        let key_arrays = vec![r.iter().map(|b| b.column(0)).collect()];
        let encoder = match KeyEncoder::fit(&key_arrays, false).map_err(err)? {
            Fitted::Encoder(e) => e,
            // No non-null build key (the empty shapes): nothing to join.
            _ => continue,
        };
        let what = format!("shape {i} (R {r_rows:?}, S {s_rows:?})");
        let bits = partition_bits(r_rows.iter().sum());
        let hosts = vec![HostBackend::default(); backends.len()];
        for deal in [Deal::Routes, Deal::Partitions(bits)] {
            exchanged(backends, &r, &encoder, deal).map_err(|e| format!("{what}: R: {e}"))?;
            exchanged(backends, &s, &encoder, deal).map_err(|e| format!("{what}: S: {e}"))?;
            let got = joined(backends, &r, &s, &encoder, deal)
                .map_err(|e| format!("{what}: {deal:?}: {e}"))?;
            let (rows, sum) = totals(&got);
            let expected = expected_join(&r, &s);
            if (rows, sum) != expected {
                return Err(format!(
                    "{what}: {deal:?}: joined share by share: {rows} rows, payload sum {sum}; \
                     expected {expected:?}"
                ));
            }
            // Dealt out by partition, the output is the host twin's, row for row.
            if let Deal::Partitions(_) = deal {
                let want = joined(&hosts, &r, &s, &encoder, deal)?;
                if got != want {
                    return Err(format!(
                        "{what}: {deal:?}: the output differs from the host's"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// R ⋈ S on k (nulls never match), output R.a and S.b: R and S (one batch per backend) are
/// exchanged together as `deal` says, and PHJ-OM runs on each device's shares: dealt out by
/// route, its build side transformed before it takes its share of S; by partition, their keys
/// matched before their columns are taken. Every device's output, device by device.
fn joined<B: Backend + Clone>(
    backends: &[B],
    r: &[RecordBatch],
    s: &[RecordBatch],
    encoder: &KeyEncoder,
    deal: Deal,
) -> Result<Vec<RecordBatch>, String> {
    let layout = OutputLayout {
        schema: Arc::new(Schema::new(vec![
            r[0].schema().field(1).clone(),
            r[0].schema().field(2).clone().with_name("s_b"),
        ])),
        columns: vec![OutputColumn::Build(1), OutputColumn::Probe(2)],
        build_keys: vec![0],
        probe_keys: vec![0],
        check: None,
        filter: None,
    };
    let (r_parts, s_parts) = (upload_all(backends, r)?, upload_all(backends, s)?);
    let sets = [
        ExchangeSet {
            parts: &r_parts,
            keys: &[0],
            columns: &[0, 1, 2],
        },
        ExchangeSet {
            parts: &s_parts,
            keys: &[0],
            columns: &[0, 1, 2],
        },
    ];
    let shares = deal_out(backends, &sets, encoder, deal)?;
    let mut output = vec![];
    for (b, mut d) in backends.iter().zip(shares) {
        let phases = Phases::new(&ExecutionPlanMetricsSet::new());
        let out = match deal {
            Deal::Routes => {
                let r = d.take(0).map_err(err)?;
                let build = BuildSide::from_device(b, &r, &layout, encoder.clone(), &phases)
                    .map_err(err)?;
                let s = d.take(1).map_err(err)?;
                join_on_device(b, &build, &s, &layout, &phases).map_err(err)?
            }
            Deal::Partitions(_) => {
                // The keys matched while the columns may still be in flight.
                let (r, s) = (d.take_keys(0).map_err(err)?, d.take_keys(1).map_err(err)?);
                let matches = b
                    .hash_join(r.keys(), s.keys(), encoder.width())
                    .map_err(err)?;
                let r = r.ready().map_err(err)?;
                let build =
                    BuildSide::from_transformed(r, &layout, encoder.clone()).map_err(err)?;
                let s = s.ready().map_err(err)?;
                materialize(b, &build, &s, &matches, &layout, &phases).map_err(err)?
            }
        };
        output.extend(out.download(b, &layout.schema, 1 << 20).map_err(err)?);
    }
    Ok(output)
}
