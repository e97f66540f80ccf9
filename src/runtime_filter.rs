//! [`RuntimeFilterExec`]: applies the dynamic filters of the `GpuJoinExec`s above it to the rows
//! of a scan that cannot apply them itself, and [`insert`], the planning step that places it.
//!
//! A join's dynamic filter (its build keys' bounds, and their set where few probe rows are
//! expected to match: `exec::filter`) reaches the probe side's scan through DataFusion's
//! filter pushdown, which carries it through projections, filters, repartitions, aggregates
//! grouped by the key and the preserved sides of other joins. A Parquet scan may prune with
//! it; an in-memory table (`MemTable`) ignores it, and Parquet without
//! `datafusion.execution.parquet.pushdown_filters` prunes only whole row groups. The rows it
//! would have pruned then pay for every operator between the scan and the join: an
//! aggregate over all of `lineitem` (TPC-H Q17, whose join keeps a few thousand parts), a
//! string filter (Q19), another join.
//!
//! ```text
//!   GpuJoinExec (build keys: 2,040 parts)        the join publishes its filter once the build
//!   ├── build side                               side is read, before its probe side is
//!   └── AggregateExec (gby = l_partkey)          polled; the aggregate then groups only the
//!         └── RuntimeFilterExec  ◄── filter      rows of those parts
//!               └── DataSourceExec (lineitem)
//! ```
//!
//! [`insert`] (from `GpuJoinRule`'s late pass, before DataFusion's post-optimization filter
//! pushdown) puts a `RuntimeFilterExec` above each `DataSourceExec` under the probe side of a
//! join that prunes it (a `GpuJoinExec` whose build keys may prune its probe rows). Where that
//! join reads the scan through projections and repartitions alone, the node applies only the
//! filters of joins further up (TPC-H Q18's semi join, built on its subquery, prunes `orders`
//! under the join that reads it): the join itself stages only the keys of such rows where few
//! match (`gpu_join.probe_columns`), which costs less than testing each against a set on the
//! CPU (about 20 ns a row), so its own filter goes to no node ([`reads_scans_directly`]). No
//! filter from above a limit (a node with a `fetch`, a limit, an aggregate with a limit on its
//! groups) may be applied under it: rows pruned below it would change which rows it keeps,
//! though DataFusion passes the joins' filters through a `FilterExec` or a
//! `CoalescePartitionsExec` that has a `fetch`. So a pruning join under a limit places nodes
//! for itself and the joins below it, and none goes under a limit that lies on a pruning
//! join's probe side. The pushdown then offers the node every
//! filter that reaches it; it passes them on to the scan, keeps the `GpuJoinExec`s' dynamic
//! filters that the scan does not apply (not DataFusion's own: an aggregate's min/max bounds
//! leave out a column whose bound is still null, and hold only where DataFusion applies them),
//! and removes itself where it keeps none. Each partition judges each filter from its
//! 65,536th row on (`JUDGE_AFTER_ROWS`), at every batch, by the rows it has seen so far, and
//! stops applying one that keeps more than half of them (a join's bounds that span the probe
//! keys prune nothing, and cost a copy of every batch).
//! EXPLAIN shows the node with its filters (a set as `key IN (n build keys)`); EXPLAIN ANALYZE
//! counts `pruned_rows` and `filters_dropped`.

use std::fmt;
use std::sync::Arc;

use arrow::array::{AsArray, RecordBatch};
use arrow::compute::filter_record_batch;
use datafusion::common::config::ConfigOptions;
use datafusion::common::stats::Statistics;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{Result, ScalarValue, internal_err};
use datafusion::datasource::source::DataSourceExec;
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::ColumnarValue;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::PhysicalSortExpr;
use datafusion::physical_expr::expressions::DynamicFilterPhysicalExpr;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::execution_plan::CardinalityEffect;
use datafusion::physical_plan::filter_pushdown::{
    ChildPushdownResult, FilterDescription, FilterPushdownPhase, FilterPushdownPropagation,
    PushedDown,
};
use datafusion::physical_plan::limit::{GlobalLimitExec, LocalLimitExec};
use datafusion::physical_plan::metrics::{
    BaselineMetrics, Count, ExecutionPlanMetricsSet, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sort_pushdown::SortOrderPushdownResult;
use datafusion::physical_plan::statistics::{ChildStats, StatisticsArgs};
use datafusion::physical_plan::stream::RecordBatchStreamAdapter;
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::{
    ChildrenPropertiesMode, DisplayAs, DisplayFormatType, ExecutionPlan, PlanProperties,
    ReplaceChildrenOptions,
};
use futures::StreamExt;

use crate::exec::{GpuJoinExec, applied_above_scans};

/// Applies the `GpuJoinExec`s' dynamic filters pushed to it, which its input (a scan) does not
/// apply, to every batch of its input.
#[derive(Debug, Clone)]
pub struct RuntimeFilterExec {
    input: Arc<dyn ExecutionPlan>,
    /// The dynamic filters it applies, in its input's columns.
    filters: Vec<Arc<dyn PhysicalExpr>>,
    metrics: ExecutionPlanMetricsSet,
}

impl RuntimeFilterExec {
    /// A node over `input` that applies `filters` (none yet where the pushdown is to come).
    pub fn new(input: Arc<dyn ExecutionPlan>, filters: Vec<Arc<dyn PhysicalExpr>>) -> Self {
        Self {
            input,
            filters,
            metrics: ExecutionPlanMetricsSet::new(),
        }
    }

    /// The filters it applies.
    pub fn filters(&self) -> &[Arc<dyn PhysicalExpr>] {
        &self.filters
    }

    /// The node it reads.
    pub fn input(&self) -> &Arc<dyn ExecutionPlan> {
        &self.input
    }
}

impl DisplayAs for RuntimeFilterExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let filters: Vec<String> = self.filters.iter().map(|e| e.to_string()).collect();
        match t {
            DisplayFormatType::TreeRender => write!(f, "filters={}", filters.join(", ")),
            _ => write!(f, "RuntimeFilterExec: filters=[{}]", filters.join(", ")),
        }
    }
}

impl ExecutionPlan for RuntimeFilterExec {
    fn name(&self) -> &str {
        "RuntimeFilterExec"
    }

    fn properties(&self) -> &Arc<PlanProperties> {
        // Rows are dropped, never changed or reordered: the input's properties hold.
        self.input.properties()
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![true]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.input]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        for e in &self.filters {
            if f(e)? == TreeNodeRecursion::Stop {
                return Ok(TreeNodeRecursion::Stop);
            }
        }
        Ok(TreeNodeRecursion::Continue)
    }

    fn replace_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
        _options: ReplaceChildrenOptions,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let [input] = <[_; 1]>::try_from(children).map_err(|c| {
            datafusion::common::internal_datafusion_err!(
                "RuntimeFilterExec takes one child, got {}",
                c.len()
            )
        })?;
        Ok(Arc::new(Self::new(input, self.filters.clone())))
    }

    fn with_new_children(
        self: Arc<Self>,
        children: Vec<Arc<dyn ExecutionPlan>>,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        self.replace_children(
            children,
            ReplaceChildrenOptions::new(ChildrenPropertiesMode::Recompute),
        )
    }

    fn execute(
        &self,
        partition: usize,
        context: Arc<TaskContext>,
    ) -> Result<SendableRecordBatchStream> {
        let input = self.input.execute(partition, context)?;
        let schema = input.schema();
        let mut filters: Vec<Judged> = self.filters.iter().map(Judged::new).collect();
        let baseline = BaselineMetrics::new(&self.metrics, partition);
        let counts = Counts {
            pruned: MetricBuilder::new(&self.metrics).counter("pruned_rows", partition),
            dropped: MetricBuilder::new(&self.metrics).counter("filters_dropped", partition),
        };
        let stream = input.filter_map(move |batch| {
            let out = batch.and_then(|b| {
                let _timer = baseline.elapsed_compute().timer();
                apply(&mut filters, b, &counts)
            });
            std::future::ready(match out {
                Ok(b) if b.num_rows() == 0 => None,
                Ok(b) => {
                    baseline.record_output(b.num_rows());
                    Some(Ok(b))
                }
                Err(e) => Some(Err(e)),
            })
        });
        Ok(Box::pin(RecordBatchStreamAdapter::new(schema, stream)))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn child_stats_requests(&self, partition: Option<usize>) -> Vec<ChildStats> {
        vec![ChildStats::At(partition)]
    }

    fn statistics_from_inputs(
        &self,
        input_stats: &[Arc<Statistics>],
        _args: &StatisticsArgs,
    ) -> Result<Arc<Statistics>> {
        // At most the input's rows; how many the filters keep is known only at run time.
        match input_stats {
            [input] if self.filters.is_empty() => Ok(Arc::clone(input)),
            [input] => Ok(Arc::new(input.as_ref().clone().to_inexact())),
            _ => internal_err!("RuntimeFilterExec has one input"),
        }
    }

    fn cardinality_effect(&self) -> CardinalityEffect {
        CardinalityEffect::LowerEqual
    }

    fn try_pushdown_sort(
        &self,
        order: &[PhysicalSortExpr],
    ) -> Result<SortOrderPushdownResult<Arc<dyn ExecutionPlan>>> {
        // Dropping rows keeps their order: the scan below may serve the order as it would.
        self.input.try_pushdown_sort(order)?.try_map(|input| {
            Ok(Arc::new(Self::new(input, self.filters.clone())) as Arc<dyn ExecutionPlan>)
        })
    }

    fn gather_filters_for_pushdown(
        &self,
        _phase: FilterPushdownPhase,
        parent_filters: Vec<Arc<dyn PhysicalExpr>>,
        _config: &ConfigOptions,
    ) -> Result<FilterDescription> {
        // Every filter goes on to the scan, which may prune with it (a Parquet scan's row
        // groups) even where it does not apply it to rows.
        FilterDescription::from_children(parent_filters, &self.children())
    }

    fn handle_child_pushdown_result(
        &self,
        phase: FilterPushdownPhase,
        child_pushdown_result: ChildPushdownResult,
        _config: &ConfigOptions,
    ) -> Result<FilterPushdownPropagation<Arc<dyn ExecutionPlan>>> {
        if phase != FilterPushdownPhase::Post {
            return Ok(FilterPushdownPropagation::if_all(child_pushdown_result));
        }
        let mut filters = self.filters.clone();
        let mut answers = vec![];
        for f in &child_pushdown_result.parent_filters {
            let answer = match f.all() {
                PushedDown::Yes => PushedDown::Yes,
                // Only the joins' own: static filters stay where they are (a FilterExec above
                // applies them), and DataFusion's own dynamic filters hold only where it puts
                // them (an aggregate's min/max bounds leave out a column whose bound is still
                // null, which an early row of that column does not pass); and not that of a
                // join that stages these rows itself.
                PushedDown::No if !applied_above_scans(f.filter.as_ref()) => PushedDown::No,
                PushedDown::No => {
                    filters.push(Arc::clone(&f.filter));
                    PushedDown::Yes
                }
            };
            answers.push(answer);
        }
        let result = FilterPushdownPropagation::with_parent_pushdown_result(answers);
        Ok(match filters.is_empty() {
            // Nothing to apply: the scan stands where it stood.
            true => result.with_updated_node(Arc::clone(&self.input)),
            false if filters.len() == self.filters.len() => result,
            false => {
                result.with_updated_node(Arc::new(Self::new(Arc::clone(&self.input), filters)))
            }
        })
    }
}

/// Rows a filter is applied to in one partition before it is judged.
const JUDGE_AFTER_ROWS: usize = 1 << 16;

/// One filter of a partition's stream and what it has done there: a filter that keeps more
/// than half the rows it sees is dropped (testing each row costs about what the rows it
/// prunes would cost the operators above; a join's bounds that span the probe keys prune
/// nothing).
struct Judged {
    filter: Arc<dyn PhysicalExpr>,
    seen: usize,
    kept: usize,
    on: bool,
}

impl Judged {
    fn new(filter: &Arc<dyn PhysicalExpr>) -> Self {
        Self {
            filter: Arc::clone(filter),
            seen: 0,
            kept: 0,
            on: true,
        }
    }
}

/// A partition's counts: rows pruned, and filters dropped for pruning too few.
struct Counts {
    pruned: Count,
    dropped: Count,
}

/// `batch`'s rows that pass every filter still on.
fn apply(filters: &mut [Judged], mut batch: RecordBatch, counts: &Counts) -> Result<RecordBatch> {
    for f in filters.iter_mut().filter(|f| f.on) {
        let rows = batch.num_rows();
        if rows == 0 {
            break;
        }
        batch = match f.filter.evaluate(&batch)? {
            // A filter not yet published passes every row, and is not judged.
            ColumnarValue::Scalar(ScalarValue::Boolean(Some(true))) => continue,
            ColumnarValue::Scalar(_) => batch.slice(0, 0),
            ColumnarValue::Array(keep) => filter_record_batch(&batch, keep.as_boolean())?,
        };
        counts.pruned.add(rows - batch.num_rows());
        f.seen += rows;
        f.kept += batch.num_rows();
        if f.seen >= JUDGE_AFTER_ROWS && f.kept * 2 > f.seen {
            f.on = false;
            counts.dropped.add(1);
        }
    }
    Ok(batch)
}

/// Whether a `RuntimeFilterExec` in `plan` applies `filter` (a join's dynamic filter, as
/// pushed down and remapped: the same expression id).
pub(crate) fn applies(plan: &Arc<dyn ExecutionPlan>, filter: &DynamicFilterPhysicalExpr) -> bool {
    let id = filter.expression_id();
    let here = plan
        .downcast_ref::<RuntimeFilterExec>()
        .is_some_and(|node| id.is_some() && node.filters.iter().any(|f| f.expression_id() == id));
    here || plan.children().into_iter().any(|c| applies(c, filter))
}

/// Puts a [`RuntimeFilterExec`] above every `DataSourceExec` under the probe side of a
/// `GpuJoinExec` that prunes it, outside limits (module doc). The filters come later, from
/// DataFusion's post-optimization filter pushdown, which decides what each node applies
/// ([`crate::exec::applied_above_scans`]); a node that gets none removes itself.
pub fn insert(plan: Arc<dyn ExecutionPlan>) -> Result<Arc<dyn ExecutionPlan>> {
    walk(plan, false, false)
}

/// `plan` with nodes placed. `probed`: under the probe side of a join that prunes it, with no
/// limit on the way; `fenced`: under a limit that is itself on such a probe side, so that the
/// filter of a join above the limit may reach it (through a `FilterExec` or
/// `CoalescePartitionsExec` with a `fetch`): no node goes there.
fn walk(
    plan: Arc<dyn ExecutionPlan>,
    probed: bool,
    fenced: bool,
) -> Result<Arc<dyn ExecutionPlan>> {
    if plan.is::<RuntimeFilterExec>() {
        return Ok(plan);
    }
    if plan.is::<DataSourceExec>() {
        return Ok(match probed && !fenced {
            true => Arc::new(RuntimeFilterExec::new(plan, vec![])),
            false => plan,
        });
    }
    // Rows pruned under a limit change which rows it keeps (the first n in an order, or the
    // first n groups): no filter from above may pass one, and a join under it starts afresh
    // (unless the limit is on a pruning join's probe side: then no node goes under it).
    let limited = plan.fetch().is_some()
        || plan.is::<GlobalLimitExec>()
        || plan.is::<LocalLimitExec>()
        || plan
            .downcast_ref::<AggregateExec>()
            .is_some_and(|a| a.limit_options().is_some());
    let past = probed && !limited;
    let kinds: Vec<bool> = match plan.downcast_ref::<GpuJoinExec>() {
        // A join that stops at `fetch` rows keeps the first it finds: none below it.
        Some(_) if limited => vec![false, false],
        // A join that prunes its probe side: every scan under that side gets a node, for its
        // filter and those of joins further up (where the join reads the scan through
        // projections and repartitions alone, only theirs: `reads_scans_directly`).
        Some(join) if join.publishes_key_values() => vec![past, true],
        // Filters from above reach either side.
        _ => vec![past; plan.children().len()],
    };
    let fenced = fenced || (limited && probed);
    let kids = plan
        .children()
        .into_iter()
        .zip(kinds)
        .map(|(c, probed)| walk(Arc::clone(c), probed, fenced))
        .collect::<Result<Vec<_>>>()?;
    replace(plan, kids)
}

/// Whether `probe` (a join's probe side) reaches every scan under it through projections,
/// repartitions, coalescing, unions and `RuntimeFilterExec`s alone, so that the join stages the
/// scans' rows as they are read: its own dynamic filter then goes to no `RuntimeFilterExec`
/// ([`crate::exec::applied_above_scans`]).
pub(crate) fn reads_scans_directly(probe: &Arc<dyn ExecutionPlan>) -> bool {
    if probe.is::<DataSourceExec>() {
        return true;
    }
    let passes =
        probe.is::<RuntimeFilterExec>() || (cheap(probe.as_ref()) && probe.fetch().is_none());
    passes && probe.children().into_iter().all(reads_scans_directly)
}

/// `plan` over `kids`, the same node where they are the same.
fn replace(
    plan: Arc<dyn ExecutionPlan>,
    kids: Vec<Arc<dyn ExecutionPlan>>,
) -> Result<Arc<dyn ExecutionPlan>> {
    let same = plan
        .children()
        .iter()
        .zip(&kids)
        .all(|(a, b)| Arc::ptr_eq(a, b));
    match same {
        true => Ok(plan),
        false => plan.replace_children(
            kids,
            ReplaceChildrenOptions::new(ChildrenPropertiesMode::Keep),
        ),
    }
}

/// Whether `plan` passes its rows on for little work each (projections, repartitions,
/// coalescing, unions), so that pruning under it spares nothing the join would not.
fn cheap(plan: &dyn ExecutionPlan) -> bool {
    plan.is::<ProjectionExec>()
        || plan.is::<RepartitionExec>()
        || plan.is::<CoalescePartitionsExec>()
        || plan.is::<CooperativeExec>()
        || plan.is::<UnionExec>()
}
