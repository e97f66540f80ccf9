//! Host twin of `kernels/bucket_probe.cu`: probing a bucketed build side in probe order, for
//! every [`ProbeEmit`], with or without check bytes ([`KeyCheck`]) and a compiled filter
//! ([`FilterInput`]).

use datafusion::common::Result;

use super::keys::EncodedKey;
use super::{HostBuffer, typed};
use crate::backend::{
    FilterInput, KEY_CHECK_BYTES, KeyCheck, KeyWidth, NO_ROW, PROBE_RUN, Partitioned, ProbeEmit,
    check_bucket_probe, probe_runs,
};
use crate::filter::{FilterColumn, PairFilter};

/// One row's check bytes.
type CheckBytes = [u8; KEY_CHECK_BYTES];

/// The check bytes of a probe, a slice of rows per word: the build rows' (bucket order) and the
/// probe rows'.
struct Check<'a> {
    build: Vec<&'a [CheckBytes]>,
    probe: Vec<&'a [CheckBytes]>,
}

impl<'a> Check<'a> {
    /// The check bytes of `build_rows` build and `probe_rows` probe rows (lengths checked by
    /// the caller).
    fn of(
        check: Option<&KeyCheck<'a, HostBuffer>>,
        build_rows: usize,
        probe_rows: usize,
    ) -> Option<Self> {
        let rows = |b: &'a HostBuffer, n: usize| -> &'a [CheckBytes] {
            let (chunks, _) = b.as_slice()[..n * KEY_CHECK_BYTES].as_chunks::<KEY_CHECK_BYTES>();
            chunks
        };
        check.map(|c| Self {
            build: c.build.iter().map(|&b| rows(b, build_rows)).collect(),
            probe: c.probe.iter().map(|&p| rows(p, probe_rows)).collect(),
        })
    }

    /// Whether build row `r` and probe row `s` have the same check bytes.
    fn equal(&self, r: usize, s: usize) -> bool {
        self.build
            .iter()
            .zip(&self.probe)
            .all(|(b, p)| b[r] == p[s])
    }
}

/// A compiled filter with its columns (lengths checked by the caller).
struct Filter<'a> {
    filter: &'a PairFilter,
    build: Vec<FilterColumn<'a>>,
    probe: Vec<FilterColumn<'a>>,
}

impl<'a> Filter<'a> {
    fn of(input: &FilterInput<'a, HostBuffer>) -> Self {
        let columns = |side: &[(&'a HostBuffer, Option<&'a HostBuffer>)]| {
            side.iter()
                .map(|(values, validity)| FilterColumn {
                    values: values.as_slice(),
                    validity: validity.map(|v| v.as_slice()),
                })
                .collect()
        };
        Self {
            filter: input.filter,
            build: columns(&input.build),
            probe: columns(&input.probe),
        }
    }
}

/// What a pair of equal keys must also pass: equal check bytes, and the filter.
pub(crate) struct PairTests<'a> {
    check: Option<Check<'a>>,
    filter: Option<Filter<'a>>,
}

impl<'a> PairTests<'a> {
    /// The tests of a bucket probe of `rows` probe keys of `width`, its inputs checked.
    pub(crate) fn of(
        build: &Partitioned<HostBuffer>,
        probe_keys: &HostBuffer,
        (rows, width): (usize, KeyWidth),
        check: Option<&KeyCheck<'a, HostBuffer>>,
        filter: Option<&FilterInput<'a, HostBuffer>>,
    ) -> Result<Self> {
        let len = HostBuffer::len;
        check_bucket_probe(build, probe_keys, (rows, width), check, filter, len)?;
        Ok(Self {
            check: Check::of(check, build.rows, rows),
            filter: filter.map(Filter::of),
        })
    }
}

/// A probe row (`s`) as the table compares it: its encoded key, where keys are checked its
/// check bytes, and the join's filter.
#[derive(Clone, Copy)]
struct ProbeKey<'a, K> {
    k: K,
    s: usize,
    check: Option<&'a Check<'a>>,
    filter: Option<&'a Filter<'a>>,
}

impl<'a, K: EncodedKey> ProbeKey<'a, K> {
    fn new(k: K, tests: &'a PairTests<'a>, s: usize) -> Self {
        Self {
            k,
            s,
            check: tests.check.as_ref(),
            filter: tests.filter.as_ref(),
        }
    }

    /// Whether build position `r` holds this key and passes the filter with it.
    fn matches(&self, keys: &[K], r: u32) -> bool {
        keys[r as usize] == self.k
            && self.check.is_none_or(|c| c.equal(r as usize, self.s))
            && self
                .filter
                .is_none_or(|f| f.filter.eval(&f.build, &f.probe, r as usize, self.s))
    }
}

/// Calls `emit` with every build position that holds `p`'s key, in position order.
fn matches<K: EncodedKey>(
    keys: &[K],
    bounds: &[u32],
    bits: u32,
    p: ProbeKey<'_, K>,
    mut emit: impl FnMut(u32),
) {
    if p.k == K::SENTINEL {
        return;
    }
    let b = p.k.partition_of(bits) as usize;
    for r in bounds[b]..bounds[b + 1] {
        if p.matches(keys, r) {
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

/// The output rows of probe key `k` under `emit`, as build positions ([`NO_ROW`] for none),
/// in order; marks every match in `visited` if given.
fn rows_of<K: EncodedKey>(
    (keys, bounds, bits): (&[K], &[u32], u32),
    k: ProbeKey<'_, K>,
    emit: ProbeEmit,
    visited: Option<&mut [u8]>,
    mut out: impl FnMut(u32),
) {
    let pairs = matches!(emit, ProbeEmit::Pairs | ProbeEmit::PairsOrAlone);
    let (mut first, mut visited) = (NO_ROW, visited);
    matches(keys, bounds, bits, k, |r| {
        if first == NO_ROW {
            first = r;
        }
        if let Some(v) = visited.as_deref_mut() {
            v[r as usize] = 1;
        }
        if pairs {
            out(r);
        }
    });
    match emit {
        ProbeEmit::PairsOrAlone | ProbeEmit::Unmatched if first == NO_ROW => out(NO_ROW),
        ProbeEmit::Matched if first != NO_ROW => out(first),
        ProbeEmit::Every => out(first),
        _ => {}
    }
}

/// Where each run's output rows start, and their total (`runs + 1` values).
pub(crate) fn count<K: EncodedKey>(
    build: &Partitioned<HostBuffer>,
    probe: &[u8],
    rows: usize,
    emit: ProbeEmit,
    tests: &PairTests<'_>,
    mut visited: Option<&mut [u8]>,
) -> Vec<u64> {
    let (keys, bounds) = table::<K>(build);
    let probe = typed::<K>(probe, rows);
    let mut offsets = Vec::with_capacity(probe_runs(rows) + 1);
    let mut total = 0u64;
    for (run, run_keys) in probe.chunks(PROBE_RUN).enumerate() {
        offsets.push(total);
        for (i, &k) in run_keys.iter().enumerate() {
            let v = visited.as_deref_mut();
            let k = ProbeKey::new(k, tests, run * PROBE_RUN + i);
            rows_of((keys, bounds, build.bits), k, emit, v, |_| total += 1);
        }
    }
    offsets.push(total);
    offsets
}

/// The output of one [`write`]: rows whose place lies in `first..first + build.len()`.
pub(crate) struct Window<'a> {
    pub first: u64,
    pub offsets: &'a [u64],
    pub build: &'a mut [u32],
    pub probe: &'a mut [u32],
}

/// Writes the output rows whose place lies in the window.
pub(crate) fn write<K: EncodedKey>(
    build: &Partitioned<HostBuffer>,
    probe: &[u8],
    rows: usize,
    emit: ProbeEmit,
    tests: &PairTests<'_>,
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
            let s = run * PROBE_RUN + i;
            let k = ProbeKey::new(k, tests, s);
            let s = s as u32;
            rows_of((keys, bounds, build.bits), k, emit, None, |r| {
                if (lo..hi).contains(&place) {
                    out.build[(place - lo) as usize] = r;
                    out.probe[(place - lo) as usize] = s;
                }
                place += 1;
            });
        }
    }
}

/// Each probe key's build position (the first where several hold the key), or [`NO_ROW`], into
/// `out`; gives the probe rows without a build row and those whose key several build rows hold
/// (looking no further than a second). With `exact`, every row of a key's bucket holds the key
/// (a direct table), but for the bucket the sentinel hashes to, which holds null keys too.
pub(crate) fn lookup<K: EncodedKey>(
    build: &Partitioned<HostBuffer>,
    probe: &[u8],
    exact: bool,
    out: &mut [u32],
) -> [u64; 2] {
    let (keys, bounds) = table::<K>(build);
    let probe = typed::<K>(probe, out.len());
    let mut counts = [0u64; 2];
    for (&k, found) in probe.iter().zip(out.iter_mut()) {
        let mut holding = 0usize;
        *found = NO_ROW;
        if k != K::SENTINEL {
            let b = k.partition_of(build.bits);
            let alike = exact && b != K::SENTINEL.partition_of(build.bits);
            let b = b as usize;
            for r in bounds[b]..bounds[b + 1] {
                if alike || keys[r as usize] == k {
                    if holding == 0 {
                        *found = r;
                    }
                    holding += 1;
                    if holding > 1 {
                        break;
                    }
                }
            }
        }
        counts[0] += u64::from(holding == 0);
        counts[1] += u64::from(holding > 1);
    }
    counts
}
