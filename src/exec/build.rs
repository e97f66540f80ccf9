//! The build side of a `GpuJoinExec`, made once and shared by every output partition: the
//! left input collected, its keys encoded and every needed column partitioned on the backend.
//! If the keys cannot be encoded in 64 bits, the join falls back to DataFusion's
//! `HashJoinExec` over the already collected batches.

use std::sync::Arc;

use arrow::array::{ArrayRef, RecordBatch};
use datafusion::common::{NullEquality, Result};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::execution::TaskContext;
use datafusion::logical_expr::JoinType;
use datafusion::physical_plan::joins::{HashJoinExec, JoinOn, PartitionMode};
use datafusion::physical_plan::{ExecutionPlan, collect};

use super::metrics::GpuJoinMetrics;
use crate::backend::{CudaBackend, HostBackend};
use crate::columns::{Fitted, KeyEncoder};
use crate::join::{BuildSide, OutputLayout};

/// The shared build state of one `GpuJoinExec` execution.
pub enum SharedBuild {
    Host(HostBackend, BuildSide<HostBackend>),
    Cuda(CudaBackend, BuildSide<CudaBackend>),
    /// Some key column has no non-null build row: the join is empty.
    Empty,
    /// The keys do not fit the GPU path: DataFusion's own hash join runs instead.
    Fallback(Arc<HashJoinExec>),
}

/// Everything needed to make the build side.
pub struct BuildInputs {
    pub left: Arc<dyn ExecutionPlan>,
    pub right: Arc<dyn ExecutionPlan>,
    pub on: JoinOn,
    pub projection: Option<Vec<usize>>,
    pub null_equality: NullEquality,
    pub layout: OutputLayout,
    pub backend: super::JoinBackend,
}

/// Collects the left input and builds the shared state.
pub async fn make_build(
    inputs: BuildInputs,
    ctx: Arc<TaskContext>,
    metrics: GpuJoinMetrics,
) -> Result<Arc<SharedBuild>> {
    let batches = collect(Arc::clone(&inputs.left), ctx).await?;
    let rows: usize = batches.iter().map(|b| b.num_rows()).sum();
    metrics.build_rows.add(rows);
    tokio::task::spawn_blocking(move || build_blocking(inputs, batches, &metrics))
        .await
        .map_err(|e| datafusion::common::exec_datafusion_err!("build task failed: {e}"))?
        .map(Arc::new)
}

fn build_blocking(
    inputs: BuildInputs,
    batches: Vec<RecordBatch>,
    metrics: &GpuJoinMetrics,
) -> Result<SharedBuild> {
    let keys: Vec<Vec<&ArrayRef>> = inputs
        .layout
        .build_keys
        .iter()
        .map(|&c| batches.iter().map(|b| b.column(c)).collect())
        .collect();
    let encoder = match KeyEncoder::fit(&keys)? {
        Fitted::Encoder(e) => e,
        Fitted::NoMatches => return Ok(SharedBuild::Empty),
        Fitted::TooWide => {
            log::info!("GpuJoinExec: key ranges exceed 64 bits; running HashJoinExec instead");
            return fallback(inputs, batches);
        }
    };
    let phases = &metrics.phases;
    Ok(match inputs.backend {
        super::JoinBackend::Host => {
            let b = HostBackend;
            let side = BuildSide::new(&b, &batches, &inputs.layout, encoder, phases)?;
            SharedBuild::Host(b, side)
        }
        super::JoinBackend::Cuda(device) => {
            let b = CudaBackend::new(crate::device::cuda_device(device)?, Default::default())?;
            let side = BuildSide::new(&b, &batches, &inputs.layout, encoder, phases)?;
            if let Some((_, peak)) = crate::backend::Backend::memory_use(&b) {
                metrics.peak_device_memory.set_max(peak);
            }
            SharedBuild::Cuda(b, side)
        }
    })
}

fn fallback(inputs: BuildInputs, batches: Vec<RecordBatch>) -> Result<SharedBuild> {
    let schema = inputs.left.schema();
    let left = MemorySourceConfig::try_new_exec(&[batches], schema, None)?;
    let join = HashJoinExec::try_new(
        left,
        inputs.right,
        inputs.on,
        None,
        &JoinType::Inner,
        inputs.projection,
        PartitionMode::CollectLeft,
        inputs.null_equality,
        false,
    )?;
    Ok(SharedBuild::Fallback(Arc::new(join)))
}
