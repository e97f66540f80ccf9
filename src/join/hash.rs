//! HASH, the streaming engine's join: the build side becomes a [`BucketTable`] once, and every
//! probe chunk is probed against it in probe order, at a cost in proportion to the chunk.
//!
//! ```text
//!  build blocks ─► upload ─► unpack bitmaps, concatenate ─► encode keys ─► partition into
//!                  2^bits buckets of ~2 rows, the needed build columns moving along  (once)
//!
//!  probe chunk ──► upload ─► unpack bitmaps ─► encode keys ─► count pairs per run of probe rows
//!                  ─► scan ─► per output window: write (build position, probe row) pairs ─►
//!                  gather every output column, pack bitmaps ─► download
//! ```
//! A probe key looks only at its own bucket (`bounds[b]..bounds[b+1]` of the bucketed build
//! keys), so neither the probe chunk nor the build side is re-partitioned per chunk. Build
//! columns are gathered from their bucketed (transformed) copies; probe columns from the chunk
//! itself, at non-decreasing rows. Output comes in probe order, and within a probe row in
//! build order; windows of the output (passes) are written one at a time, so the output of one
//! chunk can be larger than device memory.

use std::ops::Range;

use datafusion::common::{Result, internal_err};

use super::layout::{OutputColumn, OutputLayout};
use super::transform::{TransformedRelation, transform};
use crate::backend::{Backend, probe_runs};
use crate::columns::{
    BlockLayout, ColumnKind, DeviceColumn, DeviceRelation, KeyEncoder, bitmap_bytes,
};
use crate::device::HostBlock;

/// Bucket bits for a build side of `rows` rows: about two rows per bucket.
pub fn bucket_bits(rows: usize) -> u32 {
    rows.div_ceil(2)
        .max(2)
        .next_power_of_two()
        .trailing_zeros()
        .min(crate::backend::MAX_PARTITION_BITS - 1)
}

/// The build side ready for probing: encoded keys bucketed, with the build columns the output
/// takes in bucket order.
#[derive(Debug)]
pub struct BucketTable<B: Backend> {
    relation: TransformedRelation<B>,
    encoder: KeyEncoder,
}

impl<B: Backend> BucketTable<B> {
    /// Encodes the build keys of `relation` and partitions them into buckets, moving the build
    /// columns `layout` outputs with them. Enqueued on `backend`.
    pub fn build(
        backend: &B,
        relation: &DeviceRelation<B::Buf>,
        layout: &OutputLayout,
        encoder: KeyEncoder,
    ) -> Result<Self> {
        let payload: Vec<usize> = layout.build_columns().collect();
        let relation = transform(
            backend,
            relation,
            &layout.build_keys,
            &payload,
            &encoder,
            bucket_bits(relation.rows),
        )?;
        Ok(Self { relation, encoder })
    }
}

/// Encodes the probe keys of a chunk (its needed probe columns, by probe column index).
pub fn encode_probe<B: Backend>(
    backend: &B,
    table: &BucketTable<B>,
    chunk: &DeviceRelation<B::Buf>,
    layout: &OutputLayout,
) -> Result<B::Buf> {
    let keys = layout
        .probe_keys
        .iter()
        .map(|&c| {
            let col = chunk.column(c)?;
            Ok((&col.values, col.validity.as_ref()))
        })
        .collect::<Result<Vec<_>>>()?;
    table.encoder.encode(backend, &keys, chunk.rows)
}

/// Counts the pairs of a chunk's encoded probe keys: where each run of [`PROBE_RUN`] probe rows
/// writes, and (last) the chunk's total (`runs + 1` u64 values).
pub fn count<B: Backend>(
    backend: &B,
    table: &BucketTable<B>,
    keys: &B::Buf,
    rows: usize,
) -> Result<B::Buf> {
    backend.bucket_count(&table.relation.keys, keys, rows, table.encoder.width())
}

/// Index of the total in the u64 offsets [`count`] returns.
pub fn total_index(rows: usize) -> usize {
    probe_runs(rows)
}

/// One output column of a pass, ready to download: values (booleans as a packed bitmap) and,
/// if some row may be null, a packed validity bitmap.
#[derive(Debug)]
pub struct PassColumn<Buf> {
    pub kind: ColumnKind,
    pub values: Buf,
    pub validity: Option<Buf>,
}

/// The output rows of one window of a chunk's pairs, on the backend.
#[derive(Debug)]
pub struct PassOutput<Buf> {
    pub rows: usize,
    pub columns: Vec<PassColumn<Buf>>,
}

/// Device bytes one pass of `rows` output rows needs at most (pairs, gathered columns,
/// bitmaps), for output columns of `kinds` (and whether each may hold nulls).
pub fn pass_bytes(kinds: &[(ColumnKind, bool)], rows: usize) -> usize {
    let columns: usize = kinds
        .iter()
        .map(|&(kind, nullable)| {
            let values = rows * kind.width()
                + if kind == ColumnKind::Boolean {
                    bitmap_bytes(rows)
                } else {
                    0
                };
            values
                + if nullable {
                    rows + bitmap_bytes(rows)
                } else {
                    0
                }
        })
        .sum();
    8 * rows + columns + 64 * (kinds.len() + 2)
}

/// Writes the pairs in `window` and materializes every output column for them.
#[allow(clippy::too_many_arguments)]
pub fn materialize<B: Backend>(
    backend: &B,
    table: &BucketTable<B>,
    chunk: &DeviceRelation<B::Buf>,
    keys: &B::Buf,
    offsets: &B::Buf,
    window: Range<u64>,
    layout: &OutputLayout,
) -> Result<PassOutput<B::Buf>> {
    let rows = (window.end - window.start) as usize;
    let mut build_idx = backend.alloc(rows * 4)?;
    let mut probe_idx = backend.alloc(rows * 4)?;
    backend.bucket_write(
        &table.relation.keys,
        keys,
        chunk.rows,
        table.encoder.width(),
        offsets,
        window,
        &mut build_idx,
        &mut probe_idx,
    )?;
    let columns = layout
        .columns
        .iter()
        .map(|c| {
            let (col, idx) = match c {
                OutputColumn::Build(i) => (table.relation.column(*i)?, &build_idx),
                OutputColumn::Probe(i) => (chunk.column(*i)?, &probe_idx),
            };
            let gathered = col.map(rows, |b, w| backend.gather(b, idx, rows, w))?;
            pass_column(backend, gathered)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(PassOutput { rows, columns })
}

/// Packs a gathered column's bitmaps for download.
fn pass_column<B: Backend>(backend: &B, col: DeviceColumn<B::Buf>) -> Result<PassColumn<B::Buf>> {
    let rows = col.rows;
    let values = match col.kind {
        ColumnKind::Boolean => backend.pack_bits(&col.values, rows)?,
        ColumnKind::Fixed(_) => col.values,
    };
    let validity = col
        .validity
        .map(|v| backend.pack_bits(&v, rows))
        .transpose()?;
    Ok(PassColumn {
        kind: col.kind,
        values,
        validity,
    })
}

/// The host layout of a pass's output: its columns for `rows` rows, each with a validity
/// bitmap if it may hold nulls.
pub fn pass_layout(kinds: &[(ColumnKind, bool)], rows: usize) -> BlockLayout {
    BlockLayout::new(kinds.iter().copied(), rows)
}

/// Enqueues the download of a pass into `block` (laid out by [`pass_layout`]); returns, per
/// column, whether its validity bitmap was filled in.
pub fn download_pass<B: Backend>(
    backend: &B,
    pass: &PassOutput<B::Buf>,
    layout: &BlockLayout,
    block: &mut HostBlock,
) -> Result<Vec<bool>> {
    if layout.columns.len() != pass.columns.len() || layout.rows < pass.rows {
        return internal_err!("download_pass: layout does not fit the pass");
    }
    pass.columns
        .iter()
        .zip(&layout.columns)
        .map(|(col, at)| {
            let bytes = at.values_bytes(pass.rows);
            backend.copy_to_host(&col.values, 0, block, at.values, bytes)?;
            match (&col.validity, at.validity) {
                (Some(v), Some(offset)) => {
                    backend.copy_to_host(v, 0, block, offset, bitmap_bytes(pass.rows))?;
                    Ok(true)
                }
                (Some(_), None) => internal_err!("download_pass: nulls without a bitmap"),
                (None, _) => Ok(false),
            }
        })
        .collect()
}

/// Where the output of a chunk with `total` pairs is cut into windows of at most `pass_rows`.
pub fn windows(total: u64, pass_rows: usize) -> impl Iterator<Item = Range<u64>> {
    let step = pass_rows.max(1) as u64;
    (0..total.div_ceil(step)).map(move |i| i * step..((i + 1) * step).min(total))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_hold_about_two_rows() {
        assert_eq!(bucket_bits(0), 1);
        assert_eq!(bucket_bits(4), 1);
        assert_eq!(bucket_bits(5), 2);
        assert_eq!(bucket_bits(1 << 26), 25);
        assert_eq!(bucket_bits(usize::MAX >> 1), 31);
    }

    #[test]
    fn windows_cover_the_output_once() {
        let w: Vec<_> = windows(10, 4).collect();
        assert_eq!(w, vec![0..4, 4..8, 8..10]);
        assert_eq!(windows(0, 4).count(), 0);
    }
}
