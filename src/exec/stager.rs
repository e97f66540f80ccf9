//! [`Stager`]: batches copied into pinned host blocks, block after block — how
//! both build and probe rows reach the device lane — and the [`Staged`] rows it hands over.
//! A staged column is an array copied as it is, or a checked key's length classes and check
//! bytes, computed straight into the block ([`StageColumn`]), so that no array holds them
//! first (the device hashes them). An integer column whose rows in a block span a narrow range
//! is packed into fewer bytes ([`Frame`], [`Stager::pack`]).

use std::sync::mpsc::Sender;

use arrow::array::ArrayRef;
use datafusion::common::{Result, exec_datafusion_err, internal_err};
use datafusion::physical_plan::metrics::Time;

use super::key_hash::KeyHash;
use super::lane::Job;
use crate::backend::Backend;
use crate::columns::{
    BlockLayout, ColumnKind, Frame, RawColumns, ValueSpan, clear_bitmaps, span_of, stage_column,
    upload_block,
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
}

impl Stager {
    /// A stager of blocks of `rows` rows of columns of `kinds`.
    pub fn new(kinds: &[(ColumnKind, bool)], rows: usize) -> Self {
        Self {
            layout: BlockLayout::new(kinds.iter().copied(), rows),
            block: None,
            rows: 0,
            has_nulls: vec![false; kinds.len()],
            frames: vec![None; kinds.len()],
        }
    }

    /// Starts filling `block`, unpacked.
    pub fn open(&mut self, mut block: HostBlock) -> Result<()> {
        clear_bitmaps(&self.layout, block.bytes_mut()?);
        self.block = Some(block);
        self.rows = 0;
        self.has_nulls.fill(false);
        self.frames.fill(None);
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
        let Some(block) = self.block.as_mut() else {
            return Err(exec_datafusion_err!("staging without a block"));
        };
        if columns.len() != self.layout.columns.len() {
            return internal_err!(
                "staging {} columns into a block of {}",
                columns.len(),
                self.layout.columns.len()
            );
        }
        let len = columns.iter().find_map(StageColumn::len).unwrap_or(0);
        let n = (len - from).min(self.layout.rows - self.rows);
        let bytes = block.bytes_mut()?;
        for (c, column) in columns.iter().enumerate() {
            let has_nulls = match column {
                StageColumn::Array(a) => {
                    let frame = self.frames[c].as_ref();
                    stage_column(&self.layout, c, bytes, self.rows, &a.slice(from, n), frame)?
                }
                StageColumn::CheckedKey { key, hash, check } => {
                    let _timer = key_hash_time.timer();
                    let key = key.slice(from, n);
                    hash.stage_checked(&key, &self.layout, (c, *check), bytes, self.rows)?
                }
                StageColumn::CheckBytes => false,
            };
            self.has_nulls[c] |= has_nulls;
        }
        self.rows += n;
        Ok(n)
    }

    /// Whether the block is full.
    pub fn is_full(&self) -> bool {
        self.rows == self.layout.rows
    }

    /// Takes the staged rows out (`None` if there are none).
    pub fn take(&mut self) -> Option<Staged> {
        let block = self.block.take()?;
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
