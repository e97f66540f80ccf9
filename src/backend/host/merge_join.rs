//! Host twin of the sort-merge join's primitives: the sort by sort key (`kernels/partition.cu`'s
//! passes over the top bits of the partition hash) and the match finding of
//! `kernels/merge_join.cu`, in the kernels' output order.

use super::keys::EncodedKey;
use super::typed;

/// Sorts `rows` keys (bytes of `K`s) by their sort key of `bits` bits, stably. Returns the keys
/// in that order and, for each position, the input row it holds (by which carried columns are
/// gathered).
pub(crate) fn sort<K: EncodedKey>(keys: &[u8], rows: usize, bits: u32) -> (Vec<K>, Vec<u32>) {
    let keys = typed::<K>(keys, rows);
    let mut order: Vec<u32> = (0..rows as u32).collect();
    // A stable sort by the whole sort key is what stable LSD radix passes over its digits give.
    order.sort_by_key(|&i| keys[i as usize].partition_of(bits));
    let out = order.iter().map(|&i| keys[i as usize]).collect();
    (out, order)
}

/// Pairs (build positions, probe positions) of equal keys between two sides sorted by sort
/// keys of `bits` bits, ordered by probe position, then build position; the sentinel matches
/// nothing.
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
