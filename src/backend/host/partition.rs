//! Host twin of `kernels/partition.cu`: a stable counting sort by partition id, or by route;
//! and the sort-merge join's sort, a stable sort by sort key (a partition id of up to 32 bits,
//! whose bounds would not fit in memory).

use super::keys::EncodedKey;
use super::typed;

/// What the rows are sorted by.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SplitBy {
    /// The partition id of `bits` bits.
    Partition(u32),
    /// The route of `bits` bits.
    Route(u32),
}

impl SplitBy {
    /// Bits of the ids.
    pub(crate) fn bits(self) -> u32 {
        match self {
            Self::Partition(bits) | Self::Route(bits) => bits,
        }
    }

    fn id<K: EncodedKey>(self, k: K) -> u32 {
        match self {
            Self::Partition(bits) => k.partition_of(bits),
            Self::Route(bits) => k.route_of(bits),
        }
    }
}

/// Splits `rows` keys (bytes of `K`s) by `by` into `2^bits` parts, stably. Returns the
/// `2^bits + 1` bounds and, for each position, the input row it holds (by which the keys and
/// the carried columns are gathered).
pub(crate) fn split<K: EncodedKey>(keys: &[u8], rows: usize, by: SplitBy) -> (Vec<u32>, Vec<u32>) {
    let keys = typed::<K>(keys, rows);
    let parts = 1usize << by.bits();
    let mut bounds = vec![0u32; parts + 1];
    for &k in keys {
        bounds[by.id(k) as usize + 1] += 1;
    }
    for p in 0..parts {
        bounds[p + 1] += bounds[p];
    }
    let mut next = bounds.clone();
    let mut order = vec![0u32; rows];
    for (i, &k) in keys.iter().enumerate() {
        let p = by.id(k) as usize;
        order[next[p] as usize] = i as u32;
        next[p] += 1;
    }
    (bounds, order)
}

/// Sorts `rows` keys (bytes of `K`s) by their sort key of `bits` bits, stably. Returns, for each
/// position, the input row it holds (by which the keys and the carried columns are gathered).
pub(crate) fn sort<K: EncodedKey>(keys: &[u8], rows: usize, bits: u32) -> Vec<u32> {
    let keys = typed::<K>(keys, rows);
    let mut order: Vec<u32> = (0..rows as u32).collect();
    // A stable sort by the whole sort key is what stable LSD radix passes over its digits give.
    order.sort_by_key(|&i| keys[i as usize].partition_of(bits));
    order
}
