//! [`SideColumns`]: the columns a join stages from one of its inputs — some of the input's own
//! fixed-width columns, and columns the host computes:
//!
//! - `__key_hash` ([`KeyHash`]), where keys are hashed, followed by its words of check bytes
//!   (`__key_check`, `__key_check1`, ...) where hashed keys are checked on the device. Hashes verified on the host are appended to each batch as
//!   it arrives; checked keys' length classes (in the hash column, which the device hashes) and
//!   check bytes are computed straight into the staging block ([`StageColumn::CheckedKey`]),
//!   and no batch holds them;
//! - `__row`, made while staging: on the build side each row's place among all build rows (in
//!   the order they were collected), which the device carries through its transform so that
//!   the host can gather the columns the device does not hold ([`HostGather`]); a side with no
//!   column to stage at all (a cross join over strings) stages it only to count its rows.
//!
//! Column indices past the input's own address these columns, so a staged side is described
//! by indices alone, as before.
//!
//! [`HostGather`]: super::gather::HostGather

use std::sync::Arc;

use arrow::array::{Array, RecordBatch, UInt32Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::{Result, internal_err};

use super::device_views::{VIEW_BYTES, carried_as_views};
use super::gather::HostBuild;
use super::key_hash::KeyHash;
use super::stager::StageColumn;
use crate::columns::{ColumnKind, KeyRange};

/// What a join stages from one input.
#[derive(Debug, Clone)]
pub struct SideColumns {
    /// The input's schema with the computed columns after its own.
    pub schema: SchemaRef,
    /// Columns of the input itself.
    width: usize,
    /// The key hash over these key columns, at index `width`.
    hash: Option<(KeyHash, Vec<usize>)>,
    row: Option<usize>,
}

impl SideColumns {
    /// Where the row column of an input of `width` columns goes, after the columns `hash`
    /// computes.
    pub fn row_index(width: usize, hash: Option<&KeyHash>) -> usize {
        width + hash.map_or(0, |h| h.fields().len())
    }

    /// The columns of `input`, with the columns `hash` computes over its key columns and a row
    /// column.
    pub fn new(input: &SchemaRef, hash: Option<(KeyHash, Vec<usize>)>, row: bool) -> Self {
        let width = input.fields().len();
        let mut fields: Vec<Field> = input.fields().iter().map(|f| f.as_ref().clone()).collect();
        if let Some((h, _)) = &hash {
            fields.extend(h.fields());
        }
        let row = row.then(|| Self::row_index(width, hash.as_ref().map(|h| &h.0)));
        if row.is_some() {
            fields.push(Field::new("__row", DataType::UInt32, false));
        }
        Self {
            schema: Arc::new(Schema::new(fields)),
            width,
            hash,
            row,
        }
    }

    /// The key hash, where it is checked on the device (computed while staging).
    fn checked(&self) -> Option<(&KeyHash, usize)> {
        match &self.hash {
            Some((hash, keys)) if hash.checked() => Some((hash, keys[0])),
            _ => None,
        }
    }

    /// How column `c` is staged (its kind on the device and whether it may hold nulls), `None`
    /// if the device cannot carry it. A checked key's hash column is staged as its length
    /// classes, a byte a row, which the device hashes; a view column as its 16-byte views
    /// ([`BuildViews`](super::device_views::BuildViews)).
    pub fn staged_kind(&self, c: usize) -> Option<(ColumnKind, bool)> {
        let field = self.schema.fields().get(c)?;
        let kind = match self.checked() {
            Some(_) if c == self.width => ColumnKind::Fixed(1),
            _ if carried_as_views(field.data_type()) => ColumnKind::Fixed(VIEW_BYTES as usize),
            _ => ColumnKind::of(field.data_type())?,
        };
        Some((kind, field.is_nullable()))
    }

    /// An input batch as the join holds it: with its key hash, if keys are hashed and verified
    /// on the host (checked keys are hashed while staging).
    pub fn arrive(&self, batch: RecordBatch) -> Result<RecordBatch> {
        let Some((hash, keys)) = self.hash.as_ref().filter(|(h, _)| !h.checked()) else {
            return Ok(batch);
        };
        let mut columns = batch.columns().to_vec();
        columns.extend(hash.columns(&batch, keys)?);
        let mut fields: Vec<Field> = batch
            .schema()
            .fields()
            .iter()
            .map(|f| f.as_ref().clone())
            .collect();
        fields.extend(hash.fields());
        Ok(RecordBatch::try_new(
            Arc::new(Schema::new(fields)),
            columns,
        )?)
    }

    /// Widens `ranges` (one per key column `keys` of this side's schema) to a held batch's
    /// keys. A checked key's hashes are not computed yet: any non-null key (or any key, if
    /// nulls are equal) widens its range to every hash it can have.
    pub fn update_ranges(
        &self,
        ranges: &mut [KeyRange],
        batch: &RecordBatch,
        keys: &[usize],
    ) -> Result<()> {
        if let Some((hash, key)) = self.checked() {
            let key = batch.column(key);
            if hash.nulls_equal() || key.logical_null_count() < key.len() {
                let (lo, hi) = hash.checked_range();
                ranges[0].include(lo, hi);
            }
            return Ok(());
        }
        for (range, &k) in ranges.iter_mut().zip(keys) {
            range.update(batch.column(k))?;
        }
        Ok(())
    }

    /// The length of a held batch's longest key, where keys are checked (0 otherwise).
    pub fn longest_key(&self, batch: &RecordBatch) -> Result<usize> {
        match self.checked() {
            Some((_, key)) => super::key_check::longest_key(batch.column(key)),
            None => Ok(0),
        }
    }

    /// The input's own columns of a batch the join holds.
    pub fn input_part(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        if batch.num_columns() == self.width {
            return Ok(batch.clone());
        }
        Ok(batch.project(&(0..self.width).collect::<Vec<_>>())?)
    }

    /// Columns `indices` of a held batch whose first row is row `first_row` of its side, as
    /// they are staged; view columns by `build`, the build side's buffers (a view column
    /// staged without them is an error).
    pub fn staged(
        &self,
        batch: &RecordBatch,
        indices: &[usize],
        first_row: usize,
        build: Option<&HostBuild>,
    ) -> Result<Vec<StageColumn>> {
        let checked = self.checked();
        let hash_at = self.width;
        let words = checked.map_or(0, |(h, _)| h.check_words());
        let check_at = hash_at + 1..hash_at + 1 + words;
        indices
            .iter()
            .map(|&c| {
                Ok(match (self.row, checked) {
                    (Some(r), _) if r == c => {
                        let first = first_row as u32;
                        let rows = batch.num_rows() as u32;
                        StageColumn::Array(Arc::new(UInt32Array::from_iter_values(
                            (0..rows).map(|i| first.wrapping_add(i)),
                        )))
                    }
                    (_, Some((hash, key))) if c == hash_at => {
                        // The words are staged as consecutive columns of the block.
                        let at = |c: usize| indices.iter().position(|&i| i == c);
                        let first = at(check_at.start);
                        let consecutive = check_at
                            .clone()
                            .zip(first.into_iter().flat_map(|f| f..))
                            .all(|(c, block)| indices.get(block) == Some(&c));
                        let (Some(check), true) = (first, consecutive) else {
                            return internal_err!("a checked key staged without its check bytes");
                        };
                        StageColumn::CheckedKey {
                            key: Arc::clone(batch.column(key)),
                            hash: hash.clone(),
                            check,
                        }
                    }
                    (_, Some(_)) if check_at.contains(&c) => {
                        if !indices.contains(&hash_at) {
                            return internal_err!("check bytes staged without their key's hashes");
                        }
                        StageColumn::CheckBytes
                    }
                    _ if carried_as_views(batch.column(c).data_type()) => {
                        let array = batch.column(c);
                        match build.and_then(|b| b.staged_views(c, array, first_row)) {
                            Some(views) => StageColumn::Array(views?),
                            None => {
                                return internal_err!("view column {c} staged without its buffers");
                            }
                        }
                    }
                    _ => StageColumn::Array(Arc::clone(batch.column(c))),
                })
            })
            .collect()
    }
}
