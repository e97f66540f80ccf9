//! [`DeviceRelation`]: some columns of a relation on a backend, by column index — uploaded from
//! Arrow batches, produced by a join, downloaded as Arrow batches. A join's output stays a
//! `DeviceRelation` until it is downloaded, so joins can be chained on the device.

use std::collections::HashMap;

use arrow::array::{ArrayRef, RecordBatch, RecordBatchOptions};
use arrow::datatypes::SchemaRef;
use datafusion::common::{Result, internal_err};

use super::fixed::{DeviceColumn, download_column, upload_column};
use crate::backend::Backend;

/// Columns of one relation on a backend, all of `rows` rows.
#[derive(Debug)]
pub struct DeviceRelation<B> {
    pub columns: HashMap<usize, DeviceColumn<B>>,
    pub rows: usize,
}

impl<B> DeviceRelation<B> {
    /// The column with index `c`, or an internal error if it is not here.
    pub fn column(&self, c: usize) -> Result<&DeviceColumn<B>> {
        match self.columns.get(&c) {
            Some(col) => Ok(col),
            None => internal_err!("DeviceRelation: no column {c}"),
        }
    }

    /// Bytes these columns take in Arrow's host layout (bit-packed validity and booleans): what
    /// an upload or a download of them moves.
    pub fn host_bytes(&self) -> usize {
        self.columns.values().map(DeviceColumn::host_bytes).sum()
    }
}

impl<Buf> DeviceRelation<Buf> {
    /// Uploads the columns `needed` of `batches` (each batch of one schema).
    pub fn upload<B: Backend<Buf = Buf>>(
        backend: &B,
        batches: &[RecordBatch],
        needed: &[usize],
    ) -> Result<Self> {
        let rows = batches.iter().map(|b| b.num_rows()).sum();
        let columns = needed
            .iter()
            .map(|&c| {
                let arrays: Vec<&ArrayRef> = batches.iter().map(|b| b.column(c)).collect();
                Ok((c, upload_column(backend, &arrays)?))
            })
            .collect::<Result<_>>()?;
        Ok(Self { columns, rows })
    }

    /// Downloads columns `0..schema.fields().len()` as batches of at most `batch_rows` rows.
    pub fn download<B: Backend<Buf = Buf>>(
        &self,
        backend: &B,
        schema: &SchemaRef,
        batch_rows: usize,
    ) -> Result<Vec<RecordBatch>> {
        let batch_rows = batch_rows.max(1);
        let columns = schema
            .fields()
            .iter()
            .enumerate()
            .map(|(c, field)| {
                download_column(backend, self.column(c)?, field.data_type(), batch_rows)
            })
            .collect::<Result<Vec<_>>>()?;
        // Each column arrives as one array per batch; deal them out batch by batch.
        let mut columns: Vec<_> = columns.into_iter().map(Vec::into_iter).collect();
        let rows = self.rows;
        (0..rows)
            .step_by(batch_rows)
            .map(|lo| {
                let arrays: Vec<ArrayRef> = columns.iter_mut().filter_map(Iterator::next).collect();
                let options =
                    RecordBatchOptions::new().with_row_count(Some(batch_rows.min(rows - lo)));
                Ok(RecordBatch::try_new_with_options(
                    schema.clone(),
                    arrays,
                    &options,
                )?)
            })
            .collect()
    }
}
