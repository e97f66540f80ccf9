//! TPC-H Q3, Q5 and Q10 on a Ballista cluster started in this process (a scheduler and
//! executors), with `GpuJoinExec` on the executors; the answers are compared with a local
//! `SessionContext`'s (DataFusion's own joins).
//!
//! ```text
//! cargo run --release -p datafusion-gpu-join-integrations --example ballista -- \
//!     [--scale SF] [--nodes EXECUTORS] [--set gpu_join.backend=host ...]
//! ```
//!
//! Prints `results equal: true` or `results equal: false`, and exits non-zero on false.

use std::process::ExitCode;

use datafusion::common::Result;
use datafusion_gpu_join_integrations::example::Options;
use datafusion_gpu_join_integrations::{ballista, tpch};

#[tokio::main]
async fn main() -> Result<ExitCode> {
    let options = Options::parse(std::env::args().skip(1))?;
    let data = tempfile::Builder::new()
        .prefix("gpu-join-ballista")
        .tempdir()?;
    tpch::write_tables(data.path(), options.scale, 2 * options.nodes)?;
    let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
    let cluster = ballista::start(
        options.nodes,
        (cores / options.nodes).max(1),
        &options.settings(),
    )
    .await?;
    let compared = tpch::compare_with_local(&cluster.client, &cluster.codec, data.path()).await?;
    Ok(match tpch::report("Ballista", &compared) {
        true => ExitCode::SUCCESS,
        false => ExitCode::FAILURE,
    })
}
