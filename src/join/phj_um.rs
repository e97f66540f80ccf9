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

use datafusion::common::Result;

use super::layout::OutputLayout;
use super::materialize::join_untransformed_by;
use super::phases::Phases;
use super::phj::partition_bits;
use crate::backend::Backend;
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
    layout.keys_compared_alone("PHJ-UM")?;
    let (bits, width) = (partition_bits(build.rows), encoder.width());
    join_untransformed_by(
        backend,
        (build, probe),
        layout,
        encoder,
        phases,
        |keys, rows, positions| backend.partition(keys, rows, width, bits, &[(positions, 4)]),
        |b, p| backend.hash_join(b, p, width),
    )
}
