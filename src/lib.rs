//! Runs Apache DataFusion's joins on NVIDIA GPUs.
//!
//! [`GpuJoinRule`], a physical optimizer rule, replaces eligible `HashJoinExec` and
//! `SortMergeJoinExec` nodes (and cross, nested loop and piecewise merge joins whose predicate
//! compiles for the device: [`filter`])
//! with [`GpuJoinExec`], a streaming join: the build side is radix-partitioned once on the device
//! into a bucketed table (by a hash of its keys, HASH, or for dense keys by their values,
//! DIRECT: [`join::algorithm`]), and the probe side streams through it chunk by chunk, in probe
//! order, through one device lane per join that overlaps uploads, kernels and downloads — on a
//! CUDA GPU, or with the same algorithm on the CPU ([`backend::HostBackend`]) where there is
//! none. Relations already on the device can also be joined with PHJ-OM or SMJ-OM (Wu et
//! al., VLDB 2024; [`join::join_on_device`], [`join::smj::sort_merge_join`]).
//!
//! ```text
//!  SQL / DataFrame ─► physical plan with HashJoinExec ─► GpuJoinRule ─► GpuJoinExec
//!  build batches ─► pinned pages ─► upload ─► encode keys ─► bucket (once, on the device)
//!  probe chunks  ─► pinned pages ─► upload ─► encode ─► count → scan → write pairs
//!                   ─► gather output columns ─► download ─► Arrow batches (no copy)
//! ```
//!
//! # Use
//!
//! ```no_run
//! # async fn f() -> datafusion::common::Result<()> {
//! let ctx = datafusion_gpu_join::gpu_session_context(Default::default());
//! ctx.sql("CREATE TABLE r AS VALUES (1, 'a')").await?;
//! let df = ctx.sql("SELECT * FROM r a JOIN r b ON a.column1 = b.column1").await?;
//! df.show().await?;
//! # Ok(()) }
//! ```
//! [`GpuJoinCodec`] carries `GpuJoinExec` in `datafusion-proto` plans, for engines that send
//! plans to other processes. [`RuntimeFilterExec`], which the rule places above scans under a
//! join's probe side, applies the join's dynamic filter where the scan cannot.
//!
//! `SET gpu_join.enabled = false` turns the rule off; `SET gpu_join.backend = 'host'` runs
//! the algorithm on the CPU; `SET gpu_join.memory_limit = '8GiB'` bounds the device memory GPU
//! joins hold at once. See [`GpuJoinConfig`] for every setting.

pub mod backend;
pub mod codec;
pub mod columns;
pub mod config;
pub mod device;
pub mod exec;
pub mod filter;
pub mod join;
pub mod rule;
pub mod runtime_filter;
mod trace;

use std::sync::Arc;

use datafusion::execution::SessionStateBuilder;
use datafusion::physical_optimizer::PhysicalOptimizerRule;
use datafusion::physical_optimizer::optimizer::PhysicalOptimizer;
use datafusion::prelude::{SessionConfig, SessionContext};

pub use codec::{DecodedJoins, GpuJoinCodec};
pub use config::GpuJoinConfig;
pub use exec::{BuildCache, GpuJoinExec};
pub use rule::GpuJoinRule;
pub use runtime_filter::RuntimeFilterExec;

/// DataFusion's physical optimizer rules with [`GpuJoinRule`]'s passes added
/// ([`add_gpu_join_rules`]).
pub fn physical_optimizer_rules() -> Vec<Arc<dyn PhysicalOptimizerRule + Send + Sync>> {
    let mut rules = PhysicalOptimizer::new().rules;
    add_gpu_join_rules(&mut rules);
    rules
}

/// Adds [`GpuJoinRule`] to a list of physical optimizer rules: before `EnsureRequirements` (so
/// the plan is adapted to `GpuJoinExec`'s input requirements and checked by
/// `SanityCheckPlan`), and its late pass ([`GpuJoinRule::late`]) after the last
/// `ProjectionPushdown`. A list without those rules gets the rule before `SanityCheckPlan`, or
/// last.
pub fn add_gpu_join_rules(rules: &mut Vec<Arc<dyn PhysicalOptimizerRule + Send + Sync>>) {
    let at = rules
        .iter()
        .position(|r| r.name() == "EnsureRequirements")
        .or_else(|| rules.iter().position(|r| r.name() == "SanityCheckPlan"))
        .unwrap_or(rules.len());
    rules.insert(at, Arc::new(GpuJoinRule::new()));
    if let Some(last) = rules.iter().rposition(|r| r.name() == "ProjectionPushdown")
        && last > at
    {
        rules.insert(last + 1, Arc::new(GpuJoinRule::late()));
    }
}

/// A [`SessionStateBuilder`] with the `gpu_join` settings registered in `config` and
/// [`GpuJoinRule`] in the physical optimizer.
pub fn gpu_session_state_builder(config: SessionConfig) -> SessionStateBuilder {
    let config = with_gpu_join_config(config);
    SessionStateBuilder::new()
        .with_config(config)
        .with_default_features()
        .with_physical_optimizer_rules(physical_optimizer_rules())
}

/// Registers the `gpu_join` settings (defaults) and the session's [`BuildCache`] in `config`,
/// unless already there.
pub fn with_gpu_join_config(config: SessionConfig) -> SessionConfig {
    let config = if config.options().extensions.get::<GpuJoinConfig>().is_some() {
        config
    } else {
        config.with_option_extension(GpuJoinConfig::default())
    };
    if config.get_extension::<BuildCache>().is_some() {
        config
    } else {
        config.with_extension(Arc::new(BuildCache::default()))
    }
}

/// The build sides a session keeps across its queries (`gpu_join.cache_bytes`), if its config
/// has a cache ([`with_gpu_join_config`] registers one): `build_cache(ctx.state().config())`.
pub fn build_cache(config: &SessionConfig) -> Option<Arc<BuildCache>> {
    config.get_extension::<BuildCache>()
}

/// A [`SessionContext`] whose hash joins run on the GPU where they can.
pub fn gpu_session_context(config: SessionConfig) -> SessionContext {
    SessionContext::new_with_state(gpu_session_state_builder(config).build())
}
