//! [`GpuJoinExec`]: the plan node that replaces an eligible `HashJoinExec`.
//!
//! # Inputs and partitioning
//!
//! ```text
//!            GpuJoinExec  (output partition i = probe partition i joined with the build side)
//!            /         \
//!   left: build side    right: probe side
//!   (SinglePartition:   (any partitioning; each partition streams
//!    collected once,     through the device on its own CUDA stream)
//!    shared by all)
//! ```
//! The node requires its left input as a single partition and leaves the right input's
//! partitioning alone, so no CPU hash repartitioning is kept that the GPU would redo. Output
//! rows of partition i come only from probe partition i, so the probe side's hash
//! partitioning carries over to the output; row order within a partition is not kept.
//!
//! # Output
//!
//! Schema, column order, nullability and embedded projection are those of the replaced
//! `HashJoinExec`. Like it, the node absorbs a `ProjectionExec` above it that keeps a subset of
//! its columns (`ProjectionPushdown`), so columns the query drops are never materialized on the
//! device nor downloaded.

use std::fmt;
use std::sync::Arc;

use arrow::datatypes::SchemaRef;
use datafusion::common::tree_node::TreeNodeRecursion;
use datafusion::common::{JoinSide, NullEquality, Result, internal_err, project_schema};
use datafusion::execution::{SendableRecordBatchStream, TaskContext};
use datafusion::logical_expr::JoinType;
use datafusion::physical_expr::equivalence::join_equivalence_properties;
use datafusion::physical_expr::expressions::Column;
use datafusion::physical_expr::projection::ProjectionMapping;
use datafusion::physical_expr::{Distribution, PhysicalExpr};
use datafusion::physical_plan::execution_plan::Boundedness;
use datafusion::physical_plan::joins::PartitionMode;
use datafusion::physical_plan::joins::utils::{
    JoinOn, adjust_right_output_partitioning, build_join_schema,
};
use datafusion::physical_plan::metrics::{
    ExecutionPlanMetricsSet, Gauge, MetricBuilder, MetricsSet,
};
use datafusion::physical_plan::projection::{
    EmbeddedProjection, ProjectionExec, try_embed_projection,
};
use datafusion::physical_plan::{
    DisplayAs, DisplayFormatType, ExecutionPlan, ExecutionPlanProperties,
    InputDistributionRequirements, PlanProperties, ReplaceChildrenOptions,
};
use futures::FutureExt;
use futures::future::{BoxFuture, Shared};

use super::build::{BuildInputs, SharedBuild, make_build};
use super::metrics::GpuJoinMetrics;
use super::stream::GpuJoinStream;
use crate::join::{OutputColumn, OutputLayout};

/// Where a `GpuJoinExec` runs its primitives.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JoinBackend {
    /// The CUDA device with this ordinal.
    Cuda(usize),
    /// The CPU twin of the GPU algorithm.
    Host,
}

impl fmt::Display for JoinBackend {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Cuda(d) => write!(f, "cuda:{d}"),
            Self::Host => write!(f, "host"),
        }
    }
}

type SharedBuildFuture =
    Shared<BoxFuture<'static, Result<Arc<SharedBuild>, Arc<datafusion::common::DataFusionError>>>>;

/// Runs an inner equi-join as a partitioned hash join on a GPU (or on its host twin).
pub struct GpuJoinExec {
    left: Arc<dyn ExecutionPlan>,
    right: Arc<dyn ExecutionPlan>,
    on: JoinOn,
    projection: Option<Vec<usize>>,
    null_equality: NullEquality,
    /// The partition mode of the replaced `HashJoinExec`, shown in EXPLAIN.
    replaced_mode: PartitionMode,
    backend: JoinBackend,
    probe_chunk_rows: usize,
    layout: Arc<OutputLayout>,
    cache: Arc<PlanProperties>,
    metrics: ExecutionPlanMetricsSet,
    peak_device_memory: Gauge,
    /// The build side, made by the first partition that asks and shared by all.
    build: std::sync::Mutex<Option<SharedBuildFuture>>,
}

impl fmt::Debug for GpuJoinExec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuJoinExec")
            .field("on", &self.on)
            .field("backend", &self.backend)
            .finish()
    }
}

fn column_index(expr: &Arc<dyn PhysicalExpr>) -> Result<usize> {
    match expr.downcast_ref::<Column>() {
        Some(c) => Ok(c.index()),
        None => internal_err!("GpuJoinExec join keys must be columns, got {expr}"),
    }
}

impl GpuJoinExec {
    /// A GPU inner join of `left` (build) and `right` (probe) on column pairs `on`.
    #[allow(clippy::too_many_arguments)]
    pub fn try_new(
        left: Arc<dyn ExecutionPlan>,
        right: Arc<dyn ExecutionPlan>,
        on: JoinOn,
        projection: Option<Vec<usize>>,
        null_equality: NullEquality,
        replaced_mode: PartitionMode,
        backend: JoinBackend,
        probe_chunk_rows: usize,
    ) -> Result<Self> {
        let (join_schema, _) = build_join_schema(&left.schema(), &right.schema(), &JoinType::Inner);
        let join_schema = Arc::new(join_schema);
        let schema = project_schema(&join_schema, projection.as_ref())?;
        let left_cols = left.schema().fields().len();
        let columns = match &projection {
            Some(p) => p.clone(),
            None => (0..join_schema.fields().len()).collect(),
        }
        .into_iter()
        .map(|i| {
            if i < left_cols {
                OutputColumn::Build(i)
            } else {
                OutputColumn::Probe(i - left_cols)
            }
        })
        .collect();
        let layout = OutputLayout {
            schema: Arc::clone(&schema),
            columns,
            build_keys: on
                .iter()
                .map(|(l, _)| column_index(l))
                .collect::<Result<_>>()?,
            probe_keys: on
                .iter()
                .map(|(_, r)| column_index(r))
                .collect::<Result<_>>()?,
        };
        let cache = Arc::new(Self::compute_properties(
            &left,
            &right,
            &join_schema,
            &on,
            projection.as_deref(),
        )?);
        let metrics = ExecutionPlanMetricsSet::new();
        let peak_device_memory = MetricBuilder::new(&metrics).global_gauge("peak_device_memory");
        Ok(Self {
            left,
            right,
            on,
            projection,
            null_equality,
            replaced_mode,
            backend,
            probe_chunk_rows,
            layout: Arc::new(layout),
            cache,
            metrics,
            peak_device_memory,
            build: std::sync::Mutex::new(None),
        })
    }

    fn compute_properties(
        left: &Arc<dyn ExecutionPlan>,
        right: &Arc<dyn ExecutionPlan>,
        join_schema: &SchemaRef,
        on: &JoinOn,
        projection: Option<&[usize]>,
    ) -> Result<PlanProperties> {
        // Partitioning moves rows within a partition: no input order is kept.
        let mut eq = join_equivalence_properties(
            left.equivalence_properties().clone(),
            right.equivalence_properties().clone(),
            &JoinType::Inner,
            Arc::clone(join_schema),
            &[false, false],
            Some(JoinSide::Right),
            on,
        )?;
        let mut partitioning = adjust_right_output_partitioning(
            right.output_partitioning(),
            left.schema().fields().len(),
        )?;
        if let Some(p) = projection {
            let mapping = ProjectionMapping::from_indices(p, join_schema)?;
            let out_schema = project_schema(join_schema, Some(&p.to_vec()))?;
            partitioning = partitioning.project(&mapping, &eq);
            eq = eq.project(&mapping, out_schema);
        }
        // Inner join output streams as the probe side arrives.
        let emission = right.pipeline_behavior();
        let bounded = left.boundedness().is_unbounded() || right.boundedness().is_unbounded();
        let boundedness = if bounded {
            Boundedness::Unbounded {
                requires_infinite_memory: false,
            }
        } else {
            Boundedness::Bounded
        };
        Ok(PlanProperties::new(eq, partitioning, emission, boundedness))
    }

    /// The build (left) input.
    pub fn left(&self) -> &Arc<dyn ExecutionPlan> {
        &self.left
    }

    /// The probe (right) input.
    pub fn right(&self) -> &Arc<dyn ExecutionPlan> {
        &self.right
    }

    /// The join key pairs.
    pub fn on(&self) -> &JoinOn {
        &self.on
    }

    /// Where the join runs.
    pub fn backend(&self) -> JoinBackend {
        self.backend
    }

    fn shared_build(&self, ctx: &Arc<TaskContext>) -> Result<SharedBuildFuture> {
        let mut guard = self
            .build
            .lock()
            .map_err(|_| datafusion::common::exec_datafusion_err!("build lock poisoned"))?;
        if let Some(f) = guard.as_ref() {
            return Ok(f.clone());
        }
        let inputs = BuildInputs {
            left: Arc::clone(&self.left),
            right: Arc::clone(&self.right),
            on: self.on.clone(),
            projection: self.projection.clone(),
            null_equality: self.null_equality,
            layout: (*self.layout).clone(),
            backend: self.backend,
        };
        let metrics = GpuJoinMetrics::new(0, &self.metrics, self.peak_device_memory.clone());
        let fut = make_build(inputs, Arc::clone(ctx), metrics)
            .map(|r| r.map_err(Arc::new))
            .boxed()
            .shared();
        *guard = Some(fut.clone());
        Ok(fut)
    }
}

impl EmbeddedProjection for GpuJoinExec {
    /// The same join with `projection` (indices into this node's output) applied on top of its
    /// own; `None` outputs every column of the join.
    fn with_projection(&self, projection: Option<Vec<usize>>) -> Result<Self> {
        let projection = match (projection, &self.projection) {
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
        Self::try_new(
            Arc::clone(&self.left),
            Arc::clone(&self.right),
            self.on.clone(),
            projection,
            self.null_equality,
            self.replaced_mode,
            self.backend,
            self.probe_chunk_rows,
        )
    }
}

impl DisplayAs for GpuJoinExec {
    fn fmt_as(&self, t: DisplayFormatType, f: &mut fmt::Formatter) -> fmt::Result {
        let on = self
            .on
            .iter()
            .map(|(l, r)| format!("({l}, {r})"))
            .collect::<Vec<_>>()
            .join(", ");
        match t {
            DisplayFormatType::TreeRender => write!(
                f,
                "join_type=Inner\non={on}\nbackend={}\nalgorithm=PHJ-OM",
                self.backend
            ),
            _ => {
                write!(
                    f,
                    "GpuJoinExec: join_type=Inner, on=[{on}], backend={}, algorithm=PHJ-OM",
                    self.backend
                )?;
                if let Some(p) = &self.projection {
                    // As HashJoinExec shows it: name@index in the join's full output.
                    let (join_schema, _) = build_join_schema(
                        &self.left.schema(),
                        &self.right.schema(),
                        &JoinType::Inner,
                    );
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
                if matches!(t, DisplayFormatType::Verbose) {
                    write!(f, ", replaced_mode={:?}", self.replaced_mode)?;
                }
                Ok(())
            }
        }
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
        InputDistributionRequirements::new(vec![
            Distribution::SinglePartition,
            Distribution::UnspecifiedDistribution,
        ])
    }

    fn maintains_input_order(&self) -> Vec<bool> {
        vec![false, false]
    }

    fn children(&self) -> Vec<&Arc<dyn ExecutionPlan>> {
        vec![&self.left, &self.right]
    }

    fn apply_expressions(
        &self,
        f: &mut dyn FnMut(&Arc<dyn PhysicalExpr>) -> Result<TreeNodeRecursion>,
    ) -> Result<TreeNodeRecursion> {
        let mut recursion = TreeNodeRecursion::Continue;
        for (l, r) in &self.on {
            for e in [l, r] {
                recursion = f(e)?;
                if matches!(recursion, TreeNodeRecursion::Stop) {
                    return Ok(recursion);
                }
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
        Ok(Arc::new(Self::try_new(
            left,
            right,
            self.on.clone(),
            self.projection.clone(),
            self.null_equality,
            self.replaced_mode,
            self.backend,
            self.probe_chunk_rows,
        )?))
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
        let parts = self.right.output_partitioning().partition_count();
        if partition >= parts {
            return internal_err!("GpuJoinExec has {parts} partitions, asked for {partition}");
        }
        let build = self
            .shared_build(&context)?
            .map(|r| r.map_err(datafusion::common::DataFusionError::Shared))
            .boxed();
        Ok(Box::pin(GpuJoinStream::new(
            self.schema(),
            partition,
            Arc::clone(&self.right),
            context,
            build,
            self.probe_chunk_rows,
            Arc::clone(&self.layout),
            GpuJoinMetrics::new(partition, &self.metrics, self.peak_device_memory.clone()),
        )))
    }

    fn metrics(&self) -> Option<MetricsSet> {
        Some(self.metrics.clone_inner())
    }

    fn try_swapping_with_projection(
        &self,
        projection: &ProjectionExec,
    ) -> Result<Option<Arc<dyn ExecutionPlan>>> {
        try_embed_projection(projection, self)
    }
}
