//! One execution of a `GpuJoinExec`: what its output partitions share. Its build future
//! decides how the join runs and prepares the device for the probe side:
//!
//! 1. collect the build (left) input, every partition in its own task, gathering each key
//!    column's range as batches arrive;
//! 2. decide: an empty build side ends the join (unless the join type outputs rows without a
//!    match: then DataFusion's join runs); the plan switches where the build side needs it
//!    ([`Switch`]: exact keys whose ranges need more than 64 bits join on a hash, each
//!    collected batch getting its key hash; checked keys with a build key longer than the
//!    node's words of check bytes carry as many words as the longest build key needs, and
//!    with one longer than 64 bytes are verified on the host, re-hashed over their whole
//!    keys); the probe
//!    columns are taken on the host where the build keys predict few probe rows matched
//!    ([`RunSpec::probe_on_host`], `exec::carriage`); a build side
//!    larger than `gpu_join.memory_limit` allows is joined in groups (`exec::grace`) where
//!    `grace::refusal` lets it, and otherwise falls back to DataFusion's `HashJoinExec`
//!    (`NestedLoopJoinExec` for a join without keys) over the collected batches (the reason
//!    shows in EXPLAIN ANALYZE); where DataFusion's memory pool refuses the build side of a
//!    join that replaced a join that spills (a nested loop or sort-merge join), DataFusion's
//!    spilling join runs over fresh copies of the inputs instead;
//! 3. reserve the join's device memory at once — the build side (with the data of the build
//!    view columns whose values the device gathers, `exec::view_bytes`) and the first chunk in
//!    flight, the chunk sized to half the memory free now — waiting, where even the smallest
//!    chunk does not fit, for its build side and one smallest chunk (joins of one pipeline
//!    hold their memory until the query ends, so a lower join that cannot fit then still waits
//!    for ever); refused, a plan first tries again with the view values on the host, then a
//!    plan whose build views the device would carry gives way to its twin that gathers them on
//!    the host ([`RunSpec::views_on_host`]) before groups or a fallback;
//! 4. publish the dynamic filter to the probe scan; a build side of fewer rows than
//!    `gpu_join.min_build_rows` (the rule's gate, counted now rather than estimated) then falls
//!    back to DataFusion's join;
//! 5. start the device lane and stage the build batches into pinned blocks, in parallel tasks,
//!    sending each to the lane as it fills; then the collected batches are dropped.
//!
//! On several devices (`gpu_join.devices`, [`spread_devices`]), steps 3 and 5 run for each:
//! the first device reserves (and may wait) as above, each other one joins only if its memory
//! is free now, and every device that joins gets a lane and its own copy of the build side.
//!
//! Partitions start reading and staging probe batches when the future resolves, while the lanes
//! are still uploading the build side and bucketing it; partition `p` feeds lane `p % n`.

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use arrow::array::{ArrayRef, RecordBatch};
use arrow::datatypes::SchemaRef;
use datafusion::common::runtime::SpawnedTask;
use datafusion::common::utils::memory::RecordBatchMemoryCounter;
use datafusion::common::{DataFusionError, Result, exec_datafusion_err, internal_err};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool, MemoryReservation};
use datafusion::physical_expr::expressions::DynamicFilterPhysicalExpr;
use datafusion::physical_plan::joins::utils::JoinOn;
use datafusion::physical_plan::joins::{HashJoinExec, PartitionMode};
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};
use datafusion::physical_plan::{
    ChildrenPropertiesMode, ExecutionPlan, ExecutionPlanProperties, ReplaceChildrenOptions,
};
use futures::future::{BoxFuture, Shared};
use futures::{FutureExt, StreamExt};
use std::sync::mpsc::Sender;

use super::build_cache::{BuildCache, CacheUse, CachedPartition, identify};
use super::carriage::{self, ProbeColumns};
use super::coalesce::coalesced;
use super::device_views::{BuildViews, beyond_views, is_view, parts};
use super::filter::{self, BuildKeys};
use super::gather::{Counted, HostBuild, HostGather, view_buffer_bound};
use super::grace::{self, GraceRun};
use super::key_check;
use super::lane::{Job, LaneEnd, spawn_lane};
use super::marks::MarksMerge;
use super::metrics::RunMetrics;
use super::node::{JoinBackend, SpillingTwin};
use super::null_aware::{NullAware, NullAwareRun};
use super::residual::Residual;
use super::side::SideColumns;
use super::sizing::{ColumnKinds, Limits, MIN_CHUNK_ROWS, Sizing, build_bytes, plan};
use super::stager::Stager;
use super::view_bytes::{self, ValueStats};
use crate::backend::{Backend, CudaBackend, HostBackend};
use crate::columns::{BlockLayout, ColumnKind, Fitted, KeyEncoder, KeyRange, copy_off};
use crate::config::MemoryLimit;
use crate::device::{Devices, Holder, HostPool, MemoryBudget, MemoryTracker, Pages, Reservation};
use crate::join::algorithm::{self, Algorithm};
use crate::join::{Emission, OutputLayout};
use crate::trace::trace;
use datafusion::logical_expr::JoinType;

/// Everything an execution (its partitions and its device lane) needs from its plan node.
#[derive(Debug, Clone)]
pub(crate) struct RunSpec {
    pub left: Arc<dyn ExecutionPlan>,
    pub right_schema: SchemaRef,
    pub on: JoinOn,
    /// What the lane outputs: the join's output, or with a residual filter its candidates.
    pub layout: Arc<OutputLayout>,
    pub join_type: JoinType,
    /// Whether a null key equals a null key (`IS NOT DISTINCT FROM`).
    pub nulls_equal: bool,
    /// Whether keys are hashed (and verified by the residual filter), not encoded exactly.
    pub hashed_keys: bool,
    /// The residual filter, evaluated on the host over the candidates.
    pub residual: Option<Arc<Residual>>,
    /// The columns gathered on the host, from the lane's positions.
    pub gather: Option<Arc<HostGather>>,
    /// The columns staged from each input (its own, and those the host computes).
    pub build_side: SideColumns,
    pub probe_side: SideColumns,
    /// Output (probe) partitions: the lane outputs the build rows after this many said
    /// `ProbeDone`.
    pub probe_partitions: usize,
    pub backend: JoinBackend,
    pub max_chunk_rows: usize,
    /// Whether staged blocks pack integer columns of a narrow range (`gpu_join.pack_uploads`).
    pub pack_uploads: bool,
    /// Whether the values of the build view columns the device carries are gathered on the
    /// device too, where a column's allow it (`gpu_join.view_bytes_on_device`,
    /// [`view_bytes`](super::view_bytes)).
    pub view_bytes_on_device: bool,
    /// The join algorithm asked for (`gpu_join.algorithm`).
    pub algorithm: Algorithm,
    /// The algorithm the last execution ran, as EXPLAIN ANALYZE shows it.
    pub algorithm_run: Arc<std::sync::Mutex<Option<String>>>,
    pub memory_limit: MemoryLimit,
    /// Build columns staged (keys and output columns), and their kinds.
    pub build_indices: Vec<usize>,
    pub build_kinds: Vec<(ColumnKind, bool)>,
    /// Probe columns staged, and the kinds of probe and output columns.
    pub probe_indices: Vec<usize>,
    pub kinds: ColumnKinds,
    /// DataFusion's join of the same inputs (a `HashJoinExec`, or without keys a
    /// `NestedLoopJoinExec`), for statistics and fallbacks.
    pub fallback: Arc<dyn ExecutionPlan>,
    /// DataFusion's join that spills, run where the memory pool refuses the build side; `None`
    /// where the replaced join does not spill either (a hash join).
    pub spilling: Option<Arc<SpillingTwin>>,
    pub dynamic_filter: Option<Arc<DynamicFilterPhysicalExpr>>,
    /// A `RuntimeFilterExec` under the probe side applies `dynamic_filter`: only then is a set
    /// of the build keys worth building for it (`exec::filter`).
    pub filter_applied_on_host: bool,
    pub metrics: RunMetrics,
    /// Why the last execution fell back to DataFusion's join, shown in EXPLAIN ANALYZE.
    pub fallback_reason: Arc<std::sync::Mutex<Option<String>>>,
    /// The plan an execution runs instead where its build side needs it.
    pub switch: Option<Switch>,
    /// The same join with its build views gathered on the host: where the device carries
    /// build views ([`HostGather::build_views`]), run if the build side does not fit the
    /// device with them.
    pub views_on_host: Option<Arc<RunSpec>>,
    /// Why the last execution ran `views_on_host`, where it did (shared by every plan of the
    /// join).
    pub views_moved_at_run: Arc<std::sync::Mutex<Option<String>>>,
    /// Where the last execution gathered the values of the build view columns the device
    /// carried, per column ([`view_bytes::Plan`]; shared by every plan of the join).
    pub values_at_run: Arc<std::sync::Mutex<Option<String>>>,
    /// The same join with the probe columns it outputs taken on the host by probe row
    /// position, not staged (`exec::carriage`): where it outputs probe rows only where they
    /// match, and stages a probe column only for the output.
    pub probe_on_host: Option<Arc<RunSpec>>,
    /// `gpu_join.probe_columns`: whether an execution runs `probe_on_host`.
    pub probe_columns: ProbeColumns,
    /// Why the last execution ran `probe_on_host`, where it did (shared by every plan of the
    /// join).
    pub probe_moved_at_run: Arc<std::sync::Mutex<Option<String>>>,
    /// A null-aware anti join's keys and output (`NOT IN`).
    pub null_aware: Option<NullAware>,
    /// Why the residual filter runs on the host, where there is one (EXPLAIN VERBOSE).
    pub host_filter_reason: Option<String>,
    /// The plan the last execution switched to: 0 where it ran the node's, else one more than
    /// its index in [`Switch::specs`] (shared by every plan of the join).
    pub switched_at_run: Arc<AtomicUsize>,
    /// The probe (right) input.
    pub right: Arc<dyn ExecutionPlan>,
    /// What the last execution did with the build cache, as EXPLAIN ANALYZE shows it (`None`
    /// where the cache is off).
    pub cache_at_run: Arc<std::sync::Mutex<Option<String>>>,
    /// Groups the last execution joined its build side in (0: it did not).
    pub grace_groups: Arc<std::sync::atomic::AtomicUsize>,
    /// Whether this is the join of one group of a grace join (`RunSpec::over`).
    pub grace_group: bool,
    /// Whether a build side larger than the memory limit may be joined in groups
    /// ([`GraceRun`]) rather than by DataFusion's join: `None` where it may, else why not.
    pub grace: Option<&'static str>,
}

/// The plan an execution switches to, decided by its build side.
#[derive(Debug, Clone)]
pub(crate) enum Switch {
    /// For exact keys whose value ranges may need more than 64 bits together: the same join on
    /// hashed keys, run where the build side's ranges do.
    WideKeys(Arc<RunSpec>),
    /// For hashed keys checked on the device: the same join with more words of check bytes
    /// (`wider`, by words, ascending), run where a build key is longer than the node's words
    /// hold, and the same join verified on the host, run where one is longer than the most
    /// words hold.
    LongKeys {
        wider: Vec<Arc<RunSpec>>,
        verified: Arc<RunSpec>,
    },
}

impl Switch {
    /// The plans an execution may switch to; [`RunSpec::switched_at_run`] holds one more than
    /// the index of the one it ran.
    pub fn specs(&self) -> Vec<&Arc<RunSpec>> {
        match self {
            Self::WideKeys(s) => vec![s],
            Self::LongKeys { wider, verified } => wider.iter().chain([verified]).collect(),
        }
    }

    /// The plan a build side whose longest checked key has `longest` bytes runs, with its
    /// number in [`specs`](Self::specs) plus one, for a node of `words` words of check bytes:
    /// `None` where the node's plan holds it.
    fn for_longest(&self, longest: usize, words: usize) -> Option<(usize, &Arc<RunSpec>)> {
        let Self::LongKeys { wider, verified } = self else {
            return None;
        };
        let verify = (wider.len() + 1, verified);
        match key_check::words_for(longest) {
            Some(need) if need <= words => None,
            // The fewest words that hold the key, or (where no twin has that many, which the
            // node never plans) the host's verification: a build key in the long class would
            // match a probe key of its length with the same first bytes.
            Some(need) => Some(
                (wider.iter().enumerate())
                    .find(|(_, s)| s.check_words() >= need)
                    .map_or(verify, |(i, s)| (i + 1, s)),
            ),
            None => Some(verify),
        }
    }
}

impl RunSpec {
    /// The same join over other inputs, for a group of a grace join (`exec::grace`): the
    /// group's build rows and a probe input of as many partitions as this join's. It
    /// publishes no dynamic filter (the whole build side's is published), has no spilling twin
    /// (which would read the node's own inputs) and is not split again.
    pub fn over(
        &self,
        left: Arc<dyn ExecutionPlan>,
        right: Arc<dyn ExecutionPlan>,
    ) -> Result<RunSpec> {
        let options = ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute);
        let fallback = Arc::clone(&self.fallback)
            .replace_children(vec![Arc::clone(&left), Arc::clone(&right)], options)?;
        let over = |s: &Arc<RunSpec>| s.over(Arc::clone(&left), Arc::clone(&right)).map(Arc::new);
        let switch = match &self.switch {
            Some(Switch::WideKeys(s)) => Some(Switch::WideKeys(over(s)?)),
            Some(Switch::LongKeys { wider, verified }) => Some(Switch::LongKeys {
                wider: wider.iter().map(over).collect::<Result<_>>()?,
                verified: over(verified)?,
            }),
            None => None,
        };
        let views_on_host = self.views_on_host.as_ref().map(over).transpose()?;
        Ok(RunSpec {
            left,
            right,
            fallback,
            switch,
            views_on_host,
            // A group runs the plan its join chose (its own keys would predict a share of
            // matches too small by the number of groups).
            probe_on_host: None,
            spilling: None,
            dynamic_filter: None,
            grace: Some("the join is a group of a build side already split"),
            grace_group: true,
            // The node's EXPLAIN tells of the whole join's build side.
            switched_at_run: Default::default(),
            views_moved_at_run: Default::default(),
            probe_moved_at_run: Default::default(),
            grace_groups: Default::default(),
            cache_at_run: Default::default(),
            ..self.clone()
        })
    }

    /// The words of check bytes this plan's checked key carries (0 where keys are not checked
    /// on the device).
    pub fn check_words(&self) -> usize {
        self.layout.check.map_or(0, |c| c.words)
    }

    /// Whether this plan's hashed key is checked on the device.
    pub fn checked_keys(&self) -> bool {
        self.check_words() > 0
    }

    /// Whether a build side of `rows` rows has too many to gather columns on the host by a
    /// 32-bit build row position, where this plan does.
    pub fn positions_overflow(&self, rows: usize) -> bool {
        rows >= crate::backend::NO_ROW as usize
            && self
                .gather
                .as_ref()
                .is_some_and(|g| g.needs_build_positions())
    }

    /// What the join type outputs of each side (candidates, with a residual filter).
    pub fn emission(&self) -> Emission {
        match self.residual {
            Some(_) => Emission::filtered(self.join_type),
            None => Emission::of(self.join_type),
        }
    }

    /// The schema of the rows the join hands out.
    pub fn output_schema(&self) -> &SchemaRef {
        match (&self.residual, &self.gather) {
            (Some(r), _) => r.schema(),
            (None, Some(g)) => g.schema(),
            (None, None) => &self.layout.schema,
        }
    }
}

/// How the join runs, once the build side has been read.
pub(crate) enum Outcome {
    /// The build side has no row with a key: the join is empty.
    Empty,
    /// DataFusion's join runs instead, over the collected build side.
    Fallback(Arc<dyn ExecutionPlan>),
    /// The build side is larger than the memory limit: it is joined in groups, one at a time.
    Grace(Arc<GraceRun>),
    /// Probe chunks go to the lanes: partition `p` to lane `p % lanes.len()`.
    Ready {
        /// The plan the execution runs: the node's, or its hashed-key twin.
        spec: Arc<RunSpec>,
        /// A lane per device the join runs on, each with the whole build side.
        lanes: Vec<ReadyLane>,
        /// When every lane has ended and given its device memory back.
        ended: LaneEnd,
        host: HostHeld,
    },
}

/// One device's lane of a ready execution.
pub(crate) struct ReadyLane {
    pub lane: Sender<Job>,
    /// The device's chunk sizes.
    pub sizing: Sizing,
    /// The device's pinned staging pages.
    pub staging: HostPool,
}

/// What the partitions take from the build side on the host.
pub(crate) struct HostHeld {
    /// The build columns the host gathers.
    pub build: Arc<HostBuild>,
    /// A null-aware anti join's state.
    pub null_aware: Option<Arc<NullAwareRun>>,
}

pub(crate) type SharedOutcome =
    Shared<BoxFuture<'static, std::result::Result<Arc<Outcome>, Arc<DataFusionError>>>>;

/// The shared state of one execution.
pub(crate) struct JoinRun {
    pub spec: Arc<RunSpec>,
    pub outcome: SharedOutcome,
    /// The task context the execution began with: DataFusion hands the same one to every
    /// partition of an execution.
    pub ctx: Arc<TaskContext>,
    /// Set when a partition's stream is dropped before its end (a consumer that read only
    /// some partitions) or fails: after which only the same task context joins this
    /// execution.
    pub abandoned: Arc<AtomicBool>,
}

impl JoinRun {
    /// Starts an execution (the build future runs when a partition polls it).
    pub fn new(spec: Arc<RunSpec>, ctx: Arc<TaskContext>) -> Self {
        let outcome = build(Arc::clone(&spec), Arc::clone(&ctx))
            .map(|r| r.map(Arc::new).map_err(Arc::new))
            .boxed()
            .shared();
        Self {
            spec,
            outcome,
            ctx,
            abandoned: Arc::default(),
        }
    }

    /// Whether a partition executed with `ctx` belongs to this execution, given that it was
    /// not executed in it yet: the same task context does (DataFusion hands every partition of
    /// an execution the same one), another only while no partition of this execution was
    /// dropped before its end or failed (a plan executed again after a consumer that read
    /// some partitions and dropped them, or after an error). A partition that ran to its end
    /// did all its work here (its matches marked, its end counted), so an execution that goes
    /// on with the partitions not executed before is complete, whichever executions the
    /// others then join.
    pub fn admits(&self, ctx: &Arc<TaskContext>) -> bool {
        Arc::ptr_eq(&self.ctx, ctx) || !self.abandoned.load(Ordering::Relaxed)
    }
}

/// One build partition as collected (or as the build cache kept it), with the host memory
/// it holds.
struct Collected {
    part: CachedPartition,
    reservation: MemoryReservation,
    /// Whether the memory pool refused a batch where DataFusion's join can spill: that join
    /// then runs over the inputs themselves.
    refused: bool,
}

impl Collected {
    /// A partition the build cache kept: its batches' memory is the cache's reservation.
    fn kept(part: &CachedPartition, pool: &Arc<dyn MemoryPool>) -> Self {
        Self {
            part: part.clone(),
            reservation: MemoryConsumer::new("GpuJoinExec build (kept)").register(pool),
            refused: false,
        }
    }
}

/// What this execution does with the session's build cache (`gpu_join.cache_bytes`).
fn cache_use(spec: &RunSpec, ctx: &TaskContext) -> CacheUse {
    let limit = crate::rule::settings(ctx.session_config().options())
        .cache_bytes
        .0;
    let Some(cache) = ctx.session_config().get_extension::<BuildCache>() else {
        return match limit {
            0 => CacheUse::Off,
            _ => CacheUse::Unkept(
                "the session has no build cache (its config did not go through \
                 with_gpu_join_config)"
                    .into(),
            ),
        };
    };
    if limit == 0 || spec.grace_group {
        cache.trim(limit);
        return CacheUse::Off;
    }
    // What the join itself puts into the batches it collects, and the ranges it takes; and
    // the session's settings, which its expressions read (a time zone, a Parquet option), but
    // whether a new session makes its default catalog, which changes no batch (read only as a
    // session is made; DataFusion turns it off as a `SET datafusion.runtime...` remakes the
    // session's state, which would make every kept build side miss). The runtime's settings (a
    // memory limit) are not among these; an entry read under a new memory pool moves its count
    // there (`BuildCache::get`).
    let settings: Vec<String> = (ctx.session_config().options().entries().into_iter())
        .filter(|e| {
            !e.key.starts_with("gpu_join.")
                && e.key != "datafusion.catalog.create_default_catalog_and_schema"
        })
        .map(|e| format!("{}={:?}", e.key, e.value))
        .collect();
    let join = format!(
        "{:?}",
        (
            &spec.build_side,
            &spec.layout.build_keys,
            spec.nulls_equal,
            matches!(spec.switch, Some(Switch::LongKeys { .. })),
            settings,
        )
    );
    match identify(&join, &spec.left) {
        Ok(identity) => CacheUse::Kept {
            cache,
            identity,
            limit,
        },
        Err(why) => CacheUse::Unkept(why),
    }
}

/// Reads one build partition, gathering key ranges and reserving the batches' host memory:
/// each buffer once (`counter`, shared by the partitions), however many batches share it (an
/// aggregate's output batches are slices of one, a scan's of a table's), as DataFusion's hash
/// join counts its build side.
async fn collect_partition(
    spec: Arc<RunSpec>,
    partition: usize,
    ctx: Arc<TaskContext>,
    counter: Arc<Mutex<RecordBatchMemoryCounter>>,
) -> Result<Collected> {
    let side = &spec.build_side;
    let (schema, keys) = (&side.schema, &spec.layout.build_keys);
    let mut ranges = keys
        .iter()
        .map(|&k| KeyRange::new(schema.field(k).data_type()))
        .collect::<Result<Vec<_>>>()?;
    let reservation =
        MemoryConsumer::new(format!("GpuJoinExec build[{partition}]")).register(ctx.memory_pool());
    let outputs = spec.backend.output_pools()?;
    let mut stream = spec.left.execute(partition, ctx)?;
    let mut collected = Collected {
        part: CachedPartition {
            batches: vec![],
            ranges: vec![],
            rows: 0,
            longest_key: 0,
        },
        reservation,
        refused: false,
    };
    let twin_spills = spec.spilling.is_some();
    let long_keys_switch = matches!(spec.switch, Some(Switch::LongKeys { .. }));
    while let Some(batch) = stream.next().await {
        let batch = batch?;
        if batch.num_rows() == 0 {
            continue;
        }
        // Another join's output, held until the build side is staged: off its pages, which
        // that join (and every other) needs again for its next windows.
        let pages: Vec<Pages> = outputs.iter().map(HostPool::pages).collect();
        let batch = match copy_off(&batch, |p| pages.iter().any(|pages| pages.hold(p)))? {
            Some((copy, bytes)) => {
                spec.metrics.build_copied_bytes.add(bytes);
                copy
            }
            None => batch,
        };
        let timer = spec.metrics.key_hash_time.timer();
        let batch = side.arrive(batch)?;
        timer.done();
        let bytes = counter
            .lock()
            .map_err(|_| exec_datafusion_err!("GpuJoinExec build counter poisoned"))?
            .count_batch(&batch);
        if let Err(e) = collected.reservation.try_grow(bytes) {
            if !twin_spills {
                return Err(e);
            }
            collected.refused = true;
            break;
        }
        side.update_ranges(&mut ranges, &batch, keys)?;
        // Past the most bytes checked on the device, a key is verified on the host whatever
        // its length.
        if long_keys_switch && collected.part.longest_key <= key_check::KEY_CHECK_MAX_BYTES {
            let longest = side.longest_key(&batch)?;
            collected.part.longest_key = collected.part.longest_key.max(longest);
        }
        collected.part.rows += batch.num_rows();
        collected.part.batches.push(batch);
    }
    collected.part.ranges = ranges;
    Ok(collected)
}

/// The key ranges of every collected build partition, merged.
fn merged_ranges(collected: &[Collected]) -> Vec<KeyRange> {
    let mut ranges = collected
        .first()
        .map(|c| c.part.ranges.clone())
        .unwrap_or_default();
    for c in collected.iter().skip(1) {
        for (r, o) in ranges.iter_mut().zip(&c.part.ranges) {
            r.merge(o);
        }
    }
    ranges
}

/// Gives every collected build batch `hashed`'s key hash (in place of the columns computed
/// before, if any), and gives the hash's range. The batches are hashed on every core: this is
/// on the build's critical path, and hashing 16 million 36-byte strings on one core took a
/// third of a second.
fn hash_collected(hashed: &RunSpec, collected: &mut [Collected]) -> Result<Vec<KeyRange>> {
    let key = hashed.layout.build_keys[0];
    let dt = hashed.build_side.schema.field(key).data_type();
    let parts = collected.len();
    // Each part's hash column (8 bytes and a validity bit a row) reserved before it exists.
    let estimates: Vec<usize> = (collected.iter())
        .map(|c| c.part.rows * 8 + c.part.rows.div_ceil(8))
        .collect();
    for (c, &bytes) in collected.iter_mut().zip(&estimates) {
        c.reservation.try_grow(bytes)?;
    }
    // Every batch, with the part (and reservation) it belongs to.
    let mut batches: Vec<(usize, &mut RecordBatch)> = (collected.iter_mut().enumerate())
        .flat_map(|(p, c)| c.part.batches.iter_mut().map(move |b| (p, b)))
        .collect();
    let per_thread = batches.len().div_ceil(host_cores()).max(1);
    let panicked = || exec_datafusion_err!("GpuJoinExec: a thread hashing build keys panicked");
    // Per thread: its batches' range, and what each part's batches grew by.
    let shares = std::thread::scope(|scope| {
        let handles: Vec<_> = batches
            .chunks_mut(per_thread)
            .map(|share| {
                scope.spawn(move || -> Result<(KeyRange, Vec<usize>)> {
                    let mut range = KeyRange::new(dt)?;
                    let mut grown = vec![0; parts];
                    for (part, batch) in share.iter_mut() {
                        let before = batch.get_array_memory_size();
                        let timer = hashed.metrics.key_hash_time.timer();
                        **batch =
                            (hashed.build_side).arrive(hashed.build_side.input_part(batch)?)?;
                        timer.done();
                        grown[*part] += batch.get_array_memory_size().saturating_sub(before);
                        range.update(batch.column(key))?;
                    }
                    Ok((range, grown))
                })
            })
            .collect();
        join_all(handles, panicked)
    })?;
    drop(batches);
    let mut range = KeyRange::new(dt)?;
    let mut grown = vec![0; parts];
    for (share, share_grown) in shares {
        range.merge(&share);
        grown.iter_mut().zip(share_grown).for_each(|(g, b)| *g += b);
    }
    // The estimates settled against what the batches grew by.
    for ((c, bytes), estimate) in collected.iter_mut().zip(grown).zip(estimates) {
        match bytes.checked_sub(estimate) {
            Some(more) => c.reservation.try_grow(more)?,
            None => c.reservation.shrink(estimate - bytes),
        }
    }
    Ok(vec![range])
}

/// The build future: steps 1 to 5 of the module doc.
async fn build(spec: Arc<RunSpec>, ctx: Arc<TaskContext>) -> Result<Outcome> {
    let started = std::time::Instant::now();
    // What EXPLAIN ANALYZE tells of the last execution is this one's from here on.
    clear_moved(&spec);
    // (A grace join's groups are parts of one execution: what one shows stays.)
    if !spec.grace_group {
        for shown in [&spec.cache_at_run, &spec.fallback_reason] {
            if let Ok(mut shown) = shown.lock() {
                *shown = None;
            }
        }
    }
    let holder = Holder::of(&ctx);
    let mut cache = cache_use(&spec, &ctx);
    if let CacheUse::Kept { identity, .. } = &cache
        && let Err(why) = identity.files_as_listed(&ctx).await
    {
        cache = CacheUse::Unkept(why);
    }
    let kept = match &cache {
        CacheUse::Kept {
            cache,
            identity,
            limit,
        } => cache.get(&identity.key, *limit, ctx.memory_pool()),
        _ => None,
    };
    let mut collected: Vec<Collected> =
        match &kept {
            // The build input is not read: the batches a query of the session collected from
            // it are joined again.
            Some(kept) => (kept.build.iter())
                .map(|p| Collected::kept(p, ctx.memory_pool()))
                .collect(),
            None => {
                let parts = spec.left.output_partitioning().partition_count();
                // One count of the buffers for every partition: partitions may share them too.
                let counter = Arc::new(Mutex::new(RecordBatchMemoryCounter::new()));
                let tasks: Vec<_> = (0..parts)
                    .map(|p| {
                        let counter = Arc::clone(&counter);
                        SpawnedTask::spawn(collect_partition(
                            Arc::clone(&spec),
                            p,
                            Arc::clone(&ctx),
                            counter,
                        ))
                    })
                    .collect();
                let mut collected = vec![];
                for task in tasks {
                    collected.push(task.join().await.map_err(|e| {
                        exec_datafusion_err!("GpuJoinExec build task failed: {e}")
                    })??);
                }
                collected
            }
        };
    if collected.iter().any(|c| c.refused)
        && let Some(spilling) = &spec.spilling
    {
        // DataFusion's spilling join reads the inputs itself, in passes where it spills.
        drop(collected);
        let plan = spilling.ready(ctx.session_config().options(), spec.probe_partitions)?;
        mark_fallback(
            &spec,
            &spilling.name,
            "the memory pool refused the build side, and DataFusion's join spills".into(),
        );
        return Ok(Outcome::Fallback(plan));
    }
    // What the cache keeps of this build side, where it does: its entry counts the batches
    // in the pool from here on.
    let mut kept_by_cache = None;
    let cached = match (cache, kept) {
        (CacheUse::Off, _) => None,
        (CacheUse::Unkept(why), _) => Some(format!("not kept: {why}")),
        (CacheUse::Kept { .. }, Some(kept)) => {
            kept_by_cache = Some(kept);
            Some("hit".to_string())
        }
        (
            CacheUse::Kept {
                cache,
                identity,
                limit,
            },
            None,
        ) => {
            let build = collected.iter().map(|c| c.part.clone()).collect();
            // The cache takes the batches' reservations over: the pool counts them once.
            let take = || {
                (collected.iter_mut())
                    .map(|c| c.reservation.take())
                    .collect()
            };
            Some(
                match cache.put(identity, build, limit, ctx.memory_pool(), take) {
                    Ok(kept) => {
                        kept_by_cache = Some(kept);
                        "stored".to_string()
                    }
                    Err(why) => format!("not stored: {why}"),
                },
            )
        }
    };
    if let Ok(mut shown) = spec.cache_at_run.lock() {
        *shown = cached;
    }
    let rows: usize = collected.iter().map(|c| c.part.rows).sum();
    trace!("build side collected: {rows} rows");
    if !spec.grace_group {
        // A grace join's groups are counted once, as the whole build side.
        spec.metrics.build_rows.add(rows);
    }
    let mut ranges = merged_ranges(&collected);
    // Exact keys whose ranges need more than 64 bits together: the join runs on a hash of them.
    let mut spec = spec;
    let wide = matches!(
        KeyEncoder::from_ranges(&ranges, spec.nulls_equal),
        Fitted::TooWide
    );
    let longest_key = collected.iter().map(|c| c.part.longest_key).max();
    spec.switched_at_run.store(0, Ordering::Relaxed);
    spec.grace_groups.store(0, Ordering::Relaxed);
    if let Ok(mut shown) = spec.algorithm_run.lock() {
        *shown = None;
    }
    match spec.switch.clone() {
        Some(Switch::WideKeys(hashed)) if wide => {
            ranges = hash_collected(&hashed, &mut collected)?;
            hashed.switched_at_run.store(1, Ordering::Relaxed);
            spec = hashed;
        }
        Some(switch @ Switch::LongKeys { .. }) => {
            let longest = longest_key.unwrap_or(0);
            if let Some((at, to)) = switch.for_longest(longest, spec.check_words()) {
                let to = Arc::clone(to);
                // Verified on the host: re-hashed over the whole keys, without check bytes.
                if !to.checked_keys() {
                    ranges = hash_collected(&to, &mut collected)?;
                }
                to.switched_at_run.store(at, Ordering::Relaxed);
                spec = to;
            }
        }
        _ => {}
    }
    // A null-aware anti join's build rows with a null key stay on the host; the batches as
    // they were are kept for a fallback (DataFusion's join needs those rows).
    let mut unsplit = None;
    let null_aware = match &spec.null_aware {
        Some(plan) => {
            let batches: Vec<RecordBatch> = (collected.iter())
                .flat_map(|c| c.part.batches.iter().cloned())
                .collect();
            let set_aside =
                plan.split(collected.iter_mut().flat_map(|c| c.part.batches.iter_mut()))?;
            unsplit = set_aside.is_some().then_some(batches);
            for c in collected.iter_mut() {
                c.part.rows = c.part.batches.iter().map(|b| b.num_rows()).sum();
            }
            Some(Arc::new(NullAwareRun::new(
                plan.clone(),
                set_aside,
                spec.probe_partitions,
            )))
        }
        None => None,
    };
    let rows: usize = collected.iter().map(|c| c.part.rows).sum();
    let config = ctx.session_config().options();
    let batch_size = ctx.session_config().batch_size().max(1);
    let encoder = match (rows, KeyEncoder::from_ranges(&ranges, spec.nulls_equal)) {
        (0, _) | (_, Fitted::NoMatches) => {
            // No build key to match: the output is the rows the join keeps without a match.
            let empty = match rows {
                0 => spec.join_type.empty_build_side_produces_empty_result(),
                _ => spec.join_type.empty_map_produces_empty_result(),
            };
            if !empty {
                return fallback(
                    &spec,
                    collected,
                    unsplit,
                    "the build side has no key to match, and the output keeps unmatched rows"
                        .into(),
                    batch_size,
                );
            }
            if let Some(f) = &spec.dynamic_filter {
                f.mark_complete();
            }
            return Ok(Outcome::Empty);
        }
        (_, Fitted::TooWide) => {
            return fallback(
                &spec,
                collected,
                unsplit,
                "the key columns' value ranges need more than 64 bits".into(),
                batch_size,
            );
        }
        (_, Fitted::Encoder(e)) => e,
    };
    // Probe columns taken on the host where few probe rows are expected to match.
    let spans = (!spec.hashed_keys).then(|| {
        ranges
            .iter()
            .filter_map(KeyRange::value_span)
            .collect::<Vec<_>>()
    });
    if let Some(twin) = spec.probe_on_host.clone()
        && let Some(why) = carriage::on_host(spec.probe_columns, spans.as_deref(), rows)
    {
        if let Ok(mut moved) = spec.probe_moved_at_run.lock() {
            *moved = Some(why);
        }
        spec = twin;
    }
    let chosen = algorithm::choose(spec.algorithm, encoder, rows);
    if let Ok(mut shown) = spec.algorithm_run.lock() {
        *shown = Some(chosen.shown);
    }
    let encoder = chosen.encoder;
    // Bounds of hashed keys say nothing of the key columns.
    let filter = spec
        .dynamic_filter
        .as_ref()
        .filter(|_| filter::enabled(config) && !spec.hashed_keys);
    if spec.positions_overflow(rows) {
        return fallback(
            &spec,
            collected,
            unsplit,
            "the build side has too many rows to gather columns by a 32-bit position".into(),
            batch_size,
        );
    }
    if let (Some(f), None) = (&spec.dynamic_filter, filter) {
        // Wired at planning, but turned off for this execution: a scan must not wait for it.
        f.mark_complete();
    }
    if let Some(f) = filter {
        let keys = BuildKeys {
            ranges: &ranges,
            arrays: spec
                .layout
                .build_keys
                .iter()
                .map(|&k| {
                    collected
                        .iter()
                        .flat_map(|c| c.part.batches.iter().map(move |b| Arc::clone(b.column(k))))
                        .collect::<Vec<ArrayRef>>()
                })
                .collect(),
            rows,
            key_set: spec.filter_applied_on_host && crate::rule::settings(config).runtime_filters,
        };
        filter::publish(f, &spec.on, &spec.right_schema, &keys, config)?;
    }
    // The rule's gate, with the build rows counted rather than estimated: DataFusion's join
    // probes a build side this small for less than staging the probe rows for the device costs
    // (TPC-H Q16's anti join: DataFusion estimated 20 % of `supplier`, 4 rows at SF 1 passed
    // its filter). It gets the dynamic filter published above. Not for a grace join's group
    // (a share of a large build side).
    let min_build_rows = crate::rule::settings(config).min_build_rows;
    if rows < min_build_rows && !spec.grace_group {
        return fallback(
            &spec,
            collected,
            unsplit,
            format!(
                "the build side has {rows} rows, fewer than gpu_join.min_build_rows = {min_build_rows}"
            ),
            batch_size,
        );
    }
    // What the host holds for the device's plan `spec`: the build columns it gathers.
    let prepare = |spec: &RunSpec, collected: &[Collected]| -> Result<Prepared> {
        let held = held(collected);
        let counted = match &kept_by_cache {
            Some(kept) => Counted::Kept(kept),
            None => Counted::Collected(&held),
        };
        let build = match &spec.gather {
            Some(g) => HostBuild::new(
                collected.iter().flat_map(|c| c.part.batches.iter()),
                &g.build_columns,
                &g.build_views,
                MemoryConsumer::new("GpuJoinExec gathered build columns")
                    .register(ctx.memory_pool()),
                counted,
                batch_size,
            )?,
            None => HostBuild::default(),
        };
        Ok(Prepared {
            encoder: encoder.clone(),
            host: HostHeld {
                build: Arc::new(build),
                null_aware: null_aware.clone(),
            },
            holder,
            started,
        })
    };
    let devices = spread_devices(&spec, rows);
    let max_view_buffers = view_buffer_bound(batch_size);
    let (spec, outcome) = match spec.backend {
        JoinBackend::Host(_) => {
            let total = crate::backend::system_memory();
            let queues = devices
                .iter()
                .map(|_| (HostBackend::new(Arc::new(MemoryTracker::default())), total))
                .collect::<Vec<_>>();
            start_plan(spec, &queues, &mut collected, prepare, max_view_buffers).await?
        }
        JoinBackend::Cuda(_) => {
            let queues = devices
                .iter()
                .map(|ordinal| {
                    let device = crate::device::cuda_device(ordinal)?;
                    let total = device.total_memory();
                    Ok((
                        CudaBackend::new(device, Arc::new(MemoryTracker::default()))?,
                        total,
                    ))
                })
                .collect::<Result<Vec<_>>>()?;
            start_plan(spec, &queues, &mut collected, prepare, max_view_buffers).await?
        }
    };
    match outcome {
        Started::Ready(outcome) => Ok(outcome),
        Started::Refused(Refused::DoesNotFit { reason, groups }) => {
            match grace::refusal(&spec, groups, &ctx) {
                Some(why) => fallback(
                    &spec,
                    collected,
                    unsplit,
                    format!("{reason}; {why}"),
                    batch_size,
                ),
                None => {
                    log::info!("GpuJoinExec joins its build side in {groups} groups: {reason}");
                    spec.grace_groups.store(groups, Ordering::Relaxed);
                    let batches = input_batches(&spec, collected)?;
                    Ok(Outcome::Grace(Arc::new(GraceRun::new(
                        &spec, batches, groups, ctx,
                    )?)))
                }
            }
        }
        Started::Refused(Refused::TooBig(reason)) => {
            fallback(&spec, collected, unsplit, reason, batch_size)
        }
    }
}

/// The devices an execution with `build_rows` build rows spreads over: its backend's, no more
/// than its probe partitions (a lane per device, each fed by whole partitions), and only the
/// first unless statistics estimate the probe side at least as large as the build side. Each
/// device holds the whole build side: where the build is larger than the probe, copying it to
/// every device would cost more than splitting the probe saves (reasoned, not measured).
fn spread_devices(spec: &RunSpec, build_rows: usize) -> Devices {
    let devices = spec.backend.devices().first_n(spec.probe_partitions);
    if devices.len() == 1 {
        return devices;
    }
    let probe_rows = estimated_rows(spec.right.as_ref());
    match probe_rows {
        Some(p) if p >= build_rows => devices,
        _ => {
            log::info!(
                "GpuJoinExec runs on one device of {devices}: {build_rows} build rows against a \
                 probe side estimated at {probe_rows:?} rows"
            );
            devices.first_n(1)
        }
    }
}

/// The rows DataFusion's statistics estimate `plan` gives, if they do.
pub(crate) fn estimated_rows(plan: &dyn ExecutionPlan) -> Option<usize> {
    StatisticsContext::new()
        .compute(plan, &StatisticsArgs::new())
        .ok()
        .and_then(|s| s.num_rows.get_value().copied())
}

/// What the build side prepared for the device to start with.
struct Prepared {
    encoder: KeyEncoder,
    host: HostHeld,
    /// The query the join belongs to, for the device memory budget.
    holder: Holder,
    /// When the join began collecting its build side.
    started: std::time::Instant,
}

/// What starting the device gave.
enum Started {
    Ready(Outcome),
    /// The first device refused the join.
    Refused(Refused),
}

/// Why a device does not take the join.
enum Refused {
    /// The build side and one smallest chunk are more than the memory limit; in `groups`
    /// groups, each would take at most half of it.
    DoesNotFit { reason: String, groups: usize },
    /// The join does not fit the memory free, and may not wait for more.
    TooBig(String),
}

impl Refused {
    /// Why.
    fn reason(&self) -> &str {
        match self {
            Self::DoesNotFit { reason, .. } | Self::TooBig(reason) => reason,
        }
    }
}

/// Steps 3 and 5 on each device of `queues` (with its memory in all): reserves the join's
/// memory, starts the lanes, and stages the build side into each device's pinned pages, the
/// batches read once (moving them out of `collected`, which keeps them where the build side
/// does not fit).
///
/// The first device decides as a lone device would: it may wait for memory, and where the join
/// does not fit it, the join runs in groups or falls back. Each further device joins only if
/// its memory is free now, and is left out otherwise (the reason is logged).
async fn start_devices<B: Backend>(
    spec: &Arc<RunSpec>,
    queues: &[(B, usize)],
    collected: &mut [Collected],
    prepared: Prepared,
) -> Result<Started> {
    let Prepared {
        encoder,
        host,
        holder,
        started,
    } = prepared;
    let rows: usize = collected.iter().map(|c| c.part.rows).sum();
    let mut values = values_plan(spec, collected, &host.build);
    let mut admitted = vec![];
    for (i, (queue, total)) in queues.iter().enumerate() {
        let mut admitted_here =
            admit(spec, queue, *total, rows, &encoder, holder, i == 0, &values).await?;
        if let (0, Err(refused)) = (i, &admitted_here)
            && values.any()
        {
            // The view values stay on the host where the build side fits only without them.
            values = values.on_host(&format!(
                "host (the build side fits the device only without its values: {})",
                refused.reason()
            ));
            show_values(spec, &host.build, &values);
            admitted_here =
                admit(spec, queue, *total, rows, &encoder, holder, true, &values).await?;
        }
        match admitted_here {
            Ok(a) => admitted.push((queue, a)),
            Err(refused) if i == 0 => return Ok(Started::Refused(refused)),
            Err(refused) => log::info!(
                "GpuJoinExec leaves its {} device {} of {} out: {}",
                queue.name(),
                i + 1,
                queues.len(),
                refused.reason()
            ),
        }
    }
    let n = admitted.len();
    let mut lanes = Vec::with_capacity(n);
    let mut ends = Vec::with_capacity(n);
    // Lanes that each mark the build rows their partitions match merge their marks.
    let marks = (n > 1 && spec.emission().build.is_some()).then(|| Arc::new(MarksMerge::new(n)));
    for (i, (queue, (sizing, reservation))) in admitted.into_iter().enumerate() {
        let (lane, ended) = spawn_lane(queue, Arc::clone(spec))?;
        send(
            &lane,
            Job::Start {
                reservation,
                encoder: encoder.clone(),
                sizing,
                started: (i == 0).then_some(started),
                // Partition `p` feeds lane `p % n`.
                partitions: (i..spec.probe_partitions).step_by(n).count(),
                marks: marks.clone(),
                values: values
                    .any()
                    .then(|| (Arc::clone(&host.build), values.columns.clone())),
            },
        )?;
        lanes.push(ReadyLane {
            lane,
            sizing,
            staging: queue.staging().clone(),
        });
        ends.push(ended);
    }
    stage_build(spec, &lanes, collected, &host.build).await?;
    for lane in &lanes {
        send(&lane.lane, Job::BuildDone)?;
    }
    Ok(Started::Ready(Outcome::Ready {
        spec: Arc::clone(spec),
        lanes,
        ended: LaneEnd::all(ends),
        host,
    }))
}

/// Which of the build view columns the device carries have their values gathered on the device
/// too (`gpu_join.view_bytes_on_device`, [`view_bytes::Plan`]), as EXPLAIN ANALYZE shows it
/// (`values_at_run`).
fn values_plan(spec: &RunSpec, collected: &[Collected], build: &HostBuild) -> view_bytes::Plan {
    let columns = build.view_columns();
    let plan = match spec.view_bytes_on_device {
        true => view_bytes::Plan::of(columns.iter().map(|(c, views)| {
            let arrays: Vec<ArrayRef> = (collected.iter())
                .flat_map(|p| p.part.batches.iter().map(|b| Arc::clone(b.column(*c))))
                .collect();
            (views, ValueStats::of(&arrays))
        })),
        false => view_bytes::Plan::off(columns.len()),
    };
    show_values(spec, build, &plan);
    plan
}

/// Records `plan` for EXPLAIN ANALYZE (`values_at_run`).
fn show_values(spec: &RunSpec, build: &HostBuild, plan: &view_bytes::Plan) {
    let schema = spec.left.schema();
    let shown: Vec<String> = (build.view_columns().iter().zip(&plan.reasons))
        .map(|((c, _), why)| format!("{}@{c}: {why}", schema.field(*c).name()))
        .collect();
    if let Ok(mut at_run) = spec.values_at_run.lock() {
        *at_run = (!shown.is_empty()).then(|| shown.join(", "));
    }
}

/// Starts the devices for `spec` with what `prepare` makes of the collected build side, or
/// for its twin that gathers its build views on the host (`spec.views_on_host`, which stages 4
/// bytes a build row for them all instead of 16 a view column): where the views point into
/// more buffers than an output array should list, or the first device refuses `spec`. Gives
/// the plan that started, or was refused last.
async fn start_plan<B: Backend>(
    spec: Arc<RunSpec>,
    queues: &[(B, usize)],
    collected: &mut [Collected],
    prepare: impl Fn(&RunSpec, &[Collected]) -> Result<Prepared>,
    max_view_buffers: usize,
) -> Result<(Arc<RunSpec>, Started)> {
    let rows: usize = collected.iter().map(|c| c.part.rows).sum();
    let on_host = spec
        .views_on_host
        .clone()
        .filter(|twin| !twin.positions_overflow(rows));
    let too_many = match (&spec.gather, &on_host) {
        (Some(g), Some(_)) => g.build_views.iter().find_map(|&c| {
            let arrays: Vec<ArrayRef> = collected
                .iter()
                .flat_map(|p| p.part.batches.iter().map(|b| Arc::clone(b.column(c))))
                .collect();
            let nullable = spec.left.schema().field(c).is_nullable();
            if let Some(why) = beyond_views(&arrays, nullable) {
                return Some(why);
            }
            let buffers = BuildViews::listed(&arrays).map_or(0, |l| l.buffers());
            (buffers > max_view_buffers).then(|| {
                format!(
                    "the build side's views point into more than {max_view_buffers} data \
                     buffers, which every output array would list"
                )
            })
        }),
        _ => None,
    };
    let refused = match too_many {
        Some(why) => why,
        None => {
            let started = prepare_and_start(&spec, queues, collected, &prepare).await?;
            match (started, &on_host) {
                (Started::Refused(refused), Some(_)) => format!(
                    "the build side fits the device's memory limit only without its views ({})",
                    refused.reason()
                ),
                (started, _) => return Ok((spec, started)),
            }
        }
    };
    let Some(on_host) = on_host else {
        return internal_err!("build views moved to the host without a plan for it");
    };
    log::info!("GpuJoinExec gathers its build views on the host: {refused}");
    if let Ok(mut moved) = spec.views_moved_at_run.lock() {
        *moved = Some(refused);
    }
    let started = prepare_and_start(&on_host, queues, collected, &prepare).await?;
    Ok((on_host, started))
}

/// Starts the devices for `spec` with what `prepare` makes of the collected build side; where
/// the first device refuses it, the bytes the host's build columns took over from the
/// collected partitions go back to them (the batches stay held, for what runs instead).
async fn prepare_and_start<B: Backend>(
    spec: &Arc<RunSpec>,
    queues: &[(B, usize)],
    collected: &mut [Collected],
    prepare: &impl Fn(&RunSpec, &[Collected]) -> Result<Prepared>,
) -> Result<Started> {
    let prepared = prepare(spec, collected)?;
    let build = Arc::clone(&prepared.host.build);
    let started = start_devices(spec, queues, collected, prepared).await?;
    if matches!(started, Started::Refused(_)) {
        build.give_back(&held(collected));
    }
    Ok(started)
}

/// The reservations of the collected build partitions, in order: what the build columns the
/// host gathers take their bytes over from ([`HostBuild::new`]).
fn held(collected: &[Collected]) -> Vec<&MemoryReservation> {
    collected.iter().map(|c| &c.reservation).collect()
}

/// Sends a job to a lane.
fn send(lane: &Sender<Job>, job: Job) -> Result<()> {
    lane.send(job)
        .map_err(|_| exec_datafusion_err!("GpuJoinExec lane stopped"))
}

/// Step 3 on one device: reserves the memory of a build side of `rows` rows (with the data of
/// the view columns whose values `values` gathers on the device) and its first chunk in
/// flight, and sizes the chunks. Where even the smallest chunk does not fit the
/// memory free, it waits if `may_wait`; otherwise (or where waiting cannot help) it says why
/// the join does not start here.
#[allow(clippy::too_many_arguments)]
async fn admit<B: Backend>(
    spec: &Arc<RunSpec>,
    queue: &B,
    total_memory: usize,
    rows: usize,
    encoder: &KeyEncoder,
    holder: Holder,
    may_wait: bool,
    values: &view_bytes::Plan,
) -> Result<std::result::Result<(Sizing, Reservation), Refused>> {
    let budget: &Arc<MemoryBudget> = queue.budget();
    budget.set_capacity(spec.memory_limit.bytes(total_memory))?;
    // What the join's estimate misses, it may take from memory free in the budget.
    queue.tracker().set_overdraft(budget, holder);
    let staging = queue.staging();
    let build_rows_per_block = block_rows(&spec.build_kinds, staging.page_bytes());
    // What the blocks' copies take on the device (each region 64-byte aligned).
    let blocks = rows.div_ceil(build_rows_per_block);
    let raw = BlockLayout::new(spec.build_kinds.iter().copied(), rows).bytes
        + blocks * spec.build_kinds.len() * 2 * 64;
    let build_bytes = build_bytes(
        &spec.build_kinds,
        raw,
        spec.kinds.derived,
        rows,
        spec.emission().build.is_some(),
        spec.pack_uploads,
        encoder.direct_bits(),
    ) + values.data_bytes;
    let limits = Limits {
        max_chunk_rows: spec.max_chunk_rows,
        budget: budget.capacity(),
        build: build_bytes,
        staging_page: staging.page_bytes(),
        output_page: queue.output().page_bytes(),
        values: values.pass_values(),
    };
    // The join's chunks are sized to the memory free now, not to the whole budget: the joins
    // of a pipeline (a join probing with another's output) run at once, and one that took
    // half the budget for its chunks would leave less to the joins under it. Where even that
    // does not fit, the join needs at least its build side and one chunk of the smallest size.
    // It waits for them only if its query holds no device memory and no other join of its
    // query waits: the joins above it in the pipeline hold theirs until its output has gone
    // through them, so waiting for them would be for ever; it runs on the CPU instead. Memory
    // other queries hold comes back as they end, and they do not wait for this one.
    // Chunks as large as half the memory free (besides `held` bytes already reserved) allows,
    // with the bytes they need beyond `held`, if those are free now.
    let fit_now = |held: usize| {
        let free = Limits {
            budget: budget.available() + held,
            ..limits
        };
        plan(&spec.kinds, free)
            .ok()
            .map(|s| (s, build_bytes + s.slot_bytes))
    };
    if let Some(admitted) =
        fit_now(0).and_then(|(s, need)| Some((s, budget.try_reserve(need, holder)?)))
    {
        return Ok(Ok(admitted));
    }
    let least = Limits {
        max_chunk_rows: MIN_CHUNK_ROWS,
        ..limits
    };
    let sizing = match plan(&spec.kinds, least) {
        Ok(s) => s,
        Err(e) => {
            // Groups of half the limit, if the other half holds a smallest chunk.
            let half = (limits.budget / 2).max(1);
            let group = Limits {
                build: half,
                ..least
            };
            return Ok(Err(match plan(&spec.kinds, group) {
                Ok(_) => Refused::DoesNotFit {
                    reason: e.to_string(),
                    groups: build_bytes.div_ceil(half).max(2),
                },
                Err(_) => Refused::TooBig(format!(
                    "{e}; in groups of half the limit, no probe chunk would fit either"
                )),
            }));
        }
    };
    let held = build_bytes + sizing.slot_bytes;
    if !may_wait {
        return Ok(Err(Refused::TooBig(format!(
            "the join needs {held} bytes of device memory, and {} are free now",
            budget.available()
        ))));
    }
    let Some(mut reservation) = budget.reserve_unless_held(held, holder).await? else {
        return Ok(Err(Refused::TooBig(format!(
            "the join needs {held} bytes of device memory, {} are free, and the other \
             joins of its query hold {} bytes (or wait for memory), which they may give \
             back only once this join's output has gone through them",
            budget.available(),
            budget.held_by(holder)
        ))));
    };
    // Once admitted, larger chunks where memory is free by then.
    let grown = fit_now(reservation.bytes())
        .filter(|(_, need)| *need > held)
        .and_then(|(s, need)| Some((s, reservation.try_more(need - held)?)));
    Ok(Ok(match grown {
        Some((larger, more)) => {
            reservation.merge(more);
            (larger, reservation)
        }
        None => (sizing, reservation),
    }))
}

/// Rows of a block of the given column kinds that fit `bytes` (a page).
fn block_rows(kinds: &[(ColumnKind, bool)], bytes: usize) -> usize {
    let per_row = BlockLayout::row_bytes(kinds.iter().copied()).max(1);
    let mut rows = (bytes / per_row).max(1);
    while rows > 1 && BlockLayout::new(kinds.iter().copied(), rows).bytes > bytes {
        rows -= rows / 16 + 1;
    }
    rows
}

/// The host's cores, which host work spreads over.
pub(crate) fn host_cores() -> usize {
    std::thread::available_parallelism().map_or(4, |n| n.get())
}

/// The results of scoped threads, each joined before any result is read: a thread left
/// unjoined at the first error that then panicked would make its scope panic. The first
/// error, or `panicked()` where a thread panicked.
pub(crate) fn join_all<T>(
    handles: Vec<std::thread::ScopedJoinHandle<'_, Result<T>>>,
    panicked: impl Fn() -> DataFusionError,
) -> Result<Vec<T>> {
    let joined: Vec<_> = handles.into_iter().map(|h| h.join()).collect();
    (joined.into_iter())
        .map(|j| j.map_err(|_| panicked())?)
        .collect()
}

/// Stages the collected build batches into pinned blocks of each lane's device and sends them
/// to the lanes, with one task per core. The batches move into the tasks, each of which stages
/// its batches for one lane after another and drops them at its end: freeing them (the hashes
/// computed for them, say) is spread over the cores too.
async fn stage_build(
    spec: &Arc<RunSpec>,
    lanes: &[ReadyLane],
    collected: &mut [Collected],
    host: &Arc<HostBuild>,
) -> Result<()> {
    // Each batch with the place of its first row among the build rows (their `__row`).
    let mut first = 0;
    let batches: Vec<(RecordBatch, usize)> = collected
        .iter_mut()
        .flat_map(|c| std::mem::take(&mut c.part.batches))
        .map(|b| {
            first += b.num_rows();
            let at = first - b.num_rows();
            (b, at)
        })
        .collect();
    let cores = host_cores();
    let per_task = batches.len().div_ceil(cores).max(1);
    let mut batches = batches.into_iter().peekable();
    let groups = std::iter::from_fn(|| {
        batches.peek()?;
        Some(batches.by_ref().take(per_task).collect::<Vec<_>>())
    });
    let tasks: Vec<_> = groups
        .enumerate()
        .map(|(task, group)| {
            let spec = Arc::clone(spec);
            let host = Arc::clone(host);
            let lanes: Vec<(Sender<Job>, HostPool)> = lanes
                .iter()
                .map(|l| (l.lane.clone(), l.staging.clone()))
                .collect();
            SpawnedTask::spawn(async move {
                let cut = group
                    .iter()
                    .map(|(batch, first)| {
                        let columns = spec.build_side.staged(
                            batch,
                            &spec.build_indices,
                            *first,
                            Some(&host),
                        )?;
                        Ok((columns, batch.num_rows()))
                    })
                    .collect::<Result<Vec<_>>>()?;
                // Lane after lane, each lane's last block sent before the next lane's first is
                // taken: a task waits for a page only while it holds none, so tasks waiting for
                // pages never hold the pages others wait for.
                // Every block of this task's rows is packed alike, where it can be.
                let kinds = &spec.build_kinds;
                let frames = if spec.pack_uploads {
                    Stager::frames(kinds, cut.iter().map(|(columns, _)| columns.as_slice()))
                } else {
                    vec![None; kinds.len()]
                };
                for (lane, staging) in &lanes {
                    let rows = block_rows(kinds, staging.page_bytes());
                    let mut stager = Stager::new(kinds, rows);
                    let mut blocks = 0;
                    let mut build = |staged| {
                        blocks += 1;
                        Job::Build((task, blocks), staged)
                    };
                    for (columns, rows) in &cut {
                        let mut at = 0;
                        while at < *rows {
                            if stager.block.is_none() {
                                stager.open(staging.take(stager.layout.bytes).await?)?;
                                stager.pack(&frames)?;
                            }
                            at += stager.stage(columns, at, &spec.metrics.key_hash_time)?;
                            if stager.is_full() {
                                stager.send(lane, &mut build)?;
                            }
                        }
                    }
                    stager.send(lane, build)?;
                }
                Ok::<_, DataFusionError>(())
            })
        })
        .collect();
    for task in tasks {
        task.join()
            .await
            .map_err(|e| exec_datafusion_err!("GpuJoinExec staging task failed: {e}"))??;
    }
    Ok(())
}

/// Records that DataFusion's join runs instead, and why. The dynamic filter is left as it is
/// (a fallback's filter, if published, stays right) and marked complete, so that no probe scan
/// waits for it.
fn mark_fallback(spec: &RunSpec, join: &str, reason: String) {
    log::info!("GpuJoinExec runs {join} instead: {reason}");
    // No plan of the join's ran, whichever way it carried columns, keys or algorithm (a build
    // side taken from the cache still was: `cache_at_run` stays).
    clear_moved(spec);
    spec.switched_at_run.store(0, Ordering::Relaxed);
    if let Ok(mut shown) = spec.algorithm_run.lock() {
        *shown = None;
    }
    if let Some(f) = &spec.dynamic_filter {
        f.mark_complete();
    }
    if let Ok(mut r) = spec.fallback_reason.lock() {
        *r = Some(format!("{join}: {reason}"));
    }
}

/// Forgets which twin the last execution ran (`views_moved_at_run`, `probe_moved_at_run`).
fn clear_moved(spec: &RunSpec) {
    for moved in [
        &spec.views_moved_at_run,
        &spec.values_at_run,
        &spec.probe_moved_at_run,
    ] {
        if let Ok(mut moved) = moved.lock() {
            *moved = None;
        }
    }
}

/// The collected build batches, with the input's own columns only.
fn input_batches(spec: &RunSpec, collected: Vec<Collected>) -> Result<Vec<RecordBatch>> {
    collected
        .into_iter()
        .flat_map(|c| c.part.batches)
        .map(|b| spec.build_side.input_part(&b))
        .collect()
}

/// Rows of the batches a fallback's build side with view columns is coalesced into.
const FALLBACK_BATCH_ROWS: usize = 1 << 20;

/// The build side DataFusion's join gets in a fallback: the collected batches with the input's
/// own columns, or a null-aware anti join's batches as they were before its rows with a null
/// key were set aside (`unsplit`), which DataFusion's join needs too.
fn fallback_input(
    spec: &RunSpec,
    collected: Vec<Collected>,
    unsplit: Option<Vec<RecordBatch>>,
) -> Result<Vec<RecordBatch>> {
    match unsplit {
        Some(batches) => batches
            .iter()
            .map(|b| spec.build_side.input_part(b))
            .collect(),
        None => input_batches(spec, collected),
    }
}

/// Falls back to DataFusion's join over the collected build side ([`fallback_input`]), for
/// output batches of `batch_size` rows.
fn fallback(
    spec: &RunSpec,
    collected: Vec<Collected>,
    unsplit: Option<Vec<RecordBatch>>,
    reason: String,
    batch_size: usize,
) -> Result<Outcome> {
    mark_fallback(spec, spec.fallback.name(), reason);
    let mut batches = fallback_input(spec, collected, unsplit)?;
    // View columns whose batches list more data buffers than an output batch of `batch_size`
    // rows may carry ([`view_buffer_bound`]) get buffers of their own first:
    // DataFusion's join concatenates its build side, listing every batch's buffers (a scan's
    // pieces of one table each list all of the table's), and every output array it takes from
    // them copies that list: 217 thousand buffers a column for a build side of 96 thousand rows
    // in 7-row batches ran out of 20 GB (differential seed 7006344). The copy is counted once
    // DataFusion's join collects it; the batches it replaces go.
    let schema = spec.left.schema();
    let listed = |c: usize| -> usize {
        (batches.iter())
            .filter_map(|b| parts(b.column(c).as_ref()).map(|(_, buffers)| buffers.len()))
            .sum()
    };
    let many = (0..schema.fields().len())
        .any(|c| is_view(schema.field(c).data_type()) && listed(c) > view_buffer_bound(batch_size));
    if many {
        batches = coalesced(&schema, batches, FALLBACK_BATCH_ROWS)?;
    }
    let left: Arc<dyn ExecutionPlan> =
        MemorySourceConfig::try_new_exec(&[batches], spec.left.schema(), None)?;
    twin_over(spec, left)
}

/// DataFusion's join of the same inputs, with build input `left` (of one partition).
fn twin_over(spec: &RunSpec, left: Arc<dyn ExecutionPlan>) -> Result<Outcome> {
    let Some(hash) = spec.fallback.downcast_ref::<HashJoinExec>() else {
        let right = Arc::clone(spec.fallback.children()[1]);
        let options = ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute);
        return Ok(Outcome::Fallback(
            Arc::clone(&spec.fallback).replace_children(vec![left, right], options)?,
        ));
    };
    let join = hash
        .builder()
        .with_new_children(vec![left, Arc::clone(hash.right())])?
        .with_partition_mode(PartitionMode::CollectLeft)
        .reset_state()
        .build()?;
    Ok(Outcome::Fallback(Arc::new(join)))
}
