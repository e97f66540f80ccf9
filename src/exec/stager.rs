//! [`Stager`]: batches copied into pinned host blocks, block after block — how
//! both build and probe rows reach the device lane — and the [`Staged`] rows it hands over.
//! A staged column is an array copied as it is, or a checked key's length classes and check
//! bytes, computed straight into the block ([`StageColumn`]), so that no array holds them
//! first (the device hashes them). An integer column whose rows in a block span a narrow range
//! is packed into fewer bytes ([`Frame`], [`Stager::pack`]).

use std::sync::Arc;
use std::sync::mpsc::Sender;

use arrow::array::ArrayRef;
use datafusion::common::{Result, exec_datafusion_err, internal_err};
use datafusion::physical_plan::metrics::Time;

use super::key_hash::KeyHash;
use super::lane::Job;
use crate::backend::Backend;
use crate::columns::{
    BlockLayout, ColumnKind, Frame, RawColumns, ValueSpan, clear_bitmaps, span_of, stage_column,
    stage_packed, upload_block,
};
use crate::device::HostBlock;

/// Events recorded on a queue before and after some work enqueued on it.
pub(crate) type Span<E> = (E, E);

/// Staged columns on the device, with the span of their copies.
pub(crate) type Uploaded<B> = (RawColumns<<B as Backend>::Buf>, Span<<B as Backend>::Event>);

/// Rows staged in a host block.
#[derive(Debug)]
pub(crate) struct Staged {
    pub block: HostBlock,
    pub layout: BlockLayout,
    pub rows: usize,
    /// Per column: whether some staged row is null.
    pub has_nulls: Vec<bool>,
    /// Per column: the frame its values are packed in, if they are.
    pub frames: Vec<Option<Frame>>,
}

impl Staged {
    /// Enqueues on `queue` the copies of the staged columns (`indices`: the input columns they
    /// hold, in block order); returns them with events recorded before and after the copies.
    pub fn upload<B: Backend>(&mut self, queue: &B, indices: &[usize]) -> Result<Uploaded<B>> {
        let start = queue.record()?;
        let raw = upload_block(
            queue,
            &mut self.block,
            &self.layout,
            self.rows,
            &self.has_nulls,
            &self.frames,
            indices,
        )?;
        Ok((raw, (start, queue.record()?)))
    }
}

/// One column of the block, as a batch gives it.
pub(crate) enum StageColumn {
    /// An array, copied.
    Array(ArrayRef),
    /// A checked key column: its length classes computed into this column of the block (which
    /// the device turns into the hashes), its check bytes into block column `check`
    /// ([`KeyHash::stage_checked`]).
    CheckedKey {
        key: ArrayRef,
        hash: KeyHash,
        check: usize,
    },
    /// Check bytes, written with their key's classes.
    CheckBytes,
}

impl StageColumn {
    /// Rows the column has (`None`: check bytes, which have their key's).
    fn len(&self) -> Option<usize> {
        match self {
            Self::Array(a) => Some(a.len()),
            Self::CheckedKey { key, .. } => Some(key.len()),
            Self::CheckBytes => None,
        }
    }
}

/// Batches being copied into a pinned block, one block at a time.
pub(crate) struct Stager {
    pub layout: BlockLayout,
    pub block: Option<HostBlock>,
    pub rows: usize,
    pub has_nulls: Vec<bool>,
    /// Per column: the frame the open block packs it in.
    pub frames: Vec<Option<Frame>>,
    /// Whether each block packs its columns in frames fitted to the values staged before
    /// ([`predicting`](Self::predicting)).
    predict: bool,
    /// Per column: the span of the values staged unpacked so far (those of the first block, and
    /// those that did not fit a frame), which the next block's frame is fitted to.
    seen: Vec<ValueSpan>,
    /// Per column: the slices packed into the open block, at their rows, to stage again
    /// unpacked where a later value lies outside the column's frame.
    packed: Vec<Vec<(usize, ArrayRef)>>,
}

impl Stager {
    /// A stager of blocks of `rows` rows of columns of `kinds`, unpacked unless told
    /// ([`pack`](Self::pack), [`predicting`](Self::predicting)).
    pub fn new(kinds: &[(ColumnKind, bool)], rows: usize) -> Self {
        Self {
            layout: BlockLayout::new(kinds.iter().copied(), rows),
            block: None,
            rows: 0,
            has_nulls: vec![false; kinds.len()],
            frames: vec![None; kinds.len()],
            predict: false,
            seen: vec![ValueSpan::Empty; kinds.len()],
            packed: vec![vec![]; kinds.len()],
        }
    }

    /// This stager, packing each block's columns in frames fitted to the values it staged
    /// before (a probe side's chunks, whose rows are not all in hand when a block opens). The
    /// first block is not packed, and its values are scanned; a value outside its column's
    /// frame has that column of the block staged unpacked (again, from the slices packed before
    /// it) and scanned, widening the next block's frame. Packing checks each offset as it
    /// writes it, so it is always exact and reads the values once, as the plain copy does.
    pub fn predicting(mut self) -> Self {
        self.predict = true;
        self
    }

    /// A stager of blocks of `rows` rows of the same columns, packing as this one does.
    pub fn resized(&self, rows: usize) -> Self {
        Self {
            layout: BlockLayout::new(
                self.layout
                    .columns
                    .iter()
                    .map(|c| (c.kind, c.validity.is_some())),
                rows,
            ),
            block: None,
            rows: 0,
            has_nulls: vec![false; self.has_nulls.len()],
            frames: vec![None; self.frames.len()],
            predict: self.predict,
            seen: self.seen.clone(),
            packed: vec![vec![]; self.packed.len()],
        }
    }

    /// Starts filling `block`, packed in frames fitted to the values seen where predicting.
    pub fn open(&mut self, mut block: HostBlock) -> Result<()> {
        clear_bitmaps(&self.layout, block.bytes_mut()?);
        self.block = Some(block);
        self.rows = 0;
        self.has_nulls.fill(false);
        for ((frame, span), col) in self
            .frames
            .iter_mut()
            .zip(&self.seen)
            .zip(&self.layout.columns)
        {
            *frame = match col.kind {
                ColumnKind::Fixed(w) if self.predict => Frame::around(*span, w),
                _ => None,
            };
        }
        self.packed.iter_mut().for_each(Vec::clear);
        Ok(())
    }

    /// The frames that pack columns of `kinds` for rows of `batches` (each as [`StageColumn`]s,
    /// one per column): `None` where a column's values do not span a range narrow enough.
    pub fn frames<'a>(
        kinds: &[(ColumnKind, bool)],
        batches: impl IntoIterator<Item = &'a [StageColumn]>,
    ) -> Vec<Option<Frame>> {
        let mut spans = vec![ValueSpan::Empty; kinds.len()];
        for columns in batches {
            for (span, column) in spans.iter_mut().zip(columns) {
                if *span != ValueSpan::Wide {
                    *span = span.union(match column {
                        StageColumn::Array(a) => span_of(a),
                        _ => ValueSpan::Wide,
                    });
                }
            }
        }
        spans
            .into_iter()
            .zip(kinds)
            .map(|(span, (kind, _))| match kind {
                ColumnKind::Fixed(w) => Frame::fit(span, *w),
                ColumnKind::Boolean => None,
            })
            .collect()
    }

    /// Packs the open block's columns in `frames` (from [`frames`](Self::frames) over every
    /// batch whose rows the block will hold). Only before any row is staged.
    pub fn pack(&mut self, frames: &[Option<Frame>]) -> Result<()> {
        if self.rows != 0 || frames.len() != self.frames.len() {
            return internal_err!("packing a block after staging into it, or other columns");
        }
        self.frames.copy_from_slice(frames);
        Ok(())
    }

    /// Copies rows `from..` of `columns` (one per block column; as many rows as fit) and
    /// returns how many; `key_hash_time` takes the time of computing checked keys.
    pub fn stage(
        &mut self,
        columns: &[StageColumn],
        from: usize,
        key_hash_time: &Time,
    ) -> Result<usize> {
        if self.block.is_none() {
            return Err(exec_datafusion_err!("staging without a block"));
        }
        if columns.len() != self.layout.columns.len() {
            return internal_err!(
                "staging {} columns into a block of {}",
                columns.len(),
                self.layout.columns.len()
            );
        }
        let len = columns.iter().find_map(StageColumn::len).unwrap_or(0);
        let n = (len - from).min(self.layout.rows - self.rows);
        for (c, column) in columns.iter().enumerate() {
            let has_nulls = match column {
                StageColumn::Array(a) => self.stage_array(c, &a.slice(from, n))?,
                StageColumn::CheckedKey { key, hash, check } => {
                    let _timer = key_hash_time.timer();
                    let key = key.slice(from, n);
                    let Some(block) = self.block.as_mut() else {
                        return Err(exec_datafusion_err!("staging without a block"));
                    };
                    let bytes = block.bytes_mut()?;
                    hash.stage_checked(&key, &self.layout, (c, *check), bytes, self.rows)?
                }
                StageColumn::CheckBytes => false,
            };
            self.has_nulls[c] |= has_nulls;
        }
        self.rows += n;
        Ok(n)
    }

    /// Stages `array` as column `c` at the block's next row, packed if the column is; returns
    /// whether it held a null.
    fn stage_array(&mut self, c: usize, array: &ArrayRef) -> Result<bool> {
        let Some(block) = self.block.as_mut() else {
            return Err(exec_datafusion_err!("staging without a block"));
        };
        let bytes = block.bytes_mut()?;
        if let Some(frame) = self.frames[c] {
            if let Some(has_nulls) = stage_packed(&self.layout, c, bytes, self.rows, array, &frame)?
            {
                self.packed[c].push((self.rows, Arc::clone(array)));
                return Ok(has_nulls);
            }
            // A value outside the frame: the whole column of this block goes unpacked.
            self.frames[c] = None;
            for (at, before) in self.packed[c].drain(..) {
                stage_column(&self.layout, c, bytes, at, &before)?;
            }
        }
        if self.predict && self.seen[c] != ValueSpan::Wide {
            self.seen[c] = self.seen[c].union(span_of(array));
        }
        stage_column(&self.layout, c, bytes, self.rows, array)
    }

    /// Whether the block is full.
    pub fn is_full(&self) -> bool {
        self.rows == self.layout.rows
    }

    /// Takes the staged rows out (`None` if there are none).
    pub fn take(&mut self) -> Option<Staged> {
        let block = self.block.take()?;
        self.packed.iter_mut().for_each(Vec::clear);
        if self.rows == 0 {
            return None;
        }
        Some(Staged {
            block,
            layout: self.layout.clone(),
            rows: std::mem::take(&mut self.rows),
            has_nulls: std::mem::replace(
                &mut self.has_nulls,
                vec![false; self.layout.columns.len()],
            ),
            frames: std::mem::replace(&mut self.frames, vec![None; self.layout.columns.len()]),
        })
    }

    /// Sends the staged rows, if any, as `job`.
    pub fn send(&mut self, lane: &Sender<Job>, job: impl FnOnce(Staged) -> Job) -> Result<()> {
        match self.take() {
            Some(staged) => lane
                .send(job(staged))
                .map_err(|_| exec_datafusion_err!("GpuJoinExec lane stopped")),
            None => Ok(()),
        }
    }
}
