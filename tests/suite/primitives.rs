//! Each CUDA primitive gives the same bytes as its host twin, on random inputs of awkward
//! sizes (empty, one element, not multiples of the block or tile sizes), all-equal keys and
//! skewed keys; copies through pinned blocks, at offsets, give back what went in. GPU only:
//! skipped without a device, failed with `--require-cuda`.

use arrow::datatypes::DataType;
use datafusion_gpu_join::backend::{
    Backend, CLASS_MASK, CudaBackend, FilterInput, HostBackend, HostBuffer, KEY_CHECK_BYTES,
    KEY_CHECK_WORDS, Keep, KeyCheck, KeyColumnEncoding, KeyType, KeyWidth, MatchIndices,
    Partitioned, ProbeEmit, ViewData, probe_runs,
};
use datafusion_gpu_join::columns::Frame;
use datafusion_gpu_join::device::{DeviceBuffer, HostPool, cuda_device};

use crate::harness::{Outcome, Suite, TestResult};
use crate::rng::Rng;

const SIZES: &[usize] = &[0, 1, 31, 255, 256, 1000, 4097, 65_537, 1 << 20];

fn cuda(require: bool) -> Result<Option<CudaBackend>, String> {
    match cuda_device(0) {
        Ok(d) => CudaBackend::new(d, Default::default())
            .map(Some)
            .map_err(|e| e.to_string()),
        Err(e) if require => Err(format!("--require-cuda, but: {e}")),
        Err(_) => Ok(None),
    }
}

fn bytes_of<B: Backend>(b: &B, buf: &B::Buf, len: usize) -> Result<Vec<u8>, String> {
    let mut out = vec![0u8; len];
    b.download(buf, &mut out).map_err(|e| e.to_string())?;
    Ok(out)
}

fn same(what: &str, host: &[u8], dev: &[u8]) -> Result<(), String> {
    if host == dev {
        return Ok(());
    }
    let first = host.iter().zip(dev).position(|(a, b)| a != b);
    Err(format!(
        "{what}: host and CUDA differ (host {} bytes, cuda {} bytes, first difference at byte {first:?})",
        host.len(),
        dev.len()
    ))
}

/// Random keys of `width`: `kind` 0 uniform, 1 all equal, 2 skewed (few hot keys), 3 with sentinels.
fn keys(rng: &mut Rng, n: usize, width: KeyWidth, kind: u64) -> Vec<u8> {
    let mut out = Vec::with_capacity(n * width.bytes());
    for _ in 0..n {
        let v = match kind {
            0 => rng.next_u64(),
            1 => 42,
            2 => {
                if rng.chance(0.8) {
                    rng.below(4)
                } else {
                    rng.below(1 << 20)
                }
            }
            _ => {
                if rng.chance(0.1) {
                    u64::MAX
                } else {
                    rng.below(n as u64 + 1)
                }
            }
        };
        match width {
            KeyWidth::U32 => out.extend_from_slice(&(v as u32).to_le_bytes()),
            KeyWidth::U64 => out.extend_from_slice(&v.to_le_bytes()),
        }
    }
    out
}

/// `bytes` (keys of `width`) with every key but the sentinel taken modulo `modulus`, so that
/// probes find matches; all-equal keys (`kind` 1) stay as they are.
fn squash(bytes: Vec<u8>, width: KeyWidth, kind: u64, modulus: u64) -> Vec<u8> {
    bytes
        .chunks(width.bytes())
        .flat_map(|c| {
            let mut v = [0u8; 8];
            v[..c.len()].copy_from_slice(c);
            let x = u64::from_le_bytes(v);
            let x = if x == width.sentinel() || kind == 1 {
                x
            } else {
                x % modulus
            };
            x.to_le_bytes()[..width.bytes()].to_vec()
        })
        .collect()
}

fn each_case(
    suite: &mut Suite,
    name: &str,
    body: fn(&CudaBackend, &mut Rng, usize, u64) -> Result<(), String>,
) {
    let require = suite.options.require_cuda;
    suite.add(format!("primitives::{name}"), move || -> TestResult {
        let Some(dev) = cuda(require)? else {
            return Ok(Outcome::Skipped("no CUDA device".into()));
        };
        for (i, &n) in SIZES.iter().enumerate() {
            for kind in 0..4 {
                let seed = (i as u64) * 17 + kind + 1;
                body(&dev, &mut Rng::new(seed), n, kind)
                    .map_err(|e| format!("n={n} kind={kind} seed={seed}: {e}"))?;
            }
        }
        Ok(Outcome::Passed)
    });
}

/// Widths of the columns `check_partition` carries: the row numbers (u32), then every width,
/// more columns than one scatter launch moves (`kMaxPlanes` = 8).
const CARRY_WIDTHS: &[usize] = &[4, 1, 2, 4, 8, 16, 4, 8, 1, 2];

fn check_partition(dev: &CudaBackend, rng: &mut Rng, n: usize, kind: u64) -> Result<(), String> {
    let host = HostBackend::default();
    let e = |e: datafusion::common::DataFusionError| e.to_string();
    let columns: Vec<Vec<u8>> = CARRY_WIDTHS
        .iter()
        .enumerate()
        .map(|(i, &w)| match i {
            0 => (0..n as u32).flat_map(u32::to_le_bytes).collect(),
            _ => (0..n * w).map(|_| rng.next_u64() as u8).collect(),
        })
        .collect();
    let (on_host, on_dev) = (upload_all(&host, &columns)?, upload_all(dev, &columns)?);
    for width in [KeyWidth::U32, KeyWidth::U64] {
        let k = keys(rng, n, width, kind);
        for bits in [1, 5, 8, 9, 13, 16, 17, 22] {
            // Every column at 8, 16 and 17 bits; the first nine at 9 (a launch of 8 and one of
            // a 1-byte column); none at 13; the row numbers alone at 1 and 5, the first 8-byte
            // column alone at 22 (with none or one, the narrow scatter of 4-byte keys).
            let carried: Vec<usize> = match bits {
                8 | 16 | 17 => (0..CARRY_WIDTHS.len()).collect(),
                9 => (0..9).collect(),
                13 => vec![],
                22 => vec![4],
                _ => vec![0],
            };
            let (h_carry, d_carry) = (carry(&on_host, &carried), carry(&on_dev, &carried));
            let widths: Vec<usize> = carried.iter().map(|&c| CARRY_WIDTHS[c]).collect();
            let h = host
                .partition(&host.upload(&k).map_err(e)?, n, width, bits, &h_carry)
                .map_err(e)?;
            let d = dev
                .partition(&dev.upload(&k).map_err(e)?, n, width, bits, &d_carry)
                .map_err(e)?;
            compare_partitioned(&host, &h, dev, &d, width)
                .and_then(|()| compare_carried(&host, &h.carried, dev, &d.carried, n, &widths))
                .map_err(|e| format!("{width:?} bits={bits}: {e}"))?;
        }
    }
    Ok(())
}

/// The columns `which` of `columns` (buffers of [`CARRY_WIDTHS`]) with their widths, as a
/// partitioning or sorting pass takes them to carry.
fn carry<'a, Buf>(columns: &'a [Buf], which: &[usize]) -> Vec<(&'a Buf, usize)> {
    which
        .iter()
        .map(|&c| (&columns[c], CARRY_WIDTHS[c]))
        .collect()
}

/// Copies each of `columns` into a buffer of `b`.
fn upload_all<B: Backend>(b: &B, columns: &[Vec<u8>]) -> Result<Vec<B::Buf>, String> {
    columns
        .iter()
        .map(|c| b.upload(c))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| e.to_string())
}

/// The carried columns (of `widths` bytes a value) of the host's and the device's split, or
/// sort, of `n` rows are the same bytes.
fn compare_carried(
    host: &HostBackend,
    h: &[HostBuffer],
    dev: &CudaBackend,
    d: &[DeviceBuffer],
    n: usize,
    widths: &[usize],
) -> Result<(), String> {
    if h.len() != widths.len() || d.len() != widths.len() {
        return Err(format!(
            "{} and {} carried columns, not {}",
            h.len(),
            d.len(),
            widths.len()
        ));
    }
    for (i, &w) in widths.iter().enumerate() {
        same(
            &format!("carried column {i} ({w} bytes)"),
            &bytes_of(host, &h[i], n * w)?,
            &bytes_of(dev, &d[i], n * w)?,
        )?;
    }
    Ok(())
}

/// Keys of `width` for a join of `n / 2` build rows with `n` probe rows: the build side's from a
/// smaller domain, so that probes find matches (and duplicates); skewed keys (`kind` 2) only on
/// the probe side, so that the output stays small.
fn join_keys(rng: &mut Rng, n: usize, width: KeyWidth, kind: u64) -> (Vec<u8>, Vec<u8>) {
    let domain = (n as u64 / 2).max(1);
    let build_kind = if kind == 2 { 0 } else { kind };
    let build = squash(keys(rng, n / 2, width, build_kind), width, kind, domain);
    let probe = squash(keys(rng, n, width, kind), width, kind, domain * 2);
    (build, probe)
}

/// The host's and the device's matches are the same pairs, in the same order.
fn compare_matches(
    what: &str,
    host: &HostBackend,
    hm: &MatchIndices<HostBuffer>,
    dev: &CudaBackend,
    dm: &MatchIndices<DeviceBuffer>,
) -> Result<(), String> {
    if hm.len != dm.len {
        return Err(format!(
            "{what}: host found {} matches, cuda {}",
            hm.len, dm.len
        ));
    }
    same(
        "build indices",
        &bytes_of(host, &hm.build, hm.len * 4)?,
        &bytes_of(dev, &dm.build, dm.len * 4)?,
    )
    .and_then(|()| {
        same(
            "probe indices",
            &bytes_of(host, &hm.probe, hm.len * 4)?,
            &bytes_of(dev, &dm.probe, dm.len * 4)?,
        )
    })
    .map_err(|e| format!("{what}: {e}"))
}

/// The route pass gives the host's bounds and carried columns, at 0 to 8 route bits: every
/// column (more than one scatter launch moves), one, or none.
fn check_route(dev: &CudaBackend, rng: &mut Rng, n: usize, kind: u64) -> Result<(), String> {
    let host = HostBackend::default();
    let e = |e: datafusion::common::DataFusionError| e.to_string();
    let columns: Vec<Vec<u8>> = CARRY_WIDTHS
        .iter()
        .map(|&w| (0..n * w).map(|_| rng.next_u64() as u8).collect())
        .collect();
    let (h_cols, d_cols) = (upload_all(&host, &columns)?, upload_all(dev, &columns)?);
    for width in [KeyWidth::U32, KeyWidth::U64] {
        let k = keys(rng, n, width, kind);
        for bits in [0, 1, 3, 8] {
            // Every column at 0 and 8 bits; one at 1 bit and none at 3 (the narrow scatter of
            // 4-byte keys).
            let carried = match bits {
                1 => 1,
                3 => 0,
                _ => CARRY_WIDTHS.len(),
            };
            let first: Vec<usize> = (0..carried).collect();
            let (h_carry, d_carry) = (carry(&h_cols, &first), carry(&d_cols, &first));
            let what = format!("{width:?} bits={bits}, {carried} columns");
            let h = host
                .route(&host.upload(&k).map_err(e)?, n, width, bits, &h_carry)
                .map_err(e)?;
            let d = dev
                .route(&dev.upload(&k).map_err(e)?, n, width, bits, &d_carry)
                .map_err(e)?;
            let b = ((1usize << bits) + 1) * 4;
            same(
                "bounds",
                &bytes_of(&host, &h.bounds, b)?,
                &bytes_of(dev, &d.bounds, b)?,
            )
            .and_then(|()| {
                compare_carried(
                    &host,
                    &h.carried,
                    dev,
                    &d.carried,
                    n,
                    &CARRY_WIDTHS[..carried],
                )
            })
            .map_err(|e| format!("{what}: {e}"))?;
        }
    }
    Ok(())
}

fn compare_partitioned(
    host: &HostBackend,
    h: &Partitioned<HostBuffer>,
    dev: &CudaBackend,
    d: &Partitioned<datafusion_gpu_join::device::DeviceBuffer>,
    width: KeyWidth,
) -> Result<(), String> {
    let n = h.rows;
    same(
        "keys",
        &bytes_of(host, &h.keys, n * width.bytes())?,
        &bytes_of(dev, &d.keys, n * width.bytes())?,
    )?;
    let b = ((1usize << h.bits) + 1) * 4;
    same(
        "bounds",
        &bytes_of(host, &h.bounds, b)?,
        &bytes_of(dev, &d.bounds, b)?,
    )
}

fn check_hash_join(dev: &CudaBackend, rng: &mut Rng, n: usize, kind: u64) -> Result<(), String> {
    let host = HostBackend::default();
    for width in [KeyWidth::U32, KeyWidth::U64] {
        let (build, probe) = join_keys(rng, n, width, kind);
        // Skip cases whose output would be enormous (all-equal keys at large n).
        if kind == 1 && n > 4097 {
            continue;
        }
        let bits = datafusion_gpu_join::join::partition_bits(n / 2);
        let e = |e: datafusion::common::DataFusionError| e.to_string();
        let (hb, hp) = (
            host.partition(&host.upload(&build).map_err(e)?, n / 2, width, bits, &[])
                .map_err(e)?,
            host.partition(&host.upload(&probe).map_err(e)?, n, width, bits, &[])
                .map_err(e)?,
        );
        let (db, dp) = (
            dev.partition(&dev.upload(&build).map_err(e)?, n / 2, width, bits, &[])
                .map_err(e)?,
            dev.partition(&dev.upload(&probe).map_err(e)?, n, width, bits, &[])
                .map_err(e)?,
        );
        let hm = host.hash_join(&hb, &hp, width).map_err(e)?;
        let dm = dev.hash_join(&db, &dp, width).map_err(e)?;
        compare_matches(&format!("{width:?}"), &host, &hm, dev, &dm)?;
    }
    Ok(())
}

/// The sort-merge join's primitives: `sort` gives the host's keys and carried columns (every
/// width, more columns than one scatter launch moves), and `merge_join` the host's pairs, on
/// keys with duplicates, sentinels and skew, with sort keys of 1 to 32 bits (runs of many keys,
/// up to 64 rows, and at 32 bits, of one 4-byte key); so does `index_join` (INLJ's search),
/// from the probe keys unsorted.
fn check_sort_merge(dev: &CudaBackend, rng: &mut Rng, n: usize, kind: u64) -> Result<(), String> {
    let host = HostBackend::default();
    let e = |e: datafusion::common::DataFusionError| e.to_string();
    let columns: Vec<Vec<u8>> = CARRY_WIDTHS
        .iter()
        .map(|&w| (0..n * w).map(|_| rng.next_u64() as u8).collect())
        .collect();
    let (h_cols, d_cols) = (upload_all(&host, &columns)?, upload_all(dev, &columns)?);
    for width in [KeyWidth::U32, KeyWidth::U64] {
        // Skip cases whose output would be enormous (all-equal keys at large n).
        if kind == 1 && n > 4097 {
            continue;
        }
        let (build, probe) = join_keys(rng, n, width, kind);
        for bits in [1, 8, 13, 24, 32] {
            // A probe row compares its key with every build row of its run: runs of more than
            // 64 rows (few sort-key bits for many rows) would make the test quadratic.
            if (n / 2) >> bits > 64 {
                continue;
            }
            let what = format!("{width:?} bits={bits}");
            // Every column at 8 and 32 bits, none otherwise.
            let carried = if matches!(bits, 8 | 32) {
                CARRY_WIDTHS.len()
            } else {
                0
            };
            let first: Vec<usize> = (0..carried).collect();
            let (h_carry, d_carry) = (carry(&h_cols, &first), carry(&d_cols, &first));
            let hp = host
                .sort(&host.upload(&probe).map_err(e)?, n, width, bits, &h_carry)
                .map_err(e)?;
            let dp = dev
                .sort(&dev.upload(&probe).map_err(e)?, n, width, bits, &d_carry)
                .map_err(e)?;
            same(
                "sorted keys",
                &bytes_of(&host, &hp.keys, n * width.bytes())?,
                &bytes_of(dev, &dp.keys, n * width.bytes())?,
            )
            .and_then(|()| {
                compare_carried(
                    &host,
                    &hp.carried,
                    dev,
                    &dp.carried,
                    n,
                    &CARRY_WIDTHS[..carried],
                )
            })
            .map_err(|e| format!("{what}: {e}"))?;
            let m = n / 2;
            let hb = host
                .sort(&host.upload(&build).map_err(e)?, m, width, bits, &[])
                .map_err(e)?;
            let db = dev
                .sort(&dev.upload(&build).map_err(e)?, m, width, bits, &[])
                .map_err(e)?;
            let hm = host.merge_join(&hb, &hp, width).map_err(e)?;
            let dm = dev.merge_join(&db, &dp, width).map_err(e)?;
            compare_matches(&what, &host, &hm, dev, &dm)?;
            // INLJ's search: the probe keys as they are, against the sorted build side.
            let hi =
                (host.index_join(&hb, &host.upload(&probe).map_err(e)?, n, width)).map_err(e)?;
            let di = (dev.index_join(&db, &dev.upload(&probe).map_err(e)?, n, width)).map_err(e)?;
            compare_matches(&format!("{what}, index_join"), &host, &hi, dev, &di)?;
        }
    }
    Ok(())
}

fn check_columns(dev: &CudaBackend, rng: &mut Rng, n: usize, kind: u64) -> Result<(), String> {
    let host = HostBackend::default();
    let e = |e: datafusion::common::DataFusionError| e.to_string();
    // Random indices for gather, one in eight NO_ROW (a missing side: zeros).
    let idx_bytes: Vec<u8> = (0..n)
        .flat_map(|_| {
            let i = match rng.below(8) {
                0 => datafusion_gpu_join::backend::NO_ROW,
                _ => rng.below(n as u64) as u32,
            };
            i.to_le_bytes()
        })
        .collect();
    let (hi, di) = (
        host.upload(&idx_bytes).map_err(e)?,
        dev.upload(&idx_bytes).map_err(e)?,
    );
    // Every row's position.
    same(
        "row positions",
        &bytes_of(&host, &host.row_positions(n).map_err(e)?, n * 4)?,
        &bytes_of(dev, &dev.row_positions(n).map_err(e)?, n * 4)?,
    )?;
    let widths = [1usize, 2, 4, 8, 16];
    let mut planes = Vec::new();
    for width in widths {
        let src: Vec<u8> = (0..n * width).map(|_| rng.next_u64() as u8).collect();
        let (hs, ds) = (host.upload(&src).map_err(e)?, dev.upload(&src).map_err(e)?);
        let h = host.gather(&hs, &hi, n, width).map_err(e)?;
        let d = dev.gather(&ds, &di, n, width).map_err(e)?;
        same(
            &format!("gather w{width}"),
            &bytes_of(&host, &h, n * width)?,
            &bytes_of(dev, &d, n * width)?,
        )?;
        planes.push((hs, ds, width));
    }
    // Every width twice, more planes than one launch moves, by one list of positions.
    let twice: Vec<_> = planes.iter().chain(&planes).collect();
    let h = host
        .gather_planes(
            &twice.iter().map(|(h, _, w)| (h, *w)).collect::<Vec<_>>(),
            &hi,
            n,
        )
        .map_err(e)?;
    let d = dev
        .gather_planes(
            &twice.iter().map(|(_, d, w)| (d, *w)).collect::<Vec<_>>(),
            &di,
            n,
        )
        .map_err(e)?;
    for (p, ((h, d), (_, _, w))) in h.iter().zip(&d).zip(&twice).enumerate() {
        same(
            &format!("gather_planes plane {p} w{w}"),
            &bytes_of(&host, h, n * w)?,
            &bytes_of(dev, d, n * w)?,
        )?;
    }
    if (h.len(), d.len()) != (twice.len(), twice.len()) {
        return Err(format!(
            "gather_planes: {} host and {} device planes of {}",
            h.len(),
            d.len(),
            twice.len()
        ));
    }
    // Bits <-> bytes.
    let bits: Vec<u8> = (0..n.div_ceil(8)).map(|_| rng.next_u64() as u8).collect();
    let h = host
        .unpack_bits(&host.upload(&bits).map_err(e)?, n)
        .map_err(e)?;
    let d = dev
        .unpack_bits(&dev.upload(&bits).map_err(e)?, n)
        .map_err(e)?;
    let (hb, db) = (bytes_of(&host, &h, n)?, bytes_of(dev, &d, n)?);
    same("unpack_bits", &hb, &db)?;
    let h = host.pack_bits(&h, n).map_err(e)?;
    let d = dev.pack_bits(&d, n).map_err(e)?;
    // Only the bits of real rows count; the last byte's spare bits are zero on both.
    same(
        "pack_bits",
        &bytes_of(&host, &h, n.div_ceil(8))?,
        &bytes_of(dev, &d, n.div_ceil(8))?,
    )?;
    // Packed values widened: every pair of widths, bases that carry into a 16-byte value's
    // high word and bases that wrap.
    for (width, packed) in [(2, 1), (4, 1), (4, 2), (8, 1), (8, 2), (8, 4)]
        .into_iter()
        .chain([1, 2, 4, 8].map(|p| (16, p)))
    {
        let offsets: Vec<u8> = (0..n * packed).map(|_| rng.next_u64() as u8).collect();
        let base = match kind {
            0 => rng.next_u64() as i128,
            1 => -(rng.next_u64() as i128),
            2 => i128::from(u64::MAX - rng.below(1000)),
            _ => (i128::from(rng.next_u64() as i64) << 64) | i128::from(rng.next_u64()),
        };
        let frame = Frame {
            base,
            width: packed,
        };
        let h = host
            .unframe(&host.upload(&offsets).map_err(e)?, n, width, &frame)
            .map_err(e)?;
        let d = dev
            .unframe(&dev.upload(&offsets).map_err(e)?, n, width, &frame)
            .map_err(e)?;
        same(
            &format!("unframe w{width} p{packed}"),
            &bytes_of(&host, &h, n * width)?,
            &bytes_of(dev, &d, n * width)?,
        )?;
    }
    // Scan.
    let vals: Vec<u8> = (0..n)
        .flat_map(|_| (rng.below(1000) as u32).to_le_bytes())
        .collect();
    let h = host
        .exclusive_scan(&host.upload(&vals).map_err(e)?, n)
        .map_err(e)?;
    let d = dev
        .exclusive_scan(&dev.upload(&vals).map_err(e)?, n)
        .map_err(e)?;
    same(
        "exclusive_scan",
        &bytes_of(&host, &h, (n + 1) * 4)?,
        &bytes_of(dev, &d, (n + 1) * 4)?,
    )
}

fn check_encode(dev: &CudaBackend, rng: &mut Rng, n: usize, _kind: u64) -> Result<(), String> {
    let host = HostBackend::default();
    let e = |e: datafusion::common::DataFusionError| e.to_string();
    let types = [
        KeyType::I8,
        KeyType::I16,
        KeyType::I32,
        KeyType::I64,
        KeyType::U8,
        KeyType::U16,
        KeyType::U32,
        KeyType::U64,
        KeyType::F16,
        KeyType::F32,
        KeyType::F64,
        KeyType::I128,
    ];
    for ty in types {
        let mut vals: Vec<u8> = (0..n * ty.bytes()).map(|_| rng.next_u64() as u8).collect();
        if ty.float() {
            // Every third float is -0.0 (read as +0.0, in range), every third a small value.
            let w = ty.bytes();
            for (i, v) in vals.chunks_exact_mut(w).enumerate() {
                let bits: u64 = match i % 3 {
                    0 => 1 << (8 * w - 1),
                    1 => (i % 200) as u64,
                    _ => continue,
                };
                v.copy_from_slice(&bits.to_le_bytes()[..w]);
            }
        }
        if ty == KeyType::I128 {
            // Two rows in three fit 64 bits (small values, either sign); the rest do not.
            for (i, v) in vals.chunks_exact_mut(16).enumerate() {
                if i % 3 != 2 {
                    let small = (i % 120) as i128 - 60;
                    v.copy_from_slice(&small.to_le_bytes());
                }
            }
        }
        let valid: Vec<u8> = (0..n).map(|_| rng.chance(0.9) as u8).collect();
        let valid2: Vec<u8> = (0..n).map(|_| rng.chance(0.8) as u8).collect();
        let (min, max) = if ty.signed() {
            ((-50i64) as u64, 60u64)
        } else if ty.float() {
            (0u64, 150u64)
        } else {
            (3u64, 200u64)
        };
        let enc = KeyColumnEncoding {
            ty,
            min,
            max,
            stride: 1,
            null_digit: None,
        };
        let enc2 = KeyColumnEncoding {
            ty,
            min,
            max,
            stride: 111,
            // Nulls equal nulls in the second column: its nulls take the digit after max.
            null_digit: Some(max.wrapping_sub(min).wrapping_add(1)),
        };
        for width in [KeyWidth::U32, KeyWidth::U64] {
            let (hv, dv) = (
                host.upload(&vals).map_err(e)?,
                dev.upload(&vals).map_err(e)?,
            );
            let (hn, dn) = (
                host.upload(&valid).map_err(e)?,
                dev.upload(&valid).map_err(e)?,
            );
            let h = host
                .encode_keys(&hv, Some(&hn), n, &enc, width, None)
                .map_err(e)?;
            let d = dev
                .encode_keys(&dv, Some(&dn), n, &enc, width, None)
                .map_err(e)?;
            // A second column accumulates (composite key), its nulls equal to nulls.
            let (hn2, dn2) = (
                host.upload(&valid2).map_err(e)?,
                dev.upload(&valid2).map_err(e)?,
            );
            let h = host
                .encode_keys(&hv, Some(&hn2), n, &enc2, width, Some(h))
                .map_err(e)?;
            let d = dev
                .encode_keys(&dv, Some(&dn2), n, &enc2, width, Some(d))
                .map_err(e)?;
            same(
                &format!("encode {ty:?} {width:?}"),
                &bytes_of(&host, &h, n * width.bytes())?,
                &bytes_of(dev, &d, n * width.bytes())?,
            )?;
        }
    }
    Ok(())
}

/// Checked keys' hashes from their check bytes (one, two or four words) and length classes:
/// the same as the host twin's for random, all-equal and few distinct rows and for classes with
/// stray high bits, under the full 62-bit mask and a narrow one; every hash holds its class in
/// its low bits.
fn check_hash_checked(dev: &CudaBackend, rng: &mut Rng, n: usize, kind: u64) -> Result<(), String> {
    for words in [1, 2, KEY_CHECK_WORDS] {
        check_hash_checked_words(dev, rng, n, kind, words)?;
    }
    Ok(())
}

fn check_hash_checked_words(
    dev: &CudaBackend,
    rng: &mut Rng,
    n: usize,
    kind: u64,
    words: usize,
) -> Result<(), String> {
    let host = HostBackend::default();
    let e = |e: datafusion::common::DataFusionError| e.to_string();
    let mut check = vec![vec![0u8; n * KEY_CHECK_BYTES]; words];
    let mut classes = vec![0u8; n];
    for (i, class) in classes.iter_mut().enumerate() {
        let pick = match kind {
            0 => rng.next_u64(),
            1 => 7,
            _ => rng.below(5),
        };
        let mut r = Rng::new(pick);
        for word in check.iter_mut() {
            let row = &mut word[i * KEY_CHECK_BYTES..(i + 1) * KEY_CHECK_BYTES];
            row.iter_mut().for_each(|b| *b = r.next_u64() as u8);
        }
        *class = match kind {
            3 => rng.next_u64() as u8,
            _ => r.below(67) as u8,
        };
    }
    for mask in [(1u64 << 62) - 1, (1 << 9) - 1] {
        let hc = (check.iter())
            .map(|w| host.upload(w))
            .collect::<datafusion::common::Result<Vec<_>>>()
            .map_err(e)?;
        let dc = (check.iter())
            .map(|w| dev.upload(w))
            .collect::<datafusion::common::Result<Vec<_>>>()
            .map_err(e)?;
        let (hk, dk) = (
            host.upload(&classes).map_err(e)?,
            dev.upload(&classes).map_err(e)?,
        );
        let (hc, dc): (Vec<_>, Vec<_>) = (hc.iter().collect(), dc.iter().collect());
        let h = host.hash_checked(&hc, &hk, n, mask).map_err(e)?;
        let d = dev.hash_checked(&dc, &dk, n, mask).map_err(e)?;
        let (h, d) = (bytes_of(&host, &h, n * 8)?, bytes_of(dev, &d, n * 8)?);
        same(
            &format!("hash_checked of {words} words, mask {mask:#x}"),
            &h,
            &d,
        )?;
        for (hash, &class) in h.chunks_exact(8).zip(&classes) {
            let hash = u64::from_le_bytes(hash.try_into().expect("8 bytes"));
            if hash & CLASS_MASK != u64::from(class) & CLASS_MASK || hash & !mask & !CLASS_MASK != 0
            {
                return Err(format!(
                    "hash {hash:#x} of class {class} under mask {mask:#x}"
                ));
            }
        }
    }
    Ok(())
}

/// The bucket probe (count, scan, windowed write) gives the same offsets and pairs as its twin,
/// for a build side bucketed the streaming engine's way, with the output written whole and in
/// uneven windows.
fn check_bucket_probe(dev: &CudaBackend, rng: &mut Rng, n: usize, kind: u64) -> Result<(), String> {
    let host = HostBackend::default();
    let e = |e: datafusion::common::DataFusionError| e.to_string();
    // All-equal keys at size would make n^2 / 2 pairs.
    if kind == 1 && n > 4097 {
        return Ok(());
    }
    for width in [KeyWidth::U32, KeyWidth::U64] {
        let domain = (n as u64 / 2).max(1);
        let build_rows = n / 2;
        let build_kind = if kind == 2 { 0 } else { kind };
        let build = squash(
            keys(rng, build_rows, width, build_kind),
            width,
            kind,
            domain,
        );
        let probe = squash(keys(rng, n, width, kind), width, kind, domain * 2);
        let bits = datafusion_gpu_join::join::hash::bucket_bits(build_rows);
        // Check bytes from a set of two values, so that rows with equal keys often differ in
        // them (a hash collision); carried through the build side's bucketing.
        let check_rows = |rows: usize, rng: &mut Rng| -> Vec<u8> {
            (0..rows)
                .flat_map(|_| {
                    let mut c = [0u8; KEY_CHECK_BYTES];
                    c[(rng.below(KEY_CHECK_BYTES as u64)) as usize] = rng.below(2) as u8;
                    c[0] = 7;
                    c
                })
                .collect()
        };
        // Four words of check bytes, each made so: a build side's and a probe side's, both on
        // each backend.
        let words: Vec<(Vec<u8>, Vec<u8>)> = (0..4)
            .map(|_| (check_rows(build_rows, rng), check_rows(n, rng)))
            .collect();
        let upload = |bytes: &[u8]| -> Result<(HostBuffer, DeviceBuffer), String> {
            Ok((
                host.upload(bytes).map_err(e)?,
                dev.upload(bytes).map_err(e)?,
            ))
        };
        let build_words: [_; 4] = (words.iter())
            .map(|(b, _)| upload(b))
            .collect::<Result<Vec<_>, _>>()?
            .try_into()
            .map_err(|_| "four words".to_string())?;
        let probe_words = (words.iter())
            .map(|(_, p)| upload(p))
            .collect::<Result<Vec<_>, _>>()?;
        // A filter's columns: an Int32 of the build side (carried into bucket order) and a
        // Float64 of the probe side, each with a validity byte per row (a third null).
        let valid = |rows: usize, rng: &mut Rng| -> Vec<u8> {
            (0..rows).map(|_| u8::from(rng.below(3) != 0)).collect()
        };
        let build_v: Vec<u8> = (0..build_rows)
            .flat_map(|_| (rng.below(16) as i32 - 8).to_le_bytes())
            .collect();
        let probe_w: Vec<u8> = (0..n)
            .flat_map(|_| (rng.below(16) as f64 / 2.0 - 4.0).to_le_bytes())
            .collect();
        let (build_valid, probe_valid) = (valid(build_rows, rng), valid(n, rng));
        let (hbv, dbv) = (
            host.upload(&build_v).map_err(e)?,
            dev.upload(&build_v).map_err(e)?,
        );
        let (hbn, dbn) = (
            host.upload(&build_valid).map_err(e)?,
            dev.upload(&build_valid).map_err(e)?,
        );
        let hb = host
            .partition(
                &host.upload(&build).map_err(e)?,
                build_rows,
                width,
                bits,
                &carried(build_words.each_ref().map(|w| &w.0), &hbv, &hbn),
            )
            .map_err(e)?;
        let db = dev
            .partition(
                &dev.upload(&build).map_err(e)?,
                build_rows,
                width,
                bits,
                &carried(build_words.each_ref().map(|w| &w.1), &dbv, &dbn),
            )
            .map_err(e)?;
        compare_partitioned(&host, &hb, dev, &db, width)?;
        same(
            "bucketed check bytes",
            &bytes_of(&host, &hb.carried[0], build_rows * KEY_CHECK_BYTES)?,
            &bytes_of(dev, &db.carried[0], build_rows * KEY_CHECK_BYTES)?,
        )?;
        let (hp, dp) = (
            host.upload(&probe).map_err(e)?,
            dev.upload(&probe).map_err(e)?,
        );
        same(
            "bucketed second words of check bytes",
            &bytes_of(&host, &hb.carried[3], build_rows * KEY_CHECK_BYTES)?,
            &bytes_of(dev, &db.carried[3], build_rows * KEY_CHECK_BYTES)?,
        )?;
        // No check bytes, one word, two words, four words (the build side's words are its
        // carried columns 0, 3, 4 and 5).
        let carried = [0, 3, 4, 5];
        let checks: Vec<_> = std::iter::once(None)
            .chain([1, 2, 4].map(|w| {
                Some((
                    KeyCheck {
                        build: carried[..w].iter().map(|&c| &hb.carried[c]).collect(),
                        probe: probe_words[..w].iter().map(|p| &p.0).collect(),
                    },
                    KeyCheck {
                        build: carried[..w].iter().map(|&c| &db.carried[c]).collect(),
                        probe: probe_words[..w].iter().map(|p| &p.1).collect(),
                    },
                ))
            }))
            .collect();
        let (hpw, dpw) = (
            host.upload(&probe_w).map_err(e)?,
            dev.upload(&probe_w).map_err(e)?,
        );
        let (hpn, dpn) = (
            host.upload(&probe_valid).map_err(e)?,
            dev.upload(&probe_valid).map_err(e)?,
        );
        let filter = crate::kernels::compiled_over(
            "CAST(l_v AS DOUBLE) * 0.5 < r_w OR (l_v IS NULL AND r_w >= 0)",
            &[("v", DataType::Int32)],
            &[("w", DataType::Float64)],
        )
        .map_err(e)?;
        let (hf, df) = (
            FilterInput {
                filter: &filter,
                build: vec![(&hb.carried[1], Some(&hb.carried[2]))],
                probe: vec![(&hpw, Some(&hpn))],
            },
            FilterInput {
                filter: &filter,
                build: vec![(&db.carried[1], Some(&db.carried[2]))],
                probe: vec![(&dpw, Some(&dpn))],
            },
        );
        // Every emit with every number of check words, filtered and not, up to 4,097 rows; from
        // 65,537 rows (where the host twin took most of the test's two minutes on a GPU host),
        // each emit once: no check bytes and one word each filtered and not, two words not,
        // four words filtered.
        let every = n <= 4097;
        for (i, emit) in EMITS.into_iter().enumerate() {
            for (j, check) in checks.iter().enumerate() {
                for (f, filter) in [None, Some((&hf, &df))].into_iter().enumerate() {
                    if every || (j == i % checks.len() && f == (i + i / checks.len()) % 2) {
                        check_emit(dev, (&hb, &hp), (&db, &dp), n, width, emit, check, filter)?;
                    }
                }
            }
        }
    }
    Ok(())
}

/// LOOKUP's one pass (`bucket_lookup`), comparing and not comparing build keys: build keys
/// unique (a permutation; kind 3 with a sentinel among them) and not (the kind's keys squashed,
/// so keys repeat), probe keys of the kind over twice the build's domain (some found, some not,
/// sentinels with kind 3). Positions and both counts equal the host twin's.
fn check_bucket_lookup(
    dev: &CudaBackend,
    rng: &mut Rng,
    n: usize,
    kind: u64,
) -> Result<(), String> {
    let host = HostBackend::default();
    let e = |e: datafusion::common::DataFusionError| e.to_string();
    for width in [KeyWidth::U32, KeyWidth::U64] {
        let build_rows = n / 2;
        let domain = (build_rows as u64).max(1);
        for unique in [true, false] {
            let build = if unique {
                let mut k: Vec<u64> = (0..build_rows as u64).collect();
                for i in (1..k.len()).rev() {
                    k.swap(i, rng.below(i as u64 + 1) as usize);
                }
                if kind == 3 && !k.is_empty() {
                    k[0] = width.sentinel();
                }
                k.iter()
                    .flat_map(|v| v.to_le_bytes()[..width.bytes()].to_vec())
                    .collect()
            } else {
                squash(keys(rng, build_rows, width, kind), width, kind, domain)
            };
            let probe = squash(keys(rng, n, width, kind), width, kind, domain * 2);
            let bits = datafusion_gpu_join::join::hash::bucket_bits(build_rows);
            let hb = host
                .partition(
                    &host.upload(&build).map_err(e)?,
                    build_rows,
                    width,
                    bits,
                    &[],
                )
                .map_err(e)?;
            let db = dev
                .partition(
                    &dev.upload(&build).map_err(e)?,
                    build_rows,
                    width,
                    bits,
                    &[],
                )
                .map_err(e)?;
            compare_partitioned(&host, &hb, dev, &db, width)?;
            let (hp, dp) = (
                host.upload(&probe).map_err(e)?,
                dev.upload(&probe).map_err(e)?,
            );
            for exact in [false, true] {
                let h = host.bucket_lookup(&hb, &hp, n, width, exact).map_err(e)?;
                let d = dev.bucket_lookup(&db, &dp, n, width, exact).map_err(e)?;
                let what = format!("lookup ({width:?}, unique {unique}, exact {exact})");
                same(
                    &format!("{what}: positions"),
                    &bytes_of(&host, &h.positions, n * 4)?,
                    &bytes_of(dev, &d.positions, n * 4)?,
                )?;
                let (hc, dc) = (
                    bytes_of(&host, &h.counts, 16)?,
                    bytes_of(dev, &d.counts, 16)?,
                );
                same(&format!("{what}: counts"), &hc, &dc)?;
                let repeated = u64::from_le_bytes(hc[8..].try_into().expect("8 bytes"));
                // Without `exact` keys are compared, so unique keys never repeat (with it, a
                // hashed bucket's other keys count as the probed one).
                if unique && !exact && repeated != 0 {
                    return Err(format!(
                        "{what}: {repeated} repeated keys in a unique build side"
                    ));
                }
            }
        }
    }
    Ok(())
}

/// A [`Chain`] of two lookups over a fact table of `n` rows (foreign keys `f0`, `f1`, row
/// number `p`), finished as (`p`, `d0`'s payload, `d1`'s payload), on CUDA and the host: the
/// same batches. Dimension 0 is hashed, dimension 1 direct; kind 0: every key found (no
/// selection); 1: some keys missing; 2: null foreign keys, dimension keys and payloads too; 3: a key of
/// dimension 1 held twice, so its join is no lookup on either backend where a row probes it.
/// Generic over the backend compared with the host's, so that it can be tried host against host.
fn check_lookup_chain<D: Backend>(
    dev: &D,
    rng: &mut Rng,
    n: usize,
    kind: u64,
) -> Result<(), String> {
    use std::sync::Arc;

    use arrow::array::{Array, ArrayRef, AsArray, Int32Array, RecordBatch};
    use arrow::datatypes::{Field, Int32Type, Schema};
    use datafusion_gpu_join::columns::{DeviceRelation, Fitted, KeyEncoder};
    use datafusion_gpu_join::join::hash::BucketTable;
    use datafusion_gpu_join::join::{Chain, ChainColumn, OutputColumn, OutputLayout};

    let host = HostBackend::default();
    let e = |e: datafusion::common::DataFusionError| e.to_string();
    let dim_rows = (n / 4).max(2);
    let null = |rng: &mut Rng| kind == 2 && rng.chance(0.1);
    let batch = |cols: Vec<(&str, Vec<Option<i32>>)>| -> RecordBatch {
        let fields: Vec<Field> = (cols.iter())
            .map(|(name, _)| Field::new(*name, DataType::Int32, true))
            .collect();
        let arrays: Vec<ArrayRef> = (cols.into_iter())
            .map(|(_, v)| Arc::new(Int32Array::from(v)) as ArrayRef)
            .collect();
        RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).expect("one schema")
    };
    // Foreign keys over the dimension's keys, or (kinds 1 and 2) over half as many again.
    let span = if kind == 0 {
        dim_rows
    } else {
        dim_rows + dim_rows / 2 + 1
    } as u64;
    let fk = |rng: &mut Rng| -> Vec<Option<i32>> {
        (0..n)
            .map(|_| (!null(rng)).then(|| rng.below(span) as i32))
            .collect()
    };
    let (f0, f1) = (fk(rng), fk(rng));
    let fact = batch(vec![
        ("f0", f0.clone()),
        ("f1", f1.clone()),
        ("p", (0..n as i32).map(Some).collect()),
    ]);
    // Kind 3's key of dimension 1 that two rows hold.
    let mut twice = None;
    let dims: Vec<RecordBatch> = (0..2)
        .map(|d| {
            let mut keys: Vec<i32> = (0..dim_rows as i32).collect();
            for i in (1..keys.len()).rev() {
                keys.swap(i, rng.below(i as u64 + 1) as usize);
            }
            if kind == 3 && d == 1 {
                keys[1] = keys[0];
                twice = Some(keys[0]);
            }
            let payload = (0..dim_rows)
                .map(|_| (!null(rng)).then(|| rng.below(1000) as i32))
                .collect();
            let mut keys: Vec<Option<i32>> = keys.into_iter().map(Some).collect();
            // Kind 2: a null key in each dimension, which no row may find (in the direct
            // table, null keys share the bucket of the sentinel's hash with a key value).
            if kind == 2 {
                keys[0] = None;
            }
            batch(vec![("k", keys), ("v", payload)])
        })
        .collect();
    let layout = OutputLayout {
        schema: dims[0].schema(),
        columns: vec![OutputColumn::Build(1)],
        build_keys: vec![0],
        probe_keys: vec![0],
        check: None,
        filter: None,
    };
    let encoders = (dims.iter().enumerate())
        .map(|(d, dim)| {
            let Fitted::Encoder(enc) = KeyEncoder::fit(&[vec![dim.column(0)]], false).map_err(e)?
            else {
                return Err("a dimension's keys do not encode".to_string());
            };
            match d {
                0 => Ok(enc),
                _ => enc.direct().ok_or_else(|| "no direct encoder".to_string()),
            }
        })
        .collect::<Result<Vec<_>, _>>()?;
    let out_schema = Arc::new(Schema::new(vec![
        Field::new("p", DataType::Int32, true),
        Field::new("d0", DataType::Int32, true),
        Field::new("d1", DataType::Int32, true),
    ]));
    fn run<B: Backend>(
        b: &B,
        fact: &RecordBatch,
        dims: &[RecordBatch],
        encoders: &[KeyEncoder],
        layout: &OutputLayout,
        schema: &arrow::datatypes::SchemaRef,
    ) -> datafusion::common::Result<(Vec<bool>, Vec<RecordBatch>)> {
        let base = DeviceRelation::upload(b, std::slice::from_ref(fact), &[0, 1, 2])?;
        let mut chain = Chain::new(&base);
        let mut joined = vec![];
        for (d, (dim, enc)) in dims.iter().zip(encoders).enumerate() {
            let rel = DeviceRelation::upload(b, std::slice::from_ref(dim), &[0, 1])?;
            let table = BucketTable::build(b, &rel, layout, enc.clone())?;
            joined.push(chain.join(b, &table, &[ChainColumn::Base(d)], &[1])?);
        }
        let mut columns = vec![ChainColumn::Base(2)];
        columns.extend((0..chain.joined()).map(ChainColumn::Joined));
        let out = chain.finish(b, &columns)?;
        let schema = Arc::new(Schema::new(schema.fields()[..columns.len()].to_vec()));
        Ok((joined, out.download(b, &schema, 1 << 20)?))
    }
    let (hj, hb) = run(&host, &fact, &dims, &encoders, &layout, &out_schema).map_err(e)?;
    let (dj, db) = run(dev, &fact, &dims, &encoders, &layout, &out_schema).map_err(e)?;
    // The second join is no lookup where a row the first kept (dimension 0's keys are
    // 0..dim_rows) probes the key held twice.
    let probed = (f0.iter().zip(&f1))
        .any(|(a, b)| a.is_some_and(|a| (a as usize) < dim_rows) && b.is_some() && *b == twice);
    if hj != dj || hj != [true, !probed] {
        return Err(format!("joins taken: host {hj:?}, cuda {dj:?}"));
    }
    let rows = |b: &[RecordBatch]| b.iter().map(|b| b.num_rows()).sum::<usize>();
    if kind == 0 && rows(&hb) != n {
        return Err(format!("every key found, but {} of {n} rows", rows(&hb)));
    }
    let concat = |b: &[RecordBatch]| -> Result<Option<RecordBatch>, String> {
        match b.first() {
            None => Ok(None),
            Some(first) => arrow::compute::concat_batches(&first.schema(), b)
                .map(Some)
                .map_err(|e| e.to_string()),
        }
    };
    // The inner joins computed here, in fact order: (p, d0's payload, d1's payload).
    let payloads: Vec<std::collections::HashMap<i32, Option<i32>>> = (dims.iter())
        .map(|d| {
            let k = d.column(0).as_primitive::<Int32Type>();
            let v = d.column(1).as_primitive::<Int32Type>();
            k.iter()
                .zip(v.iter())
                .filter_map(|(k, v)| Some((k?, v)))
                .collect()
        })
        .collect();
    let width = hj.iter().filter(|&&j| j).count();
    let expected: Vec<Vec<Option<i32>>> = (0..n)
        .filter_map(|i| {
            let mut row = vec![Some(i as i32)];
            for (fk, dim) in [&f0, &f1].into_iter().zip(&payloads).take(width) {
                row.push(*dim.get(&fk[i]?)?);
            }
            Some(row)
        })
        .collect();
    let got: Vec<Vec<Option<i32>>> = (hb.iter())
        .flat_map(|b| {
            (0..b.num_rows()).map(move |r| {
                (b.columns().iter())
                    .map(|c| {
                        let c = c.as_primitive::<Int32Type>();
                        c.is_valid(r).then(|| c.value(r))
                    })
                    .collect()
            })
        })
        .collect();
    if got != expected {
        return Err(format!(
            "chain output: {} rows, the join computed here {} (first difference at row {:?})",
            got.len(),
            expected.len(),
            got.iter().zip(&expected).position(|(a, b)| a != b)
        ));
    }
    if concat(&hb)? != concat(&db)? {
        return Err(format!(
            "chain output: host and CUDA differ ({} and {} rows)",
            rows(&hb),
            rows(&db)
        ));
    }
    Ok(())
}

/// The columns the bucket probe test's build side carries into bucket order: its first word of
/// check bytes, the filter's value (4 bytes) and validity (1), then its other three words.
fn carried<'a, B>(words: [&'a B; 4], value: &'a B, valid: &'a B) -> [(&'a B, usize); 6] {
    let [w0, w1, w2, w3] = words;
    [
        (w0, KEY_CHECK_BYTES),
        (value, 4),
        (valid, 1),
        (w1, KEY_CHECK_BYTES),
        (w2, KEY_CHECK_BYTES),
        (w3, KEY_CHECK_BYTES),
    ]
}

const EMITS: [ProbeEmit; 6] = [
    ProbeEmit::Pairs,
    ProbeEmit::PairsOrAlone,
    ProbeEmit::Matched,
    ProbeEmit::Unmatched,
    ProbeEmit::Every,
    ProbeEmit::Nothing,
];

/// One emit of the bucket probe on both backends, with or without check bytes and a compiled
/// filter: the same offsets, marks of the build rows matched (where the emit visits every match), output rows
/// whole and in uneven windows, the validity of their build side, and the build rows selected
/// by their marks.
#[allow(clippy::type_complexity, clippy::too_many_arguments)]
fn check_emit(
    dev: &CudaBackend,
    (hb, hp): (&Partitioned<HostBuffer>, &HostBuffer),
    (db, dp): (&Partitioned<DeviceBuffer>, &DeviceBuffer),
    n: usize,
    width: KeyWidth,
    emit: ProbeEmit,
    check: &Option<(KeyCheck<'_, HostBuffer>, KeyCheck<'_, DeviceBuffer>)>,
    filter: Option<(&FilterInput<'_, HostBuffer>, &FilterInput<'_, DeviceBuffer>)>,
) -> Result<(), String> {
    let (hc, dc) = (check.as_ref().map(|c| &c.0), check.as_ref().map(|c| &c.1));
    let (hf, df) = (filter.map(|f| f.0), filter.map(|f| f.1));
    let emit_name = format!(
        "{emit:?}, check words: {}, filtered: {}",
        hc.map_or(0, |c| c.build.len()),
        filter.is_some()
    );
    let host = HostBackend::default();
    let e = |e: datafusion::common::DataFusionError| e.to_string();
    let build_rows = hb.rows;
    let (mut hv, mut dv) = if emit.visits_all() {
        let (h, mut d) = (
            host.alloc(build_rows).map_err(e)?,
            dev.alloc(build_rows).map_err(e)?,
        );
        dev.fill(&mut d, 0).map_err(e)?;
        (Some(h), Some(d))
    } else {
        (None, None)
    };
    let ho = host
        .bucket_count(hb, hp, n, width, emit, hc, hf, hv.as_mut())
        .map_err(e)?;
    let do_ = dev
        .bucket_count(db, dp, n, width, emit, dc, df, dv.as_mut())
        .map_err(e)?;
    let runs = probe_runs(n);
    let offsets = bytes_of(&host, &ho, (runs + 1) * 8)?;
    same(
        &format!("bucket offsets ({emit_name})"),
        &offsets,
        &bytes_of(dev, &do_, (runs + 1) * 8)?,
    )?;
    if let (Some(hv), Some(dv)) = (&hv, &dv) {
        same(
            &format!("visited ({emit_name})"),
            &bytes_of(&host, hv, build_rows)?,
            &bytes_of(dev, dv, build_rows)?,
        )?;
        for keep in [Keep::Unset, Keep::Set, Keep::All] {
            check_select(dev, (hv, dv), build_rows, keep)?;
        }
    }
    let total = u64::from_le_bytes(offsets[runs * 8..].try_into().unwrap_or_default());
    // The whole output, then windows of a third (the last one shorter).
    let third = (total / 3).max(1);
    let windows = std::iter::once(0..total).chain(
        (0..total)
            .step_by(third as usize)
            .map(|lo| lo..(lo + third).min(total)),
    );
    for window in windows {
        let len = (window.end - window.start) as usize;
        let (mut hr, mut hs) = (
            host.alloc(len * 4).map_err(e)?,
            host.alloc(len * 4).map_err(e)?,
        );
        let (mut dr, mut ds) = (
            dev.alloc(len * 4).map_err(e)?,
            dev.alloc(len * 4).map_err(e)?,
        );
        host.bucket_write(
            hb,
            hp,
            n,
            width,
            emit,
            hc,
            hf,
            &ho,
            window.clone(),
            &mut hr,
            &mut hs,
        )
        .map_err(e)?;
        dev.bucket_write(
            db,
            dp,
            n,
            width,
            emit,
            dc,
            df,
            &do_,
            window.clone(),
            &mut dr,
            &mut ds,
        )
        .map_err(e)?;
        same(
            &format!("bucket build positions {window:?} ({emit_name})"),
            &bytes_of(&host, &hr, len * 4)?,
            &bytes_of(dev, &dr, len * 4)?,
        )?;
        same(
            &format!("bucket probe rows {window:?} ({emit_name})"),
            &bytes_of(&host, &hs, len * 4)?,
            &bytes_of(dev, &ds, len * 4)?,
        )?;
        same(
            &format!("present {window:?} ({emit_name})"),
            &bytes_of(&host, &host.present(&hr, len).map_err(e)?, len)?,
            &bytes_of(dev, &dev.present(&dr, len).map_err(e)?, len)?,
        )?;
    }
    Ok(())
}

/// Selecting rows by their flags gives the same offsets and positions on both backends, whole
/// and in two windows.
fn check_select(
    dev: &CudaBackend,
    (hf, df): (&HostBuffer, &DeviceBuffer),
    rows: usize,
    keep: Keep,
) -> Result<(), String> {
    let host = HostBackend::default();
    let e = |e: datafusion::common::DataFusionError| e.to_string();
    let runs = probe_runs(rows);
    let ho = host.select_count(hf, rows, keep).map_err(e)?;
    let do_ = dev.select_count(df, rows, keep).map_err(e)?;
    let offsets = bytes_of(&host, &ho, (runs + 1) * 8)?;
    same(
        &format!("select offsets ({keep:?})"),
        &offsets,
        &bytes_of(dev, &do_, (runs + 1) * 8)?,
    )?;
    let total = u64::from_le_bytes(offsets[runs * 8..].try_into().unwrap_or_default());
    let half = total / 2;
    for window in [0..total, 0..half, half..total] {
        let len = (window.end - window.start) as usize;
        let (mut ho_, mut do2) = (
            host.alloc(len * 4).map_err(e)?,
            dev.alloc(len * 4).map_err(e)?,
        );
        host.select_write(hf, rows, keep, &ho, window.clone(), &mut ho_)
            .map_err(e)?;
        dev.select_write(df, rows, keep, &do_, window.clone(), &mut do2)
            .map_err(e)?;
        same(
            &format!("selected rows {window:?} ({keep:?})"),
            &bytes_of(&host, &ho_, len * 4)?,
            &bytes_of(dev, &do2, len * 4)?,
        )?;
    }
    Ok(())
}

/// Copies through pinned blocks (at offsets, in pieces, several queues ordered by events) and
/// pageable uploads give back what went in.
fn transfers_round_trip(dev: &CudaBackend) -> Result<(), String> {
    let e = |e: datafusion::common::DataFusionError| e.to_string();
    let mut rng = Rng::new(99);
    let sizes = [1usize, 0, 5, 3 << 20, 1_234_567, (8 << 20) - 1];
    let data: Vec<Vec<u8>> = sizes
        .iter()
        .map(|&n| (0..n).map(|_| rng.next_u64() as u8).collect())
        .collect();
    let whole = data.concat();
    // Pinned (if the pool has room) and pageable uploads of several parts.
    let parts: Vec<&[u8]> = data.iter().map(Vec::as_slice).collect();
    let buf = dev.upload_parts(&parts).map_err(e)?;
    same("upload_parts", &whole, &bytes_of(dev, &buf, whole.len())?)?;
    // Through a block: up on one queue, copied within on a second that waits for it, down on a
    // third that waits for the second, at offsets.
    let (up, down) = (dev.fork().map_err(e)?, dev.fork().map_err(e)?);
    let pool = up.staging();
    let mut block = pool
        .try_take(whole.len() + 100)
        .map_err(e)?
        .ok_or("no pinned block")?;
    block.bytes_mut().map_err(e)?[100..100 + whole.len()].copy_from_slice(&whole);
    let mut a = up.alloc(whole.len() + 7).map_err(e)?;
    up.copy_to_device(&mut block, 100, &mut a, 7, whole.len())
        .map_err(e)?;
    let uploaded = up.record().map_err(e)?;
    dev.wait(&uploaded).map_err(e)?;
    let mut b = dev.alloc(whole.len()).map_err(e)?;
    dev.copy_within(&a, 7, &mut b, 0, whole.len()).map_err(e)?;
    let copied = dev.record().map_err(e)?;
    down.wait(&copied).map_err(e)?;
    let mut out = down
        .output()
        .try_take(whole.len())
        .map_err(e)?
        .ok_or("no pinned block")?;
    down.copy_to_host(&b, 0, &mut out, 0, whole.len())
        .map_err(e)?;
    let done = down.record().map_err(e)?;
    down.block_on(&done).map_err(e)?;
    same(
        "pinned round trip",
        &whole,
        &out.bytes().map_err(e)?[..whole.len()],
    )?;
    // A block turned into an Arrow buffer keeps its bytes.
    let buffer = out.into_buffer(whole.len()).map_err(e)?;
    same("arrow buffer", &whole, buffer.as_slice())?;
    // One u64 read back into a pinned block (a kernel writes it) and into a pageable one (a
    // copy), while the download queue is busy with a large copy.
    let values: Vec<u64> = (0..1000u64).map(|i| i * 0x9E37_79B9_7F4A_7C15).collect();
    let src = dev
        .upload(
            &values
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect::<Vec<u8>>(),
        )
        .map_err(e)?;
    let mut busy = down
        .output()
        .try_take(whole.len())
        .map_err(e)?
        .ok_or("no pinned block")?;
    down.copy_to_host(&b, 0, &mut busy, 0, whole.len())
        .map_err(e)?;
    let pinned = dev
        .scalars()
        .try_take(8)
        .map_err(e)?
        .ok_or("no scalar block")?;
    let pageable = HostPool::heap(64, 1).take_unpooled(8).map_err(e)?;
    for (index, mut block) in [(0, pinned), (999, pageable)] {
        dev.read_u64(&src, index, &mut block).map_err(e)?;
        let got = u64::from_le_bytes(block.bytes().map_err(e)?[..8].try_into().unwrap());
        if got != values[index] {
            return Err(format!(
                "read_u64 of element {index}: {got} != {}",
                values[index]
            ));
        }
    }
    if dev.read_u64(&src, 1000, &mut busy).is_ok() {
        return Err("read_u64 past the end of its source did not fail".into());
    }
    for q in [&up, dev, &down] {
        q.synchronize().map_err(e)?;
    }
    Ok(())
}

pub fn register(suite: &mut Suite) {
    let require = suite.options.require_cuda;
    suite.add("primitives::transfers_round_trip", move || -> TestResult {
        let Some(dev) = cuda(require)? else {
            return Ok(Outcome::Skipped("no CUDA device".into()));
        };
        transfers_round_trip(&dev)?;
        Ok(Outcome::Passed)
    });
    each_case(suite, "partition_matches_host", check_partition);
    each_case(suite, "route_matches_host", check_route);
    each_case(suite, "hash_join_matches_host", check_hash_join);
    each_case(suite, "sort_merge_matches_host", check_sort_merge);
    each_case(suite, "bucket_probe_matches_host", check_bucket_probe);
    each_case(suite, "bucket_lookup_matches_host", check_bucket_lookup);
    each_case(
        suite,
        "lookup_chain_matches_host",
        check_lookup_chain::<CudaBackend>,
    );
    each_case(suite, "gather_bits_scan_match_host", check_columns);
    each_case(suite, "encode_keys_matches_host", check_encode);
    each_case(suite, "hash_checked_matches_host", check_hash_checked);
    each_case(suite, "view_values_match_host", check_views);
}

/// The view values of an output window gathered (`view_offsets`, `view_copy`): views inline
/// and out of line into three data buffers, null rows (kinds 1 and 2), views naming bytes past
/// the data, (kind 2) values longer than half the longest left to the host (their views'
/// buffer index raised by one; those naming no buffer, 0), and (kind 3) values into a buffer of room for half of them (up to 1 KiB each for
/// the smaller sizes), whose views past it become 0.
fn check_views(dev: &CudaBackend, rng: &mut Rng, n: usize, kind: u64) -> Result<(), String> {
    let host = HostBackend::default();
    let longest = if kind == 3 && n <= 4097 { 1024 } else { 60 };
    let lens: Vec<usize> = (0..3)
        .map(|_| longest + 1 + rng.below(4096) as usize)
        .collect();
    let data: Vec<u8> = (0..lens.iter().sum::<usize>())
        .map(|_| rng.next_u64() as u8)
        .collect();
    let starts = [0u64, lens[0] as u64, (lens[0] + lens[1]) as u64];
    let views: Vec<u8> = (0..n)
        .flat_map(|_| {
            let view: u128 = match rng.below(16) {
                0 => {
                    // Past the data: a fourth buffer, or an offset past its buffer's end (of
                    // a value longer than the backends copy, in kind 2).
                    let (b, off) = match rng.below(2) {
                        0 => (3u32, 0u32),
                        _ => (2, lens[2] as u32 - 5),
                    };
                    let len: u128 = if kind == 2 { 40 } else { 20 };
                    len | (u128::from(b) << 64) | (u128::from(off) << 96)
                }
                // Inline: the primitives read only the length of such a view.
                1..=5 => (u128::from(rng.next_u64()) << 32) | u128::from(rng.below(13)),
                _ => {
                    let len = 13 + rng.below(longest as u64 - 12) as usize;
                    let b = rng.below(3) as usize;
                    let off = rng.below((lens[b] - len) as u64) as u32;
                    let at = starts[b] as usize + off as usize;
                    let prefix = u32::from_le_bytes(data[at..at + 4].try_into().unwrap());
                    (len as u128)
                        | (u128::from(prefix) << 32)
                        | ((b as u128) << 64)
                        | (u128::from(off) << 96)
                }
            };
            view.to_le_bytes()
        })
        .collect();
    let validity: Option<Vec<u8>> = (kind == 1 || kind == 2)
        .then(|| (0..n.div_ceil(8)).map(|_| rng.next_u64() as u8).collect());
    let starts: Vec<u8> = starts.iter().flat_map(|s| s.to_le_bytes()).collect();
    let input = ViewsInput {
        data: &data,
        starts: &starts,
        views: &views,
        validity: validity.as_deref(),
        rows: n,
        half_room: kind == 3,
        max_copied: match kind {
            2 => longest as u32 / 2,
            _ => u32::MAX,
        },
    };
    let host_out = gather_views(&host, &input)?;
    let dev_out = gather_views(dev, &input)?;
    same("view offsets", &host_out.offsets, &dev_out.offsets)?;
    same("gathered views", &host_out.views, &dev_out.views)?;
    same("gathered values", &host_out.values, &dev_out.values)
}

/// What [`check_views`] gives both backends.
struct ViewsInput<'a> {
    data: &'a [u8],
    starts: &'a [u8],
    views: &'a [u8],
    validity: Option<&'a [u8]>,
    rows: usize,
    /// Room for half the values' bytes only.
    half_room: bool,
    /// The longest value the backends copy.
    max_copied: u32,
}

/// What a backend made of [`ViewsInput`]: the offsets, the views after the copy, the values.
struct GatheredViews {
    offsets: Vec<u8>,
    views: Vec<u8>,
    values: Vec<u8>,
}

fn gather_views<B: Backend>(b: &B, input: &ViewsInput<'_>) -> Result<GatheredViews, String> {
    let e = |e: datafusion::common::DataFusionError| e.to_string();
    let n = input.rows;
    let (d, s) = (
        b.upload(input.data).map_err(e)?,
        b.upload(input.starts).map_err(e)?,
    );
    let vd = ViewData {
        data: &d,
        starts: &s,
        buffers: 3,
        max_copied: input.max_copied,
    };
    let mut v = b.upload(input.views).map_err(e)?;
    let valid = input.validity.map(|x| b.upload(x)).transpose().map_err(e)?;
    let offsets = b.view_offsets(&v, valid.as_ref(), n, vd).map_err(e)?;
    let o = bytes_of(b, &offsets, (n + 1) * 8)?;
    let total = u64::from_le_bytes(o[n * 8..].try_into().unwrap()) as usize;
    let room = if input.half_room { total / 2 } else { total };
    let mut out = b.alloc(room.max(1)).map_err(e)?;
    b.fill(&mut out, 0).map_err(e)?;
    b.view_copy(&mut v, valid.as_ref(), n, &offsets, vd, &mut out)
        .map_err(e)?;
    Ok(GatheredViews {
        offsets: o,
        views: bytes_of(b, &v, n * 16)?,
        values: bytes_of(b, &out, room.max(1))?,
    })
}
