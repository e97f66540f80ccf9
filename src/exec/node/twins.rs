//! The DataFusion join a [`GpuJoinExec`](super::GpuJoinExec) replaced ([`Replaced`]), and
//! DataFusion's joins that can run in its place:
//!
//! - its **twin**, DataFusion's join of the same inputs as the node has them (a `HashJoinExec`
//!   in `CollectLeft` mode, or without keys a `NestedLoopJoinExec`): it gives the statistics,
//!   and runs over a collected build side that the GPU path cannot take;
//! - its **spilling twin**, where the replaced join spills (a nested loop or sort-merge join):
//!   the join that runs instead where the memory pool refuses the build side, so that a query
//!   DataFusion runs in a small pool still runs. A hash join has none (`HashJoinExec` fails
//!   there too). A sort-merge join's sorts and repartitioning are planned by DataFusion's
//!   `EnsureRequirements` when it runs, as they would have been (none for a sorted input).

use std::fmt;
use std::sync::Arc;

use arrow::compute::SortOptions;
use arrow::datatypes::Schema;
use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::common::{JoinSide, JoinType, Result};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_optimizer::ensure_requirements::EnsureRequirements;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::execution_plan::reset_plan_states;
use datafusion::physical_plan::joins::utils::JoinFilter;
use datafusion::physical_plan::joins::{
    HashJoinExec, NestedLoopJoinExec, PartitionMode, SortMergeJoinExec,
};
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::{ExecutionPlan, ExecutionPlanProperties, Partitioning};

use super::GpuJoinExecBuilder;

/// The join node a `GpuJoinExec` replaced (EXPLAIN VERBOSE shows it as `replaced=`).
#[derive(Debug, Clone, PartialEq)]
pub enum Replaced {
    /// A `HashJoinExec` in this partition mode.
    HashJoin(PartitionMode),
    /// A `CrossJoinExec`.
    CrossJoin,
    /// A `NestedLoopJoinExec`.
    NestedLoopJoin,
    /// A `PiecewiseMergeJoinExec`.
    PiecewiseMergeJoin,
    /// A `SortMergeJoinExec`, with its sort options (one per key).
    SortMergeJoin(Vec<SortOptions>),
}

impl fmt::Display for Replaced {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::HashJoin(mode) => write!(f, "HashJoinExec({mode:?})"),
            Self::CrossJoin => write!(f, "CrossJoinExec"),
            Self::NestedLoopJoin => write!(f, "NestedLoopJoinExec"),
            Self::PiecewiseMergeJoin => write!(f, "PiecewiseMergeJoinExec"),
            Self::SortMergeJoin(_) => write!(f, "SortMergeJoinExec"),
        }
    }
}

impl Replaced {
    /// Whether the node declares its probe side's order and partitioning as kept. Not where
    /// it replaced a sort-merge join: its spilling twin partitions and sorts both inputs, so
    /// only what holds of both paths is declared (no order, unknown partitioning).
    pub fn keeps_probe_order(&self) -> bool {
        !matches!(self, Self::SortMergeJoin(_))
    }
}

/// DataFusion's join that spills, run instead of the node where the memory pool refuses the
/// build side.
#[derive(Debug)]
pub(crate) struct SpillingTwin {
    /// The join operator's name, for EXPLAIN.
    pub name: String,
    plan: Arc<dyn ExecutionPlan>,
    /// Whether its inputs' sorts and repartitioning are still to be planned.
    plan_inputs: bool,
}

impl SpillingTwin {
    /// A fresh copy of the plan (an operator's state, such as a repartition's channels, serves
    /// one execution, and the build input's has been read), ready to run under `options` in
    /// `partitions` output partitions, the node's.
    pub fn ready(
        &self,
        options: &ConfigOptions,
        partitions: usize,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let fresh = reset_plan_states(Arc::clone(&self.plan))?;
        if !self.plan_inputs {
            return Ok(fresh);
        }
        // DataFusion plans the sorts and repartitioning the join needs, as it would have.
        let mut options = options.clone();
        options.execution.target_partitions = partitions.max(1);
        let planned = EnsureRequirements::new().optimize(fresh, &options)?;
        if planned.output_partitioning().partition_count() == partitions {
            return Ok(planned);
        }
        let one: Arc<dyn ExecutionPlan> = Arc::new(CoalescePartitionsExec::new(planned));
        Ok(match partitions {
            0 | 1 => one,
            n => Arc::new(RepartitionExec::try_new(
                one,
                Partitioning::RoundRobinBatch(n),
            )?),
        })
    }
}

impl GpuJoinExecBuilder {
    /// DataFusion's join of the node's inputs: a hash join that collects the build side (in a
    /// distributed plan, whose inputs are partitioned on their keys, one that joins partition
    /// with partition), or without keys a nested loop join.
    pub(crate) fn twin(&self) -> Result<Arc<dyn ExecutionPlan>> {
        if self.on.is_empty() {
            return Ok(Arc::new(NestedLoopJoinExec::try_new(
                Arc::clone(&self.left),
                Arc::clone(&self.right),
                self.filter.clone(),
                &self.join_type,
                self.projection.clone(),
            )?));
        }
        Ok(Arc::new(
            HashJoinExec::try_new(
                Arc::clone(&self.left),
                Arc::clone(&self.right),
                self.on.clone(),
                self.filter.clone(),
                &self.join_type,
                self.projection.clone(),
                match self.distributed {
                    true => PartitionMode::Partitioned,
                    false => PartitionMode::CollectLeft,
                },
                self.null_equality,
                self.null_aware,
            )?
            .builder()
            .with_fetch(self.fetch)
            .build()?,
        ))
    }

    /// [`twin`](Self::twin), ready to run in place of the node: over a build side of several
    /// partitions, a `CollectLeft` join reads them through a `CoalescePartitionsExec`; a
    /// distributed plan's twin joins partition with partition and gets no node added (its
    /// engine matches the plan it sent to the one its executors run, node by node).
    pub(crate) fn runnable_twin(self) -> Result<Arc<dyn ExecutionPlan>> {
        let partitions = self.left.output_partitioning().partition_count();
        let builder = match (self.distributed, partitions) {
            (true, _) | (_, 1) => self,
            _ => {
                let one = Arc::new(CoalescePartitionsExec::new(Arc::clone(&self.left)));
                self.with_left(one)
            }
        };
        builder.twin()
    }

    /// DataFusion's join that spills, over the node's inputs, where the replaced join does.
    pub(super) fn spilling_twin(&self) -> Result<Option<SpillingTwin>> {
        match &self.replaced {
            // Without keys, the twin itself, over the build side in one partition: it keeps
            // the probe side's partitioning and order, as the node declares.
            _ if self.on.is_empty() => {
                let left = match self.left.output_partitioning().partition_count() {
                    1 => Arc::clone(&self.left),
                    _ => Arc::new(CoalescePartitionsExec::new(Arc::clone(&self.left))),
                };
                let join = NestedLoopJoinExec::try_new(
                    left,
                    Arc::clone(&self.right),
                    self.filter.clone(),
                    &self.join_type,
                    self.projection.clone(),
                )?;
                Ok(Some(SpillingTwin {
                    name: join.name().to_string(),
                    plan: Arc::new(join),
                    plan_inputs: false,
                }))
            }
            // The sort-merge join itself, its inputs' sorts and repartitioning planned when it
            // runs; the node declares neither order nor partitioning.
            Replaced::SortMergeJoin(options) => {
                let join = SortMergeJoinExec::try_new(
                    Arc::clone(&self.left),
                    Arc::clone(&self.right),
                    self.on.clone(),
                    self.filter.as_ref().map(left_first).transpose()?,
                    self.join_type,
                    options.clone(),
                    self.null_equality,
                )?;
                let name = join.name().to_string();
                let join: Arc<dyn ExecutionPlan> = Arc::new(join);
                let plan = match &self.projection {
                    None => join,
                    Some(projection) => {
                        let schema = join.schema();
                        let exprs = projection.iter().map(|&i| {
                            let name = schema.field(i).name();
                            (
                                Arc::new(Column::new(name, i)) as Arc<dyn PhysicalExpr>,
                                name.clone(),
                            )
                        });
                        Arc::new(ProjectionExec::try_new(exprs, join)?)
                    }
                };
                Ok(Some(SpillingTwin {
                    name,
                    plan,
                    plan_inputs: true,
                }))
            }
            _ => Ok(None),
        }
    }

    /// The same join with its inputs swapped (the right input becomes the build side), its
    /// output columns in the same order. For a builder without a projection.
    pub(super) fn swapped(self) -> Self {
        let (left_width, right_width) = (
            self.left.schema().fields().len(),
            self.right.schema().fields().len(),
        );
        // Join types that output both sides put the (new) left's columns first.
        let projection = match self.join_type {
            JoinType::Inner | JoinType::Left | JoinType::Right | JoinType::Full => Some(
                (right_width..right_width + left_width)
                    .chain(0..right_width)
                    .collect(),
            ),
            _ => None,
        };
        Self {
            on: self
                .on
                .iter()
                .map(|(l, r)| (Arc::clone(r), Arc::clone(l)))
                .collect(),
            join_type: self.join_type.swap(),
            filter: self.filter.as_ref().map(|f| f.swap()),
            projection,
            left: self.right,
            right: self.left,
            ..self
        }
    }
}

/// `filter` with its left input's columns first, as DataFusion's sort-merge join reads them
/// (whatever the column indices say); a swapped filter lists the right input's first.
fn left_first(filter: &JoinFilter) -> Result<JoinFilter> {
    let indices = filter.column_indices();
    let mut order: Vec<usize> = (0..indices.len()).collect();
    order.sort_by_key(|&i| indices[i].side != JoinSide::Left);
    let mut at = vec![0; order.len()];
    for (new, &old) in order.iter().enumerate() {
        at[old] = new;
    }
    let schema = filter.schema();
    let fields: Vec<_> = order.iter().map(|&i| schema.field(i).clone()).collect();
    let expression = Arc::clone(filter.expression())
        .transform(|e| match e.downcast_ref::<Column>() {
            Some(c) => Ok(Transformed::yes(
                Arc::new(Column::new(c.name(), at[c.index()])) as Arc<dyn PhysicalExpr>,
            )),
            None => Ok(Transformed::no(e)),
        })
        .data()?;
    Ok(JoinFilter::new(
        expression,
        order.iter().map(|&i| indices[i].clone()).collect(),
        Arc::new(Schema::new(fields)),
    ))
}
