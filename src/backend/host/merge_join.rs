//! Host twin of `kernels/merge_join.cu`: the sort-merge join's match finding between two sides
//! sorted by sort key (host `partition::sort`), and INLJ's between a sorted build side and
//! probe keys in any order (the same search), in the kernels' output order.

use super::keys::EncodedKey;
use super::typed;

/// Pairs (build positions, probe positions) of equal keys between a build side sorted by sort
/// keys of `bits` bits and probe keys (sorted or not), ordered by probe position, then build
/// position; the sentinel matches nothing.
pub(crate) fn merge_join<K: EncodedKey>(
    build: &[u8],
    build_rows: usize,
    probe: &[u8],
    probe_rows: usize,
    bits: u32,
) -> (Vec<u32>, Vec<u32>) {
    let r = typed::<K>(build, build_rows);
    let s = typed::<K>(probe, probe_rows);
    let (mut r_out, mut s_out) = (Vec::new(), Vec::new());
    for (i, &k) in s.iter().enumerate() {
        if k == K::SENTINEL {
            continue;
        }
        let h = k.partition_of(bits);
        let first = r.partition_point(|&rk| rk.partition_of(bits) < h);
        for (j, &rk) in r.iter().enumerate().skip(first) {
            if rk.partition_of(bits) != h {
                break;
            }
            if rk == k {
                r_out.push(j as u32);
                s_out.push(i as u32);
            }
        }
    }
    (r_out, s_out)
}
