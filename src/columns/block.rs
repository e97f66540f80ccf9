//! Arrow columns laid out in a host block: the unit the streaming engine copies over PCIe.
//!
//! A [`BlockLayout`] places the columns of up to `rows` rows in one block, each region 64-byte
//! aligned: a column's values (`rows` values of its width, or an LSB-first bitmap for booleans),
//! then, if the column may hold nulls, its validity bitmap (whole u32 words, as `pack_bits`
//! writes them). Probe batches are copied into such a block as they arrive ([`stage_column`],
//! or [`stage_packed`] for an integer column of a narrow range: [`Frame`]),
//! and join output downloaded into one becomes Arrow arrays without another copy
//! ([`block_arrays`], [`BlockRows`]). Each array's buffers span only its own rows' bytes of the
//! block, so DataFusion's memory accounting, which counts an array's whole buffers, counts each
//! batch handed out at its own size rather than the block's. An operator that keeps batches
//! for long copies them off the block ([`copy_off`]), so that its page goes back to its pool.
//!
//! ```text
//!  block:  | k values (rows × 4) | k validity | p values (rows × 8) | p validity | ...
//! ```

use std::ptr::NonNull;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayData, ArrayRef, BooleanArray, MutableArrayData, RecordBatch, RecordBatchOptions,
    make_array,
};
use arrow::buffer::{BooleanBuffer, Buffer, NullBuffer};
use arrow::datatypes::{DataType, SchemaRef};
use arrow::util::bit_mask::set_bits;
use datafusion::common::{Result, internal_err};

use super::fixed::{ColumnKind, value_bytes};
use super::frame::{Frame, pack_values, widen_in_place};
use super::stream_copy::stream_copy;

/// Alignment of every region.
const ALIGN: usize = 64;

fn align(n: usize) -> usize {
    n.div_ceil(ALIGN) * ALIGN
}

/// Bytes of a validity (or boolean) bitmap of `rows` bits, in whole u32 words.
pub fn bitmap_bytes(rows: usize) -> usize {
    rows.div_ceil(32) * 4
}

/// One column's regions in a block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockColumn {
    pub kind: ColumnKind,
    /// Offset of the values.
    pub values: usize,
    /// Offset of the validity bitmap, if the column may hold nulls.
    pub validity: Option<usize>,
}

impl BlockColumn {
    /// Bytes of the values of `rows` rows.
    pub fn values_bytes(&self, rows: usize) -> usize {
        match self.kind {
            ColumnKind::Fixed(w) => rows * w,
            ColumnKind::Boolean => bitmap_bytes(rows),
        }
    }
}

/// Where each column of up to `rows` rows lies in a block.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockLayout {
    pub columns: Vec<BlockColumn>,
    pub rows: usize,
    pub bytes: usize,
}

impl BlockLayout {
    /// Lays out columns of the given kinds (and whether each may hold nulls) for `rows` rows.
    pub fn new(columns: impl IntoIterator<Item = (ColumnKind, bool)>, rows: usize) -> Self {
        let mut at = 0;
        let columns = columns
            .into_iter()
            .map(|(kind, nullable)| {
                let mut col = BlockColumn {
                    kind,
                    values: at,
                    validity: None,
                };
                at += align(col.values_bytes(rows));
                if nullable {
                    col.validity = Some(at);
                    at += align(bitmap_bytes(rows));
                }
                col
            })
            .collect();
        Self {
            columns,
            rows,
            bytes: at.max(ALIGN),
        }
    }

    /// Bytes per row the layout takes (rounding aside).
    pub fn row_bytes(kinds: impl IntoIterator<Item = (ColumnKind, bool)>) -> usize {
        kinds
            .into_iter()
            .map(|(kind, nullable)| {
                let values = match kind {
                    ColumnKind::Fixed(w) => w * 8,
                    ColumnKind::Boolean => 1,
                };
                (values + usize::from(nullable)).div_ceil(8)
            })
            .sum()
    }
}

/// Sets bits `offset..offset + len` of `bitmap`.
fn set_ones(bitmap: &mut [u8], offset: usize, len: usize) {
    let mut i = offset;
    let end = offset + len;
    while i < end && !i.is_multiple_of(8) {
        bitmap[i / 8] |= 1 << (i % 8);
        i += 1;
    }
    while i + 8 <= end {
        bitmap[i / 8] = 0xff;
        i += 8;
    }
    while i < end {
        bitmap[i / 8] |= 1 << (i % 8);
        i += 1;
    }
}

/// Clears the bitmaps (validity, boolean values) of `layout` in `bytes`, before staging into a
/// reused block: [`stage_column`] only sets bits.
pub fn clear_bitmaps(layout: &BlockLayout, bytes: &mut [u8]) {
    for col in &layout.columns {
        if col.kind == ColumnKind::Boolean {
            bytes[col.values..col.values + bitmap_bytes(layout.rows)].fill(0);
        }
        if let Some(v) = col.validity {
            bytes[v..v + bitmap_bytes(layout.rows)].fill(0);
        }
    }
}

/// Where the values of rows `at..at + len` of fixed-width column `c` of `layout` lie in a block.
pub fn values_range(
    layout: &BlockLayout,
    c: usize,
    at: usize,
    len: usize,
) -> Result<std::ops::Range<usize>> {
    let ColumnKind::Fixed(w) = layout.columns[c].kind else {
        return internal_err!("the values of a boolean column are bits");
    };
    values_range_of(layout, c, at, len, w)
}

/// The bytes of rows `at..at + len` of column `c` of the block when its values take `width`
/// bytes each (less than the column's width where it is packed).
fn values_range_of(
    layout: &BlockLayout,
    c: usize,
    at: usize,
    len: usize,
    width: usize,
) -> Result<std::ops::Range<usize>> {
    if at + len > layout.rows {
        return internal_err!(
            "staging rows {at}..{} past the block's {}",
            at + len,
            layout.rows
        );
    }
    let start = layout.columns[c].values;
    Ok(start + at * width..start + (at + len) * width)
}

/// Copies `array` into column `c` of the block at row `at`. Returns whether it held a null.
pub fn stage_column(
    layout: &BlockLayout,
    c: usize,
    bytes: &mut [u8],
    at: usize,
    array: &ArrayRef,
) -> Result<bool> {
    let col = &layout.columns[c];
    let len = array.len();
    match col.kind {
        ColumnKind::Fixed(w) => {
            let data = array.to_data();
            stream_copy(
                &mut bytes[values_range(layout, c, at, len)?],
                value_bytes(&data, w),
            );
        }
        ColumnKind::Boolean => {
            if at + len > layout.rows {
                return internal_err!("staging rows past the block's {}", layout.rows);
            }
            let Some(b) = array.as_any().downcast_ref::<BooleanArray>() else {
                return internal_err!("stage_column: not a boolean array");
            };
            let values = b.values();
            let region = &mut bytes[col.values..col.values + bitmap_bytes(layout.rows)];
            set_bits(region, values.inner().as_slice(), at, values.offset(), len);
        }
    }
    stage_validity(layout, c, bytes, at, len, array.nulls())
}

/// Copies `array` into column `c` of the block at row `at` packed in `frame` (every row of the
/// block's column must be). Returns whether it held a null, or `None` where a value lies
/// outside the frame: the rows are then not staged, and the column must be staged unpacked.
pub fn stage_packed(
    layout: &BlockLayout,
    c: usize,
    bytes: &mut [u8],
    at: usize,
    array: &ArrayRef,
    frame: &Frame,
) -> Result<Option<bool>> {
    let ColumnKind::Fixed(w) = layout.columns[c].kind else {
        return internal_err!("a boolean column is not packed");
    };
    let range = values_range_of(layout, c, at, array.len(), frame.width)?;
    if !pack_values(array, w, frame, &mut bytes[range]) {
        return Ok(None);
    }
    stage_validity(layout, c, bytes, at, array.len(), array.nulls()).map(Some)
}

/// Widens rows `0..rows` of column `c` of the block, packed in `frame`, to the column's full
/// width where they lie, last row first: row i's values overlap only the offsets of rows at
/// or after it, which are read before they are overwritten.
pub fn widen_column(
    layout: &BlockLayout,
    c: usize,
    bytes: &mut [u8],
    rows: usize,
    frame: &Frame,
) -> Result<()> {
    let ColumnKind::Fixed(w) = layout.columns[c].kind else {
        return internal_err!("a boolean column is not packed");
    };
    let region = &mut bytes[values_range(layout, c, 0, rows)?];
    widen_in_place(region, rows, w, frame);
    Ok(())
}

/// Sets the validity of rows `at..at + len` of column `c` of the block from `nulls` (`None`:
/// all valid). Returns whether a row is null.
pub fn stage_validity(
    layout: &BlockLayout,
    c: usize,
    bytes: &mut [u8],
    at: usize,
    len: usize,
    nulls: Option<&NullBuffer>,
) -> Result<bool> {
    let nulls = nulls.filter(|n| n.null_count() > 0);
    let bits = bitmap_bytes(layout.rows);
    match (layout.columns[c].validity, nulls) {
        (Some(v), Some(n)) => {
            set_bits(
                &mut bytes[v..v + bits],
                n.buffer().as_slice(),
                at,
                n.offset(),
                len,
            );
        }
        (Some(v), None) => set_ones(&mut bytes[v..v + bits], at, len),
        (None, Some(_)) => {
            return internal_err!("staging nulls into a column laid out without validity");
        }
        (None, None) => {}
    }
    Ok(nulls.is_some())
}

/// Bytes `offset..offset + len` of `block` as a buffer of their own, which keeps `block`'s
/// memory alive. Its capacity (what DataFusion's memory accounting counts) is `len`, where a
/// slice of `block` would count all of `block`.
fn part(block: &Buffer, offset: usize, len: usize) -> Result<Buffer> {
    if offset.checked_add(len).is_none_or(|end| end > block.len()) {
        return internal_err!(
            "block part: {len} bytes at {offset} do not fit {} bytes",
            block.len()
        );
    }
    let Some(ptr) = NonNull::new(block.as_ptr().wrapping_add(offset).cast_mut()) else {
        return internal_err!("block part: a null block");
    };
    // SAFETY: `offset + len <= block.len()`, so the part's bytes are initialized bytes of
    // `block`. The owner, a clone of `block`, keeps them alive as long as the part lives. No
    // one writes them while it does: the owner's clone keeps `block`'s allocation shared, and
    // Arrow turns a buffer back into a mutable one only if its allocation is not shared and
    // not custom (the part's is custom).
    Ok(unsafe { Buffer::from_custom_allocation(ptr, len, Arc::new(block.clone())) })
}

/// Arrays of types `types` (one per layout column) over rows `lo..lo + len` of a block holding
/// `rows` rows, as an Arrow buffer ([`HostBlock::into_buffer`](crate::device::HostBlock)).
/// `has_nulls[c]`: whether column c's validity bitmap is filled in. Each array's buffers are
/// its own bytes of the block ([`part`]).
pub fn block_arrays(
    layout: &BlockLayout,
    block: &Buffer,
    has_nulls: &[bool],
    types: &[&DataType],
    lo: usize,
    len: usize,
) -> Result<Vec<ArrayRef>> {
    layout
        .columns
        .iter()
        .zip(types)
        .zip(has_nulls)
        .map(|((col, dt), &has_nulls)| {
            if lo + len > layout.rows {
                return internal_err!("rows {lo}..{} of a block of {}", lo + len, layout.rows);
            }
            // The bytes of bits `lo..lo + len` of the bitmap at `at`.
            let bits = |at: usize| -> Result<BooleanBuffer> {
                let bytes = part(block, at + lo / 8, (lo % 8 + len).div_ceil(8))?;
                Ok(BooleanBuffer::new(bytes, lo % 8, len))
            };
            let nulls = match col.validity {
                Some(v) if has_nulls => Some(NullBuffer::new(bits(v)?)),
                _ => None,
            };
            let array: ArrayRef = match col.kind {
                ColumnKind::Boolean => Arc::new(BooleanArray::new(bits(col.values)?, nulls)),
                ColumnKind::Fixed(w) => {
                    let values = part(block, col.values + lo * w, len * w)?;
                    make_array(
                        ArrayData::builder((*dt).clone())
                            .len(len)
                            .add_buffer(values)
                            .nulls(nulls)
                            .build()?,
                    )
                }
            };
            Ok(array)
        })
        .collect()
}

/// The join rows of one block downloaded from the device (or, for a join without output
/// columns, only their number), handed out in batches whose arrays are their own rows' bytes
/// of the block ([`block_arrays`]); the block goes back to its pool when the last is dropped.
#[derive(Debug)]
pub struct BlockRows {
    block: Buffer,
    layout: BlockLayout,
    has_nulls: Vec<bool>,
    schema: SchemaRef,
    /// View values the device gathered for the rows, one buffer per column of views that point
    /// into it (`exec::view_bytes`), with that column's place.
    values: Vec<(usize, Buffer)>,
}

impl BlockRows {
    /// The rows of `layout` in `block`, with columns of `schema`'s types.
    pub fn new(
        block: Buffer,
        layout: BlockLayout,
        has_nulls: Vec<bool>,
        schema: SchemaRef,
    ) -> Self {
        Self {
            block,
            layout,
            has_nulls,
            schema,
            values: vec![],
        }
    }

    /// The rows with `values`: per column of views, the buffer its views point into.
    pub fn with_values(mut self, values: Vec<(usize, Buffer)>) -> Self {
        self.values = values;
        self
    }

    /// Per column of views the device pointed into a buffer of values, that buffer.
    pub fn values(&self) -> &[(usize, Buffer)] {
        &self.values
    }

    /// `rows` rows of a join without output columns.
    pub fn count(rows: usize, schema: SchemaRef) -> Self {
        let layout = BlockLayout::new(std::iter::empty(), rows);
        Self::new(Buffer::from_vec(Vec::<u8>::new()), layout, vec![], schema)
    }

    pub fn rows(&self) -> usize {
        self.layout.rows
    }

    /// Rows `lo..lo + len` as a batch.
    pub fn batch(&self, lo: usize, len: usize) -> Result<RecordBatch> {
        let types: Vec<_> = self.schema.fields().iter().map(|f| f.data_type()).collect();
        let arrays = block_arrays(&self.layout, &self.block, &self.has_nulls, &types, lo, len)?;
        let options = RecordBatchOptions::new().with_row_count(Some(len));
        Ok(RecordBatch::try_new_with_options(
            Arc::clone(&self.schema),
            arrays,
            &options,
        )?)
    }
}

/// `batch` with each array that has a buffer in memory `held` says is someone else's (a page of
/// a pool: [`Pages::hold`](crate::device::Pages::hold)), itself or in a child (a struct or a
/// list over a join's output column), replaced by a copy in memory of its own, and the bytes
/// of the copies; `None` where no array has such a buffer. An operator that keeps batches for
/// long (a build side) copies them off the pages, which then go back to their pool at once.
pub fn copy_off(
    batch: &RecordBatch,
    held: impl Fn(*const u8) -> bool,
) -> Result<Option<(RecordBatch, usize)>> {
    fn uses(data: &ArrayData, held: &dyn Fn(*const u8) -> bool) -> bool {
        data.buffers().iter().any(|b| held(b.as_ptr()))
            || data.nulls().is_some_and(|n| held(n.buffer().as_ptr()))
            || data.child_data().iter().any(|c| uses(c, held))
    }
    let mut copied = 0;
    let columns = batch
        .columns()
        .iter()
        .map(|array| {
            let data = array.to_data();
            if !uses(&data, &held) {
                return Ok(Arc::clone(array));
            }
            let mut copy = MutableArrayData::new(vec![&data], false, data.len());
            copy.try_extend(0, 0, data.len())?;
            let copy = make_array(copy.freeze());
            copied += copy.get_array_memory_size();
            Ok(copy)
        })
        .collect::<Result<Vec<_>>>()?;
    if copied == 0 {
        return Ok(None);
    }
    let options = RecordBatchOptions::new().with_row_count(Some(batch.num_rows()));
    let batch = RecordBatch::try_new_with_options(batch.schema(), columns, &options)?;
    Ok(Some((batch, copied)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{BooleanArray, Int32Array, Int64Array};

    /// Copies the arrays of one batch (one per layout column, in order) into the block at row
    /// `at`. Returns, per column, whether the arrays held a null.
    fn stage_batch(
        layout: &BlockLayout,
        bytes: &mut [u8],
        at: usize,
        arrays: &[&ArrayRef],
    ) -> Result<Vec<bool>> {
        if arrays.len() != layout.columns.len() {
            return internal_err!(
                "stage_batch: {} arrays for {} columns",
                arrays.len(),
                layout.columns.len()
            );
        }
        arrays
            .iter()
            .enumerate()
            .map(|(c, a)| stage_column(layout, c, bytes, at, a))
            .collect()
    }

    #[test]
    fn staged_batches_come_back_as_equal_arrays() {
        let kinds = [
            (ColumnKind::Fixed(4), true),
            (ColumnKind::Boolean, true),
            (ColumnKind::Fixed(8), false),
        ];
        let layout = BlockLayout::new(kinds, 100);
        let mut block = arrow::buffer::MutableBuffer::from_len_zeroed(layout.bytes);
        let bytes = block.as_slice_mut();
        bytes.fill(0xAA);
        clear_bitmaps(&layout, bytes);
        let a: ArrayRef = Arc::new(Int32Array::from(vec![Some(1), None, Some(3), Some(4)]));
        let b: ArrayRef = Arc::new(BooleanArray::from(vec![
            Some(true),
            Some(false),
            None,
            Some(true),
        ]));
        let c: ArrayRef = Arc::new(Int64Array::from(vec![10, 20, 30, 40]));
        // Sliced arrays start at an offset in their buffers.
        let (a1, b1, c1) = (a.slice(1, 3), b.slice(1, 3), c.slice(1, 3));
        let n0 = stage_batch(&layout, bytes, 0, &[&a, &b, &c]).unwrap();
        let n1 = stage_batch(&layout, bytes, 4, &[&a1, &b1, &c1]).unwrap();
        assert_eq!(n0, vec![true, true, false]);
        assert_eq!(n1, vec![true, true, false]);
        let block = Buffer::from(block);
        let types = [&DataType::Int32, &DataType::Boolean, &DataType::Int64];
        let out = block_arrays(&layout, &block, &[true, true, false], &types, 3, 4).unwrap();
        let want_a: ArrayRef = Arc::new(Int32Array::from(vec![Some(4), None, Some(3), Some(4)]));
        let want_b: ArrayRef = Arc::new(BooleanArray::from(vec![
            Some(true),
            Some(false),
            None,
            Some(true),
        ]));
        let want_c: ArrayRef = Arc::new(Int64Array::from(vec![40, 20, 30, 40]));
        assert_eq!(&out[0], &want_a);
        assert_eq!(&out[1], &want_b);
        assert_eq!(&out[2], &want_c);
    }

    /// A batch cut from a window on a pool page keeps the page out of its pool; its copy off
    /// the page does not, and holds the same rows.
    #[test]
    fn batches_copied_off_a_page_let_it_go_back() {
        use arrow::datatypes::{Field, Schema};
        let pool = crate::device::HostPool::heap(1 << 16, 1);
        let kinds = [(ColumnKind::Fixed(4), true), (ColumnKind::Boolean, false)];
        let layout = BlockLayout::new(kinds, 8);
        let mut block = pool.try_take(layout.bytes).unwrap().unwrap();
        let bytes = block.bytes_mut().unwrap();
        clear_bitmaps(&layout, bytes);
        let a: ArrayRef = Arc::new(Int32Array::from(vec![Some(1), None, Some(3), Some(4)]));
        let b: ArrayRef = Arc::new(BooleanArray::from(vec![true, false, false, true]));
        let nulls = stage_batch(&layout, bytes, 0, &[&a, &b]).unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int32, true),
            Field::new("b", DataType::Boolean, false),
        ]));
        let window = BlockRows::new(
            block.into_buffer(layout.bytes).unwrap(),
            layout,
            nulls,
            schema,
        );
        let batch = window.batch(0, 4).unwrap();
        let other = RecordBatch::try_new(batch.schema(), vec![Arc::clone(&a), Arc::clone(&b)]);
        assert!(
            copy_off(&other.unwrap(), |p| pool.pages().hold(p))
                .unwrap()
                .is_none()
        );
        let (copy, bytes) = copy_off(&batch, |p| pool.pages().hold(p)).unwrap().unwrap();
        assert_eq!(copy, batch);
        assert_eq!(bytes, copy.get_array_memory_size());
        drop((window, batch));
        assert_eq!(pool.in_use(), 0, "the copy keeps no part of the page");
        assert_eq!(copy.column(0), &a);
        assert_eq!(copy.column(1), &b);
        // The page goes back only once no batch over it is left.
        let mut block = pool.try_take(64).unwrap().unwrap();
        block.bytes_mut().unwrap().fill(0);
        let kept = block.into_buffer(64).unwrap();
        assert!(pool.pages().hold(kept.as_ptr()));
        assert!(
            !pool
                .pages()
                .hold(copy.column(0).to_data().buffers()[0].as_ptr())
        );
        assert_eq!(pool.in_use(), 1 << 16);
    }
}
