//! [`GpuJoinStream`]: the output stream of one partition of a `GpuJoinExec`, a state machine
//! with one method per state.
//!
//! ```text
//!  WaitBuild ──Empty──────────────────────────────────────────────► Done
//!     │ ──Fallback──► Fallback (DataFusion's hash join, this partition)
//!     └──Ready──► Probing: read probe batches until a chunk's rows are in hand, copy them
//!                 into a pinned block and send it to the lane as a chunk; hand out the lane's
//!                 output windows in order, in batches of the session's batch size ──► Done
//! ```
//! While probing, the stream keeps at most [`IN_FLIGHT`] chunks at the lane and stops reading
//! its input until results come back (backpressure). Its first chunk is small, for a quick
//! first batch, and each next one twice as large, up to the join's chunk size (the joins of a
//! grace join's groups start at that size: `exec::grace`); where the memory
//! pool refuses to hold more of its input, the rows in hand go out as a smaller chunk at once.
//! A staging block is taken only once a chunk's rows are in hand, and filled and sent within
//! the same poll: a partition never holds one while it waits for its input, which may be
//! another join's output that needs blocks of the same process-wide pool. A pushed-down
//! `fetch` ends the stream once that many rows are out; dropping the stream (cancellation)
//! tells the lane, which stops work for this partition.
//!
//! For joins that output build rows after the probe side, a partition whose chunks are all done
//! tells the lane (`ProbeDone`) and ends only at the lane's answer: the last partition to do so
//! receives the build rows first.

use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::task::{Context, Poll, ready};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::common::{DataFusionError, Result, exec_datafusion_err};
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryReservation};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender, unbounded_channel};

use super::coalesce::owned;
use super::dictionary_gather::dictionary_rows_cap;
use super::gather::{HostBuild, HostGather, ProbeBatches};
use super::lane::{ChunkJob, Job, LaneOutput, Work};
use super::metrics::GpuJoinMetrics;
use super::null_aware::NullAwareRun;
use super::residual::ResidualStream;
use super::run::{JoinRun, Outcome, ReadyLane, RunSpec, SharedOutcome};
use super::sizing::{MIN_CHUNK_ROWS, Sizing};
use super::stager::Stager;
use crate::columns::BlockRows;
use crate::device::{Holder, HostBlock, HostPool, QueryOf};

/// Chunks a partition keeps at the lane at most.
pub const IN_FLIGHT: usize = 2;

/// What one step of [`GpuJoinStream::poll_input`] did.
enum Step {
    /// Read a batch, or staged and sent a chunk.
    Moved,
    /// Saw the input end.
    Other,
    /// Nothing to do: the input is staged and sent, or the lane holds enough of its chunks.
    Idle,
}

/// The probing state of a partition.
struct Probing {
    /// The plan this execution runs (the node's, or its hashed-key twin).
    spec: Arc<RunSpec>,
    lane: Sender<Job>,
    sizing: Sizing,
    staging: HostPool,
    /// The probe input; `None` once it has ended.
    input: Option<SendableRecordBatchStream>,
    /// Probe batches read and not yet staged, with the host bytes reserved for each (none
    /// for a batch the memory pool refused); the first one's rows are staged up to
    /// `pending_at`.
    pending: std::collections::VecDeque<(RecordBatch, usize)>,
    pending_at: usize,
    /// Rows of `pending` not yet staged.
    pending_rows: usize,
    /// Whether the memory pool refused to hold more of the input: the rows in hand go out as
    /// a chunk now, however few.
    refused: bool,
    /// An output window from the lane, not yet turned into the join's rows.
    window: Option<Window>,
    /// Rows of the join ready to hand out, and the row handed out up to.
    ready: Option<(RecordBatch, usize)>,
    /// Rows of each output batch (the session's batch size, or fewer: [`slice_rows`]).
    batch_size: usize,
    /// The rows slices are cut to from the first slice whose gather fails, where an output
    /// column is a dictionary with 8- or 16-bit keys ([`slice_rows`]).
    dictionary_rows: Option<usize>,
    stager: Stager,
    /// Bytes of every staging block (the largest chunk's).
    block_bytes: usize,
    /// A block being waited for.
    block: Option<BoxFuture<'static, Result<HostBlock>>>,
    /// Rows of the next chunk.
    chunk_rows: usize,
    /// Chunks sent.
    sent: u64,
    /// Whether the lane has been told that every chunk is done (joins that output build rows
    /// after the probe side; `true` from the start for the others).
    said_done: bool,
    /// Per chunk at the lane: its first row's place among the partition's probe rows (`None`:
    /// the lane's answer to `ProbeDone`).
    in_flight: std::collections::VecDeque<Option<u64>>,
    /// Probe rows sent to the lane.
    rows_sent: u64,
    results: UnboundedReceiver<Result<LaneOutput>>,
    results_tx: UnboundedSender<Result<LaneOutput>>,
    /// The residual filter's pass over the lane's candidates.
    residual: Option<ResidualStream>,
    /// The columns gathered on the host: from the build side, and from the probe batches held.
    gather: Option<Arc<HostGather>>,
    build: Arc<HostBuild>,
    held: ProbeBatches,
    /// A null-aware anti join's shared state, and whether this partition has told it that it
    /// read all of its input.
    null_aware: Option<(Arc<NullAwareRun>, bool)>,
}

enum State {
    WaitBuild,
    Probing(Box<Probing>),
    Fallback(SendableRecordBatchStream),
    /// The build side is joined in groups, each by a join of its own (`exec::grace`), whose
    /// streams record this partition's metrics.
    Grace(futures::stream::BoxStream<'static, Result<RecordBatch>>),
    Done,
}

/// The output stream of one partition of a `GpuJoinExec`.
pub struct GpuJoinStream {
    schema: SchemaRef,
    partition: usize,
    /// The run's build future (a clone, so that this stream can poll it).
    outcome: SharedOutcome,
    right: Arc<dyn ExecutionPlan>,
    ctx: Arc<TaskContext>,
    metrics: GpuJoinMetrics,
    /// Rows still to hand out under a pushed-down limit.
    fetch: Option<usize>,
    /// Host memory of the probe batches this partition holds.
    reservation: MemoryReservation,
    state: State,
    /// The run's flag for a partition dropped before its end, or failed.
    abandoned: Arc<AtomicBool>,
}

impl Drop for GpuJoinStream {
    fn drop(&mut self) {
        if !matches!(self.state, State::Done) {
            self.abandoned.store(true, Ordering::Relaxed);
        }
    }
}

impl GpuJoinStream {
    pub(crate) fn new(
        partition: usize,
        run: Arc<JoinRun>,
        right: Arc<dyn ExecutionPlan>,
        ctx: Arc<TaskContext>,
        metrics: GpuJoinMetrics,
        fetch: Option<usize>,
    ) -> Self {
        let reservation =
            MemoryConsumer::new(format!("GpuJoinExec[{partition}]")).register(ctx.memory_pool());
        Self {
            schema: Arc::clone(run.spec.output_schema()),
            partition,
            outcome: run.outcome.clone(),
            right,
            ctx,
            metrics,
            fetch,
            reservation,
            state: State::WaitBuild,
            abandoned: Arc::clone(&run.abandoned),
        }
    }

    fn poll_state(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<RecordBatch>>> {
        loop {
            let poll = match &mut self.state {
                State::WaitBuild => match ready!(self.poll_build(cx)) {
                    Ok(()) => continue,
                    Err(e) => Poll::Ready(Some(Err(e))),
                },
                State::Probing(_) => self.poll_probing(cx),
                State::Fallback(stream) => stream.poll_next_unpin(cx),
                State::Grace(stream) => stream.poll_next_unpin(cx),
                State::Done => Poll::Ready(None),
            };
            return match poll {
                Poll::Ready(Some(Ok(batch))) => Poll::Ready(Some(Ok(self.limit(batch)))),
                Poll::Ready(None) => {
                    self.state = State::Done;
                    Poll::Ready(None)
                }
                other => other,
            };
        }
    }

    /// Applies the pushed-down limit to a batch that goes out.
    fn limit(&mut self, batch: RecordBatch) -> RecordBatch {
        let Some(left) = self.fetch.as_mut() else {
            return batch;
        };
        let batch = if batch.num_rows() > *left {
            batch.slice(0, *left)
        } else {
            batch
        };
        *left -= batch.num_rows();
        if *left == 0 {
            // Enough rows: drop the input and the lane's work for this partition.
            self.state = State::Done;
        }
        batch
    }

    /// WaitBuild: waits for the build side, then moves to the state it decided.
    fn poll_build(&mut self, cx: &mut Context<'_>) -> Poll<Result<()>> {
        let outcome = match ready!(self.outcome.poll_unpin(cx)) {
            Ok(o) => o,
            Err(e) => {
                self.state = State::Done;
                return Poll::Ready(Err(DataFusionError::Shared(e)));
            }
        };
        self.state = match &*outcome {
            Outcome::Empty => State::Done,
            Outcome::Grace(grace) => {
                State::Grace(grace.partition_stream(self.partition, self.metrics.clone()))
            }
            Outcome::Fallback(join) => State::Fallback(fallback(join, self.partition, &self.ctx)?),
            Outcome::Ready {
                spec, lanes, host, ..
            } => {
                let ReadyLane {
                    lane,
                    sizing,
                    staging,
                } = &lanes[self.partition % lanes.len()];
                let input = self.right.execute(self.partition, Arc::clone(&self.ctx))?;
                let (results_tx, results) = unbounded_channel();
                // A small first chunk gives a first batch soon; a grace join's groups run one
                // after another, each partition's rows of a group in hand, so at full size.
                let chunk_rows = match spec.grace_group {
                    true => sizing.chunk_rows,
                    false => (sizing.chunk_rows / 16)
                        .max(MIN_CHUNK_ROWS)
                        .min(sizing.chunk_rows),
                };
                let (batch_size, dictionary_rows) =
                    slice_rows(self.ctx.session_config().batch_size(), spec);
                State::Probing(Box::new(Probing {
                    spec: Arc::clone(spec),
                    lane: lane.clone(),
                    sizing: *sizing,
                    staging: staging.clone(),
                    input: Some(input),
                    pending: Default::default(),
                    pending_at: 0,
                    pending_rows: 0,
                    refused: false,
                    window: None,
                    ready: None,
                    batch_size,
                    dictionary_rows,
                    stager: match spec.pack_uploads {
                        true => Stager::new(&spec.kinds.probe, chunk_rows).predicting(),
                        false => Stager::new(&spec.kinds.probe, chunk_rows),
                    },
                    block_bytes: spec.kinds.staging_bytes(sizing.chunk_rows),
                    block: None,
                    chunk_rows,
                    sent: 0,
                    said_done: spec.emission().build.is_none(),
                    in_flight: Default::default(),
                    rows_sent: 0,
                    results,
                    results_tx,
                    residual: spec.residual.clone().map(ResidualStream::new),
                    gather: spec.gather.clone(),
                    build: Arc::clone(&host.build),
                    held: ProbeBatches::new(
                        self.ctx.session_config().batch_size().max(1),
                        sizing.pass_rows,
                    ),
                    null_aware: host.null_aware.clone().map(|n| (n, false)),
                }))
            }
        };
        Poll::Ready(Ok(()))
    }

    /// Probing: hands out results, and reads and stages input while few chunks are in flight.
    /// Each slice handed out first reads one more input batch (or sends a chunk) if the lane
    /// may take more, so that a partition busy with its results (a consumer aggregating them)
    /// still feeds the lane.
    fn poll_probing(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<RecordBatch>>> {
        loop {
            let State::Probing(p) = &mut self.state else {
                return Poll::Ready(None);
            };
            // Host work on the lane's output (gathering, the residual filter).
            let timer = self.metrics.baseline.elapsed_compute().timer();
            let next = p.next_slice();
            timer.done();
            let next = match next {
                Ok(next) => next,
                Err(e) => {
                    self.state = State::Done;
                    return Poll::Ready(Some(Err(e)));
                }
            };
            if let Some(batch) = next {
                loop {
                    match self.poll_input(cx) {
                        Poll::Ready(Ok(Step::Other)) => continue,
                        Poll::Ready(Err(e)) => {
                            self.state = State::Done;
                            return Poll::Ready(Some(Err(e)));
                        }
                        _ => break,
                    }
                }
                return Poll::Ready(Some(Ok(batch)));
            }
            match p.results.poll_recv(cx) {
                Poll::Ready(Some(Ok(output))) => {
                    let timer = self.metrics.baseline.elapsed_compute().timer();
                    let received = p.receive(output, &mut self.reservation);
                    timer.done();
                    if let Err(e) = received {
                        self.state = State::Done;
                        return Poll::Ready(Some(Err(e)));
                    }
                    continue;
                }
                Poll::Ready(Some(Err(e))) => {
                    self.state = State::Done;
                    return Poll::Ready(Some(Err(e)));
                }
                Poll::Ready(None) => {
                    return Poll::Ready(Some(Err(exec_datafusion_err!(
                        "GpuJoinExec lane stopped"
                    ))));
                }
                Poll::Pending => {}
            }
            if p.all_sent() {
                if !p.in_flight.is_empty() {
                    return Poll::Pending;
                }
                if let Some((n, finished @ false)) = p.null_aware.as_mut() {
                    *finished = true;
                    if let Some(set_aside) = n.finish() {
                        p.ready = Some((set_aside, 0));
                        continue;
                    }
                }
                if p.said_done {
                    self.state = State::Done;
                    return Poll::Ready(None);
                }
                // Wait for the lane's answer, after the build rows if this partition is last.
                p.lane
                    .send(Job::ProbeDone {
                        partition: self.partition,
                        seq: p.sent,
                        results: p.results_tx.clone(),
                        marks: p
                            .residual
                            .as_mut()
                            .map(ResidualStream::take_marks)
                            .unwrap_or_default(),
                    })
                    .map_err(|_| exec_datafusion_err!("GpuJoinExec lane stopped"))?;
                p.said_done = true;
                p.in_flight.push_back(None);
                continue;
            }
            match self.poll_input(cx) {
                Poll::Ready(Ok(Step::Moved | Step::Other)) => continue,
                Poll::Ready(Ok(Step::Idle)) | Poll::Pending => return Poll::Pending,
                Poll::Ready(Err(e)) => {
                    self.state = State::Done;
                    return Poll::Ready(Some(Err(e)));
                }
            }
        }
    }

    /// One step of reading and staging probe input while the lane may take more chunks: read a
    /// batch, or, once a chunk's rows are in hand (or the input has ended), wait for a block,
    /// copy the rows into it and send it.
    fn poll_input(&mut self, cx: &mut Context<'_>) -> Poll<Result<Step>> {
        let State::Probing(p) = &mut self.state else {
            return Poll::Ready(Ok(Step::Idle));
        };
        if p.all_sent() || p.in_flight.len() >= IN_FLIGHT {
            return Poll::Ready(Ok(Step::Idle));
        }
        if p.pending_rows > 0 && (p.pending_rows >= p.chunk_rows || p.refused || p.input.is_none())
        {
            ready!(Self::poll_block(p, &self.metrics, cx))?;
            let timer = self.metrics.baseline.elapsed_compute().timer();
            let staged = Self::stage(p, &mut self.reservation);
            timer.done();
            staged?;
            Self::submit(p, self.partition, &self.metrics)?;
            return Poll::Ready(Ok(Step::Moved));
        }
        let Some(input) = p.input.as_mut() else {
            return Poll::Ready(Ok(Step::Idle));
        };
        match ready!(input.poll_next_unpin(cx)) {
            Some(Ok(batch)) => {
                self.metrics.probe_rows.add(batch.num_rows());
                if batch.num_rows() > 0 {
                    if let Some((n, _)) = &p.null_aware {
                        n.observe(&batch);
                    }
                    let timer = p.spec.metrics.key_hash_time.timer();
                    let batch = p.spec.probe_side.arrive(batch)?;
                    timer.done();
                    // Where the memory pool refuses to hold more, the rows in hand go to the
                    // lane at once (smaller chunks). The batch is held unreserved until it is
                    // staged, as any operator holds the batch it works on, and the columns
                    // kept for host gathers until its chunk is done.
                    if let Some(g) = p.gather.as_ref().filter(|g| !g.probe_columns.is_empty()) {
                        let reservation = &mut self.reservation;
                        let reserved = p.held.push(&batch, &g.probe_columns, |bytes| {
                            reservation.try_grow(bytes).is_ok()
                        })?;
                        p.refused |= !reserved;
                    }
                    let mut bytes = batch.get_array_memory_size();
                    if self.reservation.try_grow(bytes).is_err() {
                        p.refused = true;
                        bytes = 0;
                    }
                    p.pending_rows += batch.num_rows();
                    p.pending.push_back((batch, bytes));
                }
                Poll::Ready(Ok(Step::Moved))
            }
            Some(Err(e)) => Poll::Ready(Err(e)),
            None => {
                p.input = None;
                Poll::Ready(Ok(Step::Other))
            }
        }
    }

    /// Waits for a staging block for the next chunk. Every block is a page of the device's
    /// pinned staging pool (sizing makes the largest chunk fit one), which is allocated once
    /// when the device opens and not counted in a query's memory pool.
    fn poll_block(
        p: &mut Probing,
        metrics: &GpuJoinMetrics,
        cx: &mut Context<'_>,
    ) -> Poll<Result<()>> {
        let bytes = p.block_bytes;
        let fut = p.block.get_or_insert_with(|| {
            let staging = p.staging.clone();
            let asked = std::time::Instant::now();
            let wait = metrics.staging_wait.clone();
            async move {
                let block = staging.take(bytes).await;
                wait.add_duration(asked.elapsed());
                block
            }
            .boxed()
        });
        let block = ready!(fut.poll_unpin(cx));
        p.block = None;
        Poll::Ready(p.stager.open(block?))
    }

    /// Copies the pending batches' rows into the block, as many as fit (packed where
    /// `gpu_join.pack_uploads` is on and a column's earlier values spanned a narrow range:
    /// [`Stager::predicting`]).
    fn stage(p: &mut Probing, reservation: &mut MemoryReservation) -> Result<()> {
        while !p.stager.is_full() {
            let Some((batch, bytes)) = p.pending.front() else {
                break;
            };
            // (A probe side's row numbers only count its rows: their values are not read.)
            let columns = p
                .spec
                .probe_side
                .staged(batch, &p.spec.probe_indices, 0, None)?;
            let n = p
                .stager
                .stage(&columns, p.pending_at, &p.spec.metrics.key_hash_time)?;
            p.pending_at += n;
            p.pending_rows -= n;
            if p.pending_at == batch.num_rows() {
                reservation.shrink((*bytes).min(reservation.size()));
                p.pending.pop_front();
                p.pending_at = 0;
            }
        }
        if p.pending.is_empty() {
            p.refused = false;
        }
        Ok(())
    }

    /// Sends the staged chunk to the lane; the next chunk is twice as large, up to the limit.
    fn submit(p: &mut Probing, partition: usize, metrics: &GpuJoinMetrics) -> Result<()> {
        let Some(staged) = p.stager.take() else {
            // Nothing staged: the block goes back to the pool.
            return Ok(());
        };
        let staged_rows = staged.rows as u64;
        p.lane
            .send(Job::Probe(ChunkJob {
                partition,
                seq: p.sent,
                work: Work::ProbeRows(staged),
                results: p.results_tx.clone(),
            }))
            .map_err(|_| exec_datafusion_err!("GpuJoinExec lane stopped"))?;
        p.sent += 1;
        p.in_flight.push_back(Some(p.rows_sent));
        p.rows_sent += staged_rows;
        metrics.chunks.add(1);
        if p.chunk_rows < p.sizing.chunk_rows {
            p.chunk_rows = (p.chunk_rows * 2).min(p.sizing.chunk_rows);
            p.stager = p.stager.resized(p.chunk_rows);
        }
        Ok(())
    }
}

impl Probing {
    /// Whether every input row has been read and sent to the lane.
    fn all_sent(&self) -> bool {
        self.input.is_none() && self.pending.is_empty() && self.stager.rows == 0
    }

    /// Takes in what the lane sent: a window of the join's rows (or candidates), which
    /// [`next_slice`](Self::next_slice) turns into output, or the end of a chunk. The lane's
    /// outputs are taken in only once the window before has been handed out, so candidates
    /// pass the residual filter before the partition tells the lane it is done: its marks must
    /// be in before the build rows go out.
    fn receive(&mut self, output: LaneOutput, reservation: &mut MemoryReservation) -> Result<()> {
        match output {
            // A null-aware anti join's build rows do not go out after a null probe key.
            LaneOutput::Window(_) if self.null_aware.as_ref().is_some_and(|n| !n.0.emits()) => {}
            LaneOutput::Window(rows) => {
                // The oldest chunk's rows: up to the next chunk's, or all sent.
                let first = self.in_flight.front().copied().flatten().unwrap_or(0);
                let end = self.in_flight.get(1).copied().flatten();
                if rows.rows() > 0 {
                    self.window = Some(Window {
                        rows,
                        at: 0,
                        chunk: first..end.unwrap_or(self.rows_sent),
                    });
                }
            }
            LaneOutput::ChunkDone => {
                self.in_flight.pop_front();
                // Probe batches before the next chunk's first row are no longer needed.
                let next = self.in_flight.front().copied().flatten();
                let released = self.held.release(next.unwrap_or(self.rows_sent));
                reservation.shrink(released.min(reservation.size()));
                if let Some(r) = self.residual.as_mut() {
                    self.ready = r.end_chunk()?.filter(|b| b.num_rows() > 0).map(|b| (b, 0));
                }
            }
        }
        Ok(())
    }

    /// The next output batch, of at most the session's batch size: from the rows ready, or
    /// else from the next slice of the lane's window, its columns gathered on the host and its
    /// candidates filtered. `None` once the window is handed out. Gathering slice by slice
    /// keeps each output batch's arrays its own (DataFusion's memory accounting counts an
    /// array's whole buffers) and each variable-length column's bytes to one batch's.
    fn next_slice(&mut self) -> Result<Option<RecordBatch>> {
        loop {
            if let Some((ready, at)) = self.ready.as_mut() {
                let len = self.batch_size.min(ready.num_rows() - *at);
                let batch = ready.slice(*at, len);
                *at += len;
                if *at >= ready.num_rows() {
                    self.ready = None;
                }
                return Ok(Some(batch));
            }
            let Some(w) = self.window.as_mut() else {
                return Ok(None);
            };
            let len = self.batch_size.min(w.rows.rows() - w.at);
            let slice = w.rows.batch(w.at, len)?;
            let (chunk, window_rows) = (w.chunk.clone(), w.rows.rows());
            let rows = match &self.gather {
                Some(g) => match g.apply(
                    &slice,
                    w.rows.values(),
                    &self.build,
                    &mut self.held,
                    chunk,
                    window_rows,
                ) {
                    Ok(rows) => rows,
                    // Rows from batches with dictionaries of their own may hold more values
                    // than small dictionary keys number: this slice again, and every one after
                    // it, cut to what they do (gathering takes nothing from the window).
                    Err(_) if self.dictionary_rows.is_some_and(|rows| len > rows) => {
                        self.batch_size = self.dictionary_rows.unwrap_or(len);
                        continue;
                    }
                    Err(e) => return Err(e),
                },
                None => slice,
            };
            if let Some(w) = self.window.as_mut() {
                w.at += len;
                if w.at >= w.rows.rows() {
                    self.window = None;
                }
            }
            if self.gather.is_none() && self.residual.is_none() {
                // The lane's rows are the join's: the slice goes out as it is.
                return Ok(Some(rows));
            }
            let rows = match self.residual.as_mut() {
                Some(r) => r.push(rows)?,
                None => Some(rows),
            };
            self.ready = rows.filter(|b| b.num_rows() > 0).map(|b| (b, 0));
        }
    }
}

/// The rows of each output slice, and of each slice after a gather that failed. An 8- or
/// 16-bit dictionary key type cannot number more rows than it has values, and a slice's rows
/// may come from probe batches each with a dictionary of its own, so each row may bring a value
/// of its own: where such a column is in the output, a slice whose gather fails is gathered
/// again cut to that many rows, and so is every later one (where the values repeat, as a
/// categorical column's do, they are deduplicated and slices keep the session's batch size).
/// A residual filter on the host may add the candidate it saved from the slice before, and
/// its state does not allow a slice again, so there slices are cut below that from the start.
fn slice_rows(batch_size: usize, spec: &RunSpec) -> (usize, Option<usize>) {
    let batch_size = batch_size.max(1);
    let schemas = [
        Some(spec.output_schema()),
        spec.gather.as_ref().map(|g| g.schema()),
    ];
    let cap = dictionary_rows_cap(schemas.into_iter().flatten().map(|s| s.as_ref()));
    match cap {
        Some(cap) if spec.residual.is_some() => (batch_size.min(cap - 1).max(1), None),
        Some(cap) => (batch_size, Some(cap)),
        None => (batch_size, None),
    }
}

/// A window of the lane's output being handed out.
struct Window {
    rows: BlockRows,
    /// The row handed out up to.
    at: usize,
    /// The partition's probe rows of the chunk the window belongs to.
    chunk: std::ops::Range<u64>,
}

impl Stream for GpuJoinStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let grace = matches!(self.state, State::Grace(_));
        let poll = self.poll_state(cx);
        if let Poll::Ready(Some(Err(_))) = &poll {
            // A failed execution is not joined again (its build's error is kept).
            self.abandoned.store(true, Ordering::Relaxed);
        }
        if grace {
            // Recorded by the groups' streams.
            return poll;
        }
        self.metrics.baseline.record_poll(poll)
    }
}

impl RecordBatchStream for GpuJoinStream {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}

/// Rows a fallback's join makes its output batches of at least, whatever the session's batch
/// size: arrow's batch coalescer gives each output batch with a view column that it compacts a
/// new buffer as large as the whole input batch's strings, and at least 1 MiB once its buffers
/// have grown, so DataFusion's join at `batch_size = 7` held about 1 MiB per 7 rows and ran out
/// of 20 GB (differential seeds 8004391, 8010613 and 8013260; DataFusion's own plan at that
/// batch size ran out too).
const FALLBACK_MIN_BATCH_ROWS: usize = 8192;

/// Partition `partition` of `join`, DataFusion's join that a run fell back to, with batches of
/// at least [`FALLBACK_MIN_BATCH_ROWS`] rows, each cut into batches of the session's batch
/// size with buffers of their own ([`owned`]). Its inputs' joins run as this execution's
/// ([`QueryOf`]).
fn fallback(
    join: &Arc<dyn ExecutionPlan>,
    partition: usize,
    ctx: &Arc<TaskContext>,
) -> Result<SendableRecordBatchStream> {
    let batch_size = ctx.session_config().batch_size().max(1);
    if batch_size >= FALLBACK_MIN_BATCH_ROWS {
        return join.execute(partition, Arc::clone(ctx));
    }
    let config = (ctx.session_config().clone())
        .with_batch_size(FALLBACK_MIN_BATCH_ROWS)
        .with_extension(Arc::new(QueryOf(Holder::of(ctx))));
    let wider = TaskContext::new(
        ctx.task_id(),
        ctx.session_id(),
        config,
        ctx.scalar_functions().clone(),
        ctx.higher_order_functions().clone(),
        ctx.aggregate_functions().clone(),
        ctx.window_functions().clone(),
        ctx.runtime_env(),
    );
    let stream = join.execute(partition, Arc::new(wider))?;
    let schema = stream.schema();
    let sliced = stream.flat_map(move |batch| {
        let slices: Vec<Result<RecordBatch>> = match batch {
            Ok(b) => (0..b.num_rows())
                .step_by(batch_size)
                .map(|at| owned(&b.slice(at, batch_size.min(b.num_rows() - at))))
                .collect(),
            Err(e) => vec![Err(e)],
        };
        futures::stream::iter(slices)
    });
    Ok(Box::pin(RecordBatchStreamAdapter::new(schema, sliced)))
}
