//! [`GpuJoinRule`]: the physical optimizer rule that swaps eligible join nodes for
//! [`GpuJoinExec`].
//!
//! ```text
//!   HashJoinExec (any join type, keys of the same    GpuJoinExec
//!   type on both sides, any filter)                ─►   ├── left  (build)
//!   CrossJoinExec                                       └── right (probe)
//!   NestedLoopJoinExec, PiecewiseMergeJoinExec
//!     (whose predicate compiles for the device)
//!   SortMergeJoinExec (its smaller input built)
//!
//! The new node keeps the replaced join's join type, filter, projection and `fetch`.
//! ```
//! It runs after `JoinSelection` (which picks the build side) and before `EnsureRequirements`,
//! which then adapts the plan to `GpuJoinExec`'s input requirements instead of adding the
//! hash repartitioning a CPU partitioned join would need (or the sorts a sort-merge join
//! would). A second pass ([`GpuJoinRule::late`]) after the last `ProjectionPushdown` takes the
//! nested loop joins whose filter that rule made compilable, and places a
//! [`crate::RuntimeFilterExec`] above the scans under a join's probe side whose rows its dynamic
//! filter should prune before other work does (`gpu_join.runtime_filters`). Anything else stays
//! DataFusion's; the reason is logged at debug level.
//!
//! Joins whose inputs DataFusion's statistics estimate small stay DataFusion's
//! (`gpu_join.min_input_rows`, `gpu_join.min_build_rows`): the GPU path's fixed costs would
//! outweigh what it saves. An input that holds a join counts as large: DataFusion's estimate
//! of a join's output is no guide ([`holds_join`]).
//!
//! With `gpu_join.backend = auto` on a machine without a usable GPU, joins stay DataFusion's:
//! the host backend (the GPU algorithm's CPU twin) is slower than `HashJoinExec`. Only
//! `gpu_join.min_build_rows = 0` (tests and benchmarks) or `backend = host` put them on it.
//!
//! A plan that a distributed engine's executors run (`gpu_join.distributed`) is planned where
//! there may be no GPU: the rule places joins by its gates alone, each executor chooses where
//! they run as it decodes them ([`crate::GpuJoinCodec`]), each join asks for its inputs
//! partitioned on their keys, and joins that output build rows after the probe stay
//! DataFusion's.

use std::sync::Arc;

use datafusion::common::JoinSide;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::common::{DataFusionError, Result, plan_err};
use datafusion::logical_expr::JoinType;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::execution_plan::ExecutionPlanProperties;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::utils::JoinFilter;
use datafusion::physical_plan::joins::{
    CrossJoinExec, HashJoinExec, NestedLoopJoinExec, PiecewiseMergeJoinExec, SortMergeJoinExec,
};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};

use crate::config::{BackendChoice, DeviceList, GpuJoinConfig};
use crate::device::Devices;
use crate::exec::{GpuJoinExec, GpuJoinExecBuilder, JoinBackend, carried_as_views};
use crate::join::Emission;

/// Replaces eligible join nodes with [`GpuJoinExec`].
#[derive(Debug, Default)]
pub struct GpuJoinRule {
    late: bool,
}

impl GpuJoinRule {
    /// The rule, to run before `EnsureRequirements`.
    pub fn new() -> Self {
        Self { late: false }
    }

    /// Its second pass, to run after DataFusion's last `ProjectionPushdown`: it replaces only
    /// nested loop joins, whose filter that rule may have rewritten into one that compiles
    /// for the device (a string comparison becomes a boolean column computed below the join).
    /// Their replacement keeps their partitioning and order, so the plan above stays valid.
    pub fn late() -> Self {
        Self { late: true }
    }

    /// Why this rule, under the `gpu_join` settings in `options`, keeps the join node `plan`
    /// (a hash, cross or nested loop join) on the CPU; `None` when it would replace it, or
    /// `plan` is no join it knows.
    pub fn fallback_reason(plan: &dyn ExecutionPlan, options: &ConfigOptions) -> Option<String> {
        let config = settings(options);
        if !config.enabled {
            return Some("gpu_join.enabled = false".into());
        }
        if let Err(reason) = eligible(plan, &config)? {
            return Some(reason);
        }
        match resolve_backend(&config) {
            Ok(Some(_)) => None,
            Ok(None) => Some("gpu_join.backend = auto, and there is no usable GPU".into()),
            Err(e) => Some(e.to_string()),
        }
    }
}

/// The `gpu_join` settings registered in `options`, or the defaults.
pub(crate) fn settings(options: &ConfigOptions) -> GpuJoinConfig {
    options
        .extensions
        .get::<GpuJoinConfig>()
        .cloned()
        .unwrap_or_default()
}

/// The `GpuJoinExec` a join node describes: a `HashJoinExec`, a `CrossJoinExec` (an inner join
/// without keys), or a `NestedLoopJoinExec` or `PiecewiseMergeJoinExec` whose predicate
/// compiles for the device (a join without keys, every pair decided in the device's probe);
/// `None` for other nodes, an error for joins it cannot replace.
fn describe(plan: &dyn ExecutionPlan) -> Option<Result<GpuJoinExecBuilder, String>> {
    if let Some(join) = plan.downcast_ref::<HashJoinExec>() {
        return Some(Ok(GpuJoinExecBuilder::from_hash_join(join)));
    }
    if let Some(join) = plan.downcast_ref::<CrossJoinExec>() {
        return Some(Ok(GpuJoinExecBuilder::from_cross_join(join)));
    }
    if let Some(join) = plan.downcast_ref::<NestedLoopJoinExec>() {
        // A filter left to the host would be evaluated over every pair, more slowly than
        // DataFusion's own nested loop join does it.
        if let Some(Err(reason)) = join.filter().map(crate::filter::compile) {
            return Some(Err(format!(
                "a nested loop join whose filter stays on the host ({reason})"
            )));
        }
        return Some(Ok(GpuJoinExecBuilder::from_nested_loop_join(join)));
    }
    if let Some(join) = plan.downcast_ref::<PiecewiseMergeJoinExec>() {
        let join = GpuJoinExecBuilder::from_piecewise_merge_join(join).map_err(|e| e.to_string());
        // Its one comparison compiles unless its expressions do not.
        if let Ok(Some(Err(reason))) = join
            .as_ref()
            .map(|j| j.filter().map(crate::filter::compile))
        {
            return Some(Err(format!(
                "a piecewise merge join whose predicate stays on the host ({reason})"
            )));
        }
        return Some(join);
    }
    if let Some(join) = plan.downcast_ref::<SortMergeJoinExec>() {
        let build =
            smaller_side(join).unwrap_or(match SortMergeJoinExec::probe_side(&join.join_type()) {
                // The buffered side, as DataFusion's sort-merge join has it.
                JoinSide::Left => JoinSide::Right,
                _ => JoinSide::Left,
            });
        return Some(Ok(GpuJoinExecBuilder::from_sort_merge_join(join, build)));
    }
    None
}

/// The input of a sort-merge join that its statistics say is smaller (in bytes, else in rows),
/// as `JoinSelection` picks a hash join's build side; `None` where they do not say.
fn smaller_side(join: &SortMergeJoinExec) -> Option<JoinSide> {
    let stats = StatisticsContext::new();
    let of =
        |input: &Arc<dyn ExecutionPlan>| stats.compute(input.as_ref(), &StatisticsArgs::new()).ok();
    let (left, right) = (of(join.left())?, of(join.right())?);
    let (l, r) = match (
        left.total_byte_size.get_value(),
        right.total_byte_size.get_value(),
    ) {
        (Some(l), Some(r)) => (*l, *r),
        _ => (*left.num_rows.get_value()?, *right.num_rows.get_value()?),
    };
    match l.cmp(&r) {
        std::cmp::Ordering::Less => Some(JoinSide::Left),
        std::cmp::Ordering::Greater => Some(JoinSide::Right),
        std::cmp::Ordering::Equal => None,
    }
}

/// How many times smaller than a join's build side its probe side must be estimated for
/// [`built_on_smaller_side`] to swap them. Estimates of filtered inputs are rough: DataFusion
/// keeps all the rows for a comparison with a column whose range it does not know and a fifth
/// of them for a predicate it cannot analyse, so TPC-H Q10's `customer ⋈ orders` (orders of
/// one quarter: 57 thousand rows at SF 1) is estimated at all of `orders` (1.5 million), and
/// `lineitem`'s returned items (1.5 million) at 1.2 million; a margin of 2 leaves that join as
/// DataFusion built it.
const SWAP_MARGIN: usize = 2;

/// [`SWAP_MARGIN`] where the build side's estimate rests on a filtered input's, which may keep
/// a few rows of millions (`l_shipdate = DATE '1995-03-15'` is estimated at all of
/// `lineitem`).
const SWAP_MARGIN_FILTERED: usize = 8;

/// The inner or left semi join `join` built on its right input instead (the same output), where
/// DataFusion built it on its left input although that side holds a join and the right side is
/// estimated at most half as large, an eighth where the left side's estimate rests on a
/// filtered input ([`rows_about`], [`SWAP_MARGIN`]), and declares no order; `None` where it
/// stays as it is (`gpu_join.orient_joins`). Without distinct counts, DataFusion's statistics
/// put an equi-join's output at about its smaller input's size, and `JoinSelection` then keeps
/// the order the query wrote:
/// - TPC-H Q18's semi join (`o_orderkey IN (SELECT l_orderkey ... GROUP BY l_orderkey HAVING
///   ...)`) built on `customer ⋈ orders ⋈ lineitem`, estimated at `customer`'s rows (it holds
///   60 million at SF 10), and probed with the subquery's 624 rows. Built on the subquery, as
///   a right semi join, its dynamic filter prunes `orders` before the joins under it read
///   `lineitem`.
/// - TPC-H Q7 builds an inner join on `supplier ⋈ lineitem ⋈ orders` (55 million rows at SF
///   30), probed with `customer` (4.5 million). Built on `customer` instead, the join's large
///   input streams through the device in chunks instead of being collected first. An inner
///   join whose left input carries view columns to its output stays as it is
///   ([`outputs_left_views`]).
fn built_on_smaller_side(join: &HashJoinExec) -> Option<GpuJoinExecBuilder> {
    let inner = match join.join_type() {
        JoinType::Inner => true,
        JoinType::LeftSemi => false,
        _ => return None,
    };
    // Built on its left input, the join keeps its right input's order; swapped, it would not.
    if !holds_join(join.left())
        || join.right().output_ordering().is_some()
        || (inner && outputs_left_views(join))
    {
        return None;
    }
    let stats = StatisticsContext::new();
    let left = rows_about(join.left(), &stats)?;
    let right = rows_about(join.right(), &stats)?.rows;
    let margin = match left.whole {
        true => SWAP_MARGIN,
        false => SWAP_MARGIN_FILTERED,
    };
    if right.saturating_mul(margin) > left.rows {
        return None;
    }
    // An inner join without a projection of its own would swap into a projection (restoring
    // its columns' order) over the swapped join; given the identity, the swapped join's own
    // projection does that.
    let swapped = match join.projection {
        None if inner => {
            let columns = (0..join.schema().fields().len()).collect();
            join.with_projection(Some(columns))
                .and_then(|j| j.swap_inputs(*join.partition_mode()))
        }
        _ => join.swap_inputs(*join.partition_mode()),
    };
    let swapped = match swapped {
        Ok(swapped) => swapped,
        Err(e) => {
            log::debug!("GpuJoinRule: a join stays as DataFusion built it: {e}");
            return None;
        }
    };
    log::debug!(
        "GpuJoinRule: a {} join built on about {} rows holding a join, probed with about \
         {right}: built on the right input instead",
        join.join_type(),
        left.rows
    );
    swapped
        .downcast_ref::<HashJoinExec>()
        .map(GpuJoinExecBuilder::from_hash_join)
}

/// Whether the inner join `join` outputs string or binary columns (`Utf8View`, `BinaryView`,
/// `Utf8`, ..., and dictionaries of those with 32- or 64-bit keys) of its left input. Built,
/// they travel through the device as views (`gpu_join.views_on_device`); probed, they are
/// gathered on the host row by row: TPC-H Q21's `supplier ⋈ lineitem` (114 million rows at SF
/// 30, carrying `s_name`) took 3.97 s of CPU summed as the probe side of the join with `orders`
/// against 0.97 s as its build side, and the query ran no faster, so [`built_on_smaller_side`]
/// leaves such a join as DataFusion built it.
fn outputs_left_views(join: &HashJoinExec) -> bool {
    let left = join.left().schema();
    let width = left.fields().len();
    let left_view = |i: usize| i < width && carried_as_views(left.field(i).data_type());
    match join.projection.as_deref() {
        Some(columns) => columns.iter().any(|&i| left_view(i)),
        None => (0..width).any(left_view),
    }
}

/// [`rows_about`]'s estimate of an input.
#[derive(Debug, Clone, Copy)]
struct Rows {
    rows: usize,
    /// Whether no filter may have dropped rows from it (DataFusion's estimate is exact, or it
    /// is a join of such inputs).
    whole: bool,
}

/// About how many rows `plan` outputs, as [`built_on_smaller_side`] compares a join's
/// inputs: DataFusion's estimate for a plan without joins; for an inner or outer join with
/// keys ([`keeps_larger_input`]), the most of its inputs' (a key joined to a foreign key
/// outputs about as many rows as the foreign side),
/// where each other input is whole (a filtered dimension would shrink the output, by how much
/// only distinct counts would tell); through a node that only moves or reorders rows, its
/// input's, and through a filter, its input's, no longer whole; `None` otherwise (an
/// aggregate, a semi or anti join, a cross join or a join with a residual filter over a join,
/// a join with a filtered smaller input).
fn rows_about(plan: &Arc<dyn ExecutionPlan>, stats: &StatisticsContext) -> Option<Rows> {
    if !holds_join(plan) {
        let estimate = stats.compute(plan.as_ref(), &StatisticsArgs::new()).ok()?;
        return Some(Rows {
            rows: *estimate.num_rows.get_value()?,
            whole: estimate.num_rows.is_exact().unwrap_or(false),
        });
    }
    let equi_join = keeps_larger_input(plan.as_ref());
    let moves_rows = plan.is::<ProjectionExec>()
        || plan.is::<RepartitionExec>()
        || plan.is::<CoalescePartitionsExec>()
        || plan.is::<SortExec>()
        || plan.is::<CooperativeExec>();
    let inputs = plan.children();
    match inputs.as_slice() {
        _ if equi_join => {
            let inputs = inputs
                .into_iter()
                .map(|input| rows_about(input, stats))
                .collect::<Option<Vec<_>>>()?;
            let most = inputs.iter().map(|i| i.rows).max()?;
            let others_whole = inputs.iter().filter(|i| i.rows < most).all(|i| i.whole);
            others_whole.then(|| Rows {
                rows: most,
                whole: inputs.iter().all(|i| i.whole),
            })
        }
        [input] if moves_rows && plan.fetch().is_none() => rows_about(input, stats),
        [input] if plan.is::<FilterExec>() => {
            rows_about(input, stats).map(|r| Rows { whole: false, ..r })
        }
        _ => None,
    }
}

/// Whether `plan` is a join that outputs about every row of its larger input where its keys
/// are a foreign key into its other inputs: an inner or outer join with keys, without a
/// residual filter (which may drop rows) or a `fetch`. Semi and anti joins output at most one
/// side's rows, and may output none.
fn keeps_larger_input(plan: &dyn ExecutionPlan) -> bool {
    let Some(join) = join_parts(plan) else {
        return false;
    };
    let outer_or_inner = matches!(
        join.join_type,
        JoinType::Inner | JoinType::Left | JoinType::Right | JoinType::Full
    );
    join.keyed && join.filter.is_none() && plan.fetch().is_none() && outer_or_inner
}

/// What a join node outputs from its inputs, as far as its rows go.
pub(crate) struct JoinParts<'a> {
    pub join_type: JoinType,
    /// Whether it joins on equal keys.
    pub keyed: bool,
    /// The residual filter (its columns by side).
    pub filter: Option<&'a JoinFilter>,
}

/// The parts of a hash, sort-merge or nested loop join, or of a `GpuJoinExec`; `None` for
/// other nodes.
pub(crate) fn join_parts(plan: &dyn ExecutionPlan) -> Option<JoinParts<'_>> {
    let parts = |join_type, keyed, filter| JoinParts {
        join_type,
        keyed,
        filter,
    };
    if let Some(j) = plan.downcast_ref::<HashJoinExec>() {
        return Some(parts(*j.join_type(), true, j.filter()));
    }
    if let Some(j) = plan.downcast_ref::<SortMergeJoinExec>() {
        return Some(parts(j.join_type(), true, j.filter().as_ref()));
    }
    if let Some(j) = plan.downcast_ref::<NestedLoopJoinExec>() {
        return Some(parts(*j.join_type(), false, j.filter()));
    }
    let j = plan.downcast_ref::<GpuJoinExec>()?;
    Some(parts(j.join_type(), !j.on().is_empty(), j.filter()))
}

/// The `GpuJoinExec` that can replace the join node `plan`, or why it stays on the CPU;
/// `None` for nodes that are no join the rule knows.
fn eligible(
    plan: &dyn ExecutionPlan,
    config: &GpuJoinConfig,
) -> Option<Result<GpuJoinExecBuilder, String>> {
    let join = describe(plan)?;
    // A join built on its smaller side, where that side passes the gates; else as DataFusion
    // built it.
    let swapped = plan
        .downcast_ref::<HashJoinExec>()
        .filter(|_| config.orient_joins)
        .and_then(built_on_smaller_side)
        .filter(|swapped| unsupported(swapped, config).is_none());
    if let Some(swapped) = swapped {
        return Some(Ok(swapped));
    }
    Some(join.and_then(|join| match unsupported(&join, config) {
        Some(reason) => Err(reason),
        None => Ok(join),
    }))
}

/// Why a join stays on the CPU, or `None` if the GPU path can run it.
fn unsupported(join: &GpuJoinExecBuilder, config: &GpuJoinConfig) -> Option<String> {
    let left = join.left();
    if left.boundedness().is_unbounded() || join.right().boundedness().is_unbounded() {
        return Some("unbounded inputs".into());
    }
    if let Some(reason) = join.unsupported() {
        return Some(reason);
    }
    if config.distributed && Emission::of(join.join_type).build.is_some() {
        // Distributed engines run each probe partition in a task of its own; the build rows
        // such a join outputs after the probe need every probe partition's marks.
        return Some(format!(
            "a {} join outputs build rows after the probe, which a distributed plan \
             (gpu_join.distributed) cannot split across tasks",
            join.join_type
        ));
    }
    if config.min_build_rows == 0 {
        return None;
    }
    let stats = StatisticsContext::new();
    let rows = |input: &Arc<dyn ExecutionPlan>| {
        if holds_join(input) {
            return None;
        }
        stats
            .compute(input.as_ref(), &StatisticsArgs::new())
            .ok()
            .and_then(|s| s.num_rows.get_value().copied())
    };
    let (build, probe) = (rows(left), rows(join.right()));
    if let Some(build) = build
        && build < config.min_build_rows
    {
        return Some(format!(
            "a build side of about {build} rows is below gpu_join.min_build_rows = {}",
            config.min_build_rows
        ));
    }
    if let (Some(build), Some(probe)) = (build, probe)
        && build.saturating_add(probe) < config.min_input_rows
    {
        return Some(format!(
            "inputs of about {build} (build) and {probe} (probe) rows are below \
             gpu_join.min_input_rows = {}",
            config.min_input_rows
        ));
    }
    None
}

/// Whether `plan` holds a join. The gate counts the size of such an input as unknown: without
/// distinct counts, which its sources rarely have, DataFusion estimates a join's output from
/// its inputs' sizes alone. In TPC-H at SF 1 it put the output of Q21's first join at 10,000
/// rows where it held 3.8 million; at SF 10 the two joins above it then stayed on the CPU, and
/// Q21 took 5.2 s against 0.73 s with them on the GPU. A join here is a node of a type that
/// [`describe`] knows, or a `GpuJoinExec`, checked by type alone (not by `describe`, which
/// compiles filters and reads statistics, for every node of every join's inputs).
fn holds_join(plan: &Arc<dyn ExecutionPlan>) -> bool {
    let join = plan.downcast_ref::<GpuJoinExec>().is_some()
        || plan.downcast_ref::<HashJoinExec>().is_some()
        || plan.downcast_ref::<CrossJoinExec>().is_some()
        || plan.downcast_ref::<NestedLoopJoinExec>().is_some()
        || plan.downcast_ref::<PiecewiseMergeJoinExec>().is_some()
        || plan.downcast_ref::<SortMergeJoinExec>().is_some();
    join || plan.children().into_iter().any(holds_join)
}

/// The backend `config` asks for, resolved against this machine; `None` when joins should stay
/// DataFusion's (`auto` without a usable GPU, unless `min_build_rows` is 0). With several
/// devices (`gpu_join.devices`), `cuda` needs every one of them, and `auto` takes those that
/// open.
pub fn resolve_backend(config: &GpuJoinConfig) -> Result<Option<JoinBackend>> {
    // Host lanes as listed; `all`, or a `gpu_join.device` that names no device, is one.
    let host = JoinBackend::Host(match config.devices {
        DeviceList::These(d) => d,
        DeviceList::Device | DeviceList::All => Devices::ZERO,
    });
    match config.backend {
        BackendChoice::Host => Ok(Some(host)),
        BackendChoice::Cuda => match usable_devices(asked_devices(config)?) {
            (Some(d), None) => Ok(Some(JoinBackend::Cuda(d))),
            (_, Some(e)) => plan_err!("gpu_join.backend = cuda, but no usable GPU: {e}"),
            (None, None) => plan_err!("gpu_join.backend = cuda, but no usable GPU"),
        },
        BackendChoice::Auto => Ok(match asked_devices(config).map(usable_devices) {
            Ok((Some(d), _)) => Some(JoinBackend::Cuda(d)),
            Ok((None, e)) => no_gpu(config, host, e.map(|e| e.to_string())),
            Err(e) => no_gpu(config, host, Some(e.to_string())),
        }),
    }
}

/// Under `auto` without a usable GPU: the host backend where `min_build_rows` is 0, else
/// DataFusion's joins.
fn no_gpu(config: &GpuJoinConfig, host: JoinBackend, why: Option<String>) -> Option<JoinBackend> {
    let why = why.unwrap_or_else(|| "none listed".into());
    if config.min_build_rows == 0 {
        log::debug!("GpuJoinRule: no usable GPU ({why}); using the host backend");
        return Some(host);
    }
    log::debug!(
        "GpuJoinRule: no usable GPU ({why}), and the host backend (gpu_join.backend = auto) \
         would be slower: joins stay DataFusion's"
    );
    None
}

/// The devices `gpu_join.devices` (or `gpu_join.device`) names on this machine.
fn asked_devices(config: &GpuJoinConfig) -> Result<Devices> {
    // Only `all` asks the driver how many there are.
    let count = match config.devices {
        DeviceList::All => crate::device::device_count().ok(),
        _ => None,
    };
    config.devices.resolve(config.device, count)
}

/// Those of `asked` that open, and the first error of one that does not.
fn usable_devices(asked: Devices) -> (Option<Devices>, Option<DataFusionError>) {
    let mut error = None;
    let usable = asked
        .iter()
        .filter(|&o| match crate::device::cuda_device(o) {
            Ok(_) => true,
            Err(e) => {
                error.get_or_insert(e);
                false
            }
        });
    (Devices::of(usable.collect::<Vec<_>>()).ok(), error)
}

/// The backend the rule gives the joins it places: [`resolve_backend`]'s, except in a plan
/// that executors run (`gpu_join.distributed`), where each executor chooses as it decodes the
/// join, and the backend here (this machine's GPUs, else the host) only shows in EXPLAIN.
fn planning_backend(config: &GpuJoinConfig) -> Result<Option<JoinBackend>> {
    if !config.distributed {
        return resolve_backend(config);
    }
    Ok(Some(match asked_devices(config).map(usable_devices) {
        Ok((Some(d), _)) => JoinBackend::Cuda(d),
        _ => JoinBackend::HOST,
    }))
}

impl PhysicalOptimizerRule for GpuJoinRule {
    fn optimize(
        &self,
        plan: Arc<dyn ExecutionPlan>,
        options: &ConfigOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let config = settings(options);
        if !config.enabled {
            return Ok(plan);
        }
        let mut backend = None;
        let plan = plan
            .transform_up(|plan| {
                if self.late && !plan.is::<NestedLoopJoinExec>() {
                    return Ok(Transformed::no(plan));
                }
                let join = match eligible(plan.as_ref(), &config) {
                    None => return Ok(Transformed::no(plan)),
                    Some(Err(reason)) => {
                        log::debug!("GpuJoinRule: keeping {}: {reason}", plan.name());
                        return Ok(Transformed::no(plan));
                    }
                    Some(Ok(join)) => join,
                };
                let backend = match backend {
                    Some(b) => b,
                    None => *backend.insert(planning_backend(&config)?),
                };
                let Some(backend) = backend else {
                    return Ok(Transformed::no(plan));
                };
                let exec = join
                    .with_backend(backend)
                    .with_distributed(config.distributed)
                    .with_probe_chunk_rows(config.probe_chunk_rows)
                    .with_pack_uploads(config.pack_uploads)
                    .with_views_on_device(config.views_on_device)
                    .with_view_bytes_on_device(config.view_bytes_on_device)
                    .with_probe_columns(config.probe_columns)
                    .with_algorithm(config.algorithm)
                    .with_memory_limit(config.memory_limit)
                    .with_key_hash_bits(config.key_hash_bits)
                    .build()?;
                Ok(Transformed::yes(Arc::new(exec) as Arc<dyn ExecutionPlan>))
            })
            .data()?;
        // Scans whose rows a join's dynamic filter should prune before costlier work than the
        // join's own: once every join is in place, before DataFusion's last filter pushdown.
        // Executors of a distributed plan decode their own, without runtime filters.
        match self.late
            && config.runtime_filters
            && !config.distributed
            && crate::exec::dynamic_filters_enabled(options)
        {
            true => crate::runtime_filter::insert(plan),
            false => Ok(plan),
        }
    }

    fn name(&self) -> &str {
        match self.late {
            false => "GpuJoinRule",
            true => "GpuJoinRule(late)",
        }
    }

    fn schema_check(&self) -> bool {
        true
    }
}
