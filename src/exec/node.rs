//! [`GpuJoinExec`]: the plan node that replaces an eligible DataFusion join (a hash,
//! sort-merge, cross, nested loop or piecewise merge join), and its builder.
//!
//! # Inputs and partitioning
//!
//! ```text
//!            GpuJoinExec  (output partition i = probe partition i joined with the build side)
//!            /         \
//!   left: build side    right: probe side
//!   (any partitioning:  (any partitioning; each partition's batches are staged into pinned
//!    every partition     blocks and sent, chunk by chunk, to the join's one device lane)
//!    read at once)
//! ```
//! The node reads every partition of its left input itself (in parallel tasks), so it needs no
//! `CoalescePartitionsExec` under it, and leaves the right input's partitioning alone, so no CPU
//! hash repartitioning is kept that the GPU would redo. Output partition i holds the output of
//! probe partition i's rows, in their probe order (and, for one probe row, in build order), as
//! `HashJoinExec` keeps them in `CollectLeft` mode. Join types that output build rows after the
//! probe side (left, full, left semi, anti and mark) emit those once, in the partition that
//! finishes its probe rows last, and so declare an unknown partitioning, as `HashJoinExec` does.
//! A node that replaced a sort-merge join declares no order and an unknown partitioning (it
//! does not keep the merge's key order).
//!
//! # Output
//!
//! Schema, column order, nullability and embedded projection are those of the replaced
//! `HashJoinExec`. Like it, the node absorbs a `ProjectionExec` above it that keeps a subset of
//! its columns (`ProjectionPushdown`), so columns the query drops are never materialized on the
//! device nor downloaded; honours a pushed-down `fetch`; pushes a dynamic filter of the build
//! side's keys into its probe input; and reports the replaced join's statistics.
//!
//! # Lifetime
//!
//! Each execution has its own build side and device lane ([`JoinRun`]), shared by its output
//! partitions and freed when the last of their streams is dropped: a finished, failed or
//! cancelled query leaves no device memory behind, even while its plan is kept.

use std::collections::HashSet;
use std::fmt;
use std::sync::{Arc, Mutex};

use arrow::datatypes::{Schema, SchemaRef};
use datafusion::common::config::ConfigOptions;
use datafusion::common::stats::Statistics;
use datafusion::common::tree_node::{Transformed, TreeNode, TreeNodeRecursion};
use datafusion::common::{
    DataFusionError, JoinSide, NullEquality, Result, internal_err, plan_err, project_schema,
};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::JoinType;
use datafusion::physical_expr::equivalence::join_equivalence_properties;
use datafusion::physical_expr::expressions::{BinaryExpr, Column, DynamicFilterPhysicalExpr};
use datafusion::physical_expr::projection::ProjectionMapping;
use datafusion::physical_expr::utils::collect_columns;
use datafusion::physical_expr::{Distribution, PhysicalExpr};
use datafusion::physical_plan::execution_plan::{Boundedness, EmissionType};
use datafusion::physical_plan::filter_pushdown::{
    ChildFilterDescription, ChildPushdownResult, FilterDescription, FilterPushdownPhase,
    FilterPushdownPropagation,
};
use datafusion::physical_plan::joins::utils::{
    ColumnIndex, JoinFilter, JoinOn, adjust_right_output_partitioning, build_join_schema,
};
use datafusion::physical_plan::joins::{
    CrossJoinExec, HashJoinExec, NestedLoopJoinExec, PartitionMode, PiecewiseMergeJoinExec,
    SortMergeJoinExec,
};
use datafusion::physical_plan::metrics::{ExecutionPlanMetricsSet, MetricsSet};
use datafusion::physical_plan::projection::{
    EmbeddedProjection, ProjectionExec, try_embed_projection,
};
use datafusion::physical_plan::statistics::{ChildStats, StatisticsArgs};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties,
    InputDistributionRequirements, Partitioning, PlanProperties, ReplaceChildrenOptions,
};

mod twins;
pub use twins::Replaced;
pub(crate) use twins::SpillingTwin;

use super::carriage::{Carriage, ProbeColumns};
use super::filter;
use super::gather::HostGather;
use super::key_hash::{KeyHash, key_columns};
use super::metrics::{GpuJoinMetrics, RunMetrics};
use super::null_aware::NullAware;
use super::residual::Residual;
use super::run::{JoinRun, RunSpec, Switch};
use super::side::SideColumns;
use super::sizing::ColumnKinds;
use super::stream::GpuJoinStream;
use crate::backend::{Backend, HostBackend, ProbeEmit};
use crate::columns::ColumnKind;
use crate::config::MemoryLimit;
use crate::device::{Devices, HostPool};
use crate::join::{Algorithm, CheckedKeys, Emission, OutputColumn, OutputLayout};

/// Where a `GpuJoinExec` runs its primitives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinBackend {
    /// The CUDA devices with these ordinals: each holds the build side, and each probe
    /// partition goes to one of them (partition `p` to the `p % n`-th).
    Cuda(Devices),
    /// The CPU twin of the GPU algorithm, with one lane per device listed (one, unless
    /// `gpu_join.devices` lists more), as the GPUs would have.
    Host(Devices),
}

impl JoinBackend {
    /// The host backend with one lane.
    pub const HOST: Self = Self::Host(Devices::ZERO);

    /// The CUDA device `ordinal` alone.
    pub fn cuda(ordinal: usize) -> Result<Self> {
        Ok(Self::Cuda(Devices::one(ordinal)?))
    }

    /// The devices (or host lanes) the join spreads over.
    pub fn devices(self) -> Devices {
        match self {
            Self::Cuda(d) | Self::Host(d) => d,
        }
    }

    /// The same backend on its first `n` devices (at least one).
    pub fn first_n(self, n: usize) -> Self {
        match self {
            Self::Cuda(d) => Self::Cuda(d.first_n(n)),
            Self::Host(d) => Self::Host(d.first_n(n)),
        }
    }

    /// The pools of host pages that joins on this backend's kind download their output into:
    /// on CUDA, every device's the process has opened, since a join's input may come from a
    /// join on any of them (one on several devices, under a join on the first alone: a join
    /// whose probe side is smaller than its build side).
    pub(crate) fn output_pools(self) -> Result<Vec<HostPool>> {
        match self {
            Self::Cuda(d) => {
                for o in d.iter() {
                    crate::device::cuda_device(o)?;
                }
                Ok(crate::device::opened_devices()
                    .iter()
                    .map(|device| device.output().clone())
                    .collect())
            }
            Self::Host(_) => Ok(vec![HostBackend::default().output().clone()]),
        }
    }
}

impl fmt::Display for JoinBackend {
    /// `cuda:0`, `cuda:0,1`, `host`, or with several host lanes `host:0,1`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cuda(d) => write!(f, "cuda:{d}"),
            Self::Host(d) if d.len() == 1 => write!(f, "host"),
            Self::Host(d) => write!(f, "host:{d}"),
        }
    }
}

/// What the plans of one join (the node's, and the one an execution may switch to) share:
/// DataFusion's join of the same inputs, the metrics, the fallback reason and whether the last
/// execution switched.
struct SharedRun {
    twin: Arc<dyn ExecutionPlan>,
    spilling: Option<Arc<SpillingTwin>>,
    metrics: RunMetrics,
    fallback_reason: Arc<Mutex<Option<String>>>,
    switched_at_run: Arc<std::sync::atomic::AtomicUsize>,
    views_moved_at_run: Arc<Mutex<Option<String>>>,
    values_at_run: Arc<Mutex<Option<String>>>,
    probe_moved_at_run: Arc<Mutex<Option<String>>>,
    grace_groups: Arc<std::sync::atomic::AtomicUsize>,
    /// The algorithm the last execution ran, as EXPLAIN ANALYZE shows it.
    algorithm_run: Arc<Mutex<Option<String>>>,
    /// What the last execution did with the build cache.
    cache_at_run: Arc<Mutex<Option<String>>>,
}

/// The first column of `schema` the GPU can carry.
fn first_carried(schema: &SchemaRef) -> Option<usize> {
    schema
        .fields()
        .iter()
        .position(|f| ColumnKind::of(f.data_type()).is_some())
}

/// Why a join of these inputs cannot run on `GpuJoinExec`, or `None` if it can. Output and
/// filter columns of any type can: those the device does not carry are gathered on the host.
pub fn unsupported(
    left: &SchemaRef,
    right: &SchemaRef,
    on: &JoinOn,
    filter: Option<&JoinFilter>,
) -> Option<String> {
    if filter.is_some_and(|f| f.column_indices().iter().any(|c| c.side == JoinSide::None)) {
        return Some("a filter over a mark column".into());
    }
    match KeyHash::plan(on, left, right, false) {
        Ok(_) => None,
        Err(DataFusionError::Plan(reason)) => Some(reason),
        Err(e) => Some(e.strip_backtrace()),
    }
}

/// Builds a [`GpuJoinExec`], checking that the GPU path can run it.
#[derive(Debug, Clone)]
pub struct GpuJoinExecBuilder {
    pub(crate) left: Arc<dyn ExecutionPlan>,
    pub(crate) right: Arc<dyn ExecutionPlan>,
    pub(crate) on: JoinOn,
    pub(crate) join_type: JoinType,
    pub(crate) projection: Option<Vec<usize>>,
    pub(crate) null_equality: NullEquality,
    pub(crate) replaced: Replaced,
    pub(crate) backend: JoinBackend,
    pub(crate) probe_chunk_rows: usize,
    pub(crate) pack_uploads: bool,
    pub(crate) views_on_device: bool,
    pub(crate) view_bytes_on_device: bool,
    pub(crate) probe_columns: ProbeColumns,
    pub(crate) algorithm: Algorithm,
    pub(crate) memory_limit: MemoryLimit,
    pub(crate) key_hash_bits: u32,
    pub(crate) fetch: Option<usize>,
    pub(crate) filter: Option<JoinFilter>,
    pub(crate) dynamic_filter: Option<Arc<DynamicFilterPhysicalExpr>>,
    pub(crate) null_aware: bool,
    pub(crate) distributed: bool,
}

impl GpuJoinExecBuilder {
    /// An inner join of `left` (build) and `right` (probe) on column pairs `on`, on the host
    /// backend with the default settings (see [`with_join_type`](Self::with_join_type)).
    pub fn new(left: Arc<dyn ExecutionPlan>, right: Arc<dyn ExecutionPlan>, on: JoinOn) -> Self {
        let defaults = crate::GpuJoinConfig::default();
        Self {
            left,
            right,
            on,
            join_type: JoinType::Inner,
            projection: None,
            null_equality: NullEquality::NullEqualsNothing,
            replaced: Replaced::HashJoin(PartitionMode::CollectLeft),
            backend: JoinBackend::HOST,
            probe_chunk_rows: defaults.probe_chunk_rows,
            pack_uploads: defaults.pack_uploads,
            views_on_device: defaults.views_on_device,
            view_bytes_on_device: defaults.view_bytes_on_device,
            probe_columns: defaults.probe_columns,
            algorithm: defaults.algorithm,
            memory_limit: defaults.memory_limit,
            key_hash_bits: defaults.key_hash_bits,
            fetch: None,
            filter: None,
            dynamic_filter: None,
            null_aware: false,
            distributed: false,
        }
    }

    /// The join a `HashJoinExec` describes (inputs, keys, join type, residual filter,
    /// projection, null equality, fetch).
    pub fn from_hash_join(join: &HashJoinExec) -> Self {
        Self::new(
            Arc::clone(join.left()),
            Arc::clone(join.right()),
            join.on().to_vec(),
        )
        .with_join_type(*join.join_type())
        .with_filter(join.filter().cloned())
        .with_projection(join.projection.as_ref().map(|p| p.to_vec()))
        .with_null_equality(join.null_equality())
        .with_replaced(Replaced::HashJoin(*join.partition_mode()))
        .with_fetch(join.fetch())
        .with_null_aware(join.null_aware)
    }

    /// The join a `CrossJoinExec` describes: every pair, as an inner join without keys.
    pub fn from_cross_join(join: &CrossJoinExec) -> Self {
        Self::new(Arc::clone(&join.left), Arc::clone(&join.right), vec![])
            .with_replaced(Replaced::CrossJoin)
    }

    /// The join a `NestedLoopJoinExec` describes: a join of any type without keys, every pair
    /// decided by its filter (if any).
    pub fn from_nested_loop_join(join: &NestedLoopJoinExec) -> Self {
        Self::new(Arc::clone(join.left()), Arc::clone(join.right()), vec![])
            .with_join_type(*join.join_type())
            .with_filter(join.filter().cloned())
            .with_projection(join.projection().as_ref().map(|p| p.to_vec()))
            .with_replaced(Replaced::NestedLoopJoin)
    }

    /// The join a `PiecewiseMergeJoinExec` describes (`l <op> r`, one range predicate): a join
    /// without keys whose filter is that predicate, the buffered input the build side.
    pub fn from_piecewise_merge_join(join: &PiecewiseMergeJoinExec) -> Result<Self> {
        let (left, right) = (join.buffered(), join.streamed());
        // The filter's intermediate schema: the columns each side's expression reads.
        let mut fields = vec![];
        let mut column_indices = vec![];
        let mut side = |expr: &Arc<dyn PhysicalExpr>, input: &Arc<dyn ExecutionPlan>, s| {
            let schema = input.schema();
            let mut columns: Vec<Column> = collect_columns(expr).into_iter().collect();
            columns.sort_by_key(|c| c.index());
            let first = fields.len();
            for c in &columns {
                fields.push(schema.field(c.index()).as_ref().clone());
                column_indices.push(ColumnIndex {
                    index: c.index(),
                    side: s,
                });
            }
            Arc::clone(expr)
                .transform(|e| {
                    let Some(c) = e.downcast_ref::<Column>() else {
                        return Ok(Transformed::no(e));
                    };
                    let at = columns.iter().position(|k| k.index() == c.index());
                    let at = at.map_or(c.index(), |i| first + i);
                    Ok(Transformed::yes(Arc::new(Column::new(c.name(), at)) as _))
                })
                .map(|t| t.data)
        };
        let l = side(&join.on.0, left, JoinSide::Left)?;
        let r = side(&join.on.1, right, JoinSide::Right)?;
        let expression = Arc::new(BinaryExpr::new(l, join.operator, r));
        let filter = JoinFilter::new(expression, column_indices, Arc::new(Schema::new(fields)));
        Ok(Self::new(Arc::clone(left), Arc::clone(right), vec![])
            .with_join_type(join.join_type())
            .with_filter(Some(filter))
            .with_replaced(Replaced::PiecewiseMergeJoin))
    }

    /// The join a `SortMergeJoinExec` describes (inputs, keys, join type, residual filter, null
    /// equality), with `build` the side built. The sort-merge join's order is not kept (its
    /// inputs need no sort): sorts a query needs above it are planned above the node.
    pub fn from_sort_merge_join(join: &SortMergeJoinExec, build: JoinSide) -> Self {
        let same = Self::new(
            Arc::clone(join.left()),
            Arc::clone(join.right()),
            join.on().to_vec(),
        )
        .with_join_type(join.join_type())
        .with_filter(join.filter().clone())
        .with_null_equality(join.null_equality())
        .with_replaced(Replaced::SortMergeJoin(join.sort_options().to_vec()));
        match build {
            JoinSide::Right => same.swapped(),
            JoinSide::Left | JoinSide::None => same,
        }
    }

    /// The residual filter, if any.
    pub fn filter(&self) -> Option<&JoinFilter> {
        self.filter.as_ref()
    }

    /// The left (build) input.
    pub fn left(&self) -> &Arc<dyn ExecutionPlan> {
        &self.left
    }

    /// The right (probe) input.
    pub fn right(&self) -> &Arc<dyn ExecutionPlan> {
        &self.right
    }

    /// The same join with `left` as its build input.
    pub(crate) fn with_left(mut self, left: Arc<dyn ExecutionPlan>) -> Self {
        self.left = left;
        self
    }

    /// Why these inputs cannot run on `GpuJoinExec`, or `None` if they can (as
    /// [`build`](Self::build) checks).
    pub fn unsupported(&self) -> Option<String> {
        match self.schemas() {
            Ok(_) => self.unsupported_for(),
            Err(e) => Some(e.to_string()),
        }
    }

    /// [`unsupported`] for this join.
    fn unsupported_for(&self) -> Option<String> {
        if self.null_aware && (self.join_type != JoinType::LeftAnti || self.on.len() != 1) {
            return Some("a null-aware join must be a left anti join on one key".into());
        }
        let (left, right) = (self.left.schema(), self.right.schema());
        unsupported(&left, &right, &self.on, self.filter.as_ref())
    }

    /// The join's full schema and where each of its columns comes from (`build_join_schema`
    /// for the join type), and the output schema after the projection.
    fn schemas(&self) -> Result<(SchemaRef, Vec<ColumnIndex>, SchemaRef)> {
        let (join_schema, column_indices) =
            build_join_schema(&self.left.schema(), &self.right.schema(), &self.join_type);
        let join_schema = Arc::new(join_schema);
        let schema = project_schema(&join_schema, self.projection.as_ref())?;
        Ok((join_schema, column_indices, schema))
    }

    /// Where each output column comes from, in the order of the output schema.
    pub(crate) fn output_columns(&self) -> Result<Vec<OutputColumn>> {
        let (join_schema, column_indices, _) = self.schemas()?;
        match &self.projection {
            Some(p) => p.clone(),
            None => (0..join_schema.fields().len()).collect(),
        }
        .into_iter()
        .map(|i| match column_indices.get(i) {
            Some(c) => Ok(match c.side {
                JoinSide::Left => OutputColumn::Build(c.index),
                JoinSide::Right => OutputColumn::Probe(c.index),
                JoinSide::None => OutputColumn::Mark,
            }),
            None => plan_err!("GpuJoinExec: projection index {i} out of range"),
        })
        .collect()
    }

    /// The join type; the left input is the build side, as in `HashJoinExec`.
    pub fn with_join_type(mut self, join_type: JoinType) -> Self {
        self.join_type = join_type;
        self
    }

    /// A residual filter over pairs of equal keys (`ON a.k = b.k AND <filter>`), evaluated on
    /// the host over the candidate pairs.
    pub fn with_filter(mut self, filter: Option<JoinFilter>) -> Self {
        self.filter = filter;
        self
    }

    /// Output only these columns of the join's schema (as `build_join_schema` makes it for the
    /// join type: left columns, then right columns, or one side and a mark).
    pub fn with_projection(mut self, projection: Option<Vec<usize>>) -> Self {
        self.projection = projection;
        self
    }

    /// How nulls compare: `NullEqualsNull` for `IS NOT DISTINCT FROM` keys.
    pub fn with_null_equality(mut self, null_equality: NullEquality) -> Self {
        self.null_equality = null_equality;
        self
    }

    /// The join node replaced (shown in EXPLAIN VERBOSE; a sort-merge join's also decides
    /// the node's properties and the join run where the memory pool refuses the build side).
    pub fn with_replaced(mut self, replaced: Replaced) -> Self {
        self.replaced = replaced;
        self
    }

    /// Where the join runs.
    pub fn with_backend(mut self, backend: JoinBackend) -> Self {
        self.backend = backend;
        self
    }

    /// Most probe rows in one chunk.
    pub fn with_probe_chunk_rows(mut self, rows: usize) -> Self {
        self.probe_chunk_rows = rows;
        self
    }

    /// Whether integer columns of a narrow range are packed for the copy to the device
    /// (`gpu_join.pack_uploads`).
    pub fn with_pack_uploads(mut self, pack: bool) -> Self {
        self.pack_uploads = pack;
        self
    }

    /// Whether the build side's view columns travel through the device as their views
    /// (`gpu_join.views_on_device`), or are gathered on the host.
    pub fn with_views_on_device(mut self, on_device: bool) -> Self {
        self.views_on_device = on_device;
        self
    }

    /// Whether the values of the build view columns the device carries are gathered on the
    /// device too (`gpu_join.view_bytes_on_device`), or on the host from their views.
    pub fn with_view_bytes_on_device(mut self, on_device: bool) -> Self {
        self.view_bytes_on_device = on_device;
        self
    }

    /// Where the join's probe columns travel (`gpu_join.probe_columns`).
    pub fn with_probe_columns(mut self, probe_columns: ProbeColumns) -> Self {
        self.probe_columns = probe_columns;
        self
    }

    /// The join algorithm (`gpu_join.algorithm`).
    pub fn with_algorithm(mut self, algorithm: Algorithm) -> Self {
        self.algorithm = algorithm;
        self
    }

    /// Bits kept of each key hash (`gpu_join.key_hash_bits`).
    pub fn with_key_hash_bits(mut self, bits: u32) -> Self {
        self.key_hash_bits = bits;
        self
    }

    /// The device memory GPU joins may hold at once.
    pub fn with_memory_limit(mut self, limit: MemoryLimit) -> Self {
        self.memory_limit = limit;
        self
    }

    /// Stop after this many output rows per partition.
    pub fn with_fetch(mut self, fetch: Option<usize>) -> Self {
        self.fetch = fetch;
        self
    }

    /// A null-aware anti join (`NOT IN`): a left anti join on one key where a null key on
    /// the probe (right) side keeps every build row out, and a build row with a null key is
    /// kept only if the probe side is empty.
    pub fn with_null_aware(mut self, null_aware: bool) -> Self {
        self.null_aware = null_aware;
        self
    }

    /// A node of a plan that a distributed engine splits into stages and tasks
    /// (`gpu_join.distributed`). The node reads every partition of its build input, which in
    /// a task of such a plan is only the task's share: so it asks for both inputs partitioned
    /// on their keys (the same partitions of both in a task; a join without keys asks for its
    /// build side in one partition), as `HashJoinExec` does in `Partitioned` mode.
    pub fn with_distributed(mut self, distributed: bool) -> Self {
        self.distributed = distributed;
        self
    }

    pub(crate) fn with_dynamic_filter(
        mut self,
        filter: Option<Arc<DynamicFilterPhysicalExpr>>,
    ) -> Self {
        self.dynamic_filter = filter;
        self
    }

    /// The node, or a planning error saying why these inputs cannot run on `GpuJoinExec`.
    pub fn build(self) -> Result<GpuJoinExec> {
        let (left_schema, right_schema) = (self.left.schema(), self.right.schema());
        let (join_schema, _, schema) = self.schemas()?;
        if let Some(reason) = self.unsupported_for() {
            return plan_err!("GpuJoinExec cannot run this join: {reason}");
        }
        let columns = self.output_columns()?;
        let twin = self.twin()?;
        let spilling = self.spilling_twin()?.map(Arc::new);
        let cache = Arc::new(compute_properties(
            &self.left,
            &self.right,
            &join_schema,
            self.join_type,
            &self.on,
            self.projection.as_deref(),
            self.replaced.keeps_probe_order(),
        )?);
        let metrics = ExecutionPlanMetricsSet::new();
        let run_metrics = RunMetrics::new(&metrics);
        let shared = SharedRun {
            twin,
            spilling,
            metrics: run_metrics,
            fallback_reason: Default::default(),
            switched_at_run: Default::default(),
            views_moved_at_run: Default::default(),
            values_at_run: Default::default(),
            probe_moved_at_run: Default::default(),
            grace_groups: Default::default(),
            algorithm_run: Default::default(),
            cache_at_run: Default::default(),
        };
        // Keys without an exact device encoding join on a hash, checked on the device (one
        // string or binary column) or verified on the host by the residual filter.
        let nulls_equal = self.null_equality == NullEquality::NullEqualsNull;
        let bits = self.key_hash_bits;
        let key_hash = KeyHash::plan(&self.on, &left_schema, &right_schema, nulls_equal)?
            .map(|h| h.with_bits(bits));
        // Each plan with build views carried by the device has a twin that gathers them on
        // the host, run where the build side fits the device only without them.
        let with_views_twin = |key_hash: &Option<KeyHash>, carriage: Carriage| {
            let spec_for = |carriage| {
                self.run_spec(
                    columns.clone(),
                    &schema,
                    key_hash.clone(),
                    &shared,
                    carriage,
                )
            };
            let mut spec = spec_for(carriage)?;
            if spec
                .gather
                .as_ref()
                .is_some_and(|g| !g.build_views.is_empty())
            {
                let views_on_host = Carriage {
                    views_on_device: false,
                    ..carriage
                };
                spec.views_on_host = Some(Arc::new(spec_for(views_on_host)?));
            }
            Ok::<_, DataFusionError>(spec)
        };
        // And each plan that stages probe columns the join outputs only where probe rows
        // match has a twin that takes them on the host, run where few probe rows will match.
        let planned = |key_hash: Option<KeyHash>| -> Result<RunSpec> {
            let mut spec = with_views_twin(&key_hash, Carriage::DEVICE)?;
            let probe_on_host = Carriage {
                probe_on_host: true,
                ..Carriage::DEVICE
            };
            if matches!(spec.emission().probe, ProbeEmit::Pairs | ProbeEmit::Matched) {
                let twin = with_views_twin(&key_hash, probe_on_host)?;
                if twin.probe_indices.len() < spec.probe_indices.len() {
                    spec.probe_on_host = Some(Arc::new(twin));
                }
            }
            Ok(spec)
        };
        let mut spec = planned(key_hash.clone())?;
        // The plan an execution switches to if its build side needs it.
        let switch = match &key_hash {
            // Exact keys whose value ranges may need more than 64 bits together: the same join
            // on a hash, for a build side whose ranges do.
            None => KeyHash::for_wide_keys(&self.on, &left_schema, nulls_equal)?
                .map(|hash| planned(Some(hash.with_bits(bits))))
                .transpose()?
                .map(|s| Switch::WideKeys(Arc::new(s))),
            // Checked keys: the same join with more words of check bytes, for a build side
            // with a key longer than the node's words, and verified on the host, for one with
            // a key longer than the most words.
            Some(hash) if hash.checked() => {
                let wider = (hash.check_words() + 1..=crate::backend::KEY_CHECK_WORDS)
                    .map(|words| planned(Some(hash.with_check_words(words))).map(Arc::new))
                    .collect::<Result<_>>()?;
                let verified = Arc::new(planned(Some(hash.verified_on_host()))?);
                Some(Switch::LongKeys { wider, verified })
            }
            Some(_) => None,
        };
        if let Some(switch) = &switch
            && (switch.specs().iter()).any(|twin| twin.output_schema() != spec.output_schema())
        {
            return internal_err!("GpuJoinExec: the switched plan changes the output schema");
        }
        spec.switch = switch;
        let spec = Arc::new(spec);
        Ok(GpuJoinExec {
            spec,
            cache,
            metrics,
            runs: Mutex::new(RunSlot::default()),
            builder: self,
        })
    }

    /// Why a build side larger than the memory limit may not be joined in groups, one after
    /// another with the probe rows of the same key hash (`exec::grace`), or `None` where it
    /// may. Each probe row must find all it needs in its group's build rows, and the groups'
    /// output follows one another in each partition.
    fn grace_refusal(&self) -> Option<&'static str> {
        let (left, right) = (self.left.schema(), self.right.schema());
        let same_types = self.on.iter().all(
            |(l, r)| matches!((l.data_type(&left), r.data_type(&right)), (Ok(a), Ok(b)) if a == b),
        );
        if self.on.is_empty() {
            Some("a join without keys cannot be split by key")
        } else if self.null_aware {
            Some("a null-aware anti join needs every build key at once")
        } else if Emission::of(self.join_type).build.is_some() {
            Some("the join outputs build rows after the probe side, from every partition's marks")
        } else if self.replaced.keeps_probe_order() && self.right.output_ordering().is_some() {
            Some("the probe side is ordered, and groups joined in turn would not keep its order")
        } else if !same_types {
            Some("the key types of the two sides differ, so their hashes would")
        } else {
            None
        }
    }

    /// What an execution needs of this join, with its keys hashed by `key_hash` or encoded
    /// exactly: the columns each side stages, what the lane outputs, the residual filter and
    /// the host-gathered columns (the build side's views among them unless `carriage` and the
    /// setting allow them on the device; its probe columns where `carriage` says).
    fn run_spec(
        &self,
        columns: Vec<OutputColumn>,
        schema: &SchemaRef,
        key_hash: Option<KeyHash>,
        shared: &SharedRun,
        carriage: Carriage,
    ) -> Result<RunSpec> {
        let (left_schema, right_schema) = (self.left.schema(), self.right.schema());
        let nulls_equal = self.null_equality == NullEquality::NullEqualsNull;
        let null_aware = match self.null_aware {
            true => Some(NullAware::plan(
                key_columns(&self.on)?[0],
                &columns,
                schema,
            )?),
            false => None,
        };
        // The filter runs in the device's probe where it compiles (and keys need no host
        // verification, which is a filter too); otherwise on the host, over candidate pairs.
        let (device_filter, host_filter_reason) = match (&self.filter, &key_hash) {
            (None, _) => (None, None),
            (Some(_), Some(h)) if !h.checked() => {
                (None, Some("keys verified on the host".to_string()))
            }
            (Some(_), _) if self.null_aware => (None, Some("a null-aware join".to_string())),
            (Some(f), _) => match crate::filter::compile(f) {
                Ok(compiled) => (Some(Arc::new(compiled)), None),
                Err(reason) => (None, Some(format!("not compiled: {reason}"))),
            },
        };
        let filter = match &key_hash {
            Some(h) if !h.checked() => {
                Some(h.verification(&self.on, self.filter.as_ref(), &left_schema, &right_schema)?)
            }
            _ if device_filter.is_some() => None,
            _ => self.filter.clone(),
        };
        // With a residual filter the lane outputs candidates, which the host filters.
        let (columns, candidate_schema, residual) = match &filter {
            Some(filter) => {
                let c = Residual::plan(
                    filter,
                    self.join_type,
                    &columns,
                    schema,
                    &left_schema,
                    &right_schema,
                )?;
                (c.columns, c.schema, Some(Arc::new(c.residual)))
            }
            None => (columns, Arc::clone(schema), None),
        };
        // Columns the device does not carry come back as positions, gathered on the host.
        let (left_width, right_width) = (left_schema.fields().len(), right_schema.fields().len());
        let build_row = SideColumns::row_index(left_width, key_hash.as_ref());
        let gathering = HostGather::plan(
            &columns,
            &candidate_schema,
            build_row,
            Carriage {
                views_on_device: carriage.views_on_device && self.views_on_device,
                ..carriage
            },
        );
        let keys = key_columns(&self.on)?;
        let (build_keys, probe_keys) = match &key_hash {
            Some(_) => (vec![left_width], vec![right_width]),
            None => keys.iter().copied().unzip(),
        };
        let layout = Arc::new(OutputLayout {
            schema: Arc::clone(&gathering.schema),
            columns: gathering.columns,
            build_keys,
            probe_keys,
            // The check bytes follow the hash.
            check: key_hash
                .as_ref()
                .filter(|h| h.checked())
                .map(|h| CheckedKeys {
                    build: left_width + 1,
                    probe: right_width + 1,
                    words: h.check_words(),
                    mask: h.mask(),
                }),
            filter: device_filter,
        });
        let lane_schema = Arc::clone(&layout.schema);
        let kind = |f: &arrow::datatypes::Field| {
            ColumnKind::of(f.data_type()).map(|k| (k, f.is_nullable()))
        };
        // A side is staged by its columns; one that the join reads none of (a cross join's
        // count) carries its first fixed-width column for its row count, or its row numbers.
        let side = |input: &SchemaRef, needed: Vec<usize>, row: usize, keys: Vec<usize>| {
            let hash = key_hash.clone().map(|h| (h, keys));
            match (needed.is_empty(), first_carried(input)) {
                (false, _) => (SideColumns::new(input, hash, needed.contains(&row)), needed),
                (true, Some(c)) => (SideColumns::new(input, hash, false), vec![c]),
                (true, None) => (SideColumns::new(input, hash, true), vec![row]),
            }
        };
        let (build_side, build_indices) = side(
            &left_schema,
            layout.build_needed(),
            build_row,
            keys.iter().map(|k| k.0).collect(),
        );
        let (probe_side, probe_indices) = side(
            &right_schema,
            layout.probe_needed(),
            SideColumns::row_index(right_width, key_hash.as_ref()),
            keys.iter().map(|k| k.1).collect(),
        );
        let kinds_of = |side: &SideColumns, indices: &[usize]| -> Result<Vec<(ColumnKind, bool)>> {
            indices
                .iter()
                .map(|&c| match side.staged_kind(c) {
                    Some(k) => Ok(k),
                    None => plan_err!(
                        "GpuJoinExec cannot carry column {} of type {}",
                        side.schema.field(c).name(),
                        side.schema.field(c).data_type()
                    ),
                })
                .collect()
        };
        let output_kinds = lane_schema
            .fields()
            .iter()
            .map(|f| kind(f))
            .collect::<Option<Vec<_>>>()
            .unwrap_or_default();
        let build_kinds = kinds_of(&build_side, &build_indices)?;
        // A checked key's hashes, derived on the device from its classes and check bytes.
        let derived = if layout.check.is_some() { 8 } else { 0 };
        let probe_kinds = kinds_of(&probe_side, &probe_indices)?;
        Ok(RunSpec {
            left: Arc::clone(&self.left),
            right_schema: Arc::clone(&right_schema),
            on: self.on.clone(),
            layout,
            join_type: self.join_type,
            nulls_equal,
            hashed_keys: key_hash.is_some(),
            residual,
            gather: gathering.gather.map(Arc::new),
            build_side,
            probe_side,
            probe_partitions: self.right.output_partitioning().partition_count(),
            backend: self.backend,
            max_chunk_rows: self.probe_chunk_rows,
            pack_uploads: self.pack_uploads,
            view_bytes_on_device: self.view_bytes_on_device,
            algorithm: self.algorithm,
            algorithm_run: Arc::clone(&shared.algorithm_run),
            memory_limit: self.memory_limit,
            build_kinds,
            build_indices,
            kinds: ColumnKinds {
                probe: probe_kinds,
                output: output_kinds,
                derived,
                packed: self.pack_uploads,
            },
            probe_indices,
            fallback: Arc::clone(&shared.twin),
            spilling: shared.spilling.clone(),
            dynamic_filter: self.dynamic_filter.clone(),
            filter_applied_on_host: self
                .dynamic_filter
                .as_ref()
                .is_some_and(|f| crate::runtime_filter::applies(&self.right, f)),
            metrics: shared.metrics.clone(),
            fallback_reason: Arc::clone(&shared.fallback_reason),
            switch: None,
            views_on_host: None,
            probe_on_host: None,
            probe_columns: self.probe_columns,
            probe_moved_at_run: Arc::clone(&shared.probe_moved_at_run),
            host_filter_reason,
            null_aware,
            switched_at_run: Arc::clone(&shared.switched_at_run),
            views_moved_at_run: Arc::clone(&shared.views_moved_at_run),
            values_at_run: Arc::clone(&shared.values_at_run),
            right: Arc::clone(&self.right),
            grace: self.grace_refusal(),
            grace_group: false,
            grace_groups: Arc::clone(&shared.grace_groups),
            cache_at_run: Arc::clone(&shared.cache_at_run),
        })
    }
}

/// The execution being started: shared by the partitions executed so far.
#[derive(Default)]
struct RunSlot {
    run: Option<Arc<JoinRun>>,
    /// Which partitions of `run` have been executed.
    started: Vec<bool>,
}

/// Runs an equi-join of any join type on a GPU (or on its host twin): the build side is bucketed
/// once on the device, and the probe side streams through it chunk by chunk.
pub struct GpuJoinExec {
    builder: GpuJoinExecBuilder,
    /// What every execution runs: derived once from the builder (layout, column kinds, the
    /// replaced join over the same inputs for statistics and fallbacks, shared metrics).
    spec: Arc<RunSpec>,
    cache: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
    runs: Mutex<RunSlot>,
}

impl fmt::Debug for GpuJoinExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuJoinExec")
            .field("on", &self.builder.on)
            .field("backend", &self.builder.backend)
            .finish()
    }
}

fn compute_properties(
    left: &Arc<dyn ExecutionPlan>,
    right: &Arc<dyn ExecutionPlan>,
    join_schema: &SchemaRef,
    join_type: JoinType,
    on: &JoinOn,
    projection: Option<&[usize]>,
    keeps_probe_order: bool,
) -> Result<PlanProperties> {
    // As HashJoinExec in CollectLeft mode: the probe side's order is kept where each probe row's
    // output comes with it; build rows output after the probe side land in one partition.
    // Where the node may run a sort-merge join instead (Replaced::keeps_probe_order), neither.
    let mut eq = join_equivalence_properties(
        left.equivalence_properties().clone(),
        right.equivalence_properties().clone(),
        &join_type,
        Arc::clone(join_schema),
        &maintains_input_order(join_type, keeps_probe_order),
        Some(JoinSide::Right),
        on,
    )?;
    let probe_partitioning = right.output_partitioning();
    let mut partitioning = match join_type {
        _ if !keeps_probe_order => {
            Partitioning::UnknownPartitioning(probe_partitioning.partition_count())
        }
        JoinType::Inner | JoinType::Right => {
            adjust_right_output_partitioning(probe_partitioning, left.schema().fields().len())?
        }
        JoinType::RightSemi | JoinType::RightAnti | JoinType::RightMark => {
            probe_partitioning.clone()
        }
        JoinType::Left
        | JoinType::Full
        | JoinType::LeftSemi
        | JoinType::LeftAnti
        | JoinType::LeftMark => {
            Partitioning::UnknownPartitioning(probe_partitioning.partition_count())
        }
    };
    if let Some(p) = projection {
        let mapping = ProjectionMapping::from_indices(p, join_schema)?;
        let out_schema = project_schema(join_schema, Some(&p.to_vec()))?;
        partitioning = partitioning.project(&mapping, &eq);
        eq = eq.project(&mapping, out_schema);
    }
    // Output streams as the probe side arrives; build rows come at the end.
    let emission = match (right.pipeline_behavior(), Emission::of(join_type).build) {
        (EmissionType::Incremental, Some(_)) => EmissionType::Both,
        (behaviour, _) => behaviour,
    };
    let unbounded = left.boundedness().is_unbounded() || right.boundedness().is_unbounded();
    let boundedness = if unbounded {
        Boundedness::Unbounded {
            requires_infinite_memory: false,
        }
    } else {
        Boundedness::Bounded
    };
    Ok(PlanProperties::new(eq, partitioning, emission, boundedness))
}

/// Whether the output keeps each input's order, as `HashJoinExec` declares it: the probe
/// side's where each probe row's output comes with it, in probe order (and the node keeps it).
fn maintains_input_order(join_type: JoinType, keeps_probe_order: bool) -> Vec<bool> {
    vec![
        false,
        keeps_probe_order
            && matches!(
                join_type,
                JoinType::Inner
                    | JoinType::Right
                    | JoinType::RightAnti
                    | JoinType::RightSemi
                    | JoinType::RightMark
            ),
    ]
}

impl GpuJoinExec {
    /// A builder for a join of `left` (build) and `right` (probe) on `on`.
    pub fn builder(
        left: Arc<dyn ExecutionPlan>,
        right: Arc<dyn ExecutionPlan>,
        on: JoinOn,
    ) -> GpuJoinExecBuilder {
        GpuJoinExecBuilder::new(left, right, on)
    }

    /// The build (left) input.
    pub fn left(&self) -> &Arc<dyn ExecutionPlan> {
        &self.builder.left
    }

    /// The probe (right) input.
    pub fn right(&self) -> &Arc<dyn ExecutionPlan> {
        &self.builder.right
    }

    /// The join key pairs.
    pub fn on(&self) -> &JoinOn {
        &self.builder.on
    }

    /// The join type.
    pub fn join_type(&self) -> JoinType {
        self.builder.join_type
    }

    /// The residual filter, if any.
    pub fn filter(&self) -> Option<&JoinFilter> {
        self.builder.filter.as_ref()
    }

    /// Where the join runs.
    pub fn backend(&self) -> JoinBackend {
        self.builder.backend
    }

    /// Whether the build side's keys may prune this join's probe rows, so that it pushes a
    /// dynamic filter into its probe input (where the session allows it): only where a probe
    /// row without a match adds nothing to the output (HashJoinExec's gate), a null key cannot
    /// match, and the join has keys. A null-aware anti join must see every probe row, nulls
    /// and all (its output depends on whether the probe side is empty or holds a null key).
    pub(crate) fn prunes_probe(&self) -> bool {
        let b = &self.builder;
        b.join_type.on_lr_is_preserved().1
            && b.null_equality == NullEquality::NullEqualsNothing
            && !b.null_aware
            && !b.on.is_empty()
    }

    /// Whether this join's dynamic filter can hold its build keys' values (bounds, a set):
    /// it prunes probe rows, and its keys are encoded exactly (keys joined on a hash publish
    /// nothing).
    pub(crate) fn publishes_key_values(&self) -> bool {
        self.prunes_probe() && !self.spec.hashed_keys
    }

    /// The dynamic filter this join pushes into its probe input, if one is wired.
    pub fn dynamic_filter(&self) -> Option<&Arc<DynamicFilterPhysicalExpr>> {
        self.builder.dynamic_filter.as_ref()
    }

    /// What the node was built from (its inputs, keys, join type and settings).
    pub(crate) fn parts(&self) -> &GpuJoinExecBuilder {
        &self.builder
    }

    /// The algorithm EXPLAIN shows: the last execution's, or before one the algorithm asked
    /// for (`auto` until a build side decides).
    fn algorithm(&self) -> String {
        let run = self.spec.algorithm_run.lock().ok().and_then(|r| r.clone());
        run.unwrap_or_else(|| self.builder.algorithm.planned_name())
    }

    /// The groups the last execution joined its build side in, where it did.
    fn grace_groups(&self) -> Option<usize> {
        let groups = self
            .spec
            .grace_groups
            .load(std::sync::atomic::Ordering::Relaxed);
        (groups > 0).then_some(groups)
    }

    /// The execution partition `partition` belongs to: the current one, or a new one where
    /// there is none, `partition` was executed in it already, or the current one lost a
    /// partition's stream before its end and `ctx` is not its task context (a plan executed
    /// again after a consumer that read only some partitions: DataFusion then executes the
    /// partitions from tasks in any order). The node lets go of an execution once all its
    /// partitions have been executed.
    fn run_for(&self, partition: usize, ctx: &Arc<TaskContext>) -> Result<Arc<JoinRun>> {
        let parts = self.cache.partitioning.partition_count();
        let mut slot = self
            .runs
            .lock()
            .map_err(|_| datafusion::common::exec_datafusion_err!("GpuJoinExec lock poisoned"))?;
        let executed = slot.started.get(partition).copied().unwrap_or(true);
        let run = match &slot.run {
            Some(run) if !executed && run.admits(ctx) => Arc::clone(run),
            _ => {
                let run = Arc::new(JoinRun::new(Arc::clone(&self.spec), Arc::clone(ctx)));
                *slot = RunSlot {
                    run: Some(Arc::clone(&run)),
                    started: vec![false; parts],
                };
                run
            }
        };
        slot.started[partition] = true;
        if slot.started.iter().all(|&s| s) {
            *slot = RunSlot::default();
        }
        Ok(run)
    }
}

/// Why the last execution ran a twin of its plan that carries some columns another way
/// (`RunSpec::views_moved_at_run`, `RunSpec::probe_moved_at_run`), where it did.
fn moved(why: &Mutex<Option<String>>) -> Option<String> {
    why.lock().ok().and_then(|m| m.clone())
}

/// Whether a join of this type keeps the rows of its (left, right) input unchanged or drops
/// them, so that a filter over one input's columns may run below the join (`HashJoinExec`'s
/// rule).
fn preserved(join_type: JoinType) -> (bool, bool) {
    match join_type {
        JoinType::Inner | JoinType::LeftSemi | JoinType::RightSemi => (true, true),
        JoinType::Left | JoinType::LeftAnti | JoinType::LeftMark => (true, false),
        JoinType::Right | JoinType::RightAnti | JoinType::RightMark => (false, true),
        JoinType::Full => (false, false),
    }
}

impl EmbeddedProjection for GpuJoinExec {
    /// The same join with `projection` (indices into this node's output) applied on top of its
    /// own; `None` outputs every column of the join.
    fn with_projection(&self, projection: Option<Vec<usize>>) -> Result<Self> {
        let projection = match (projection, &self.builder.projection) {
            (Some(new), Some(old)) => Some(
                new.iter()
                    .map(|&i| match old.get(i) {
                        Some(&j) => Ok(j),
                        None => internal_err!("GpuJoinExec: projection index {i} out of range"),
                    })
                    .collect::<Result<_>>()?,
            ),
            (new, _) => new,
        };
        self.builder.clone().with_projection(projection).build()
    }
}

impl GpuJoinExec {
    /// The plan of `spec.switch` the last execution switched to, if it did.
    fn switched(&self) -> Option<&Arc<RunSpec>> {
        let at = (self.spec.switched_at_run).load(std::sync::atomic::Ordering::Relaxed);
        let specs = self.spec.switch.as_ref()?.specs();
        at.checked_sub(1).and_then(|i| specs.get(i).copied())
    }

    /// The plan the last execution ran (the node's before any).
    fn last_run(&self) -> &RunSpec {
        let spec = self.switched().unwrap_or(&self.spec);
        let spec = match &spec.probe_on_host {
            Some(on_host) if moved(&self.spec.probe_moved_at_run).is_some() => on_host,
            _ => spec,
        };
        match &spec.views_on_host {
            Some(on_host) if moved(&self.spec.views_moved_at_run).is_some() => on_host,
            _ => spec,
        }
    }

    /// EXPLAIN's pieces on columns the device does not gather itself: those gathered on the
    /// host by row position (`gathered=host: ..`), the build view columns whose views the device
    /// carries (`views=device: ..`), where the last execution gathered their values
    /// (`view_values=[..]`), and why it gathered the views on the host instead
    /// (`views=host: ..`).
    fn gathered(&self) -> Vec<String> {
        let b = &self.builder;
        let mut pieces = vec![];
        if let Some(g) = &self.last_run().gather {
            let (l, r) = (b.left.schema(), b.right.schema());
            let host = g.describe(&l, &r);
            if !host.is_empty() {
                pieces.push(format!("gathered=host: {host}"));
            }
            let views = g.describe_views(&l);
            if !views.is_empty() {
                pieces.push(format!("views=device: {views}"));
            }
        }
        if let Some(values) = moved(&self.spec.values_at_run) {
            pieces.push(format!("view_values=[{values}]"));
        }
        if let Some(why) = moved(&self.spec.views_moved_at_run) {
            pieces.push(format!("views=host: {why}"));
        }
        if let Some(why) = moved(&self.spec.probe_moved_at_run) {
            pieces.push(format!("probe=host: {why}"));
        }
        pieces
    }

    /// Where the residual filter runs, for EXPLAIN: `device` (compiled into the probe) or
    /// `host`.
    fn filter_place(&self) -> &'static str {
        match self.last_run().layout.filter {
            Some(_) => "device",
            None => "host",
        }
    }

    /// How the keys are matched, for EXPLAIN: `None` for exact keys (as planned and as run).
    fn keys(&self) -> Option<String> {
        let run = self.switched();
        match (&self.spec.switch, run) {
            // The last execution's build keys needed more than 64 bits: it joined on a hash.
            (Some(Switch::WideKeys(_)), Some(_)) => {
                Some("hashed at run time (their value ranges need more than 64 bits)".into())
            }
            // A key of the last execution's build side was longer than the most check bytes.
            (Some(Switch::LongKeys { .. }), Some(run)) if !run.checked_keys() => Some(format!(
                "hashed, verified on the host (a build key is longer than the \
                 {} bytes checked on the device)",
                crate::backend::KEY_CHECK_MAX_BYTES
            )),
            // Each hash match is checked on the device against the keys' bytes: in the words
            // planned, or in more where the last execution's build keys were longer.
            (Some(Switch::LongKeys { .. }), run) => {
                let bytes =
                    run.unwrap_or(&self.spec).check_words() * crate::backend::KEY_CHECK_BYTES;
                Some(match bytes {
                    16 => "hashed, checked on the device".into(),
                    bytes => format!("hashed, checked on the device (keys of up to {bytes} bytes)"),
                })
            }
            // Joined on a hash of the keys; the host verifies each pair's keys.
            _ if self.spec.hashed_keys => Some("hashed".into()),
            _ => None,
        }
    }
}

impl DisplayAs for GpuJoinExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let b = &self.builder;
        let on =
            b.on.iter()
                .map(|(l, r)| format!("({l}, {r})"))
                .collect::<Vec<_>>()
                .join(", ");
        let fallback = self
            .spec
            .fallback_reason
            .lock()
            .ok()
            .and_then(|r| r.clone());
        if matches!(t, DisplayFormatType::TreeRender) {
            write!(
                f,
                "join_type={}\non={on}\nbackend={}\nalgorithm={}",
                b.join_type,
                b.backend,
                self.algorithm()
            )?;
            if let Some(keys) = self.keys() {
                write!(f, "\nkeys={keys}")?;
            }
            if let Some(filter) = &b.filter {
                write!(
                    f,
                    "\nfilter={}: {}",
                    self.filter_place(),
                    filter.expression()
                )?;
            }
            for piece in self.gathered() {
                write!(f, "\n{piece}")?;
            }
            if b.null_equality == NullEquality::NullEqualsNull {
                write!(f, "\nNullsEqual: true")?;
            }
            if b.null_aware {
                write!(f, "\nnull_aware")?;
            }
            if b.distributed {
                write!(f, "\ndistributed")?;
            }
            if let Some(reason) = fallback {
                write!(f, "\nfallback={reason}")?;
            }
            if let Some(groups) = self.grace_groups() {
                write!(f, "\ngrace={groups} build groups")?;
            }
            if let Some(cache) = moved(&self.spec.cache_at_run) {
                write!(f, "\ncache={cache}")?;
            }
            return Ok(());
        }
        write!(
            f,
            "GpuJoinExec: join_type={}, on=[{on}], backend={}, algorithm={}",
            b.join_type,
            b.backend,
            self.algorithm()
        )?;
        if let Some(p) = &b.projection {
            // As HashJoinExec shows it: name@index in the join's full output.
            let (join_schema, _) =
                build_join_schema(&b.left.schema(), &b.right.schema(), &b.join_type);
            let columns = p
                .iter()
                .map(|&i| match join_schema.fields().get(i) {
                    Some(field) => format!("{}@{i}", field.name()),
                    None => format!("?@{i}"),
                })
                .collect::<Vec<_>>()
                .join(", ");
            write!(f, ", projection=[{columns}]")?;
        }
        if let Some(keys) = self.keys() {
            write!(f, ", keys={keys}")?;
        }
        if let Some(filter) = &b.filter {
            // Compiled into the device's probe, or evaluated by DataFusion on the host over the
            // candidate pairs the device found.
            write!(
                f,
                ", filter={}: {}",
                self.filter_place(),
                filter.expression()
            )?;
        }
        for piece in self.gathered() {
            write!(f, ", {piece}")?;
        }
        if b.null_equality == NullEquality::NullEqualsNull {
            write!(f, ", NullsEqual: true")?;
        }
        if b.null_aware {
            write!(f, ", null_aware")?;
        }
        if b.distributed {
            // Planned for a distributed engine's executors: the backend shown is where it would
            // run here; each executor chooses again as it decodes it.
            write!(f, ", distributed")?;
        }
        if let Some(fetch) = b.fetch {
            write!(f, ", fetch={fetch}")?;
        }
        if matches!(t, DisplayFormatType::Verbose) {
            write!(
                f,
                ", replaced={}, probe_chunk_rows={}, pack_uploads={}, views_on_device={}, \
                 view_bytes_on_device={}, probe_columns={}, memory_limit={}",
                b.replaced,
                b.probe_chunk_rows,
                b.pack_uploads,
                b.views_on_device,
                b.view_bytes_on_device,
                b.probe_columns,
                b.memory_limit
            )?;
            if let Some(reason) = &self.last_run().host_filter_reason {
                write!(f, ", filter_on_host=[{reason}]")?;
            }
        }
        if let Some(reason) = fallback {
            // The join that ran instead, and why.
            write!(f, ", fallback=[{reason}]")?;
        }
        if let Some(groups) = self.grace_groups() {
            // The build side was larger than the memory limit: joined in groups, in turn.
            write!(f, ", grace=[{groups} build groups]")?;
        }
        if let Some(cache) = moved(&self.spec.cache_at_run) {
            // The build cache (`gpu_join.cache_bytes`): hit, stored, or why not.
            write!(f, ", cache=[{cache}]")?;
        }
        Ok(())
    }
}

impl ExecutionPlan for GpuJoinExec {
    fn name(&self) -> &str {
        "GpuJoinExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        &self.cache
    }

    fn input_distribution_requirements(&self) -> InputDistributionRequirements {
        let b = &self.builder;
        match (b.distributed, b.on.is_empty()) {
            (false, _) => InputDistributionRequirements::new(vec![
                Distribution::UnspecifiedDistribution,
                Distribution::UnspecifiedDistribution,
            ]),
            // As HashJoinExec in Partitioned mode: a task that holds some of the key
            // partitions of both inputs joins them, whatever else it reads.
            (true, false) => {
                let (left, right) =
                    b.on.iter()
                        .map(|(l, r)| (Arc::clone(l), Arc::clone(r)))
                        .unzip();
                InputDistributionRequirements::co_partitioned(vec![
                    Distribution::KeyPartitioned(left),
                    Distribution::KeyPartitioned(right),
                ])
            }
            (true, true) => InputDistributionRequirements::new(vec![
                Distribution::SinglePartition,
                Distribution::UnspecifiedDistribution,
            ]),
        }
    }

    fn benefits_from_input_partitioning(&self) -> Vec<bool> {
        // The build side is read whole, so splitting it gains nothing; more probe partitions
        // stage in parallel.
        vec![false, true]
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        // The output keeps the probe order as HashJoinExec's does (and the equivalence
        // properties say so), but DataFusion pushes a sort requirement through a node it does
        // not know by assuming its output is its children's columns side by side: true only
        // without a projection, for inner and right joins. Elsewhere the sort stays above.
        let b = &self.builder;
        let concatenated =
            b.projection.is_none() && matches!(b.join_type, JoinType::Inner | JoinType::Right);
        let keeps = maintains_input_order(b.join_type, b.replaced.keeps_probe_order());
        vec![false, concatenated && keeps[1]]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.builder.left, &self.builder.right]
    }

    /// The dynamic filter the join fills after its build side, as `HashJoinExec` does.
    fn dynamic_expressions_produced(&self) -> Vec<Arc<dyn PhysicalExpr>> {
        (self.builder.dynamic_filter.iter())
            .map(|f| Arc::clone(f) as Arc<dyn PhysicalExpr>)
            .collect()
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        let mut recursion = TreeNodeRecursion::Continue;
        let filter = self.builder.filter.as_ref().map(|f| f.expression());
        for e in self
            .builder
            .on
            .iter()
            .flat_map(|(l, r)| [l, r])
            .chain(filter)
        {
            recursion = f(e)?;
            if matches!(recursion, TreeNodeRecursion::Stop) {
                return Ok(recursion);
            }
        }
        Ok(recursion)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let [left, right]: [Arc<dyn ExecutionPlan>; 2] = match children.try_into() {
            Ok(c) => c,
            Err(_) => return internal_err!("GpuJoinExec has two children"),
        };
        let mut builder = self.builder.clone();
        builder.left = left;
        builder.right = right;
        Ok(Arc::new(builder.build()?))
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
        let parts = self.cache.partitioning.partition_count();
        if partition >= parts {
            return internal_err!("GpuJoinExec has {parts} partitions, asked for {partition}");
        }
        let run = self.run_for(partition, &context)?;
        Ok(Box::pin(GpuJoinStream::new(
            partition,
            run,
            Arc::clone(&self.builder.right),
            context,
            GpuJoinMetrics::new(partition, &self.metrics),
            self.builder.fetch,
        )))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        self.spec.fallback.statistics_from_inputs(input_stats, args)
    }

    fn child_stats_requests(&self, partition: Option<usize>) -> Vec<ChildStats> {
        self.spec.fallback.child_stats_requests(partition)
    }

    fn fetch(&self) -> Option<usize> {
        self.builder.fetch
    }

    fn with_fetch(&self, limit: Option<usize>) -> Option<Arc<dyn ExecutionPlan>> {
        // A join without keys keeps DataFusion's limit above it: its twin (a nested loop join,
        // which decoded plans and statistics use) cannot hold one.
        if self.builder.on.is_empty() {
            return None;
        }
        self.builder
            .clone()
            .with_fetch(limit)
            .build()
            .ok()
            .map(|e| Arc::new(e) as _)
    }

    fn try_swapping_with_projection(
        &self,
        projection: &ProjectionExec,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        try_embed_projection(projection, self)
    }

    fn gather_filters_for_pushdown(
        &self,
        phase: FilterPushdownPhase,
        parent_filters: Vec<Arc<dyn PhysicalExpr>>,
        config: &ConfigOptions,
    ) -> Result<FilterDescription> {
        // As HashJoinExec: a parent filter goes to a side the join preserves (whose rows reach
        // the output unchanged or not at all) and all its columns come from; never on a mark.
        let (left_preserved, right_preserved) = preserved(self.builder.join_type);
        let (mut left_allowed, mut right_allowed) = (HashSet::new(), HashSet::new());
        for (i, c) in self.builder.output_columns()?.iter().enumerate() {
            match c {
                OutputColumn::Build(_) if left_preserved => left_allowed.insert(i),
                OutputColumn::Probe(_) if right_preserved => right_allowed.insert(i),
                _ => false,
            };
        }
        let left = ChildFilterDescription::from_child_with_allowed_indices(
            &parent_filters,
            left_allowed,
            &self.builder.left,
        )?;
        let mut right = ChildFilterDescription::from_child_with_allowed_indices(
            &parent_filters,
            right_allowed,
            &self.builder.right,
        )?;
        if phase == FilterPushdownPhase::Post
            && self.prunes_probe()
            && self.builder.dynamic_filter.is_none()
            && filter::enabled(config)
            && filter::keys_named_once_below(&self.builder.right, &self.builder.on)
        {
            let staged = crate::runtime_filter::reads_scans_directly(&self.builder.right);
            right = right.with_self_filter(filter::placeholder(&self.builder.on, staged));
        }
        Ok(FilterDescription::new().with_child(left).with_child(right))
    }

    fn handle_child_pushdown_result(
        &self,
        _phase: FilterPushdownPhase,
        child_pushdown_result: ChildPushdownResult,
        _config: &ConfigOptions,
    ) -> Result<FilterPushdownPropagation<Arc<dyn ExecutionPlan>>> {
        let mut result = FilterPushdownPropagation::if_any(child_pushdown_result.clone());
        let wired = child_pushdown_result
            .self_filters
            .get(1)
            .and_then(|f| f.first())
            .and_then(|f| {
                let predicate: Arc<dyn PhysicalExpr> = Arc::clone(&f.predicate);
                Arc::downcast::<DynamicFilterPhysicalExpr>(predicate).ok()
            });
        if let Some(filter) = wired {
            let node = self
                .builder
                .clone()
                .with_dynamic_filter(Some(filter))
                .build()?;
            result = result.with_updated_node(Arc::new(node) as _);
        }
        Ok(result)
    }
}
