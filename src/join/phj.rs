//! PHJ-OM: partitioned hash join with gather from transformed relations (Wu et al., VLDB 2024).
//!
//! ```text
//!  build batches ─► upload ─► encode keys ─► partition keys ─► scatter every needed column
//!                                            (2^bits parts)     by the same permutation
//!                                                  │  once per query, shared by partitions
//!  probe chunk ───► upload ─► encode keys ─► partition keys ─► scatter columns
//!                                                  │
//!                     hash_join (count → scan → write): pairs of positions in the
//!                     partitioned build and probe relations, clustered by partition
//!                                                  │
//!                     gather each output column from its partitioned column ─► download
//! ```
//! Because every column is partitioned with its keys, the gathers read neighbouring rows
//! (clustered), which is what makes materialization cheap on a GPU.

use std::collections::HashMap;

use arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions};
use arrow::datatypes::SchemaRef;
use datafusion::common::Result;

use super::phases::{Phases, timed};
use crate::backend::{Backend, Partitioned};
use crate::columns::{DeviceColumn, KeyEncoder, download_column, upload_column};

/// Build rows per partition the partitioning aims for (half a match-finding chunk).
const ROWS_PER_PARTITION: usize = 1024;

/// Partition bits for a build side of `rows` rows: about [`ROWS_PER_PARTITION`] rows per
/// partition, between 1 and 16 bits (two 8-bit radix passes).
pub fn partition_bits(rows: usize) -> u32 {
    let parts = rows.div_ceil(ROWS_PER_PARTITION).max(2);
    parts.next_power_of_two().trailing_zeros().clamp(1, 16)
}

/// Where an output column comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OutputColumn {
    Build(usize),
    Probe(usize),
}

/// The output of a join: its schema and, per column, its source.
#[derive(Debug, Clone)]
pub struct OutputLayout {
    pub schema: SchemaRef,
    pub columns: Vec<OutputColumn>,
    pub build_keys: Vec<usize>,
    pub probe_keys: Vec<usize>,
}

impl OutputLayout {
    fn build_columns(&self) -> impl Iterator<Item = usize> + '_ {
        self.columns.iter().filter_map(|c| match c {
            OutputColumn::Build(i) => Some(*i),
            OutputColumn::Probe(_) => None,
        })
    }

    fn probe_columns(&self) -> impl Iterator<Item = usize> + '_ {
        self.columns.iter().filter_map(|c| match c {
            OutputColumn::Probe(i) => Some(*i),
            OutputColumn::Build(_) => None,
        })
    }
}

/// A relation on a backend: its uploaded columns by index, and its partitioned keys.
struct Relation<B: Backend> {
    keys: Partitioned<B::Buf>,
    columns: HashMap<usize, DeviceColumn<B::Buf>>,
}

/// Uploads the columns `needed` of `batches`, encodes and partitions the keys, and partitions
/// every column in `payload` with them.
fn transform<B: Backend>(
    backend: &B,
    batches: &[RecordBatch],
    keys: &[usize],
    payload: &[usize],
    encoder: &KeyEncoder,
    bits: u32,
    phases: &Phases,
) -> Result<Relation<B>> {
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    let mut needed: Vec<usize> = keys.iter().chain(payload).copied().collect();
    needed.sort_unstable();
    needed.dedup();
    let uploaded = timed(backend, &phases.upload, || {
        needed
            .iter()
            .map(|&c| {
                let arrays: Vec<&ArrayRef> = batches.iter().map(|b| b.column(c)).collect();
                Ok((c, upload_column(backend, &arrays)?))
            })
            .collect::<Result<HashMap<_, _>>>()
    })?;
    timed(backend, &phases.transform, || {
        let key_bufs: Vec<_> = keys
            .iter()
            .map(|c| (&uploaded[c].values, uploaded[c].validity.as_ref()))
            .collect();
        let encoded = encoder.encode(backend, &key_bufs, rows)?;
        let parts = backend.partition(&encoded, rows, encoder.width(), bits)?;
        let columns = payload
            .iter()
            .map(|&c| {
                Ok((
                    c,
                    uploaded[&c].map(rows, |b, w| backend.gather(b, &parts.src, rows, w))?,
                ))
            })
            .collect::<Result<HashMap<_, _>>>()?;
        Ok(Relation {
            keys: parts,
            columns,
        })
    })
}

/// The build side on a backend, partitioned once and shared by every probe chunk.
pub struct BuildSide<B: Backend> {
    relation: Relation<B>,
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
        let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
        let payload: Vec<usize> = layout.build_columns().collect();
        let relation = transform(
            backend,
            batches,
            &layout.build_keys,
            &payload,
            &encoder,
            partition_bits(rows),
            phases,
        )?;
        Ok(Self { relation, encoder })
    }

    /// Rows of the build side.
    pub fn rows(&self) -> usize {
        self.relation.keys.rows
    }
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
    let bits = build.relation.keys.bits;
    let probe = transform(
        backend,
        probe,
        &layout.probe_keys,
        &payload,
        &build.encoder,
        bits,
        phases,
    )?;
    let matches = timed(backend, &phases.matching, || {
        backend.hash_join(&build.relation.keys, &probe.keys, build.encoder.width())
    })?;
    let rows = matches.len;
    let gathered = timed(backend, &phases.materialize, || {
        layout
            .columns
            .iter()
            .map(|c| {
                let (col, idx) = match c {
                    OutputColumn::Build(i) => (&build.relation.columns[i], &matches.build),
                    OutputColumn::Probe(i) => (&probe.columns[i], &matches.probe),
                };
                col.map(rows, |b, w| backend.gather(b, idx, rows, w))
            })
            .collect::<Result<Vec<_>>>()
    })?;
    drop(probe);
    drop(matches);
    let batch_rows = batch_rows.max(1);
    let columns = timed(backend, &phases.download, || {
        gathered
            .iter()
            .zip(layout.schema.fields())
            .map(|(col, field)| download_column(backend, col, field.data_type(), batch_rows))
            .collect::<Result<Vec<_>>>()
    })?;
    // Each column arrives as one array per batch; deal them out batch by batch.
    let mut columns: Vec<_> = columns.into_iter().map(Vec::into_iter).collect();
    (0..rows)
        .step_by(batch_rows)
        .map(|lo| {
            let arrays: Vec<ArrayRef> = columns.iter_mut().filter_map(Iterator::next).collect();
            let options = RecordBatchOptions::new().with_row_count(Some(batch_rows.min(rows - lo)));
            Ok(RecordBatch::try_new_with_options(
                layout.schema.clone(),
                arrays,
                &options,
            )?)
        })
        .collect()
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
