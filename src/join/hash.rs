//! HASH, the streaming engine's join: the build side becomes a [`BucketTable`] once, and every
//! probe chunk is probed against it in probe order, at a cost in proportion to the chunk.
//!
//! ```text
//!  build blocks ─► upload ─► unpack bitmaps, concatenate ─► encode keys ─► partition into
//!                  2^bits buckets of ~2 rows, the needed build columns moving along  (once)
//!
//!  probe chunk ──► upload ─► unpack bitmaps ─► encode keys ─► count output rows per run of
//!                  probe rows (marking the build rows matched; hashed keys match only where
//!                  their check bytes agree too) ─► scan ─► per output window:
//!                  write (build position, probe row) pairs ─► gather every output column, pack
//!                  bitmaps ─► download
//!
//!  after the last probe chunk (left, full, left semi, anti and mark joins): select build rows
//!                  by their mark ─► per output window: gather, nulls for the probe side ─►
//!                  download
//! ```
//! What a probe row outputs, and which build rows come out at the end, depend on the join type
//! ([`Emission`](super::Emission)); a missing side's columns are null, and its positions
//! [`NO_ROW`](crate::backend::NO_ROW).
//! A probe key looks only at its own bucket (`bounds[b]..bounds[b+1]` of the bucketed build
//! keys), so neither the probe chunk nor the build side is re-partitioned per chunk. Build
//! columns are gathered from their bucketed (transformed) copies; probe columns from the chunk
//! itself, at non-decreasing rows. Output comes in probe order, and within a probe row in
//! build order; windows of the output (passes) are written one at a time, so the output of one
//! chunk can be larger than device memory.

use std::ops::Range;
use std::sync::Arc;

use datafusion::common::{Result, internal_err};

use super::checked::CheckedKeys;
use super::layout::{OutputColumn, OutputLayout};
use super::transform::{TransformedRelation, encode_keys, transform};
use crate::backend::{Backend, FilterInput, Keep, KeyCheck, ProbeEmit, probe_runs};
use crate::columns::{
    BlockLayout, ColumnKind, DeviceColumn, DeviceRelation, KeyEncoder, bitmap_bytes,
};
use crate::device::HostBlock;
use crate::filter::PairFilter;

/// Bucket bits for a build side of `rows` rows: about two rows per bucket.
pub fn bucket_bits(rows: usize) -> u32 {
    rows.div_ceil(2)
        .max(2)
        .next_power_of_two()
        .trailing_zeros()
        .min(crate::backend::MAX_PARTITION_BITS - 1)
}

/// Bucket bits of the table of `rows` build rows keyed by `encoder`: for DIRECT (a direct
/// encoder) those that give each key value a bucket of its own, else [`bucket_bits`].
pub fn table_bits(encoder: &KeyEncoder, rows: usize) -> u32 {
    encoder.direct_bits().unwrap_or_else(|| bucket_bits(rows))
}

/// The build side ready for probing: encoded keys bucketed, with the build columns the output
/// takes in bucket order.
#[derive(Debug)]
pub struct BucketTable<B: Backend> {
    relation: TransformedRelation<B>,
    encoder: KeyEncoder,
    /// The build and probe columns of check bytes, where hashed keys are checked.
    check: Option<CheckedKeys>,
    /// The residual filter the probe evaluates, if compiled for the device.
    filter: Option<Arc<PairFilter>>,
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
        let mut payload: Vec<usize> = layout.build_columns().collect();
        // Check bytes and the filter's columns move with the keys, into bucket order.
        payload.extend(layout.check.iter().flat_map(CheckedKeys::build_columns));
        payload.extend(layout.build_filter_columns());
        let relation = transform(
            backend,
            relation,
            &layout.build_keys,
            &payload,
            &encoder,
            table_bits(&encoder, relation.rows),
        )?;
        Ok(Self {
            relation,
            encoder,
            check: layout.check,
            filter: layout.filter.clone(),
        })
    }

    /// Build rows in the table.
    pub fn rows(&self) -> usize {
        self.relation.rows()
    }

    /// Encodes `rows` probe keys (one column's values and validity per build key column) as
    /// the table's build keys are encoded.
    pub fn encode_keys(
        &self,
        backend: &B,
        keys: &[(&B::Buf, Option<&B::Buf>)],
        rows: usize,
    ) -> Result<B::Buf> {
        self.encoder.encode(backend, keys, rows)
    }

    /// The bucketed keys and build columns.
    pub(super) fn relation(&self) -> &TransformedRelation<B> {
        &self.relation
    }

    /// Whether a probe of the table compares encoded keys alone (no check bytes, no filter).
    pub(super) fn keys_alone(&self) -> bool {
        self.check.is_none() && self.filter.is_none()
    }

    /// How the table's keys are encoded.
    pub(super) fn encoder(&self) -> &KeyEncoder {
        &self.encoder
    }

    /// The check bytes of the table and of `chunk`, where keys are checked.
    fn check<'a>(
        &'a self,
        chunk: &'a DeviceRelation<B::Buf>,
    ) -> Result<Option<KeyCheck<'a, B::Buf>>> {
        let Some(check) = self.check else {
            return Ok(None);
        };
        Ok(Some(KeyCheck {
            build: (check.build_columns())
                .map(|c| Ok(&self.relation.column(c)?.values))
                .collect::<Result<_>>()?,
            probe: (check.probe_columns())
                .map(|c| Ok(&chunk.column(c)?.values))
                .collect::<Result<_>>()?,
        }))
    }

    /// The compiled filter with its columns: the table's (bucket order) and `chunk`'s.
    fn filter<'a>(
        &'a self,
        chunk: &'a DeviceRelation<B::Buf>,
    ) -> Result<Option<FilterInput<'a, B::Buf>>> {
        let Some(filter) = &self.filter else {
            return Ok(None);
        };
        let column = |col: &'a DeviceColumn<B::Buf>| (&col.values, col.validity.as_ref());
        Ok(Some(FilterInput {
            filter,
            build: (filter.build_columns.iter())
                .map(|&(c, _)| Ok(column(self.relation.column(c)?)))
                .collect::<Result<_>>()?,
            probe: (filter.probe_columns.iter())
                .map(|&(c, _)| Ok(column(chunk.column(c)?)))
                .collect::<Result<_>>()?,
        }))
    }
}

/// Where the rows of a chunk's output come from.
#[derive(Debug)]
pub enum Source<'a, Buf> {
    /// A probe chunk: its columns and encoded keys, and what each of its rows emits.
    Probe {
        chunk: &'a DeviceRelation<Buf>,
        keys: &'a Buf,
        emit: ProbeEmit,
    },
    /// Build rows alone, after the last probe chunk: those `keep` keeps by their mark in
    /// `visited` (a byte per build row, set when a probe row matched it).
    Build { visited: &'a Buf, keep: Keep },
}

impl<Buf> Clone for Source<'_, Buf> {
    fn clone(&self) -> Self {
        *self
    }
}

impl<Buf> Copy for Source<'_, Buf> {}

impl<Buf> Source<'_, Buf> {
    /// Rows the source counts over: probe rows, or build rows.
    fn rows(&self, table_rows: usize) -> usize {
        match self {
            Self::Probe { chunk, .. } => chunk.rows,
            Self::Build { .. } => table_rows,
        }
    }
}

/// Encodes the probe keys of a chunk (its needed probe columns, by probe column index).
pub fn encode_probe<B: Backend>(
    backend: &B,
    table: &BucketTable<B>,
    chunk: &DeviceRelation<B::Buf>,
    layout: &OutputLayout,
) -> Result<B::Buf> {
    encode_keys(backend, chunk, &layout.probe_keys, &table.encoder)
}

/// Counts the output rows of a source: where each run of [`PROBE_RUN`] rows writes, and (last)
/// the total (`runs + 1` u64 values). Probing marks the build rows matched in `visited`.
///
/// [`PROBE_RUN`]: crate::backend::PROBE_RUN
pub fn count<B: Backend>(
    backend: &B,
    table: &BucketTable<B>,
    source: Source<'_, B::Buf>,
    visited: Option<&mut B::Buf>,
) -> Result<B::Buf> {
    match source {
        Source::Probe { chunk, keys, emit } => backend.bucket_count(
            &table.relation.keys,
            keys,
            chunk.rows,
            table.encoder.width(),
            emit,
            table.check(chunk)?.as_ref(),
            table.filter(chunk)?.as_ref(),
            visited,
        ),
        Source::Build { visited, keep } => backend.select_count(visited, table.rows(), keep),
    }
}

/// Index of the total in the u64 offsets [`count`] returns for `source`.
pub fn total_index<B: Backend>(table: &BucketTable<B>, source: &Source<'_, B::Buf>) -> usize {
    probe_runs(source.rows(table.rows()))
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

/// Writes the output rows of `source` in `window` and materializes every output column for them.
pub fn materialize<B: Backend>(
    backend: &B,
    table: &BucketTable<B>,
    source: Source<'_, B::Buf>,
    offsets: &B::Buf,
    window: Range<u64>,
    layout: &OutputLayout,
) -> Result<PassOutput<B::Buf>> {
    let rows = (window.end - window.start) as usize;
    let mut build_idx = backend.alloc(rows * 4)?;
    let probe = match source {
        Source::Probe { chunk, keys, emit } => {
            let mut probe_idx = backend.alloc(rows * 4)?;
            backend.bucket_write(
                &table.relation.keys,
                keys,
                chunk.rows,
                table.encoder.width(),
                emit,
                table.check(chunk)?.as_ref(),
                table.filter(chunk)?.as_ref(),
                offsets,
                window,
                &mut build_idx,
                &mut probe_idx,
            )?;
            Some((chunk, probe_idx))
        }
        Source::Build { visited, keep } => {
            backend.select_write(visited, table.rows(), keep, offsets, window, &mut build_idx)?;
            None
        }
    };
    // Whether a row may lack its build side; if so, which rows have one (computed once for
    // the pass: the validity of build columns that have none, and a right mark join's mark).
    let build_may_miss = matches!(
        source,
        Source::Probe { emit, .. } if emit != ProbeEmit::Pairs && emit != ProbeEmit::Matched
    );
    let takes_build = layout
        .columns
        .iter()
        .any(|c| matches!(c, OutputColumn::Build(_) | OutputColumn::Mark));
    // A probe pass's mark is whether the row has a build row (with a residual filter, only a
    // candidate's; the host decides the mark).
    let probe_mark =
        matches!(source, Source::Probe { .. }) && layout.columns.contains(&OutputColumn::Mark);
    let present = if (build_may_miss && takes_build) || probe_mark {
        Some(backend.present(&build_idx, rows)?)
    } else {
        None
    };
    let columns = layout
        .columns
        .iter()
        .zip(layout.schema.fields())
        .map(|(c, field)| {
            let gathered = match (c, &probe) {
                (OutputColumn::Build(i), _) => {
                    let col = table.relation.column(*i)?;
                    let out = col.map(rows, |b, w| backend.gather(b, &build_idx, rows, w))?;
                    // A gathered validity is 0 (null) at NO_ROW; a column without one takes
                    // the pass's.
                    let missing = present.as_ref().filter(|_| field.is_nullable());
                    return pass_column(backend, out, missing);
                }
                (OutputColumn::Probe(i), Some((chunk, probe_idx))) => {
                    let col = chunk.column(*i)?;
                    col.map(rows, |b, w| backend.gather(b, probe_idx, rows, w))?
                }
                (OutputColumn::Probe(i), None) => {
                    // Build rows alone: the probe side is null.
                    let Some(kind) = ColumnKind::of(field.data_type()) else {
                        return internal_err!("output column {i} has no device kind");
                    };
                    null_column(backend, kind, rows)?
                }
                (OutputColumn::Mark, Some(_)) => {
                    let Some(present) = &present else {
                        return internal_err!("a mark of probe rows that all have a match");
                    };
                    return Ok(PassColumn {
                        kind: ColumnKind::Boolean,
                        values: backend.pack_bits(present, rows)?,
                        validity: None,
                    });
                }
                (OutputColumn::BuildRow, _) => position_column(backend, Some(&build_idx), rows)?,
                (OutputColumn::ProbeRow, Some((_, probe_idx))) => {
                    position_column(backend, Some(probe_idx), rows)?
                }
                (OutputColumn::ProbeRow, None) => position_column(backend, None, rows)?,
                (OutputColumn::Mark, None) => {
                    let Source::Build { visited, .. } = source else {
                        return internal_err!("a mark without marks");
                    };
                    DeviceColumn {
                        kind: ColumnKind::Boolean,
                        values: backend.gather(visited, &build_idx, rows, 1)?,
                        validity: None,
                        rows,
                    }
                }
            };
            pass_column(backend, gathered, None)
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(PassOutput { rows, columns })
}

/// A UInt32 column of positions: a copy of `idx`, or `NO_ROW` everywhere.
fn position_column<B: Backend>(
    backend: &B,
    idx: Option<&B::Buf>,
    rows: usize,
) -> Result<DeviceColumn<B::Buf>> {
    let mut values = backend.alloc(rows * 4)?;
    match idx {
        Some(idx) => backend.copy_within(idx, 0, &mut values, 0, rows * 4)?,
        // NO_ROW is all ones.
        None => backend.fill(&mut values, 0xFF)?,
    }
    Ok(DeviceColumn {
        kind: ColumnKind::Fixed(4),
        values,
        validity: None,
        rows,
    })
}

/// A column of `rows` nulls.
fn null_column<B: Backend>(
    backend: &B,
    kind: ColumnKind,
    rows: usize,
) -> Result<DeviceColumn<B::Buf>> {
    let mut values = backend.alloc(rows * kind.width())?;
    backend.fill(&mut values, 0)?;
    let mut validity = backend.alloc(rows)?;
    backend.fill(&mut validity, 0)?;
    Ok(DeviceColumn {
        kind,
        values,
        validity: Some(validity),
        rows,
    })
}

/// Packs a gathered column's bitmaps for download; a column without validity takes
/// `otherwise` (validity bytes) if given.
fn pass_column<B: Backend>(
    backend: &B,
    col: DeviceColumn<B::Buf>,
    otherwise: Option<&B::Buf>,
) -> Result<PassColumn<B::Buf>> {
    let rows = col.rows;
    let values = match col.kind {
        ColumnKind::Boolean => backend.pack_bits(&col.values, rows)?,
        ColumnKind::Fixed(_) => col.values,
    };
    let validity = col
        .validity
        .as_ref()
        .or(otherwise)
        .map(|v| backend.pack_bits(v, rows))
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
