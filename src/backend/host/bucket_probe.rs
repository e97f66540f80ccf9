//! Host twin of `kernels/bucket_probe.cu`: probing a bucketed build side in probe order.

use super::keys::EncodedKey;
use super::{HostBuffer, typed};
use crate::backend::{PROBE_RUN, Partitioned, probe_runs};

/// Calls `emit` with every build position whose key equals `k`, in position order.
fn matches<K: EncodedKey>(keys: &[K], bounds: &[u32], bits: u32, k: K, mut emit: impl FnMut(u32)) {
    if k == K::SENTINEL {
        return;
    }
    let b = k.partition_of(bits) as usize;
    for r in bounds[b]..bounds[b + 1] {
        if keys[r as usize] == k {
            emit(r);
        }
    }
}

/// The build side's keys and bounds.
fn table<K: EncodedKey>(build: &Partitioned<HostBuffer>) -> (&[K], &[u32]) {
    (
        typed::<K>(build.keys.as_slice(), build.rows),
        typed::<u32>(build.bounds.as_slice(), (1usize << build.bits) + 1),
    )
}

/// Where each run's pairs start, and their total (`runs + 1` values).
pub(crate) fn count<K: EncodedKey>(
    build: &Partitioned<HostBuffer>,
    probe: &[u8],
    rows: usize,
) -> Vec<u64> {
    let (keys, bounds) = table::<K>(build);
    let probe = typed::<K>(probe, rows);
    let mut offsets = Vec::with_capacity(probe_runs(rows) + 1);
    let mut total = 0u64;
    for run in probe.chunks(PROBE_RUN) {
        offsets.push(total);
        for &k in run {
            matches(keys, bounds, build.bits, k, |_| total += 1);
        }
    }
    offsets.push(total);
    offsets
}

/// The output of one [`write`]: pairs whose place lies in `first..first + build.len()`.
pub(crate) struct Window<'a> {
    pub first: u64,
    pub offsets: &'a [u64],
    pub build: &'a mut [u32],
    pub probe: &'a mut [u32],
}

/// Writes the pairs whose place lies in the window.
pub(crate) fn write<K: EncodedKey>(
    build: &Partitioned<HostBuffer>,
    probe: &[u8],
    rows: usize,
    out: Window<'_>,
) {
    let (keys, bounds) = table::<K>(build);
    let probe = typed::<K>(probe, rows);
    let (lo, hi) = (out.first, out.first + out.build.len() as u64);
    for (run, run_keys) in probe.chunks(PROBE_RUN).enumerate() {
        let (begin, end) = (out.offsets[run], out.offsets[run + 1]);
        if end <= lo || begin >= hi {
            continue;
        }
        let mut place = begin;
        for (i, &k) in run_keys.iter().enumerate() {
            let s = (run * PROBE_RUN + i) as u32;
            matches(keys, bounds, build.bits, k, |r| {
                if (lo..hi).contains(&place) {
                    out.build[(place - lo) as usize] = r;
                    out.probe[(place - lo) as usize] = s;
                }
                place += 1;
            });
        }
    }
}
