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
    stage_packed, upload_block, widen_column,
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
    /// the device turns into the hashes), its words of check bytes into block columns `check`,
    /// `check + 1`, ... ([`KeyHash::stage_checked`]).
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

/// The frame that packs values within `span` of a column of `kind`, if any does.
fn fit(span: ValueSpan, kind: ColumnKind) -> Option<Frame> {
    match kind {
        ColumnKind::Fixed(w) => Frame::fit(span, w),
        ColumnKind::Boolean => None,
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
        }
    }

    /// This stager, packing each block's columns in frames fitted to the values it staged
    /// before (a probe side's chunks, whose rows are not all in hand when a block opens). The
    /// first block is not packed, and its values are scanned; a value outside its column's
    /// frame has that column of the block staged unpacked (the rows packed before it widened
    /// in the block) and scanned, widening the next block's frame; a column whose values spread
    /// too wide is no longer scanned. Packing checks each offset as it writes it, so it is
    /// always exact and reads the values once, as the plain copy does.
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
            .map(|(span, (kind, _))| fit(span, *kind))
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
                return Ok(has_nulls);
            }
            // A value outside the frame: the whole column of this block goes unpacked, the
            // rows packed before it widened where they lie.
            self.frames[c] = None;
            widen_column(&self.layout, c, bytes, self.rows, &frame)?;
        }
        if self.predict && self.seen[c] != ValueSpan::Wide {
            let seen = self.seen[c].union(span_of(array));
            // A column whose values together spread too wide is not scanned again.
            let packs = fit(seen, self.layout.columns[c].kind).is_some();
            self.seen[c] = if packs { seen } else { ValueSpan::Wide };
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

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Decimal128Array, Int16Array, Int32Array, Int64Array, UInt64Array};

    use super::*;
    use crate::backend::HostBackend;
    use crate::device::HostPool;

    /// A column of `ty` (0: Int16, 1: Int32, 2: Int64, 3: UInt64, 4: Decimal128) of `n` values
    /// near `centre` (within `spread`), every fifth null, sliced off a row at each end.
    fn column(rng: &mut u64, ty: usize, n: usize, centre: i128, spread: u64) -> ArrayRef {
        let mut next = || {
            *rng ^= *rng << 13;
            *rng ^= *rng >> 7;
            *rng ^= *rng << 17;
            *rng
        };
        let values: Vec<Option<i128>> = (0..n + 2)
            .map(|i| (i % 5 != 0).then(|| centre + (next() % spread) as i128 - spread as i128 / 2))
            .collect();
        let a: ArrayRef = match ty {
            0 => Arc::new(Int16Array::from_iter(
                values.iter().map(|v| v.map(|v| v as i16)),
            )),
            1 => Arc::new(Int32Array::from_iter(
                values.iter().map(|v| v.map(|v| v as i32)),
            )),
            2 => Arc::new(Int64Array::from_iter(
                values.iter().map(|v| v.map(|v| v as i64)),
            )),
            3 => Arc::new(UInt64Array::from_iter(
                values.iter().map(|v| v.map(|v| v as u64)),
            )),
            _ => Arc::new(Decimal128Array::from_iter(values.iter().copied())),
        };
        a.slice(1, n)
    }

    fn values_of(a: &ArrayRef) -> Vec<u8> {
        let w = a.data_type().primitive_width().unwrap_or(0);
        crate::columns::value_bytes(&a.to_data(), w).to_vec()
    }

    /// Columns of every packed width, their values drifting from batch to batch (so frames
    /// fitted to earlier values miss now and then, mid-block too), staged predicting (a probe
    /// side, blocks resized on the way) and with a scanned frame (a build side), come back bit
    /// for bit through the host twin's unpacking.
    #[test]
    fn packed_blocks_come_back_bit_for_bit() {
        let pool = HostPool::heap(1 << 20, 4);
        let queue = HostBackend::default();
        let widths = [2, 4, 8, 8, 16];
        let mut saved = 0;
        for seed in 1..120u64 {
            let mut rng = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
            let types = [seed as usize % 5, (seed as usize / 5) % 5];
            let kinds: Vec<_> = types
                .iter()
                .map(|&t| (ColumnKind::Fixed(widths[t]), true))
                .collect();
            let spread = [3, 200, 60_000, 1 << 30][seed as usize % 4];
            let batches: Vec<Vec<StageColumn>> = (0..24)
                .map(|b| {
                    let n = (b * 7 + seed as usize) % 40;
                    let centre = 1000 + (b as i128) * (spread as i128) / 3;
                    types
                        .iter()
                        .map(|&t| StageColumn::Array(column(&mut rng, t, n, centre, spread)))
                        .collect()
                })
                .collect();
            let predicting = seed % 2 == 0;
            let frames = Stager::frames(&kinds, batches.iter().map(Vec::as_slice));
            let mut stager = Stager::new(&kinds, 1 + seed as usize % 50);
            if predicting {
                stager = stager.predicting();
            }
            let mut got = vec![vec![]; kinds.len()];
            let mut flush = |stager: &mut Stager| {
                let Some(mut staged) = stager.take() else {
                    return;
                };
                let (raw, _) = staged.upload(&queue, &[0, 1]).unwrap();
                saved += raw.bytes_saved();
                let relation = raw.unpack(&queue, &mut vec![]).unwrap();
                for (c, got) in got.iter_mut().enumerate() {
                    let col = relation.column(c).unwrap();
                    let mut out = vec![0u8; relation.rows * col.kind.width()];
                    queue.download(&col.values, &mut out).unwrap();
                    got.extend(out);
                }
            };
            let time = Time::new();
            for (b, columns) in batches.iter().enumerate() {
                let rows = columns.iter().find_map(StageColumn::len).unwrap_or(0);
                let mut at = 0;
                while at < rows {
                    if stager.block.is_none() {
                        stager
                            .open(pool.take_unpooled(stager.layout.bytes).unwrap())
                            .unwrap();
                        if !predicting {
                            stager.pack(&frames).unwrap();
                        }
                    }
                    at += stager.stage(columns, at, &time).unwrap();
                    if stager.is_full() {
                        flush(&mut stager);
                        if predicting && b % 3 == 0 {
                            stager = stager.resized(1 + (b * 5 + seed as usize) % 60);
                        }
                    }
                }
            }
            flush(&mut stager);
            for (c, got) in got.iter().enumerate() {
                let want: Vec<u8> = batches
                    .iter()
                    .flat_map(|cols| match &cols[c] {
                        StageColumn::Array(a) => values_of(a),
                        _ => vec![],
                    })
                    .collect();
                assert!(*got == want, "seed {seed}, column {c} of type {}", types[c]);
            }
        }
        assert!(saved > 0, "nothing was packed");
    }

    /// A column whose batches are each narrow but together spread too wide to pack stops
    /// being scanned: its span turns wide.
    #[test]
    fn a_column_spread_too_wide_is_no_longer_scanned() {
        let pool = HostPool::heap(1 << 20, 4);
        let mut stager = Stager::new(&[(ColumnKind::Fixed(8), false)], 1000).predicting();
        let time = Time::new();
        for b in 0..3i64 {
            let a: ArrayRef = Arc::new(Int64Array::from_iter_values(
                (0..1000).map(|i| b * (1 << 34) + i),
            ));
            stager
                .open(pool.take_unpooled(stager.layout.bytes).unwrap())
                .unwrap();
            stager.stage(&[StageColumn::Array(a)], 0, &time).unwrap();
            stager.take();
        }
        assert_eq!(stager.seen[0], ValueSpan::Wide);
    }
}
