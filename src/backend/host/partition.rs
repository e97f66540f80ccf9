//! Host twin of `kernels/partition.cu`: a stable counting sort by partition id.

use super::keys::EncodedKey;
use super::typed;

/// Partitions `rows` keys (bytes of `K`s) into `2^bits` partitions. Returns the keys in
/// partition order, the `2^bits + 1` bounds, and for each position the input row it
/// holds (by which carried columns are gathered).
pub(crate) fn partition<K: EncodedKey>(
    keys: &[u8],
    rows: usize,
    bits: u32,
) -> (Vec<K>, Vec<u32>, Vec<u32>) {
    let keys = typed::<K>(keys, rows);
    let parts = 1usize << bits;
    let mut bounds = vec![0u32; parts + 1];
    for k in keys {
        bounds[k.partition_of(bits) as usize + 1] += 1;
    }
    for p in 0..parts {
        bounds[p + 1] += bounds[p];
    }
    let mut next = bounds.clone();
    let mut order = vec![0u32; rows];
    for (i, k) in keys.iter().enumerate() {
        let p = k.partition_of(bits) as usize;
        order[next[p] as usize] = i as u32;
        next[p] += 1;
    }
    let out = order.iter().map(|&i| keys[i as usize]).collect();
    (out, bounds, order)
}
