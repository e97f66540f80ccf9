//! One probe chunk on its way through a device lane, as a state machine with one method per
//! state. Each method enqueues work without waiting and returns whether it moved on; the lane
//! waits (for any chunk's [`Chunk::pending`] event) only when no chunk can move.
//!
//! ```text
//!  Uploaded ──(table ready)──► Counting ──(total seen)──► Passing ──(last window)──► Done
//!  upload queue:  copies        compute: unpack,           per window: compute: write pairs,
//!                               encode, count, scan,       gather, pack ─► download queue:
//!                               total ─► host (a kernel)   copies ─► a batch to the partition
//! ```
//! A chunk leaves Counting only when every earlier chunk of its partition is done, so a
//! partition's output keeps its probe order even when a chunk's output comes in several passes.
//! A window whose build view values the device gathers ([`view_bytes`]) comes down in two
//! copies into its block: its columns with each such column's total, then, once the totals
//! are back, that many bytes of values.
//!
//! For the join types that output build rows after the whole probe side (left, full, left
//! semi, anti and mark joins), the lane's last chunk holds no probe rows but the build rows
//! themselves ([`Work::BuildRows`]): it counts the build rows its join keeps by their marks,
//! and passes like any other chunk.
//! The ownership rule of `backend`: a chunk drops its device buffers only when it is done, after
//! its last event has completed, so none is freed under a kernel or copy of another queue.

use std::collections::{HashMap, VecDeque};
use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use datafusion::common::{Result, internal_err};

use super::lane::{ChunkJob, LaneOutput, Results, Work};
use super::run::RunSpec;
use super::stager::Staged;
use super::view_bytes::{self, DeviceData, WindowValues};
use crate::backend::Backend;
use crate::columns::{BlockLayout, BlockRows, DeviceRelation, RawColumns};
use crate::device::{HostBlock, HostPool, Reservation};
use crate::join::hash::{
    BucketTable, PassOutput, Source, count, download_pass, encode_probe, materialize, pass_layout,
    total_index, windows,
};
use crate::join::hash_checked_keys;
use crate::trace::trace;

/// The three queues of a lane.
pub(crate) struct Queues<B: Backend> {
    pub upload: B,
    pub compute: B,
    pub download: B,
}

/// What a chunk may use of its lane while it moves on.
pub(crate) struct LaneParts<'a, B: Backend> {
    pub queues: &'a Queues<B>,
    pub spec: &'a RunSpec,
    pub table: Option<&'a BucketTable<B>>,
    /// A byte per build row, set once a probe row matched it (joins that output build rows
    /// after the probe side).
    pub visited: Option<&'a mut B::Buf>,
    pub pass_rows: usize,
    /// Small blocks for reading totals back.
    pub scalars: &'a mut Vec<HostBlock>,
    /// Where output goes when the pinned output pool is full.
    pub spill: &'a HostPool,
    /// Per partition, the sequence number of the chunk that may hand out results next.
    pub next_out: &'a mut HashMap<usize, u64>,
    /// Per build view column the device carries, its data where the device gathers its values
    /// ([`view_bytes`]).
    pub values: &'a [Option<DeviceData<B::Buf>>],
}

/// Which phase metric an event pair times.
#[derive(Debug, Clone, Copy)]
enum Phase {
    Upload,
    Transform,
    Match,
    Materialize,
    Download,
}

/// A window of a chunk's output being materialized and downloaded: its columns, then the view
/// values the device gathered for it, whose sizes are known once the columns are down.
struct Pass<B: Backend> {
    /// Kept until the download has finished.
    _output: PassOutput<B::Buf>,
    block: HostBlock,
    layout: BlockLayout,
    has_nulls: Vec<bool>,
    downloaded: B::Event,
    values: Vec<PassValues<B>>,
    /// The values' downloads, once enqueued.
    values_downloaded: Option<B::Event>,
}

impl<B: Backend> Pass<B> {
    /// The event the pass waits for.
    fn pending(&self) -> &B::Event {
        self.values_downloaded.as_ref().unwrap_or(&self.downloaded)
    }
}

/// One column's view values of a pass ([`view_bytes::gather`]).
struct PassValues<B: Backend> {
    gathered: WindowValues<B::Buf>,
    /// Where their total comes back.
    total: HostBlock,
    /// Where they come down in the pass's block (room for the longest value gathered a row,
    /// after the columns), and their bytes once the total is back.
    at: usize,
    len: usize,
}

/// The chunk's device data once counted.
struct Probed<B: Backend> {
    /// The probe rows and their encoded keys; `None` for the build rows.
    probe: Option<(DeviceRelation<B::Buf>, B::Buf)>,
    offsets: B::Buf,
}

impl<B: Backend> Probed<B> {
    /// Where the chunk's output rows come from.
    fn source<'a>(&'a self, lane: &'a LaneParts<'_, B>) -> Result<Source<'a, B::Buf>> {
        match &self.probe {
            Some((chunk, keys)) => Ok(Source::Probe {
                chunk,
                keys,
                emit: lane.spec.emission().probe,
            }),
            None => build_source(lane),
        }
    }
}

/// A block to read a total back into: one the lane keeps, a pooled pinned one, or (where the
/// pool has none free) pageable memory.
fn scalar_block<B: Backend>(lane: &mut LaneParts<'_, B>) -> Result<HostBlock> {
    Ok(match lane.scalars.pop() {
        Some(b) => b,
        None => match lane.queues.compute.scalars().try_take(8)? {
            Some(b) => b,
            None => lane.spill.take_unpooled(8)?,
        },
    })
}

/// The output source of the build rows: those the join keeps by their marks.
fn build_source<'a, B: Backend>(lane: &'a LaneParts<'_, B>) -> Result<Source<'a, B::Buf>> {
    match (lane.visited.as_deref(), lane.spec.emission().build) {
        (Some(visited), Some(keep)) => Ok(Source::Build { visited, keep }),
        _ => internal_err!("build rows to output without marks"),
    }
}

enum State<B: Backend> {
    /// Copies enqueued; waiting for the build table.
    Uploaded,
    /// Counting enqueued; waiting to read the total back.
    Counting {
        probed: Probed<B>,
        total: HostBlock,
        counted: B::Event,
    },
    /// Writing the output window by window.
    Passing {
        probed: Probed<B>,
        windows: VecDeque<Range<u64>>,
        pass: Option<Pass<B>>,
    },
    Done,
}

/// A probe chunk of one output partition.
pub(crate) struct Chunk<B: Backend> {
    partition: usize,
    /// The chunk's place among its partition's chunks.
    seq: u64,
    results: Results,
    /// The device memory reserved for this chunk; `None`: the lane's first slot.
    pub slot: Option<Reservation>,
    /// The staged rows, until their copies have finished.
    staged: Option<Staged>,
    /// The uploaded probe rows; `None` for the build rows.
    raw: Option<RawColumns<B::Buf>>,
    /// Whether the chunk holds the build rows rather than probe rows.
    build_rows: bool,
    /// With a residual filter, the build rows' marks the host set (for the build rows).
    build_marks: Option<Vec<u8>>,
    uploaded: B::Event,
    rows: usize,
    state: State<B>,
    /// Buffers that may be freed only once the chunk's work has finished.
    keep: Vec<B::Buf>,
    /// Event pairs timing the phases.
    timings: Vec<(Phase, B::Event, B::Event)>,
    bytes_uploaded: usize,
    upload_bytes_saved: usize,
    bytes_downloaded: usize,
}

impl<B: Backend> Chunk<B> {
    /// Enqueues the copies of a staged chunk on the upload queue (the build rows need none).
    pub fn upload(
        queues: &Queues<B>,
        spec: &RunSpec,
        job: ChunkJob,
        slot: Option<Reservation>,
    ) -> Result<Self> {
        let ChunkJob {
            partition,
            seq,
            work,
            results,
        } = job;
        let mut build_marks = None;
        let (staged, raw, timings, uploaded, rows) = match work {
            Work::ProbeRows(mut staged) => {
                let (raw, (start, uploaded)) =
                    staged.upload(&queues.upload, &spec.probe_indices)?;
                let rows = staged.rows;
                let timings = vec![(Phase::Upload, start, queues.upload.record()?)];
                (Some(staged), Some(raw), timings, uploaded, rows)
            }
            Work::BuildRows(marks) => {
                build_marks = marks;
                (None, None, vec![], queues.upload.record()?, 0)
            }
        };
        let bytes_uploaded = raw.as_ref().map_or(0, RawColumns::bytes::<B>);
        let upload_bytes_saved = raw.as_ref().map_or(0, RawColumns::bytes_saved);
        Ok(Self {
            partition,
            seq,
            results,
            slot,
            build_rows: raw.is_none(),
            build_marks,
            staged,
            raw,
            timings,
            uploaded,
            rows,
            state: State::Uploaded,
            keep: vec![],
            bytes_uploaded,
            upload_bytes_saved,
            bytes_downloaded: 0,
        })
    }

    /// Whether the chunk has finished.
    pub fn is_done(&self) -> bool {
        matches!(self.state, State::Done)
    }

    /// How the trace names the chunk.
    pub fn name(&self) -> String {
        if self.build_rows {
            return format!("chunk {}#{} of the build rows", self.partition, self.seq);
        }
        format!(
            "chunk {}#{} of {} rows",
            self.partition, self.seq, self.rows
        )
    }

    /// The chunk's state, for the trace.
    pub fn stage(&self) -> &'static str {
        match self.state {
            State::Uploaded => "uploaded",
            State::Counting { .. } => "counting",
            State::Passing { .. } => "passing",
            State::Done => "done",
        }
    }

    /// The upload the chunk's staged block waits for, while the chunk still holds the block.
    pub fn staged_upload(&self) -> Option<&B::Event> {
        self.staged.as_ref().map(|_| &self.uploaded)
    }

    /// The event the chunk waits for, if it waits for one (it may have completed).
    pub fn pending(&self) -> Option<&B::Event> {
        match &self.state {
            State::Counting { counted, .. } => Some(counted),
            State::Passing {
                pass: Some(pass), ..
            } => Some(pass.pending()),
            _ => None,
        }
    }

    /// Moves the chunk on as far as it can without waiting. Returns whether it moved. A chunk
    /// that becomes done accounts for itself, tells its partition and drops its buffers.
    pub fn advance(&mut self, lane: &mut LaneParts<'_, B>) -> Result<bool> {
        self.release_staged(lane.queues)?;
        if self.is_done() {
            return Ok(false);
        }
        let state = std::mem::replace(&mut self.state, State::Done);
        let (state, moved) = match state {
            State::Uploaded => self.start_counting(lane)?,
            State::Counting {
                probed,
                total,
                counted,
            } => self.read_total(lane, probed, total, counted)?,
            State::Passing {
                probed,
                windows,
                pass,
            } => self.next_pass(lane, probed, windows, pass)?,
            State::Done => (State::Done, false),
        };
        self.state = state;
        if self.is_done() {
            self.finish(lane)?;
        }
        Ok(moved)
    }

    /// Done: account for the chunk, let the partition's next chunk hand out results, tell the
    /// partition, and drop the chunk's buffers (all its events have completed).
    fn finish(&mut self, lane: &mut LaneParts<'_, B>) -> Result<()> {
        trace!("chunk {}#{} done", self.partition, self.seq);
        self.account(lane.queues, lane.spec)?;
        *lane.next_out.entry(self.partition).or_insert(0) = self.seq + 1;
        let _ = self.results.send(Ok(LaneOutput::ChunkDone));
        self.keep.clear();
        self.raw = None;
        Ok(())
    }

    /// Gives the staged block back once its copies have finished.
    fn release_staged(&mut self, queues: &Queues<B>) -> Result<()> {
        if self.staged.is_some() && queues.upload.is_done(&self.uploaded)? {
            self.staged = None;
        }
        Ok(())
    }

    /// Uploaded → Counting: unpack, encode and count on the compute queue once the table is
    /// there; the total goes back to the host.
    fn start_counting(&mut self, lane: &mut LaneParts<'_, B>) -> Result<(State<B>, bool)> {
        let Some(table) = lane.table else {
            return Ok((State::Uploaded, false));
        };
        if self.results.is_closed() {
            return Ok((State::Done, true));
        }
        let q = &lane.queues.compute;
        let (probe, offsets, total_at) = if self.build_rows {
            let start = q.record()?;
            if let (Some(mut marks), Some(visited)) =
                (self.build_marks.take(), lane.visited.as_deref_mut())
            {
                // The host kept the pairs: its marks replace the device's.
                if marks.len() > table.rows() {
                    return internal_err!("a mark past the build side's {} rows", table.rows());
                }
                marks.resize(table.rows(), 0);
                let marks = q.upload(&marks)?;
                q.copy_within(&marks, 0, visited, 0, table.rows())?;
                self.keep.push(marks);
            }
            let source = build_source(lane)?;
            let offsets = count(q, table, source, None)?;
            self.timings.push((Phase::Materialize, start, q.record()?));
            (None, offsets, total_index(table, &source))
        } else {
            let Some(raw) = self.raw.take() else {
                return internal_err!("chunk uploaded twice");
            };
            q.wait(&self.uploaded)?;
            let start = q.record()?;
            let mut relation = raw.unpack(q, &mut self.keep)?;
            let layout = &lane.spec.layout;
            hash_checked_keys(q, layout, false, &mut relation, &mut self.keep)?;
            let keys = encode_probe(q, table, &relation, layout)?;
            self.timings.push((Phase::Transform, start, q.record()?));
            let match_start = q.record()?;
            let source = Source::Probe {
                chunk: &relation,
                keys: &keys,
                emit: lane.spec.emission().probe,
            };
            let total_at = total_index(table, &source);
            // With a residual filter the host marks the build rows of the pairs it keeps.
            let visited = match lane.spec.residual {
                Some(_) => None,
                None => lane.visited.as_deref_mut(),
            };
            let offsets = count(q, table, source, visited)?;
            self.timings.push((Phase::Match, match_start, q.record()?));
            (Some((relation, keys)), offsets, total_at)
        };
        // The total comes back through a pooled pinned block, which a kernel writes directly
        // (`read_u64`: a copy would wait behind the downloads of other chunks). Pinning memory
        // here, next to other threads' kernels and copies, is a synchronizing driver call: never
        // on this path; if the pool has no block free, pageable memory (a copy, which then waits).
        let mut total = scalar_block(lane)?;
        q.read_u64(&offsets, total_at, &mut total)?;
        let counted = q.record()?;
        trace!("{}: counting enqueued", self.name());
        let probed = Probed { probe, offsets };
        Ok((
            State::Counting {
                probed,
                total,
                counted,
            },
            true,
        ))
    }

    /// Counting → Passing (or Done): once the total is back, cut the output into windows.
    fn read_total(
        &mut self,
        lane: &mut LaneParts<'_, B>,
        probed: Probed<B>,
        mut total: HostBlock,
        counted: B::Event,
    ) -> Result<(State<B>, bool)> {
        // A cancelled chunk needs no turn, only its kernels to finish before it frees their
        // inputs (some were allocated on the upload queue).
        let cancelled = self.results.is_closed();
        let turn =
            cancelled || lane.next_out.get(&self.partition).copied().unwrap_or(0) == self.seq;
        if !turn || !lane.queues.compute.is_done(&counted)? {
            return Ok((
                State::Counting {
                    probed,
                    total,
                    counted,
                },
                false,
            ));
        }
        let pairs = u64::from_le_bytes(total.bytes()?[..8].try_into().unwrap_or_default());
        lane.scalars.push(total);
        trace!(
            "chunk {}#{}: {} rows make {pairs} pairs",
            self.partition, self.seq, self.rows
        );
        if cancelled {
            self.keep_probed(probed);
            return Ok((State::Done, true));
        }
        if lane.spec.layout.columns.is_empty() {
            // No output column (count(*)): the pairs only need counting.
            self.emit_rows(lane.spec, pairs)?;
            self.keep_probed(probed);
            return Ok((State::Done, true));
        }
        let windows: VecDeque<_> = windows(pairs, lane.pass_rows).collect();
        self.next_pass(lane, probed, windows, None)
    }

    /// Passing: hands out a downloaded window and starts the next one.
    fn next_pass(
        &mut self,
        lane: &mut LaneParts<'_, B>,
        probed: Probed<B>,
        mut windows: VecDeque<Range<u64>>,
        pass: Option<Pass<B>>,
    ) -> Result<(State<B>, bool)> {
        if let Some(mut pass) = pass {
            if !lane.queues.download.is_done(pass.pending())? {
                return Ok((
                    State::Passing {
                        probed,
                        windows,
                        pass: Some(pass),
                    },
                    false,
                ));
            }
            if !pass.values.is_empty() && pass.values_downloaded.is_none() {
                self.download_values(lane, &mut pass)?;
                return Ok((
                    State::Passing {
                        probed,
                        windows,
                        pass: Some(pass),
                    },
                    true,
                ));
            }
            self.emit_pass(lane, pass)?;
        }
        let window = match windows.pop_front() {
            Some(w) if !self.results.is_closed() => w,
            _ => {
                self.keep_probed(probed);
                return Ok((State::Done, true));
            }
        };
        let pass = self.start_pass(lane, &probed, window)?;
        Ok((
            State::Passing {
                probed,
                windows,
                pass: Some(pass),
            },
            true,
        ))
    }

    /// Enqueues one window: pairs and gathers on the compute queue, copies on the download queue.
    fn start_pass(
        &mut self,
        lane: &mut LaneParts<'_, B>,
        probed: &Probed<B>,
        window: Range<u64>,
    ) -> Result<Pass<B>> {
        let Some(table) = lane.table else {
            return internal_err!("a chunk passes without a table");
        };
        let (q, d) = (&lane.queues.compute, &lane.queues.download);
        let start = q.record()?;
        let mut output = materialize(
            q,
            table,
            probed.source(lane)?,
            &probed.offsets,
            window,
            &lane.spec.layout,
        )?;
        let layout = pass_layout(&lane.spec.kinds.output, output.rows);
        // The build view values the device gathers, each column's total read back; they come
        // down into the pass's block after its columns, in room for the longest value a row.
        let mut values = vec![];
        let mut room = layout.bytes;
        let view_columns = lane.spec.gather.iter().flat_map(|g| g.device_views());
        for (k, v) in view_columns {
            let (Some(Some(data)), Some(column)) = (lane.values.get(v), output.columns.get_mut(k))
            else {
                continue;
            };
            let validity = column.validity.as_ref();
            let rows = output.rows;
            let gathered = view_bytes::gather(q, k, &mut column.values, validity, rows, data)?;
            let mut total = scalar_block(lane)?;
            q.read_u64(&gathered.offsets, rows, &mut total)?;
            let at = room.next_multiple_of(64);
            room = at + B::buf_len(&gathered.bytes);
            values.push(PassValues {
                gathered,
                total,
                at,
                len: 0,
            });
        }
        let materialized = q.record()?;
        self.timings.push((Phase::Materialize, start, q.record()?));
        let mut block = match d.output().try_take(room)? {
            Some(b) => b,
            None => {
                lane.spec.metrics.unpooled_bytes.add(room);
                lane.spill.take_unpooled(room)?
            }
        };
        d.wait(&materialized)?;
        let down_start = d.record()?;
        let has_nulls = download_pass(d, &output, &layout, &mut block)?;
        let downloaded = d.record()?;
        self.timings
            .push((Phase::Download, down_start, d.record()?));
        self.bytes_downloaded += layout.bytes;
        lane.spec.metrics.passes.add(1);
        trace!("{}: window of {} pairs enqueued", self.name(), output.rows);
        Ok(Pass {
            _output: output,
            block,
            layout,
            has_nulls,
            downloaded,
            values,
            values_downloaded: None,
        })
    }

    /// Enqueues the downloads of a pass's view values, whose totals are back with its columns,
    /// into its block.
    fn download_values(&mut self, lane: &mut LaneParts<'_, B>, pass: &mut Pass<B>) -> Result<()> {
        let d = &lane.queues.download;
        let down_start = d.record()?;
        for v in &mut pass.values {
            let total = u64::from_le_bytes(v.total.bytes()?[..8].try_into().unwrap_or_default());
            // A view's offset has 32 bits: the device leaves out values placed past them, so a
            // larger total is refused (the sizing keeps windows far below it).
            let room = B::buf_len(&v.gathered.bytes).min(u32::MAX as usize);
            let Some(total) = usize::try_from(total).ok().filter(|&t| t <= room) else {
                return internal_err!(
                    "the device gathered {total} bytes of view values into {room} bytes"
                );
            };
            if total > 0 {
                d.copy_to_host(&v.gathered.bytes, 0, &mut pass.block, v.at, total)?;
            }
            v.len = total;
            self.bytes_downloaded += total;
            lane.spec.metrics.view_bytes_gathered.add(total);
        }
        pass.values_downloaded = Some(d.record()?);
        self.timings
            .push((Phase::Download, down_start, d.record()?));
        Ok(())
    }

    /// Sends a downloaded window to the partition over its block (no copy).
    fn emit_pass(&mut self, lane: &mut LaneParts<'_, B>, pass: Pass<B>) -> Result<()> {
        let end = (pass.values.iter())
            .map(|v| v.at + v.len)
            .fold(pass.layout.bytes, usize::max);
        let buffer = pass.block.into_buffer(end)?;
        let mut values = Vec::with_capacity(pass.values.len());
        for v in pass.values {
            lane.scalars.push(v.total);
            values.push((v.gathered.column, buffer.slice_with_length(v.at, v.len)));
        }
        let rows = BlockRows::new(
            buffer,
            pass.layout,
            pass.has_nulls,
            Arc::clone(&lane.spec.layout.schema),
        )
        .with_values(values);
        let _ = self.results.send(Ok(LaneOutput::Window(rows)));
        Ok(())
    }

    /// Sends `rows` output rows without columns.
    fn emit_rows(&mut self, spec: &RunSpec, rows: u64) -> Result<()> {
        let Ok(rows) = usize::try_from(rows) else {
            return internal_err!("{rows} output rows do not fit usize");
        };
        if rows > 0 {
            let rows = BlockRows::count(rows, Arc::clone(&spec.layout.schema));
            let _ = self.results.send(Ok(LaneOutput::Window(rows)));
        }
        Ok(())
    }

    fn keep_probed(&mut self, probed: Probed<B>) {
        self.keep.push(probed.offsets);
        if let Some((relation, keys)) = probed.probe {
            self.keep.push(keys);
            for col in relation.columns.into_values() {
                self.keep.push(col.values);
                self.keep.extend(col.validity);
            }
        }
    }

    /// The chunk's device times per phase, and bytes moved.
    fn account(&self, queues: &Queues<B>, spec: &RunSpec) -> Result<()> {
        let phases = &spec.metrics.phases;
        for (phase, start, end) in &self.timings {
            let t: Duration = queues.compute.elapsed(start, end)?;
            let time = match phase {
                Phase::Upload => &phases.upload,
                Phase::Transform => &phases.transform,
                Phase::Match => &phases.matching,
                Phase::Materialize => &phases.materialize,
                Phase::Download => &phases.download,
            };
            time.add_duration(t);
        }
        phases.bytes_uploaded.add(self.bytes_uploaded);
        phases.upload_bytes_saved.add(self.upload_bytes_saved);
        phases.bytes_downloaded.add(self.bytes_downloaded);
        Ok(())
    }

    /// Tells the partition the chunk failed.
    pub fn fail(&self, e: &Arc<datafusion::common::DataFusionError>) {
        let _ = self
            .results
            .send(Err(datafusion::common::DataFusionError::Shared(
                Arc::clone(e),
            )));
    }
}
