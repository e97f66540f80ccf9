//! SMJ-OM: sort-merge join with gather from transformed relations (Wu et al., VLDB 2024), for
//! relations already on the device (library and kernel-level benchmark; the streaming engine
//! does not run it).
//!
//! ```text
//!  build relation ─► encode keys ─► radix sort by sort key, every needed column moving
//!  probe relation ─► encode keys ─► radix sort by sort key, every needed column moving
//!                                        │  (partition.cu's passes over all 32 bits)
//!                  merge_join: each probe row's run of equal sort keys found in the build
//!                  side by binary search, count → scan → write: pairs of positions in the
//!                  sorted build and probe relations, in probe order
//!                                        │
//!                  gather each output column from its sorted column
//! ```
//! A key's sort key is its 32-bit partition hash (all of it for 4-byte keys, where it is a
//! bijection; its top 32 bits for 8-byte keys), so rows come in hash order, not key order, and
//! equal keys lie together. The probe side's sorted columns are gathered in order and the build
//! side's in nearly rising order (build positions rise with the probe rows), which is what
//! makes materialization cheap; the sorts move every column four times, against PHJ-OM's two
//! partitioning passes.

use std::collections::HashMap;

use datafusion::common::{Result, internal_err};

use super::layout::OutputLayout;
use super::materialize::gather_output;
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

/// Encodes the `keys` columns of `relation` with `encoder` and sorts them by sort key, moving
/// every column in `payload` with them. Enqueued on `backend`.
pub fn sort_relation<B: Backend>(
    backend: &B,
    relation: &DeviceRelation<B::Buf>,
    keys: &[usize],
    payload: &[usize],
    encoder: &KeyEncoder,
) -> Result<SortedRelation<B>> {
    let encoded = encode_keys(backend, relation, keys, encoder)?;
    let carry = Carry::of(relation, payload)?;
    let mut sorted = backend.sort(&encoded, relation.rows, encoder.width(), &carry.planes())?;
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
    if layout.check.is_some() {
        return internal_err!("SMJ-OM cannot check hashed keys' bytes; HASH does");
    }
    let build_columns: Vec<usize> = layout.build_columns().collect();
    let probe_columns: Vec<usize> = layout.probe_columns().collect();
    let (build, probe) = timed(backend, &phases.transform, || {
        Ok((
            sort_relation(backend, build, &layout.build_keys, &build_columns, encoder)?,
            sort_relation(backend, probe, &layout.probe_keys, &probe_columns, encoder)?,
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
