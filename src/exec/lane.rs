//! The device lane of one join execution on one device (a join on several devices has one per
//! device, each fed by its share of the output partitions): a thread that owns three queues of
//! the device — uploads, kernels, downloads — and drives the build side and every probe chunk
//! of its partitions through them.
//!
//! ```text
//!  partitions ──Job::Probe (staged block)──►┐
//!             ──Job::ProbeDone─────────────►│
//!  build tasks ─Job::Build (staged block)──►├─► lane thread ─┬─ upload queue:   H2D copies
//!              ─Job::BuildDone (encoder)───►┘                ├─ compute queue:  table, probes
//!                                                            └─ download queue: D2H copies
//!  partition i ◄── a batch per window, then ChunkDone ───────┘
//! ```
//! Joins that output build rows after the probe side (left, full, left semi, anti and mark)
//! keep a mark per build row on the device, set by the probes. Each partition says
//! `ProbeDone` once all its chunks are done; the lane answers `ChunkDone` at once, except to the
//! last partition, whose last chunk is then the build rows the join keeps — emitted once, after
//! every probe row, as by `HashJoinExec`. On several devices, each lane marks what its own
//! partitions matched; once they are all done it gives its marks to the join's [`MarksMerge`],
//! and the last lane to do so emits the build rows by every lane's marks.
//! Queues are ordered by events, never by waiting for a whole stream: a chunk's kernels wait
//! for its upload, its download waits for its kernels, and the lane thread waits only when no
//! chunk can move on: for whichever pending event completes first (or a job arrives), or, when
//! every event is complete and a last look moved nothing, for the next job. Several chunks are in flight at once (the
//! first in the run's base memory slot, more while the budget lets the lane reserve them), so
//! one chunk's upload, another's kernels and a third's download overlap. Chunks are handled in
//! the order they arrive, and each partition's results come back in its own order.
//!
//! Errors reach every partition; the lane then answers every later job with the same error.
//! When the last sender is gone the lane finishes its work, waits for its queues and frees all
//! it holds.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, Sender, TryRecvError, channel};

use crate::columns::BlockRows;
use datafusion::common::{DataFusionError, Result, exec_datafusion_err};

use super::chunk::{Chunk, LaneParts, Queues};
use super::gather::HostBuild;
use super::marks::{MarksMerge, or_marks};
use super::run::RunSpec;
use super::sizing::Sizing;
use super::stager::{Span, Staged};
use super::view_bytes::DeviceData;
use crate::backend::Backend;
use crate::columns::{DeviceRelation, RawColumns, concat};
use crate::device::{HostBlock, HostPool, Reservation};
use crate::join::hash::BucketTable;
use crate::join::hash_checked_keys;
use crate::trace::{trace, tracing};

/// Most chunks one lane keeps in flight: enough that while some chunks count (and the host reads
/// their totals), others upload, materialize and download (4 left the copy engines idle at
/// times on an H100; 16 measured no better than 8).
const MAX_IN_FLIGHT: usize = 8;

/// What ended a lane's wait.
enum Woke {
    /// There was nothing to wait for: every event had completed.
    Nothing,
    /// An event completed.
    Event,
    /// A job arrived.
    Job(Job),
    /// Every job sender is gone.
    Closed,
}

/// What a lane sends a partition.
#[derive(Debug)]
pub(crate) enum LaneOutput {
    /// One output window (or, without output columns, a count of rows), which the partition's
    /// stream hands out in batches of the session's batch size: the lane thread sends one
    /// message per window, and the partitions cut their batches in parallel.
    Window(BlockRows),
    /// All of one chunk's windows have been sent.
    ChunkDone,
}

/// Where a partition's results go.
pub(crate) type Results = tokio::sync::mpsc::UnboundedSender<Result<LaneOutput>>;

/// What a chunk holds.
pub(crate) enum Work {
    /// Staged probe rows.
    ProbeRows(Staged),
    /// The build rows the join outputs after the probe side; with a residual filter, the
    /// partitions' marks of the build rows they kept pairs of (a byte per row, table order).
    BuildRows(Option<Vec<u8>>),
}

/// A chunk of one partition.
pub(crate) struct ChunkJob {
    pub partition: usize,
    /// The chunk's place among its partition's chunks (0, 1, ...).
    pub seq: u64,
    pub work: Work,
    pub results: Results,
}

impl ChunkJob {
    /// How the trace names the job.
    fn name(&self) -> String {
        match &self.work {
            Work::ProbeRows(s) => format!(
                "probe chunk {}#{} of {} rows",
                self.partition, self.seq, s.rows
            ),
            Work::BuildRows(_) => format!("build rows as chunk {}#{}", self.partition, self.seq),
        }
    }
}

/// What a lane is told, in this order: `Start`, `Build`s, `BuildDone`, then `Probe`s and
/// `ProbeDone`s.
pub(crate) enum Job {
    /// The join's device memory (the build side and the first chunk in flight), how to encode
    /// keys, and how big chunks are.
    Start {
        reservation: Reservation,
        encoder: crate::columns::KeyEncoder,
        sizing: Sizing,
        /// When the join began collecting its build side, for `build_time`: given to one lane
        /// of a join on several devices, so that the metric is the wall time to the first
        /// lane's table.
        started: Option<std::time::Instant>,
        /// The output partitions this lane probes for (partition `p` feeds lane `p % lanes`).
        partitions: usize,
        /// Where lanes of a join on several devices that outputs build rows after the probe
        /// side merge their marks.
        marks: Option<Arc<MarksMerge>>,
        /// The build side's view columns whose values the device gathers: the host build
        /// holding their buffers, and per view column the longest value the device gathers,
        /// where it gathers them
        /// ([`view_bytes::Plan`]).
        values: Option<(Arc<HostBuild>, Vec<Option<usize>>)>,
    },
    /// Build rows, with their place in the build side: (staging task, block of the task). The
    /// table takes the blocks in this order, so the rows of one bucket (and a probe row's
    /// matches) come in the order the build side was collected, whatever order the blocks
    /// arrive in.
    Build((usize, usize), Staged),
    /// The build side is complete: make the table.
    BuildDone,
    /// Probe rows of a partition (`ChunkJob::work` is `ProbeRows`).
    Probe(ChunkJob),
    /// Every chunk of a partition is done (only for joins whose emission outputs build rows):
    /// the lane answers `ChunkDone` to `results`, after the build rows if it is the last.
    ProbeDone {
        partition: usize,
        /// The partition's next chunk number.
        seq: u64,
        results: Results,
        /// With a residual filter: a byte per build row the partition kept a pair of (table
        /// order; shorter than the table where the rest are unmarked).
        marks: Vec<u8>,
    },
}

static RUNNING: AtomicUsize = AtomicUsize::new(0);

/// Lanes whose threads have not finished (for tests that check that nothing is left behind).
pub fn lanes_running() -> usize {
    RUNNING.load(Ordering::SeqCst)
}

/// Resolves once lanes (one, or every lane of a join on several devices) have ended and
/// dropped all they held: their device memory is back in the budgets.
#[derive(Debug, Clone)]
pub(crate) struct LaneEnd(Vec<tokio::sync::watch::Receiver<bool>>);

impl LaneEnd {
    /// The end of every lane of `ends`.
    pub fn all(ends: Vec<LaneEnd>) -> Self {
        Self(ends.into_iter().flat_map(|e| e.0).collect())
    }

    /// Waits for the lanes' end.
    pub async fn wait(self) {
        for mut end in self.0 {
            // An error means the lane's thread is gone without saying so (it never started):
            // it holds nothing either.
            let _ = end.wait_for(|ended| *ended).await;
        }
    }

    /// Whether `other` tells the end of the same lanes.
    pub fn same(&self, other: &LaneEnd) -> bool {
        self.0.len() == other.0.len() && self.0.iter().zip(&other.0).all(|(a, b)| a.same_channel(b))
    }
}

/// Starts the lane of a join on `queue`'s device; the lane runs until every sender is dropped.
pub(crate) fn spawn_lane<B: Backend>(
    queue: &B,
    spec: Arc<RunSpec>,
) -> Result<(Sender<Job>, LaneEnd)> {
    let queues = Queues {
        upload: queue.fork()?,
        compute: queue.fork()?,
        download: queue.fork()?,
    };
    let (sender, jobs) = channel();
    let lane = Lane {
        queues,
        spec,
        jobs,
        closed: false,
        failed: None,
        build: BuildState::Collecting(vec![]),
        encoder: None,
        build_started: None,
        table: None,
        visited: None,
        partitions_done: 0,
        partitions: 0,
        marks: None,
        probed: false,
        host_marks: vec![],
        sizing: None,
        reservations: vec![],
        base_slot_free: false,
        waiting: VecDeque::new(),
        chunks: VecDeque::new(),
        next_out: HashMap::new(),
        scalars: vec![],
        spill: HostPool::heap(64, 0),
        values: vec![],
    };
    let (ended, end) = tokio::sync::watch::channel(false);
    RUNNING.fetch_add(1, Ordering::SeqCst);
    std::thread::Builder::new()
        .name("gpu-join-lane".into())
        .spawn(move || {
            // `run` consumes the lane: all it held is dropped before the end is told.
            lane.run();
            trace!("lane dropped");
            let _ = ended.send(true);
        })
        .map_err(|e| {
            RUNNING.fetch_sub(1, Ordering::SeqCst);
            exec_datafusion_err!("cannot start the GpuJoinExec lane thread: {e}")
        })?;
    Ok((sender, LaneEnd(vec![end])))
}

/// A build block on the device.
struct BuildPart<B: Backend> {
    /// Its place in the build side (see [`Job::Build`]).
    order: (usize, usize),
    raw: RawColumns<B::Buf>,
    /// Events around the copies.
    upload: Span<B::Event>,
    /// The staged block, until its copies have finished.
    staged: Option<Staged>,
}

enum BuildState<B: Backend> {
    /// Build blocks uploaded so far.
    Collecting(Vec<BuildPart<B>>),
    /// The table is enqueued; what it was made from is kept until `built` completes.
    Building {
        /// Events around the table's kernels.
        transform: Span<B::Event>,
        parts: Vec<BuildPart<B>>,
        _relations: Vec<DeviceRelation<B::Buf>>,
        _bitmaps: Vec<B::Buf>,
    },
    Ready,
}

struct Lane<B: Backend> {
    queues: Queues<B>,
    spec: Arc<RunSpec>,
    jobs: Receiver<Job>,
    /// Every sender is gone.
    closed: bool,
    /// The first error; every later job is answered with it.
    failed: Option<Arc<DataFusionError>>,
    build: BuildState<B>,
    encoder: Option<crate::columns::KeyEncoder>,
    /// When the join began collecting its build side (for `build_time`).
    build_started: Option<std::time::Instant>,
    table: Option<BucketTable<B>>,
    /// A byte per build row (in table order), set when a probe row matches it; only for joins
    /// that output build rows after the probe side.
    visited: Option<B::Buf>,
    /// Partitions that said `ProbeDone`, and how many will.
    partitions_done: usize,
    partitions: usize,
    /// Where the join's lanes merge their marks, on several devices.
    marks: Option<Arc<MarksMerge>>,
    /// Whether a probe chunk has arrived (counted in `device_lanes`).
    probed: bool,
    /// With a residual filter, the marks partitions sent with `ProbeDone`, merged.
    host_marks: Vec<u8>,
    sizing: Option<Sizing>,
    /// Device memory this join holds (build side, first slot); the tracker's limit.
    reservations: Vec<Reservation>,
    base_slot_free: bool,
    /// Chunks waiting for a slot.
    waiting: VecDeque<ChunkJob>,
    /// Probe chunks in flight, oldest first.
    chunks: VecDeque<Chunk<B>>,
    /// Per partition, the chunk that may hand out results next.
    next_out: HashMap<usize, u64>,
    scalars: Vec<HostBlock>,
    spill: HostPool,
    /// Per build view column the device carries, its data where the device gathers its values.
    values: Vec<Option<DeviceData<B::Buf>>>,
}

impl<B: Backend> Lane<B> {
    fn run(mut self) {
        // A panic must not leave partitions waiting for results that never come: it becomes an
        // error for all of them.
        let driven = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.drive()))
            .unwrap_or_else(|p| {
                let what = p
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
                    .unwrap_or_default();
                Err(exec_datafusion_err!("GpuJoinExec lane panicked: {what}"))
            });
        if let Err(e) = driven {
            trace!("lane failed: {e}");
            self.fail(e);
            self.answer_with_error();
        }
        self.shut_down();
        trace!("lane done");
        RUNNING.fetch_sub(1, Ordering::SeqCst);
    }

    /// The lane's loop: take jobs, move chunks on, wait when nothing moves.
    fn drive(&mut self) -> Result<()> {
        loop {
            let mut moved = self.intake()?;
            moved |= self.advance()?;
            if moved {
                continue;
            }
            let waited = std::time::Instant::now();
            let woke = self.wait_any()?;
            if !matches!(woke, Woke::Nothing) {
                self.spec
                    .metrics
                    .lane_wait_time
                    .add_duration(waited.elapsed());
                match woke {
                    Woke::Job(job) => self.accept(job)?,
                    Woke::Closed => self.closed = true,
                    Woke::Event | Woke::Nothing => {}
                }
                continue;
            }
            // Every event is complete now, also those that completed after `advance` looked at
            // them: move once more before waiting for jobs, or the lane would sleep on the job
            // channel while a chunk could go on.
            if self.advance()? {
                continue;
            }
            if self.closed {
                return Ok(());
            }
            match self.jobs.recv() {
                Ok(job) => {
                    self.spec
                        .metrics
                        .lane_wait_time
                        .add_duration(waited.elapsed());
                    self.accept(job)?
                }
                Err(_) => self.closed = true,
            }
        }
    }

    /// Takes the jobs that have arrived.
    fn intake(&mut self) -> Result<bool> {
        let mut took = false;
        loop {
            match self.jobs.try_recv() {
                Ok(job) => {
                    self.accept(job)?;
                    took = true;
                }
                Err(TryRecvError::Empty) => return Ok(took),
                Err(TryRecvError::Disconnected) => {
                    let changed = !self.closed;
                    self.closed = true;
                    return Ok(took || changed);
                }
            }
        }
    }

    fn accept(&mut self, job: Job) -> Result<()> {
        trace!(
            "job {} ({} chunks in flight, {} waiting)",
            match &job {
                Job::Start { .. } => "start".to_string(),
                Job::Build(_, s) => format!("build block of {} rows", s.rows),
                Job::BuildDone => "build done".to_string(),
                Job::Probe(p) => p.name(),
                Job::ProbeDone { partition, .. } => format!("partition {partition} probed"),
            },
            self.chunks.len(),
            self.waiting.len()
        );
        match job {
            Job::Start {
                reservation,
                encoder,
                sizing,
                started,
                partitions,
                marks,
                values,
            } => {
                self.partitions = partitions;
                self.marks = marks;
                self.reservations.push(reservation);
                self.update_limit();
                if let Some((build, columns)) = values {
                    self.upload_values(&build, &columns)?;
                }
                self.encoder = Some(encoder);
                self.sizing = Some(sizing);
                self.base_slot_free = true;
                self.build_started = started;
                Ok(())
            }
            Job::Build(order, staged) => self.upload_build(order, staged),
            Job::BuildDone => self.make_table(),
            Job::Probe(job) => {
                if !self.probed {
                    self.probed = true;
                    self.spec.metrics.device_lanes.add(1);
                }
                self.waiting.push_back(job);
                Ok(())
            }
            Job::ProbeDone {
                partition,
                seq,
                results,
                marks,
            } => {
                self.partitions_done += 1;
                or_marks(&mut self.host_marks, &marks);
                if self.partitions_done < self.partitions {
                    let _ = results.send(Ok(LaneOutput::ChunkDone));
                    return Ok(());
                }
                // The host's marks where it decides the pairs (they replace the device's).
                let host = self.spec.residual.is_some();
                let marks = match self.marks.clone() {
                    None => host.then(|| std::mem::take(&mut self.host_marks)),
                    Some(merge) => {
                        let mine = match host {
                            true => std::mem::take(&mut self.host_marks),
                            false => self.device_marks()?,
                        };
                        match merge.add(&mine)? {
                            // Every lane's marks, which replace this lane's device marks.
                            Some(all) => Some(all),
                            None => {
                                let _ = results.send(Ok(LaneOutput::ChunkDone));
                                return Ok(());
                            }
                        }
                    }
                };
                self.waiting.push_back(ChunkJob {
                    partition,
                    seq,
                    work: Work::BuildRows(marks),
                    results,
                });
                Ok(())
            }
        }
    }

    /// The device's marks, a byte a build row, copied to the host once the kernels before (every
    /// probe of this lane's partitions, all done) have set them.
    fn device_marks(&self) -> Result<Vec<u8>> {
        let (Some(table), Some(visited)) = (&self.table, &self.visited) else {
            return Err(exec_datafusion_err!("marks before the table"));
        };
        let mut marks = vec![0u8; table.rows()];
        self.queues.compute.download(visited, &mut marks)?;
        Ok(marks)
    }

    /// Sets the tracker's limit to the memory this join holds.
    fn update_limit(&self) {
        let held: usize = self
            .reservations
            .iter()
            .map(Reservation::bytes)
            .sum::<usize>()
            + self
                .chunks
                .iter()
                .filter_map(|c| c.slot.as_ref().map(Reservation::bytes))
                .sum::<usize>();
        self.queues.upload.tracker().set_limit(held);
    }

    /// Uploads the data buffers of the build view columns whose values the device gathers
    /// (`columns`: per view column of `build`, the longest value the device gathers, where it
    /// gathers them).
    fn upload_values(&mut self, build: &HostBuild, columns: &[Option<usize>]) -> Result<()> {
        let q = &self.queues.upload;
        self.values = (build.view_columns().iter().zip(columns))
            .map(|((_, views), longest)| {
                longest
                    .map(|longest| {
                        let data = DeviceData::upload(q, views, longest)?;
                        self.spec
                            .metrics
                            .phases
                            .bytes_uploaded
                            .add(views.data_bytes());
                        Ok(data)
                    })
                    .transpose()
            })
            .collect::<Result<_>>()?;
        Ok(())
    }

    fn upload_build(&mut self, order: (usize, usize), mut staged: Staged) -> Result<()> {
        let BuildState::Collecting(parts) = &mut self.build else {
            return Err(exec_datafusion_err!(
                "build rows after the build side ended"
            ));
        };
        let (raw, upload) = staged.upload(&self.queues.upload, &self.spec.build_indices)?;
        let phases = &self.spec.metrics.phases;
        phases.bytes_uploaded.add(raw.bytes::<B>());
        phases.upload_bytes_saved.add(raw.bytes_saved());
        parts.push(BuildPart {
            order,
            raw,
            upload,
            staged: Some(staged),
        });
        Ok(())
    }

    /// Enqueues the table: unpack and concatenate the build parts, hash checked keys, encode,
    /// bucket.
    fn make_table(&mut self) -> Result<()> {
        let Some(encoder) = self.encoder.take() else {
            return Err(exec_datafusion_err!(
                "the build side ended before it started"
            ));
        };
        let BuildState::Collecting(mut parts) =
            std::mem::replace(&mut self.build, BuildState::Ready)
        else {
            return Err(exec_datafusion_err!("the build side ended twice"));
        };
        parts.sort_by_key(|p| p.order);
        let q = &self.queues.compute;
        let start = q.record()?;
        let mut bitmaps = vec![];
        let mut relations = vec![];
        for part in &mut parts {
            q.wait(&part.upload.1)?;
            let raw = std::mem::replace(
                &mut part.raw,
                RawColumns {
                    rows: 0,
                    columns: vec![],
                },
            );
            relations.push(raw.unpack(q, &mut bitmaps)?);
        }
        let mut relation = concat(q, &relations)?;
        let layout = &self.spec.layout;
        hash_checked_keys(q, layout, true, &mut relation, &mut bitmaps)?;
        let table = BucketTable::build(q, &relation, layout, encoder)?;
        if self.spec.emission().build.is_some() {
            let mut visited = q.alloc(table.rows())?;
            q.fill(&mut visited, 0)?;
            self.visited = Some(visited);
        }
        let built = q.record()?;
        relations.push(relation);
        self.table = Some(table);
        self.build = BuildState::Building {
            transform: (start, built),
            parts,
            _relations: relations,
            _bitmaps: bitmaps,
        };
        Ok(())
    }

    /// Moves the build and every chunk on as far as they go without waiting.
    fn advance(&mut self) -> Result<bool> {
        let mut moved = self.finish_build()?;
        moved |= self.admit()?;
        let mut parts = LaneParts {
            queues: &self.queues,
            spec: &self.spec,
            table: self.table.as_ref(),
            visited: self.visited.as_mut(),
            pass_rows: self.sizing.map_or(1, |s| s.pass_rows),
            scalars: &mut self.scalars,
            spill: &self.spill,
            next_out: &mut self.next_out,
            values: &self.values,
        };
        for chunk in self.chunks.iter_mut() {
            moved |= chunk.advance(&mut parts)?;
        }
        if self.chunks.iter().any(Chunk::is_done) {
            let (done, going): (Vec<_>, Vec<_>) = self.chunks.drain(..).partition(Chunk::is_done);
            self.chunks = going.into();
            for chunk in done {
                self.retire(chunk);
            }
        }
        Ok(moved)
    }

    /// Gives staged build blocks back once copied, and drops what the table was made from
    /// once it is made (accounting the device time of both).
    fn finish_build(&mut self) -> Result<bool> {
        let mut moved = false;
        let parts = match &mut self.build {
            BuildState::Collecting(parts) => parts,
            BuildState::Building { parts, .. } => parts,
            BuildState::Ready => return Ok(false),
        };
        for part in parts.iter_mut() {
            if part.staged.is_some() && self.queues.upload.is_done(&part.upload.1)? {
                part.staged = None;
                moved = true;
            }
        }
        let BuildState::Building {
            transform: (start, built),
            parts,
            ..
        } = &self.build
        else {
            return Ok(moved);
        };
        if !self.queues.compute.is_done(built)? {
            return Ok(moved);
        }
        let phases = &self.spec.metrics.phases;
        let q = &self.queues.compute;
        for part in parts {
            phases
                .upload
                .add_duration(q.elapsed(&part.upload.0, &part.upload.1)?);
        }
        phases.transform.add_duration(q.elapsed(start, built)?);
        if let Some(started) = self.build_started {
            self.spec.metrics.build_time.add_duration(started.elapsed());
        }
        self.build = BuildState::Ready;
        Ok(true)
    }

    /// Starts waiting chunks while there is memory for them.
    fn admit(&mut self) -> Result<bool> {
        let Some(sizing) = self.sizing else {
            return Ok(false);
        };
        let mut moved = false;
        while let Some(job) = self.waiting.pop_front() {
            if job.results.is_closed() {
                moved = true;
                continue;
            }
            let slot = if self.base_slot_free {
                self.base_slot_free = false;
                None
            } else if self.chunks.len() < MAX_IN_FLIGHT {
                // (The join's first reservation names the query that holds the memory.)
                let more = self
                    .reservations
                    .first()
                    .and_then(|r| r.try_more(sizing.slot_bytes));
                match more {
                    Some(r) => Some(r),
                    None => {
                        self.waiting.push_front(job);
                        break;
                    }
                }
            } else {
                self.waiting.push_front(job);
                break;
            };
            let chunk = Chunk::upload(&self.queues, &self.spec, job, slot)?;
            self.chunks.push_back(chunk);
            self.update_limit();
            moved = true;
        }
        Ok(moved)
    }

    /// A finished chunk gives its memory back.
    fn retire(&mut self, chunk: Chunk<B>) {
        if chunk.slot.is_none() {
            self.base_slot_free = true;
        }
        let peak = self.queues.upload.tracker().peak();
        self.spec.metrics.peak_device_memory.set_max(peak);
        drop(chunk);
        self.update_limit();
    }

    /// The events to wait for when nothing can move, those not yet complete of: the uploads of
    /// staged build blocks (their blocks go back to the pool after them, and producers may be
    /// waiting for blocks), the table, and each chunk's upload (likewise) and pending event;
    /// oldest first, each with what it is (for the trace).
    fn open_events(&self) -> Vec<(&B::Event, String)> {
        let q = &self.queues.compute;
        let open = |(e, _): &(&B::Event, String)| !q.is_done(e).unwrap_or(true);
        let (parts, built) = match &self.build {
            BuildState::Collecting(parts) => (parts.as_slice(), None),
            BuildState::Building {
                parts,
                transform: (_, built),
                ..
            } => (parts.as_slice(), Some(built)),
            BuildState::Ready => (&[][..], None),
        };
        let named =
            |e, what: &dyn Fn() -> String| (e, if tracing() { what() } else { String::new() });
        parts
            .iter()
            .filter(|p| p.staged.is_some())
            .map(|p| named(&p.upload.1, &|| "a build block's upload".into()))
            .chain(built.map(|b| named(b, &|| "the table".into())))
            .chain(self.chunks.iter().flat_map(|c| {
                c.staged_upload()
                    .map(|e| named(e, &|| format!("{}'s upload", c.name())))
                    .into_iter()
                    .chain(
                        c.pending()
                            .map(|e| named(e, &|| format!("{} ({})", c.name(), c.stage()))),
                    )
            }))
            .filter(open)
            .collect()
    }

    /// When nothing can move: waits until any open event completes or a job arrives, whichever
    /// comes first, so that work ready on one queue never waits behind a slower chunk on
    /// another (e.g. a chunk whose count is back, behind an older chunk's download). Polls:
    /// spinning for a few microseconds, then sleeping 20 µs between looks (an interrupt-driven
    /// blocking wait was seen to miss its wake-up on a virtualized GPU host, leaving the lane
    /// asleep forever). When tracing, says every two seconds what it waits for.
    fn wait_any(&self) -> Result<Woke> {
        let events = self.open_events();
        if events.is_empty() {
            return Ok(Woke::Nothing);
        }
        let q = &self.queues.compute;
        let start = std::time::Instant::now();
        let mut said = 0;
        loop {
            for (event, _) in &events {
                if q.is_done(event)? {
                    return Ok(Woke::Event);
                }
            }
            match self.jobs.try_recv() {
                Ok(job) => return Ok(Woke::Job(job)),
                Err(TryRecvError::Disconnected) if !self.closed => return Ok(Woke::Closed),
                Err(_) => {}
            }
            if start.elapsed() < std::time::Duration::from_micros(20) {
                std::hint::spin_loop();
                continue;
            }
            std::thread::sleep(std::time::Duration::from_micros(20));
            let secs = start.elapsed().as_secs();
            if tracing() && secs >= said + 2 {
                said = secs;
                trace!("still waiting for {} after {secs} s", events[0].1);
            }
        }
    }

    /// Sends `e` to every partition with work here, and remembers it.
    fn fail(&mut self, e: DataFusionError) {
        let e = Arc::new(e);
        for chunk in &self.chunks {
            chunk.fail(&e);
        }
        for job in self.waiting.drain(..) {
            let _ = job
                .results
                .send(Err(DataFusionError::Shared(Arc::clone(&e))));
        }
        self.failed = Some(e);
    }

    /// After a failure: answers every later probe job with the error until all senders are gone.
    fn answer_with_error(&mut self) {
        let Some(e) = self.failed.clone() else {
            return;
        };
        while let Ok(job) = self.jobs.recv() {
            let results = match job {
                Job::Probe(job) => job.results,
                Job::ProbeDone { results, .. } => results,
                Job::Start { .. } | Job::Build(..) | Job::BuildDone => continue,
            };
            let _ = results.send(Err(DataFusionError::Shared(Arc::clone(&e))));
        }
    }

    /// Waits for the queues, then frees everything (the ownership rule of `backend`).
    fn shut_down(&mut self) {
        for q in [
            &self.queues.upload,
            &self.queues.compute,
            &self.queues.download,
        ] {
            if let Err(e) = q.synchronize() {
                log::error!("GpuJoinExec lane: waiting for the device failed: {e}");
            }
        }
        self.chunks.clear();
        self.waiting.clear();
        self.build = BuildState::Ready;
        self.table = None;
        self.visited = None;
        self.scalars.clear();
        self.reservations.clear();
    }
}
