//! [`Stager`]: batches copied into pinned host blocks, block after block — how
//! both build and probe rows reach the device lane — and the [`Staged`] rows it hands over.
//! A staged column is an array copied as it is, or a checked key's length classes and check
//! bytes, computed straight into the block ([`StageColumn`]), so that no array holds them
//! first (the device hashes them).

use std::sync::mpsc::Sender;

use arrow::array::ArrayRef;
use datafusion::common::{Result, exec_datafusion_err, internal_err};
use datafusion::physical_plan::metrics::Time;

use super::key_hash::KeyHash;
use super::lane::Job;
use crate::backend::Backend;
use crate::columns::{
    BlockLayout, ColumnKind, RawColumns, clear_bitmaps, stage_column, upload_block,
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
}

impl Stager {
    /// A stager of blocks of `rows` rows of columns of `kinds`.
    pub fn new(kinds: &[(ColumnKind, bool)], rows: usize) -> Self {
        Self {
            layout: BlockLayout::new(kinds.iter().copied(), rows),
            block: None,
            rows: 0,
            has_nulls: vec![false; kinds.len()],
        }
    }

    /// Starts filling `block`.
    pub fn open(&mut self, mut block: HostBlock) -> Result<()> {
        clear_bitmaps(&self.layout, block.bytes_mut()?);
        self.block = Some(block);
        self.rows = 0;
        self.has_nulls.fill(false);
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
                    stage_column(&self.layout, c, bytes, self.rows, &a.slice(from, n))?
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
