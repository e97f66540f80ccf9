//! PHJ-OM: partitioned hash join with gather from transformed relations (Wu et al., VLDB 2024).
//!
//! ```text
//!  build batches ─► upload ─► encode keys ─► partition keys, every needed column moving
//!                                            (2^bits parts) with them, pass by pass
//!                                                  │  once per query, shared by partitions
//!  probe chunk ───► upload ─► encode keys ─► partition keys and columns
//!                                                  │
//!                     hash_join (count → scan → write): pairs of positions in the
//!                     partitioned build and probe relations, clustered by partition
//!                                                  │
//!                     gather each output column from its partitioned column ─► download
//! ```
//! Because every column is partitioned with its keys, the gathers read neighbouring rows
//! (clustered), which is what makes materialization cheap on a GPU.

use arrow::array::RecordBatch;
use datafusion::common::Result;

use super::layout::OutputLayout;
use super::materialize::gather_output;
use super::phases::{Phases, timed};
use super::transform::{TransformedRelation, needed, transform};
use crate::backend::{Backend, MatchIndices};
use crate::columns::{DeviceRelation, KeyEncoder};

/// Build rows per partition the partitioning aims for (half a match-finding chunk).
const ROWS_PER_PARTITION: usize = 1024;

/// Partition bits for a build side of `rows` rows: about [`ROWS_PER_PARTITION`] rows per
/// partition, between 1 and 16 bits (two 8-bit radix passes).
pub fn partition_bits(rows: usize) -> u32 {
    let parts = rows.div_ceil(ROWS_PER_PARTITION).max(2);
    parts.next_power_of_two().trailing_zeros().clamp(1, 16)
}

/// The build side on a backend, partitioned once and shared by every probe chunk.
pub struct BuildSide<B: Backend> {
    relation: TransformedRelation<B>,
    encoder: KeyEncoder,
}

impl<B: Backend> BuildSide<B> {
    /// Uploads and partitions the build batches: keys and every column the output needs.
    pub fn new(
        backend: &B,
        batches: &[RecordBatch],
        layout: &OutputLayout,
        encoder: KeyEncoder,
        phases: &Phases,
    ) -> Result<Self> {
        let payload: Vec<usize> = layout.build_columns().collect();
        let relation = upload(
            backend,
            batches,
            &needed(&layout.build_keys, &payload),
            phases,
        )?;
        Self::from_device(backend, &relation, layout, encoder, phases)
    }

    /// Partitions a build relation already on the backend.
    pub fn from_device(
        backend: &B,
        relation: &DeviceRelation<B::Buf>,
        layout: &OutputLayout,
        encoder: KeyEncoder,
        phases: &Phases,
    ) -> Result<Self> {
        layout.keys_compared_alone("PHJ-OM")?;
        let payload: Vec<usize> = layout.build_columns().collect();
        let relation = timed(backend, &phases.transform, || {
            transform(
                backend,
                relation,
                &layout.build_keys,
                &payload,
                &encoder,
                partition_bits(relation.rows),
            )
        })?;
        Ok(Self { relation, encoder })
    }

    /// A build relation transformed already (a device's share of an exchange dealt out by
    /// partition, [`super::exchange_partitioned`]), its keys encoded with `encoder`.
    pub fn from_transformed(
        relation: TransformedRelation<B>,
        layout: &OutputLayout,
        encoder: KeyEncoder,
    ) -> Result<Self> {
        layout.keys_compared_alone("PHJ-OM")?;
        Ok(Self { relation, encoder })
    }

    /// Rows of the build side.
    pub fn rows(&self) -> usize {
        self.relation.rows()
    }
}

/// Uploads the columns `needed` of `batches`, counting time and bytes in `phases`.
fn upload<B: Backend>(
    backend: &B,
    batches: &[RecordBatch],
    needed: &[usize],
    phases: &Phases,
) -> Result<DeviceRelation<B::Buf>> {
    let relation = timed(backend, &phases.upload, || {
        DeviceRelation::upload(backend, batches, needed)
    })?;
    phases.bytes_uploaded.add(relation.host_bytes());
    Ok(relation)
}

/// Joins one chunk of probe batches with the build side; returns the output rows as batches
/// of at most `batch_rows` rows.
pub fn join_chunk<B: Backend>(
    backend: &B,
    build: &BuildSide<B>,
    probe: &[RecordBatch],
    layout: &OutputLayout,
    phases: &Phases,
    batch_rows: usize,
) -> Result<Vec<RecordBatch>> {
    let payload: Vec<usize> = layout.probe_columns().collect();
    let uploaded = upload(
        backend,
        probe,
        &needed(&layout.probe_keys, &payload),
        phases,
    )?;
    let probe = transform_probe(backend, build, &uploaded, layout, phases)?;
    // The uploaded columns are no longer needed: free them before matching.
    drop(uploaded);
    let output = join_transformed(backend, build, probe, layout, phases)?;
    let batches = timed(backend, &phases.download, || {
        output.download(backend, &layout.schema, batch_rows)
    })?;
    phases.bytes_downloaded.add(output.host_bytes());
    Ok(batches)
}

/// Joins a probe relation already on the backend with the build side; the output stays on
/// the backend, its columns numbered as in `layout`.
pub fn join_on_device<B: Backend>(
    backend: &B,
    build: &BuildSide<B>,
    probe: &DeviceRelation<B::Buf>,
    layout: &OutputLayout,
    phases: &Phases,
) -> Result<DeviceRelation<B::Buf>> {
    let probe = transform_probe(backend, build, probe, layout, phases)?;
    join_transformed(backend, build, probe, layout, phases)
}

/// Partitions a probe relation like the build side.
fn transform_probe<B: Backend>(
    backend: &B,
    build: &BuildSide<B>,
    probe: &DeviceRelation<B::Buf>,
    layout: &OutputLayout,
    phases: &Phases,
) -> Result<TransformedRelation<B>> {
    let payload: Vec<usize> = layout.probe_columns().collect();
    timed(backend, &phases.transform, || {
        transform(
            backend,
            probe,
            &layout.probe_keys,
            &payload,
            &build.encoder,
            build.relation.keys.bits,
        )
    })
}

/// Matches a transformed probe relation (partitioned like the build side, with its encoder)
/// with the build side and materializes the output; it stays on the backend, its columns
/// numbered as in `layout`.
pub fn join_transformed<B: Backend>(
    backend: &B,
    build: &BuildSide<B>,
    probe: TransformedRelation<B>,
    layout: &OutputLayout,
    phases: &Phases,
) -> Result<DeviceRelation<B::Buf>> {
    let matches = timed(backend, &phases.matching, || {
        backend.hash_join(&build.relation.keys, &probe.keys, build.encoder.width())
    })?;
    materialize(backend, build, &probe, &matches, layout, phases)
}

/// The output of matches found between the build side and `probe` (positions in each, as
/// [`Backend::hash_join`] gives them): each column `layout` names gathered from its side.
pub fn materialize<B: Backend>(
    backend: &B,
    build: &BuildSide<B>,
    probe: &TransformedRelation<B>,
    matches: &MatchIndices<B::Buf>,
    layout: &OutputLayout,
    phases: &Phases,
) -> Result<DeviceRelation<B::Buf>> {
    gather_output(
        backend,
        &build.relation.columns,
        &probe.columns,
        matches,
        layout,
        phases,
    )
}

#[cfg(test)]
mod tests {
    use super::partition_bits;

    #[test]
    fn partition_bits_aim_at_a_thousand_rows_per_partition() {
        assert_eq!(partition_bits(0), 1);
        assert_eq!(partition_bits(1000), 1);
        assert_eq!(partition_bits(1 << 20), 10);
        assert_eq!(partition_bits(1 << 26), 16);
        assert_eq!(partition_bits(1 << 30), 16);
    }
}
