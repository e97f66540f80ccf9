//! INLJ: the index nested loop join (He et al., SIGMOD 2008), for relations already on the
//! device (library and kernel-level benchmark; the streaming engine does not run it).
//!
//! ```text
//!  build relation ─► encode keys ─► radix sort by sort key, every needed build column moving
//!                                   with the keys: the index (as SMJ-OM sorts, `smj`)
//!  probe relation ─► encode keys, in place: the probe side is neither sorted nor moved
//!                                        │
//!                  index_join: each probe row's run of its sort key found in the index by
//!                  binary search, its keys compared, count → scan → write: pairs of
//!                  positions in the index and in the probe relation, in probe order
//!                                        │
//!                  build columns gathered from the index, probe columns from the probe
//!                  relation as given (at rising rows)
//! ```
//! Against SMJ-OM, the probe side is never transformed: its keys are read once by the search
//! and its columns once by the gathers, while each search reads the index at scattered rows
//! (the caches hold a small index whole). The output's rows come in probe order.

use datafusion::common::Result;

use super::layout::OutputLayout;
use super::materialize::gather_output;
use super::phases::{Phases, timed};
use super::smj::{sort_bits, sort_relation};
use super::transform::encode_keys;
use crate::backend::Backend;
use crate::columns::{DeviceRelation, KeyEncoder};

/// The inner join of `build` and `probe`, relations on the backend, on the keys `layout` names
/// (encoded with `encoder`, fitted to both sides' keys) by INLJ; the output stays on the
/// backend, its columns numbered as in `layout`. Times go to `phases`: the index and the probe
/// keys' encoding to transform, the search to matching.
pub fn index_nested_loop_join<B: Backend>(
    backend: &B,
    build: &DeviceRelation<B::Buf>,
    probe: &DeviceRelation<B::Buf>,
    layout: &OutputLayout,
    encoder: &KeyEncoder,
    phases: &Phases,
) -> Result<DeviceRelation<B::Buf>> {
    layout.keys_compared_alone("INLJ")?;
    let build_columns: Vec<usize> = layout.build_columns().collect();
    let (index, probe_keys) = timed(backend, &phases.transform, || {
        let index = sort_relation(
            backend,
            build,
            &layout.build_keys,
            &build_columns,
            encoder,
            sort_bits(build.rows),
        )?;
        let probe_keys = encode_keys(backend, probe, &layout.probe_keys, encoder)?;
        Ok((index, probe_keys))
    })?;
    let matches = timed(backend, &phases.matching, || {
        backend.index_join(&index.keys, &probe_keys, probe.rows, encoder.width())
    })?;
    drop(probe_keys);
    gather_output(
        backend,
        &index.columns,
        &probe.columns,
        &matches,
        layout,
        phases,
    )
}
