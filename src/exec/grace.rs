//! [`GraceRun`]: a build side larger than `gpu_join.memory_limit` allows, joined in groups.
//!
//! Where the build side and one smallest probe chunk do not fit the memory limit, the build rows
//! are split into groups by a hash of their keys (DataFusion's `create_hashes` with a fixed
//! seed, so that equal keys of the two sides always land in the same group), enough groups that
//! each takes at most half the limit. Every output partition then joins the groups in turn, each
//! as a join of its own (`RunSpec::over`): the group's build rows against the partition's probe
//! rows of the same hash, through the same engine (device lane, chunks, output windows).
//!
//! - Group 0 is joined as the probe input streams in: its rows go on to the group's join, and
//!   the rows of the other groups are held on the host, reserved against DataFusion's memory
//!   pool, for theirs (a hybrid hash join: the probe side is read once).
//! - One group's join runs at a time in an execution. A partition done with a group waits for
//!   the others to finish it, and the next group's join starts once the last one's lane has
//!   given its device memory back. A group's join ends as soon as no partition is in it, and
//!   runs again (uploading its build rows again) for a partition that comes to it later, so a
//!   partition whose consumer polls it alone (a task per partition) never waits for one that
//!   nobody polls.
//! - Only joins whose output each probe row makes alone (inner, right, right semi, anti and
//!   mark), on keys of one type on both sides, over a probe side whose order they need not
//!   keep, are split (`RunSpec::grace` says why not); the others run DataFusion's join, as
//!   EXPLAIN ANALYZE shows. Each partition's output comes group after group.
//! - A group's join spreads over several devices (`gpu_join.devices`) as a join of its size
//!   would: its probe input reports the probe side's estimate over the groups.

use std::fmt;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, ready};

use arrow::array::{RecordBatch, UInt32Array};
use arrow::compute::take_record_batch;
use arrow::datatypes::SchemaRef;
use datafusion::common::hash_utils::{RandomState, create_hashes};
use datafusion::common::stats::Precision;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Result, Statistics, exec_datafusion_err, internal_err};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryLimit, MemoryReservation};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::physical_expr::{EquivalenceProperties, Partitioning, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::statistics::StatisticsArgs;
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties, ReplaceChildrenOptions,
};
use futures::stream::BoxStream;
use futures::{Stream, StreamExt};
use tokio::sync::Notify;

use super::coalesce::coalesced;
use super::lane::LaneEnd;
use super::metrics::GpuJoinMetrics;
use super::run::{JoinRun, Outcome, RunSpec, estimated_rows, host_cores, join_all};
use super::stream::GpuJoinStream;
use super::view_gather::batches_bytes;
use crate::trace::trace;

/// The most groups a build side is split into; one that needs more runs DataFusion's join.
/// Each group's join pays a fixed cost (its lane, its build side staged and bucketed, a pass
/// over each partition's rows of the group: about 6 ms on an H200), and the split itself copies
/// both sides on the host. A 2^24-row build side in 53 groups took 0.69-0.85 s against 2^26
/// probe rows, where DataFusion's join took 0.41-0.44 s (BENCHMARKS.md).
const MAX_GROUPS: usize = 16;

/// Why `spec`'s build side may not be joined in `groups` groups here, or `None` where it may:
/// the join's own refusal (`RunSpec::grace`), a bounded memory pool (the probe rows held for
/// later groups cannot spill; DataFusion's join streams them), or more than [`MAX_GROUPS`].
pub(crate) fn refusal(spec: &RunSpec, groups: usize, ctx: &TaskContext) -> Option<String> {
    if let Some(why) = spec.grace {
        return Some(why.to_string());
    }
    if !matches!(ctx.memory_pool().memory_limit(), MemoryLimit::Infinite) {
        return Some(
            "DataFusion's memory pool is bounded, and joined in groups the join would hold the \
             probe rows of the later groups, which it cannot spill"
                .into(),
        );
    }
    (groups > MAX_GROUPS).then(|| {
        format!(
            "split into groups of half the limit it would take {groups}, more than \
             {MAX_GROUPS} (each group's join costs a pass of its own)"
        )
    })
}

/// The seed of the hash that splits both sides into groups.
const SEED: u64 = 0x6772_6163_655f_6a6e;

/// One execution's build side, split into groups joined in turn.
pub(crate) struct GraceRun {
    /// Each group's join: its build rows against the probe rows routed to it.
    groups: Vec<Arc<RunSpec>>,
    router: Arc<Router>,
    ctx: Arc<TaskContext>,
    active: Mutex<Active>,
    /// Told when a group's join ends.
    changed: Notify,
    /// The host memory of the build rows, held until the execution ends.
    _reservation: MemoryReservation,
}

/// The group whose join runs now.
#[derive(Default)]
struct Active {
    /// The group and its join's execution.
    run: Option<(usize, Arc<JoinRun>)>,
    /// Partitions in that join.
    users: usize,
    /// The lane of the last group's join, until it has given its device memory back.
    releasing: Option<LaneEnd>,
}

impl GraceRun {
    /// Splits `batches` (the build input's own columns) into `groups` groups of `spec`'s join.
    pub fn new(
        spec: &RunSpec,
        batches: Vec<RecordBatch>,
        groups: usize,
        ctx: Arc<TaskContext>,
    ) -> Result<Self> {
        let reservation =
            MemoryConsumer::new("GpuJoinExec grace build groups").register(ctx.memory_pool());
        // Each buffer counted once (batches that are slices of one share it).
        reservation.try_grow(batches_bytes(&batches))?;
        let build_keys: Vec<_> = spec.on.iter().map(|(l, _)| Arc::clone(l)).collect();
        let split = split_build(batches, &build_keys, groups, &spec.left.schema())?;
        // Each group's join sees its share of the probe side's estimate, so that it spreads
        // over several devices as a join of that size would.
        let probe_rows = estimated_rows(spec.right.as_ref()).map(|rows| rows.div_ceil(groups));
        let router = Arc::new(Router {
            groups,
            probe_keys: spec.on.iter().map(|(_, r)| Arc::clone(r)).collect(),
            right: Arc::clone(&spec.right),
            parts: (0..spec.probe_partitions)
                .map(|p| {
                    let name = format!("GpuJoinExec grace probe[{p}]");
                    Mutex::new(Held {
                        groups: vec![vec![]; groups],
                        bytes: vec![0; groups],
                        live: None,
                        started: false,
                        reservation: MemoryConsumer::new(name).register(ctx.memory_pool()),
                    })
                })
                .collect(),
        });
        let groups = split
            .into_iter()
            .enumerate()
            .map(|(group, batches)| {
                // Dealt out to partitions, which the group's join collects in parallel.
                let parts = batches.len().clamp(1, host_cores());
                let mut partitions = vec![vec![]; parts];
                for (i, batch) in batches.into_iter().enumerate() {
                    partitions[i % parts].push(batch);
                }
                let left: Arc<dyn ExecutionPlan> =
                    MemorySourceConfig::try_new_exec(&partitions, spec.left.schema(), None)?;
                let right = Arc::new(GroupProbe::new(
                    Arc::clone(&router),
                    group,
                    Arc::clone(&spec.right_schema),
                    spec.probe_partitions,
                    probe_rows,
                ));
                Ok(Arc::new(spec.over(left, right)?))
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            groups,
            router,
            ctx,
            active: Mutex::new(Active::default()),
            changed: Notify::new(),
            _reservation: reservation,
        })
    }

    /// The output of one partition: its rows of every group in turn.
    pub fn partition_stream(
        self: &Arc<Self>,
        partition: usize,
        metrics: GpuJoinMetrics,
    ) -> BoxStream<'static, Result<RecordBatch>> {
        let state = PartitionState {
            grace: Arc::clone(self),
            partition,
            metrics,
            next: 0,
            current: None,
        };
        futures::stream::try_unfold(state, |mut s| async move {
            loop {
                if let Some((stream, _)) = s.current.as_mut() {
                    if let Some(batch) = stream.next().await {
                        return Ok(Some((batch?, s)));
                    }
                    // The stream first, then the group (which may end its join).
                    s.current = None;
                    // Rows held for the group that its join did not read (its build side had
                    // no key to match) go.
                    s.grace.router.discard(s.partition, s.next - 1)?;
                    if s.next == 1 {
                        // Group 0's join may have stopped reading (an empty build side): the
                        // other groups' probe rows are still to be routed.
                        s.grace.router.finish(s.partition, &s.grace.ctx).await?;
                    }
                }
                let group = s.next;
                if group == s.grace.groups.len() {
                    return Ok(None);
                }
                s.next += 1;
                if group > 0 && !s.grace.router.holds(s.partition, group)? {
                    continue;
                }
                let in_group = s.grace.enter(group).await?;
                let spec = &s.grace.groups[group];
                let stream: SendableRecordBatchStream = Box::pin(GpuJoinStream::new(
                    s.partition,
                    Arc::clone(&in_group.run),
                    Arc::clone(&spec.right),
                    Arc::clone(&s.grace.ctx),
                    s.metrics.clone(),
                    None,
                ));
                s.current = Some((stream, in_group));
            }
        })
        .boxed()
    }

    /// Joins `group`'s join, starting it where no group's join runs, and waiting while another
    /// group's does or the last one's memory is not back yet.
    async fn enter(self: &Arc<Self>, group: usize) -> Result<InGroup> {
        loop {
            let changed = self.changed.notified();
            let releasing = {
                let mut active = self.active.lock().map_err(|_| poisoned())?;
                match (&active.run, &active.releasing) {
                    (Some((g, run)), _) if *g == group => {
                        let run = Arc::clone(run);
                        active.users += 1;
                        return Ok(self.in_group(run));
                    }
                    (Some(_), _) => None,
                    (None, Some(end)) => Some(end.clone()),
                    (None, None) => {
                        trace!("grace group {group}: its join starts");
                        let spec = Arc::clone(&self.groups[group]);
                        let run = Arc::new(JoinRun::new(spec, Arc::clone(&self.ctx)));
                        active.run = Some((group, Arc::clone(&run)));
                        active.users = 1;
                        return Ok(self.in_group(run));
                    }
                }
            };
            match releasing {
                Some(end) => {
                    end.clone().wait().await;
                    trace!("grace group {group}: the last group's memory is back");
                    let mut active = self.active.lock().map_err(|_| poisoned())?;
                    if active.releasing.as_ref().is_some_and(|r| r.same(&end)) {
                        active.releasing = None;
                    }
                }
                None => changed.await,
            }
        }
    }

    fn in_group(self: &Arc<Self>, run: Arc<JoinRun>) -> InGroup {
        InGroup {
            run,
            grace: Arc::clone(self),
        }
    }

    /// A partition is done with the running group's join; the last one ends it.
    fn leave(&self) {
        let Ok(mut active) = self.active.lock() else {
            return;
        };
        active.users = active.users.saturating_sub(1);
        if active.users > 0 {
            return;
        }
        if let Some((group, run)) = active.run.take() {
            trace!("grace group {group}: the last partition left");
            active.releasing = match run.outcome.peek() {
                Some(Ok(outcome)) => match &**outcome {
                    Outcome::Ready { ended, .. } => Some(ended.clone()),
                    _ => None,
                },
                _ => None,
            };
        }
        drop(active);
        self.changed.notify_waiters();
    }
}

fn poisoned() -> datafusion::common::DataFusionError {
    exec_datafusion_err!("GpuJoinExec grace state poisoned")
}

/// A partition's place in its group's join; leaving it when dropped.
struct InGroup {
    run: Arc<JoinRun>,
    grace: Arc<GraceRun>,
}

impl Drop for InGroup {
    fn drop(&mut self) {
        self.grace.leave();
    }
}

/// Where one partition's output stands.
struct PartitionState {
    grace: Arc<GraceRun>,
    partition: usize,
    metrics: GpuJoinMetrics,
    /// The next group to join.
    next: usize,
    /// The output of the group's join in progress (dropped before its place in the group).
    current: Option<(SendableRecordBatchStream, InGroup)>,
}

/// Splits `batch`'s rows by the group of their keys' hash: per group, its rows (or none) and
/// the bytes they take. The rows are put in group order with one `take`, and each group's are
/// a slice of that batch, whose bytes are counted in proportion to its rows.
fn split_by_group(
    batch: &RecordBatch,
    keys: &[Arc<dyn PhysicalExpr>],
    groups: usize,
) -> Result<Vec<Option<(RecordBatch, usize)>>> {
    let rows = batch.num_rows();
    let arrays = keys
        .iter()
        .map(|k| k.evaluate(batch)?.into_array(rows))
        .collect::<Result<Vec<_>>>()?;
    let mut hashes = vec![0; rows];
    create_hashes(&arrays, &RandomState::with_seed(SEED), &mut hashes)?;
    // Multiply-shift: the hash's high bits pick the group.
    let group_of: Vec<usize> = hashes
        .iter()
        .map(|&h| ((u128::from(h) * groups as u128) >> 64) as usize)
        .collect();
    let mut counts = vec![0usize; groups];
    for &g in &group_of {
        counts[g] += 1;
    }
    let mut split = vec![None; groups];
    if let Some(g) = counts.iter().position(|&c| c == rows) {
        split[g] = Some((batch.clone(), batch.get_array_memory_size()));
        return Ok(split);
    }
    let mut starts = vec![0; groups];
    for g in 1..groups {
        starts[g] = starts[g - 1] + counts[g - 1];
    }
    let mut at = starts.clone();
    let mut order = vec![0u32; rows];
    for (row, &g) in group_of.iter().enumerate() {
        order[at[g]] = row as u32;
        at[g] += 1;
    }
    let sorted = take_record_batch(batch, &UInt32Array::from(order))?;
    let bytes = sorted.get_array_memory_size();
    for (g, place) in split.iter_mut().enumerate() {
        if counts[g] > 0 {
            let part = sorted.slice(starts[g], counts[g]);
            *place = Some((part, bytes * counts[g] / rows.max(1)));
        }
    }
    Ok(split)
}

/// The build batches split into `groups` groups, each group's rows copied out into batches of
/// its own (a slice of a batch put in group order would count that whole batch in the memory
/// pool, where the group's join reserves its build side), spread over the cores: a thread per
/// share of the batches, then per share of the groups.
fn split_build(
    batches: Vec<RecordBatch>,
    keys: &[Arc<dyn PhysicalExpr>],
    groups: usize,
    schema: &SchemaRef,
) -> Result<Vec<Vec<RecordBatch>>> {
    let threads = host_cores();
    let panicked =
        || exec_datafusion_err!("GpuJoinExec grace: a thread splitting the build panicked");
    let per_thread = batches.len().div_ceil(threads).max(1);
    let shares = std::thread::scope(|scope| {
        let handles: Vec<_> = batches
            .chunks(per_thread)
            .map(|share| {
                scope.spawn(move || -> Result<Vec<Vec<RecordBatch>>> {
                    let mut split = vec![vec![]; groups];
                    for batch in share {
                        let parts = split_by_group(batch, keys, groups)?;
                        for (g, part) in parts.into_iter().enumerate() {
                            split[g].extend(part.map(|(rows, _)| rows));
                        }
                    }
                    Ok(split)
                })
            })
            .collect();
        join_all(handles, panicked)
    })?;
    drop(batches);
    let mut by_group: Vec<Vec<RecordBatch>> = vec![vec![]; groups];
    for share in shares {
        for (g, rows) in share.into_iter().enumerate() {
            by_group[g].extend(rows);
        }
    }
    let per_thread = groups.div_ceil(threads).max(1);
    std::thread::scope(|scope| {
        let handles: Vec<_> = by_group
            .chunks(per_thread)
            .map(|share| {
                scope.spawn(move || {
                    share
                        .iter()
                        .map(|rows| coalesced(schema, rows.clone(), BUILD_ROWS))
                        .collect::<Result<Vec<_>>>()
                })
            })
            .collect();
        Ok(join_all(handles, panicked)?.into_iter().flatten().collect())
    })
}

/// Rows of the batches a group's held probe rows are replayed in: routed batches hold a
/// group's share of an input batch each, too few rows to stage one at a time.
const REPLAY_ROWS: usize = 1 << 20;

/// Rows of a group's build batches, dealt out to the partitions its join collects and stages
/// in parallel.
const BUILD_ROWS: usize = 1 << 17;

/// Routes every partition's probe rows to their groups.
struct Router {
    groups: usize,
    probe_keys: Vec<Arc<dyn PhysicalExpr>>,
    right: Arc<dyn ExecutionPlan>,
    parts: Vec<Mutex<Held>>,
}

impl fmt::Debug for Router {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Router")
            .field("groups", &self.groups)
            .finish()
    }
}

/// One partition's probe rows on their way to their groups.
struct Held {
    /// Rows of every group after the first, as routed, and the bytes reserved for them.
    groups: Vec<Vec<RecordBatch>>,
    bytes: Vec<usize>,
    /// The input, where group 0's join stopped reading it before its end.
    live: Option<SendableRecordBatchStream>,
    /// Whether the input has been opened.
    started: bool,
    /// Host memory of the rows held.
    reservation: MemoryReservation,
}

impl Router {
    fn part(&self, partition: usize) -> Result<std::sync::MutexGuard<'_, Held>> {
        self.parts
            .get(partition)
            .ok_or_else(|| exec_datafusion_err!("GpuJoinExec grace: no partition {partition}"))?
            .lock()
            .map_err(|_| poisoned())
    }

    /// The probe input of `group`'s join in `partition`: the input itself, routed, for group
    /// 0; the rows held for the others.
    fn input(
        self: &Arc<Self>,
        partition: usize,
        group: usize,
        ctx: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let schema = self.right.schema();
        let mut held = self.part(partition)?;
        if group > 0 {
            let batches = std::mem::take(&mut held.groups[group]);
            let bytes = std::mem::take(&mut held.bytes[group]);
            held.reservation.shrink(bytes);
            drop(held);
            let batches = coalesced(&schema, batches, REPLAY_ROWS)?;
            let stream = futures::stream::iter(batches.into_iter().map(Ok));
            return Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)));
        }
        let input = match (held.live.take(), held.started) {
            (Some(live), _) => Some(live),
            (None, false) => {
                held.started = true;
                Some(self.right.execute(partition, ctx)?)
            }
            (None, true) => None,
        };
        Ok(Box::pin(Routing {
            router: Arc::clone(self),
            partition,
            input,
            schema,
        }))
    }

    /// Keeps `batch`'s rows of the later groups, and gives its rows of group 0.
    fn route(&self, partition: usize, batch: RecordBatch) -> Result<Option<RecordBatch>> {
        let mut parts = split_by_group(&batch, &self.probe_keys, self.groups)?.into_iter();
        let first = parts.next().flatten().map(|(rows, _)| rows);
        let later: Vec<(usize, RecordBatch, usize)> = parts
            .enumerate()
            .filter_map(|(g, b)| b.map(|(rows, bytes)| (g + 1, rows, bytes)))
            .collect();
        if !later.is_empty() {
            let mut held = self.part(partition)?;
            held.reservation
                .try_grow(later.iter().map(|(_, _, bytes)| bytes).sum())?;
            for (g, rows, bytes) in later {
                held.groups[g].push(rows);
                held.bytes[g] += bytes;
            }
        }
        Ok(first)
    }

    /// Drops what `partition` still holds of `group`.
    fn discard(&self, partition: usize, group: usize) -> Result<()> {
        let mut held = self.part(partition)?;
        held.groups[group].clear();
        let bytes = std::mem::take(&mut held.bytes[group]);
        held.reservation.shrink(bytes);
        Ok(())
    }

    /// Whether `partition` holds probe rows of `group`.
    fn holds(&self, partition: usize, group: usize) -> Result<bool> {
        Ok(!self.part(partition)?.groups[group].is_empty())
    }

    /// Routes what is left of `partition`'s input (group 0's rows are dropped: its join has
    /// stopped reading, so it outputs nothing for them).
    /// (An input routed to its end gives nothing more.)
    async fn finish(self: &Arc<Self>, partition: usize, ctx: &Arc<TaskContext>) -> Result<()> {
        let mut rest = self.input(partition, 0, Arc::clone(ctx))?;
        while let Some(batch) = rest.next().await {
            batch?;
        }
        Ok(())
    }
}

/// A partition's probe input, routed: rows of group 0 go on, the others are held.
struct Routing {
    router: Arc<Router>,
    partition: usize,
    input: Option<SendableRecordBatchStream>,
    schema: SchemaRef,
}

impl Stream for Routing {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        loop {
            let Some(input) = self.input.as_mut() else {
                return Poll::Ready(None);
            };
            let batch = match ready!(input.poll_next_unpin(cx)) {
                Some(Ok(batch)) => batch,
                Some(Err(e)) => return Poll::Ready(Some(Err(e))),
                None => {
                    self.input = None;
                    return Poll::Ready(None);
                }
            };
            match self.router.route(self.partition, batch) {
                Ok(Some(first)) => return Poll::Ready(Some(Ok(first))),
                Ok(None) => continue,
                Err(e) => return Poll::Ready(Some(Err(e))),
            }
        }
    }
}

impl RecordBatchStream for Routing {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}

impl Drop for Routing {
    fn drop(&mut self) {
        // Not read to its end: the rest is routed later (`Router::finish`).
        if let Some(input) = self.input.take()
            && let Ok(mut held) = self.router.part(self.partition)
        {
            held.live = Some(input);
        }
    }
}

/// The probe input of one group's join: a leaf that reads the rows routed to the group.
#[derive(Debug)]
struct GroupProbe {
    router: Arc<Router>,
    group: usize,
    properties: Arc<PlanProperties>,
    /// The rows it is estimated to give: the probe side's estimate over the groups.
    rows: Option<usize>,
}

impl GroupProbe {
    fn new(
        router: Arc<Router>,
        group: usize,
        schema: SchemaRef,
        partitions: usize,
        rows: Option<usize>,
    ) -> Self {
        let properties = PlanProperties::new(
            EquivalenceProperties::new(schema),
            Partitioning::UnknownPartitioning(partitions),
            EmissionType::Incremental,
            Boundedness::Bounded,
        );
        Self {
            router,
            group,
            properties: Arc::new(properties),
            rows,
        }
    }
}

impl DisplayAs for GroupProbe {
    fn fmt_as(&self, _t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        write!(f, "GraceGroupProbe: group={}", self.group)
    }
}

impl ExecutionPlan for GroupProbe {
    fn name(&self) -> &str {
        "GraceGroupProbe"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.properties
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![]
    }

    fn statistics_from_inputs(
        &self,
        _input_stats: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        let mut stats = Statistics::new_unknown(&self.schema());
        if let (None, Some(rows)) = (args.partition(), self.rows) {
            stats.num_rows = Precision::Inexact(rows);
        }
        Ok(Arc::new(stats))
    }

    fn apply_expressions(
        &self,
        _f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if children.is_empty() {
            return Ok(self);
        }
        internal_err!("GraceGroupProbe has no children")
    }

    #[allow(deprecated)]
    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(
                datafusion::physical_plan::ChildrenPropertiesMode::Recompute,
            ),
        )
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        self.router.input(partition, self.group, context)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Array, Int64Array};
    use arrow::datatypes::{DataType, Field, Schema};
    use datafusion::physical_expr::expressions::col;

    fn batch(keys: Vec<i64>, other: Vec<i64>) -> RecordBatch {
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("x", DataType::Int64, false),
        ]));
        RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(keys)),
                Arc::new(Int64Array::from(other)),
            ],
        )
        .unwrap()
    }

    /// The group of every row of a split batch, by its `x`.
    fn groups_of(split: &[Option<(RecordBatch, usize)>]) -> std::collections::HashMap<i64, usize> {
        let mut at = std::collections::HashMap::new();
        for (g, part) in split.iter().enumerate() {
            let Some((rows, _)) = part else { continue };
            let x = rows
                .column(1)
                .as_any()
                .downcast_ref::<Int64Array>()
                .unwrap();
            for i in 0..x.len() {
                assert!(at.insert(x.value(i), g).is_none(), "a row in two groups");
            }
        }
        at
    }

    #[test]
    fn every_row_lands_in_one_group_and_equal_keys_in_the_same() {
        let keys: Vec<i64> = (0..5000).map(|i| i * 7919 % 1000).collect();
        let first = batch(keys.clone(), (0..5000).collect());
        let k = col("k", &first.schema()).unwrap();
        let split = split_by_group(&first, std::slice::from_ref(&k), 7).unwrap();
        let at = groups_of(&split);
        assert_eq!(at.len(), 5000);
        // Each group gets some rows, and counts its bytes in proportion.
        let used: usize = split.iter().flatten().map(|(_, bytes)| bytes).sum();
        assert!(split.iter().all(Option::is_some));
        assert!(used <= first.get_array_memory_size() * 2);
        // The same keys in another batch, another order, land where they landed.
        let reversed: Vec<i64> = keys.iter().rev().copied().collect();
        let second = batch(reversed, (0..5000).rev().collect());
        let again = groups_of(&split_by_group(&second, &[k], 7).unwrap());
        assert_eq!(at, again);
    }

    #[test]
    fn null_keys_stay_together_and_one_group_keeps_the_batch() {
        let keys = vec![None, Some(3), None, Some(3)];
        let schema = Arc::new(Schema::new(vec![
            Field::new("k", DataType::Int64, true),
            Field::new("x", DataType::Int64, false),
        ]));
        let b = RecordBatch::try_new(
            schema,
            vec![
                Arc::new(Int64Array::from(keys)),
                Arc::new(Int64Array::from(vec![0, 1, 2, 3])),
            ],
        )
        .unwrap();
        let k = col("k", &b.schema()).unwrap();
        let at = groups_of(&split_by_group(&b, std::slice::from_ref(&k), 16).unwrap());
        assert_eq!(at[&0], at[&2]);
        assert_eq!(at[&1], at[&3]);
        let one = split_by_group(&b, &[k], 1).unwrap();
        assert_eq!(one[0].as_ref().map(|(r, _)| r.num_rows()), Some(4));
    }
}
