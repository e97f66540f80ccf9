//! SMJ-OM: sort-merge join with gather from transformed relations (Wu et al., VLDB 2024), for
//! relations already on the device (library and kernel-level benchmark; the streaming engine
//! does not run it); and SMJ-UM ([`sort_merge_join_untransformed`]), the same merge of keys
//! sorted with each row's position alone, every output column gathered from the untransformed
//! relations by the matched rows' positions (as PHJ-UM does, `phj_um`).
//!
//! ```text
//!  build relation ─► encode keys ─► radix sort by sort key, every needed column moving
//!  probe relation ─► encode keys ─► radix sort by sort key, every needed column moving
//!                                        │  (partition.cu's passes, 8 bits each)
//!                  merge_join: each probe row's run of equal sort keys found in the build
//!                  side by binary search and its keys compared, count → scan → write: pairs
//!                  of positions in the sorted build and probe relations, in probe order
//!                                        │
//!                  gather each output column from its sorted column
//! ```
//! A key's sort key is the top bits of its partition hash ([`sort_bits`]: enough for runs of
//! about four build rows, in whole passes), so rows come in hash order, not key order, and
//! equal keys lie together in one run with the few other keys of their sort key. The probe
//! side's sorted columns are gathered in order and the build side's in nearly rising order
//! (build positions rise with the probe rows), which is what makes materialization cheap; the
//! sorts move every column three times at 2^26 build rows, against PHJ-OM's two partitioning
//! passes.

use std::collections::HashMap;

use datafusion::common::Result;

use super::layout::OutputLayout;
use super::materialize::{gather_output, join_untransformed_by};
use super::phases::{Phases, timed};
use super::transform::{Carry, encode_keys};
use crate::backend::{Backend, Sorted};
use crate::columns::{DeviceColumn, DeviceRelation, KeyEncoder};

/// A relation sorted for a merge: its sorted keys and its needed columns, in the keys' order.
#[derive(Debug)]
pub struct SortedRelation<B: Backend> {
    pub keys: Sorted<B::Buf>,
    pub columns: HashMap<usize, DeviceColumn<B::Buf>>,
}

/// Build rows a run of equal sort keys holds at most, about: [`sort_bits`] aims at it.
const ROWS_PER_RUN: usize = 4;

/// Sort-key bits for a build side of `rows` rows: whole radix passes of 8 bits, enough for runs
/// of at most about four build rows (a probe row compares its key with its run's),
/// from 8 to 32 bits. 2^26 rows take 24 bits, three passes where all 32 take four.
pub fn sort_bits(rows: usize) -> u32 {
    let runs = rows.div_ceil(ROWS_PER_RUN).max(1);
    let bits = runs.next_power_of_two().trailing_zeros();
    (bits.div_ceil(8) * 8).clamp(8, 32)
}

/// Encodes the `keys` columns of `relation` with `encoder` and sorts them by their sort key of
/// `bits` bits, moving every column in `payload` with them. Enqueued on `backend`.
pub fn sort_relation<B: Backend>(
    backend: &B,
    relation: &DeviceRelation<B::Buf>,
    keys: &[usize],
    payload: &[usize],
    encoder: &KeyEncoder,
    bits: u32,
) -> Result<SortedRelation<B>> {
    let encoded = encode_keys(backend, relation, keys, encoder)?;
    let carry = Carry::of(relation, payload)?;
    let mut sorted = backend.sort(
        &encoded,
        relation.rows,
        encoder.width(),
        bits,
        &carry.planes(),
    )?;
    let columns = carry.moved(std::mem::take(&mut sorted.carried))?;
    Ok(SortedRelation {
        keys: sorted,
        columns,
    })
}

/// The inner join of `build` and `probe`, relations on the backend, on the keys `layout` names
/// (encoded with `encoder`, fitted to the build side's keys): both sorted, merged, and the
/// output's columns gathered, numbered as in `layout`. Times go to `phases`: the sorts to
/// transform, the merge to matching.
pub fn sort_merge_join<B: Backend>(
    backend: &B,
    build: &DeviceRelation<B::Buf>,
    probe: &DeviceRelation<B::Buf>,
    layout: &OutputLayout,
    encoder: &KeyEncoder,
    phases: &Phases,
) -> Result<DeviceRelation<B::Buf>> {
    layout.keys_compared_alone("SMJ-OM")?;
    let build_columns: Vec<usize> = layout.build_columns().collect();
    let probe_columns: Vec<usize> = layout.probe_columns().collect();
    let bits = sort_bits(build.rows);
    let (build, probe) = timed(backend, &phases.transform, || {
        Ok((
            sort_relation(
                backend,
                build,
                &layout.build_keys,
                &build_columns,
                encoder,
                bits,
            )?,
            sort_relation(
                backend,
                probe,
                &layout.probe_keys,
                &probe_columns,
                encoder,
                bits,
            )?,
        ))
    })?;
    let matches = timed(backend, &phases.matching, || {
        backend.merge_join(&build.keys, &probe.keys, encoder.width())
    })?;
    gather_output(
        backend,
        &build.columns,
        &probe.columns,
        &matches,
        layout,
        phases,
    )
}

/// SMJ-UM: [`sort_merge_join`] with only the keys and each row's position sorted, and every
/// output column gathered from `build` and `probe` as given by the matched rows' positions.
/// The pairs, and so the output's rows and their order, are SMJ-OM's.
pub fn sort_merge_join_untransformed<B: Backend>(
    backend: &B,
    build: &DeviceRelation<B::Buf>,
    probe: &DeviceRelation<B::Buf>,
    layout: &OutputLayout,
    encoder: &KeyEncoder,
    phases: &Phases,
) -> Result<DeviceRelation<B::Buf>> {
    layout.keys_compared_alone("SMJ-UM")?;
    let (bits, width) = (sort_bits(build.rows), encoder.width());
    join_untransformed_by(
        backend,
        (build, probe),
        layout,
        encoder,
        phases,
        |keys, rows, positions| backend.sort(keys, rows, width, bits, &[(positions, 4)]),
        |b, p| backend.merge_join(b, p, width),
    )
}

#[cfg(test)]
mod tests {
    use super::sort_bits;

    #[test]
    fn sort_bits_aim_at_runs_of_four_build_rows_in_whole_passes() {
        assert_eq!(sort_bits(0), 8);
        assert_eq!(sort_bits(1000), 8);
        assert_eq!(sort_bits(1 << 16), 16);
        assert_eq!(sort_bits((1 << 16) + 1), 16);
        assert_eq!(sort_bits(1 << 20), 24);
        assert_eq!(sort_bits(1 << 26), 24);
        assert_eq!(sort_bits(1 << 27), 32);
        assert_eq!(sort_bits(1 << 31), 32);
    }
}
