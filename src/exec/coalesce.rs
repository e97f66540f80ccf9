//! [`coalesced`]: batches concatenated into fewer, larger ones that own their bytes; [`owned`]:
//! one batch copied into bytes of its own; [`take_rows`]: rows of a batch, columns or none.
//!
//! Batches cut from larger ones (slices, `take`s, a scan's pieces of one table) keep listing
//! the buffers they were cut from; a view column lists every data buffer of its source. Joined
//! or concatenated as they are, such lists add up: thousands of small batches that each list
//! a table's buffers make one array that lists them thousands of times, and every array `take`
//! makes from it copies that list. A grace join's replayed probe rows and build groups, and the
//! build side handed to DataFusion's join in a fallback, are coalesced here first.

use arrow::array::{RecordBatch, RecordBatchOptions, UInt32Array};
use arrow::compute::{concat_batches, take};
use arrow::datatypes::SchemaRef;
use datafusion::common::Result;

use super::view_gather::compact_if;

/// The rows `rows` of `batch`, which may have no column (Arrow's `take_record_batch` needs
/// one to know the row count).
pub fn take_rows(batch: &RecordBatch, rows: &UInt32Array) -> Result<RecordBatch> {
    let columns = (batch.columns().iter())
        .map(|c| take(c.as_ref(), rows, None))
        .collect::<std::result::Result<Vec<_>, _>>()?;
    let options = RecordBatchOptions::new().with_row_count(Some(rows.len()));
    Ok(RecordBatch::try_new_with_options(
        batch.schema(),
        columns,
        &options,
    )?)
}

/// `batch` (a slice, say) copied into buffers of its own, its view columns holding only the
/// bytes their rows use: DataFusion's operators count every buffer of a batch they keep.
pub fn owned(batch: &RecordBatch) -> Result<RecordBatch> {
    let rows = UInt32Array::from_iter_values(0..batch.num_rows() as u32);
    compacted(take_rows(batch, &rows)?)
}

/// `batch` with its view columns' bytes copied into buffers of their own.
fn compacted(batch: RecordBatch) -> Result<RecordBatch> {
    let (schema, columns, rows) = batch.into_parts();
    let columns = (columns.into_iter())
        .map(|c| compact_if(c, |_, _| true))
        .collect();
    let options = RecordBatchOptions::new().with_row_count(Some(rows));
    Ok(RecordBatch::try_new_with_options(
        schema, columns, &options,
    )?)
}

/// `batches` concatenated into batches of about `target` rows (at least), each in buffers of
/// its own: a lone slice, which `concat_batches` would give back as it is, is copied too, and
/// so are the bytes of view columns, which `take` and `concat` leave in the buffers they read
/// (a grace group's routed pieces, each listing every buffer of its input batch, concatenated
/// listed millions: differential seed 5000664).
pub fn coalesced(
    schema: &SchemaRef,
    batches: Vec<RecordBatch>,
    target: usize,
) -> Result<Vec<RecordBatch>> {
    let concat = |run: &[RecordBatch]| -> Result<RecordBatch> {
        match run {
            [one] => owned(one),
            _ => compacted(concat_batches(schema, run)?),
        }
    };
    let mut out = vec![];
    let mut run: Vec<RecordBatch> = vec![];
    let mut rows = 0;
    for batch in batches {
        rows += batch.num_rows();
        run.push(batch);
        if rows >= target {
            out.push(concat(&std::mem::take(&mut run))?);
            rows = 0;
        }
    }
    if !run.is_empty() {
        out.push(concat(&run)?);
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, Int64Array};
    use arrow::datatypes::{DataType, Field, Schema};

    use super::*;

    /// One integer column, `x`.
    fn batch(values: impl IntoIterator<Item = i64>) -> RecordBatch {
        let x = Int64Array::from_iter_values(values);
        RecordBatch::try_from_iter([("x", Arc::new(x) as ArrayRef)]).unwrap()
    }

    #[test]
    fn batches_are_coalesced_into_batches_of_their_own() {
        let parts: Vec<RecordBatch> = (0..10).map(|i| batch(vec![i; 3])).collect();
        let schema = parts[0].schema();
        let out = coalesced(&schema, parts.clone(), 1 << 20).unwrap();
        assert_eq!(out.len(), 1);
        assert_eq!(out[0].num_rows(), 30);
        let out = coalesced(&schema, parts, 7).unwrap();
        let rows: Vec<usize> = out.iter().map(|b| b.num_rows()).collect();
        assert_eq!(rows, vec![9, 9, 9, 3]);
        assert!(coalesced(&schema, vec![], 7).unwrap().is_empty());
        // A lone slice is copied out of the batch it is cut from.
        let big = batch(0..10_000);
        let slice = big.slice(100, 10);
        let out = coalesced(&schema, vec![slice], 7).unwrap();
        assert_eq!(out[0].num_rows(), 10);
        assert!(out[0].get_array_memory_size() < big.get_array_memory_size() / 10);
    }

    #[test]
    fn coalesced_view_columns_list_buffers_of_their_own() {
        use arrow::array::{AsArray, StringViewArray};
        // One view column over several buffers, cut into many small pieces, each listing them
        // all (as a group's routed pieces of an input batch do).
        let mut builder = arrow::array::StringViewBuilder::new().with_fixed_block_size(1024);
        for i in 0..2000 {
            builder.append_value(format!("a string longer than twelve bytes, row {i}"));
        }
        let views: StringViewArray = builder.finish();
        let buffers = views.data_buffers().len();
        assert!(buffers > 20);
        let schema = Arc::new(Schema::new(vec![Field::new(
            "s",
            DataType::Utf8View,
            false,
        )]));
        let whole =
            RecordBatch::try_new(Arc::clone(&schema), vec![Arc::new(views) as ArrayRef]).unwrap();
        let pieces: Vec<RecordBatch> = (0..200).map(|i| whole.slice(i * 10, 10)).collect();
        let out = coalesced(&schema, pieces, 1 << 20).unwrap();
        assert_eq!(out.len(), 1);
        let column = out[0].column(0).as_string_view();
        assert_eq!(
            column.value(1234),
            whole.column(0).as_string_view().value(1234)
        );
        // Before, the pieces' lists were concatenated: 200 times every buffer.
        assert!(
            column.data_buffers().len() < buffers,
            "{}",
            column.data_buffers().len()
        );
        let lone = coalesced(&schema, vec![whole.slice(5, 3)], 7).unwrap();
        assert_eq!(lone[0].column(0).as_string_view().data_buffers().len(), 1);
    }
}
