//! Ballista 55: a scheduler and executors started in this process, planning with
//! `GpuJoinRule` and sending plans with `GpuJoinCodec` around Ballista's own codec.
//!
//! A deployment does the same in its own scheduler and executor binaries:
//! - the scheduler's session builder ([`scheduler_session`]) adds the rule to the physical
//!   optimizer, sets `gpu_join.distributed` (the scheduler needs no GPU: it places
//!   `GpuJoinExec` wherever the rule's gates pass, and each join gathers its build side into
//!   one partition, which Ballista reads in every task that probes), and turns Ballista's
//!   adaptive planner off (it would plan without the rule);
//! - scheduler and executors both use [`codec`]: `GpuJoinCodec` wrapping
//!   `BallistaPhysicalExtensionCodec`;
//! - every executor decides where each join runs as it decodes it, from the job's settings
//!   (the client's `gpu_join.*`) and its own hardware: its GPU, the host backend, or, with
//!   `gpu_join.backend = auto` and no usable GPU, DataFusion's own join.

use std::sync::Arc;
use std::time::Duration;

use ballista::prelude::SessionContextExt;
use ballista_core::extension::SessionConfigExt;
use ballista_core::registry::BallistaFunctionRegistry;
use ballista_core::serde::protobuf::scheduler_grpc_client::SchedulerGrpcClient;
use ballista_core::serde::{
    BallistaCodec, BallistaLogicalExtensionCodec, BallistaPhysicalExtensionCodec,
};
use ballista_core::utils::default_session_builder;
use ballista_core::{ConfigProducer, RuntimeProducer};
use ballista_executor::new_standalone_executor_from_builder;
use ballista_scheduler::SessionBuilder;
use ballista_scheduler::standalone::new_standalone_scheduler_with_builder;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::SessionState;
use datafusion::execution::SessionStateBuilder;
use datafusion::execution::runtime_env::RuntimeEnvBuilder;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpu_join::{GpuJoinCodec, physical_optimizer_rules, with_gpu_join_config};

/// A Ballista cluster in this process, and a client connected to it.
pub struct Cluster {
    /// A client session: queries sent through it run on the executors.
    pub client: SessionContext,
    /// The codec every executor decodes with (its counts say where their joins ran).
    pub codec: GpuJoinCodec,
}

/// `GpuJoinCodec` around Ballista's physical codec: what the scheduler encodes stage plans
/// with and the executors decode them with.
pub fn codec() -> GpuJoinCodec {
    GpuJoinCodec::new(Arc::new(BallistaPhysicalExtensionCodec::default()))
}

/// The settings every Ballista process starts from: Ballista's, with `gpu_join`'s registered
/// (so that a job's `gpu_join.*` settings reach the scheduler and the executors).
pub fn base_config() -> SessionConfig {
    with_gpu_join_config(SessionConfig::new_with_ballista())
}

/// The scheduler's session for a job: Ballista's default, with `GpuJoinRule` in its physical
/// optimizer, planning for executors (`gpu_join.distributed`: no GPU needed here, the
/// executors choose where joins run), with Ballista's static planner: its adaptive one (on by
/// default) plans with a fixed list of physical optimizer rules, which has no room for
/// `GpuJoinRule`.
pub fn scheduler_session(config: SessionConfig) -> Result<SessionState> {
    let mut config = with_gpu_join_config(config);
    config.options_mut().set("gpu_join.distributed", "true")?;
    config
        .options_mut()
        .set("ballista.planner.adaptive.enabled", "false")?;
    let state = default_session_builder(config)?;
    Ok(SessionStateBuilder::new_from_existing(state)
        .with_physical_optimizer_rules(physical_optimizer_rules())
        .build())
}

/// Starts a scheduler and `executors` executors of `vcores` task slots each, and connects a
/// client whose session holds `settings` (`gpu_join.*` and DataFusion's own).
pub async fn start(executors: usize, vcores: usize, settings: &[(&str, &str)]) -> Result<Cluster> {
    if executors == 0 || vcores == 0 {
        return Err(DataFusionError::Configuration(
            "a Ballista cluster needs at least one executor with one task slot".into(),
        ));
    }
    let codec = codec();
    let ballista_codec = || {
        BallistaCodec::new(
            Arc::new(BallistaLogicalExtensionCodec::default()),
            Arc::new(codec.clone()),
        )
    };
    let config_producer: ConfigProducer = Arc::new(base_config);
    let session_builder: SessionBuilder = Arc::new(scheduler_session);
    let address = new_standalone_scheduler_with_builder(
        session_builder,
        config_producer.clone(),
        ballista_codec(),
    )
    .await
    .map_err(|e| DataFusionError::Execution(format!("Ballista scheduler: {e}")))?;
    let url = format!("http://localhost:{}", address.port());
    let runtime_producer: RuntimeProducer =
        Arc::new(|_: &SessionConfig| RuntimeEnvBuilder::new().build_arc());
    for _ in 0..executors {
        let scheduler = connect(&url).await?;
        new_standalone_executor_from_builder(
            scheduler,
            vcores,
            config_producer.clone(),
            runtime_producer.clone(),
            ballista_codec(),
            BallistaFunctionRegistry::default(),
        )
        .await
        .map_err(|e| DataFusionError::Execution(format!("Ballista executor: {e}")))?;
    }
    let mut config = base_config();
    for (key, value) in settings {
        config.options_mut().set(key, value)?;
    }
    let state = SessionStateBuilder::new()
        .with_config(config)
        .with_default_features()
        .build();
    let client =
        SessionContext::remote_with_state(&format!("df://localhost:{}", address.port()), state)
            .await?;
    Ok(Cluster { client, codec })
}

/// A client of the scheduler at `url`, once it listens (it starts listening as it is spawned).
async fn connect(url: &str) -> Result<SchedulerGrpcClient<tonic::transport::Channel>> {
    let mut last = None;
    for _ in 0..100 {
        match SchedulerGrpcClient::connect(url.to_string()).await {
            Ok(client) => return Ok(client),
            Err(e) => last = Some(e),
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Err(DataFusionError::Execution(format!(
        "Ballista scheduler at {url} did not answer: {last:?}"
    )))
}
