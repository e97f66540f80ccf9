//! [`GpuJoinRule`]: the physical optimizer rule that swaps eligible `HashJoinExec` nodes for
//! [`GpuJoinExec`].
//!
//! ```text
//!   HashJoinExec (any join type, column keys     GpuJoinExec
//!   of integer/date/timestamp types, no filter, ─►   ├── left  (build)
//!   supported output types, big build side)          └── right (probe)
//!
//! The new node keeps the replaced join's join type, projection and `fetch`.
//! ```
//! It runs after `JoinSelection` (which picks the build side) and before `EnsureRequirements`,
//! which then adapts the plan to `GpuJoinExec`'s input requirements instead of adding the
//! hash repartitioning a CPU partitioned join would need. Anything else stays a
//! `HashJoinExec`; the reason is logged at debug level.
//!
//! With `gpu_join.backend = auto` on a machine without a usable GPU, joins stay DataFusion's:
//! the host backend (the GPU algorithm's CPU twin) is slower than `HashJoinExec`. Only
//! `gpu_join.min_build_rows = 0` (tests and benchmarks) or `backend = host` put them on it.

use std::sync::Arc;

use datafusion::common::config::ConfigOptions;
use datafusion::common::tree_node::{Transformed, TransformedResult, TreeNode};
use datafusion::common::{Result, plan_err};
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::execution_plan::ExecutionPlanProperties;
use datafusion::physical_plan::joins::HashJoinExec;
use datafusion::physical_plan::statistics::{StatisticsArgs, StatisticsContext};

use crate::config::{BackendChoice, GpuJoinConfig};
use crate::exec::{GpuJoinExecBuilder, JoinBackend};

/// Replaces eligible `HashJoinExec` nodes with [`GpuJoinExec`].
#[derive(Debug, Default)]
pub struct GpuJoinRule;

impl GpuJoinRule {
    pub fn new() -> Self {
        Self
    }

    /// Why this rule, under the `gpu_join` settings in `options`, keeps `join` a
    /// `HashJoinExec`; `None` when it would replace it.
    pub fn fallback_reason(join: &HashJoinExec, options: &ConfigOptions) -> Option<String> {
        let config = settings(options);
        if !config.enabled {
            return Some("gpu_join.enabled = false".into());
        }
        if let Some(reason) = unsupported(join, &config) {
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
fn settings(options: &ConfigOptions) -> GpuJoinConfig {
    options
        .extensions
        .get::<GpuJoinConfig>()
        .cloned()
        .unwrap_or_default()
}

/// Why a hash join stays on the CPU, or `None` if the GPU path can run it.
fn unsupported(join: &HashJoinExec, config: &GpuJoinConfig) -> Option<String> {
    if join.null_aware {
        return Some("null-aware joins are not supported yet".into());
    }
    if join.left.boundedness().is_unbounded() || join.right.boundedness().is_unbounded() {
        return Some("unbounded inputs".into());
    }
    if let Some(reason) = crate::exec::unsupported(
        &join.left.schema(),
        &join.right.schema(),
        &join.on,
        &join.schema(),
        join.filter(),
    ) {
        return Some(reason);
    }
    let stats = StatisticsContext::new();
    let rows = |p: &Arc<dyn ExecutionPlan>| {
        let s = stats.compute(p.as_ref(), &StatisticsArgs::new()).ok()?;
        s.num_rows.get_value().copied()
    };
    if let Some(build) = rows(&join.left)
        && build < config.min_build_rows
    {
        return Some(format!(
            "a build side of about {build} rows is below gpu_join.min_build_rows = {}",
            config.min_build_rows
        ));
    }
    None
}

/// The backend `config` asks for, resolved against this machine; `None` when joins should stay
/// DataFusion's (`auto` without a usable GPU, unless `min_build_rows` is 0).
pub fn resolve_backend(config: &GpuJoinConfig) -> Result<Option<JoinBackend>> {
    match config.backend {
        BackendChoice::Host => Ok(Some(JoinBackend::Host)),
        BackendChoice::Cuda => match crate::device::cuda_device(config.device) {
            Ok(_) => Ok(Some(JoinBackend::Cuda(config.device))),
            Err(e) => plan_err!("gpu_join.backend = cuda, but no usable GPU: {e}"),
        },
        BackendChoice::Auto => Ok(match crate::device::cuda_device(config.device) {
            Ok(_) => Some(JoinBackend::Cuda(config.device)),
            Err(e) if config.min_build_rows == 0 => {
                log::debug!("GpuJoinRule: no usable GPU ({e}); using the host backend");
                Some(JoinBackend::Host)
            }
            Err(e) => {
                log::debug!(
                    "GpuJoinRule: no usable GPU ({e}), and the host backend \
                     (gpu_join.backend = auto) would be slower: joins stay DataFusion's"
                );
                None
            }
        }),
    }
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
        plan.transform_up(|plan| {
            let Some(join) = plan.downcast_ref::<HashJoinExec>() else {
                return Ok(Transformed::no(plan));
            };
            if let Some(reason) = unsupported(join, &config) {
                log::debug!("GpuJoinRule: keeping HashJoinExec: {reason}");
                return Ok(Transformed::no(plan));
            }
            let backend = match backend {
                Some(b) => b,
                None => *backend.insert(resolve_backend(&config)?),
            };
            let Some(backend) = backend else {
                return Ok(Transformed::no(plan));
            };
            let exec = GpuJoinExecBuilder::from_hash_join(join)
                .with_backend(backend)
                .with_probe_chunk_rows(config.probe_chunk_rows)
                .with_memory_limit(config.memory_limit)
                .build()?;
            Ok(Transformed::yes(Arc::new(exec) as Arc<dyn ExecutionPlan>))
        })
        .data()
    }

    fn name(&self) -> &str {
        "GpuJoinRule"
    }

    fn schema_check(&self) -> bool {
        true
    }
}
