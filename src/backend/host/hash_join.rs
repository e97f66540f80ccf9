//! Host twin of `kernels/hash_join.cu`: the partitioned hash join's match finding, chunk by
//! chunk of build rows as the kernel does, in the kernel's output order.

use std::collections::HashMap;

use super::keys::EncodedKey;
use super::{HostBuffer, typed};
use crate::backend::{JOIN_CHUNK, Partitioned};

/// Pairs (build positions, probe positions) of equal keys.
pub(crate) fn hash_join<K: EncodedKey>(
    build: &Partitioned<HostBuffer>,
    probe: &Partitioned<HostBuffer>,
) -> (Vec<u32>, Vec<u32>) {
    let rk = typed::<K>(build.keys.as_slice(), build.rows);
    let sk = typed::<K>(probe.keys.as_slice(), probe.rows);
    let parts = 1usize << build.bits;
    let rb = typed::<u32>(build.bounds.as_slice(), parts + 1);
    let sb = typed::<u32>(probe.bounds.as_slice(), parts + 1);
    let (mut r_out, mut s_out) = (Vec::new(), Vec::new());
    let mut table: HashMap<K, Vec<u32>> = HashMap::new();
    for p in 0..parts {
        let (r0, r1, s0, s1) = (
            rb[p] as usize,
            rb[p + 1] as usize,
            sb[p] as usize,
            sb[p + 1] as usize,
        );
        if r0 == r1 || s0 == s1 {
            continue;
        }
        for chunk in (r0..r1).step_by(JOIN_CHUNK) {
            table.clear();
            let end = (chunk + JOIN_CHUNK).min(r1);
            for (r, k) in rk.iter().enumerate().take(end).skip(chunk) {
                if *k != K::SENTINEL {
                    table.entry(*k).or_default().push(r as u32);
                }
            }
            for (s, k) in sk.iter().enumerate().take(s1).skip(s0) {
                if let Some(rows) = table.get(k) {
                    for &r in rows {
                        r_out.push(r);
                        s_out.push(s as u32);
                    }
                }
            }
        }
    }
    (r_out, s_out)
}
