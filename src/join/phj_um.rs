//! PHJ-UM: the partitioned hash join materialized from the untransformed relations (Wu et al.,
//! VLDB 2024), for relations already on the device (library and kernel-level benchmark; the
//! streaming engine does not run it).
//!
//! ```text
//!  build relation ─► encode keys ─► partition keys and row positions (2^bits partitions)
//!  probe relation ─► encode keys ─► partition keys and row positions, like the build side
//!                                        │
//!                  hash_join (count → scan → write): pairs of positions in the partitioned
//!                  build and probe keys, clustered by partition
//!                                        │
//!                  each side: its rows' positions in the relation as given (one gather),
//!                  then every output column gathered from that relation by them
//! ```
//! Against PHJ-OM (`phj`), whose transform moves every output column with the keys, the
//! transform here moves one 4-byte position a row whatever the columns, and the gathers read
//! the untransformed columns at scattered rows: it pays where the output columns are many or
//! wide and few rows match. The pairs, and so the output's rows and their order, are PHJ-OM's.

use datafusion::common::{Result, internal_err};

use super::layout::OutputLayout;
use super::materialize::{gather_untransformed, positions_carried};
use super::phases::{Phases, timed};
use super::phj::partition_bits;
use super::transform::keys_and_positions;
use crate::backend::{Backend, Partitioned};
use crate::columns::{DeviceRelation, KeyEncoder};

/// Joins `build` with `probe` on the layout's keys (encoded with `encoder`, fitted to both
/// sides' keys) by PHJ-UM; the output stays on the backend, its columns numbered as in
/// `layout`. Inner joins without a residual filter or checked keys.
pub fn join_untransformed<B: Backend>(
    backend: &B,
    build: &DeviceRelation<B::Buf>,
    probe: &DeviceRelation<B::Buf>,
    layout: &OutputLayout,
    encoder: &KeyEncoder,
    phases: &Phases,
) -> Result<DeviceRelation<B::Buf>> {
    if layout.check.is_some() {
        return internal_err!("PHJ-UM cannot check hashed keys' bytes; HASH does");
    }
    let bits = partition_bits(build.rows);
    let (b, p) = timed(backend, &phases.transform, || {
        let b = positions_partitioned(backend, build, &layout.build_keys, encoder, bits)?;
        let p = positions_partitioned(backend, probe, &layout.probe_keys, encoder, bits)?;
        Ok((b, p))
    })?;
    let matches = timed(backend, &phases.matching, || {
        backend.hash_join(&b, &p, encoder.width())
    })?;
    // The partitioned keys and bounds are freed here, before the gathers.
    let rows = (positions_carried(b)?, positions_carried(p)?);
    gather_untransformed(backend, build, probe, rows, matches, layout, phases)
}

/// The `keys` columns of `relation` encoded and partitioned into `2^bits` partitions, each
/// row's position moving with its key (the one carried column).
fn positions_partitioned<B: Backend>(
    backend: &B,
    relation: &DeviceRelation<B::Buf>,
    keys: &[usize],
    encoder: &KeyEncoder,
    bits: u32,
) -> Result<Partitioned<B::Buf>> {
    let (encoded, positions) = keys_and_positions(backend, relation, keys, encoder)?;
    backend.partition(
        &encoded,
        relation.rows,
        encoder.width(),
        bits,
        &[(&positions, 4)],
    )
}
