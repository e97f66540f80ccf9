//! datafusion-distributed 4: workers served over gRPC on local ports in this process, a
//! coordinating session that plans with `GpuJoinRule`, and `GpuJoinCodec` on both sides.
//!
//! A deployment does the same across machines:
//! - the coordinating session is [`gpu_session_state_builder`] with `gpu_join.distributed` set
//!   (joins placed without a GPU needed there, each gathering its build side into one
//!   partition), the distributed planner, and the codec;
//! - every worker's session ([`worker_session`]) holds the worker's own `gpu_join` settings
//!   and decodes with the codec. It decides where each join runs as it decodes it: its GPU,
//!   the host backend, or, with `gpu_join.backend = auto` and no usable GPU, DataFusion's own
//!   join.
//!
//! The distributed planner broadcasts `HashJoinExec`'s build sides, not `GpuJoinExec`'s: a
//! stage holding a `GpuJoinExec` runs in one task (with its partitions in parallel), and the
//! stages below it, scans included, across the workers.

use std::net::{Ipv4Addr, SocketAddr};

use async_trait::async_trait;
use datafusion::common::{DataFusionError, Result};
use datafusion::execution::SessionState;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_distributed::{
    DistributedExt, SessionStateBuilderExt, Worker, WorkerQueryContext, WorkerResolver,
};
use datafusion_gpu_join::{GpuJoinCodec, gpu_session_state_builder, with_gpu_join_config};
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio_stream::wrappers::TcpListenerStream;
use tonic::transport::Server;
use url::Url;

/// A datafusion-distributed cluster in this process, and a coordinating session.
pub struct Cluster {
    /// The coordinating session: queries run through it are planned into stages that run on
    /// the workers.
    pub client: SessionContext,
    /// The codec every worker decodes with (its counts say where their joins ran).
    pub codec: GpuJoinCodec,
}

/// The codec: `GpuJoinCodec` around DataFusion's default one, next to which datafusion-
/// distributed puts its own.
pub fn codec() -> GpuJoinCodec {
    GpuJoinCodec::default()
}

/// A worker's session for one request: the worker's own `gpu_join` settings (`settings`,
/// name–value pairs), which decide where the joins it decodes run, and `codec` to decode the
/// stage plan with.
///
/// The settings are the worker's, not the coordinator's: datafusion-distributed sends a
/// config extension's settings by the names its `entries()` lists without the extension's
/// prefix (DataFusion's `extensions_options!` convention), while `gpu_join`'s list themselves
/// under their full names, which Ballista and `SHOW` need.
pub async fn worker_session(
    ctx: WorkerQueryContext,
    codec: GpuJoinCodec,
    settings: &[(String, String)],
) -> Result<SessionState> {
    let mut builder = ctx.builder;
    let config = builder.config().get_or_insert_with(SessionConfig::new);
    *config = with_gpu_join_config(config.clone());
    for (key, value) in settings {
        config.options_mut().set(key, value)?;
    }
    Ok(builder.with_distributed_user_codec(codec).build())
}

/// Starts `workers` workers, and a coordinating session; both hold `settings` (`gpu_join.*`
/// and DataFusion's own). The coordinator's file scans split into tasks of about
/// `bytes_per_task` bytes (fewer bytes, more tasks, up to one per worker).
pub async fn start(
    workers: usize,
    bytes_per_task: usize,
    settings: &[(&str, &str)],
) -> Result<Cluster> {
    if workers == 0 {
        return Err(DataFusionError::Configuration(
            "a datafusion-distributed cluster needs at least one worker".into(),
        ));
    }
    let codec = codec();
    let worker_settings: Arc<Vec<(String, String)>> = Arc::new(
        settings
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect(),
    );
    let mut urls = vec![];
    for _ in 0..workers {
        let listener = TcpListener::bind(SocketAddr::from((Ipv4Addr::LOCALHOST, 0))).await?;
        let port = listener.local_addr()?.port();
        urls.push(
            Url::parse(&format!("http://127.0.0.1:{port}"))
                .map_err(|e| DataFusionError::Execution(e.to_string()))?,
        );
        let (worker_codec, worker_settings) = (codec.clone(), Arc::clone(&worker_settings));
        let worker = Worker::from_session_builder(move |ctx: WorkerQueryContext| {
            let (codec, settings) = (worker_codec.clone(), Arc::clone(&worker_settings));
            async move { worker_session(ctx, codec, &settings).await }
        });
        tokio::spawn(
            Server::builder()
                .add_service(worker.into_worker_server())
                .serve_with_incoming(TcpListenerStream::new(listener)),
        );
    }
    let mut config = with_gpu_join_config(SessionConfig::new());
    config.options_mut().set("gpu_join.distributed", "true")?;
    for (key, value) in settings {
        config.options_mut().set(key, value)?;
    }
    let state = gpu_session_state_builder(config)
        .with_distributed_user_codec(codec.clone())
        .with_distributed_worker_resolver(Workers(urls))
        .with_distributed_planner()
        .with_distributed_file_scan_config_bytes_per_partition(bytes_per_task)?
        .build();
    Ok(Cluster {
        client: SessionContext::new_with_state(state),
        codec,
    })
}

/// The workers' addresses.
struct Workers(Vec<Url>);

#[async_trait]
impl WorkerResolver for Workers {
    fn get_urls(&self) -> Result<Vec<Url>, DataFusionError> {
        Ok(self.0.clone())
    }
}
