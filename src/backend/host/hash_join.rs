//! Host twin of `kernels/hash_join.cu`: the partitioned hash join's match finding, chunk by
//! chunk of build rows as the kernel does, in the kernel's output order.

use std::collections::HashMap;

use super::keys::EncodedKey;
use super::{HostBuffer, typed};
use crate::backend::{JOIN_CHUNK, Partitioned};

/// Pairs (build positions, probe positions) of equal keys. A partition's rows are its segments'
/// in turn ([`Partitioned::segments`]), in chunks of [`JOIN_CHUNK`] build rows counted across
/// them.
pub(crate) fn hash_join<K: EncodedKey>(
    build: &Partitioned<HostBuffer>,
    probe: &Partitioned<HostBuffer>,
) -> (Vec<u32>, Vec<u32>) {
    let rk = typed::<K>(build.keys.as_slice(), build.rows);
    let sk = typed::<K>(probe.keys.as_slice(), probe.rows);
    let parts = 1usize << build.bits;
    let rb = typed::<u32>(build.bounds.as_slice(), build.segments * (parts + 1));
    let sb = typed::<u32>(probe.bounds.as_slice(), probe.segments * (parts + 1));
    // Partition p's positions on one side, segment by segment.
    let rows_of = |bounds: &[u32], p: usize| -> Vec<usize> {
        bounds
            .chunks_exact(parts + 1)
            .flat_map(|b| b[p] as usize..b[p + 1] as usize)
            .collect()
    };
    let (mut r_out, mut s_out) = (Vec::new(), Vec::new());
    let mut table: HashMap<K, Vec<u32>> = HashMap::new();
    for p in 0..parts {
        let (r_rows, s_rows) = (rows_of(rb, p), rows_of(sb, p));
        if r_rows.is_empty() || s_rows.is_empty() {
            continue;
        }
        for chunk in r_rows.chunks(JOIN_CHUNK) {
            table.clear();
            for &r in chunk {
                if rk[r] != K::SENTINEL {
                    table.entry(rk[r]).or_default().push(r as u32);
                }
            }
            for &s in &s_rows {
                if let Some(rows) = table.get(&sk[s]) {
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
