//! [`SideColumns`]: the columns a join stages from one of its inputs — some of the input's own
//! fixed-width columns, and up to three columns the host computes:
//!
//! - `__key_hash` ([`KeyHash`]), appended to each batch as it arrives, where keys are hashed,
//!   followed by `__key_check` where hashed keys are checked on the device;
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

use arrow::array::{ArrayRef, RecordBatch, UInt32Array};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef};
use datafusion::common::Result;

use super::key_hash::KeyHash;

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

    /// An input batch as the join holds it: with its key hash (and check bytes), if keys are
    /// hashed.
    pub fn arrive(&self, batch: RecordBatch) -> Result<RecordBatch> {
        let Some((hash, keys)) = &self.hash else {
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

    /// Whether a held batch has a key longer than the check bytes, where keys are checked.
    pub fn has_long_key(&self, batch: &RecordBatch) -> Result<bool> {
        match &self.hash {
            Some((hash, _)) if hash.checked() => {
                super::key_check::has_long_key(batch.column(self.width))
            }
            _ => Ok(false),
        }
    }

    /// The input's own columns of a batch the join holds.
    pub fn input_part(&self, batch: &RecordBatch) -> Result<RecordBatch> {
        if batch.num_columns() == self.width {
            return Ok(batch.clone());
        }
        Ok(batch.project(&(0..self.width).collect::<Vec<_>>())?)
    }

    /// Columns `indices` of a held batch whose first row is row `first_row` of its side.
    pub fn staged(
        &self,
        batch: &RecordBatch,
        indices: &[usize],
        first_row: usize,
    ) -> Vec<ArrayRef> {
        indices
            .iter()
            .map(|&c| match self.row {
                Some(r) if r == c => {
                    let first = first_row as u32;
                    let rows = batch.num_rows() as u32;
                    Arc::new(UInt32Array::from_iter_values(
                        (0..rows).map(|i| first.wrapping_add(i)),
                    )) as ArrayRef
                }
                _ => Arc::clone(batch.column(c)),
            })
            .collect()
    }
}
