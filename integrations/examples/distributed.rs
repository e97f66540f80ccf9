//! TPC-H Q3, Q5 and Q10 on a datafusion-distributed cluster started in this process (workers
//! on local ports), with `GpuJoinExec` on the workers; the answers are compared with a local
//! `SessionContext`'s (DataFusion's own joins).
//!
//! ```text
//! cargo run --release -p datafusion-gpu-join-integrations --example distributed -- \
//!     [--scale SF] [--nodes WORKERS] [--set gpu_join.backend=host ...]
//! ```
//!
//! Prints `results equal: true` or `results equal: false`, and exits non-zero on false.

use std::process::ExitCode;

use datafusion::common::Result;
use datafusion_gpu_join_integrations::example::Options;
use datafusion_gpu_join_integrations::{distributed, tpch};

#[tokio::main]
async fn main() -> Result<ExitCode> {
    let options = Options::parse(std::env::args().skip(1))?;
    let data = tempfile::Builder::new()
        .prefix("gpu-join-distributed")
        .tempdir()?;
    tpch::write_tables(data.path(), options.scale, 2 * options.nodes)?;
    // Scans of more than a MiB spread across the workers.
    let cluster = distributed::start(options.nodes, 1 << 20, &options.settings()).await?;
    let compared = tpch::compare_with_local(&cluster.client, &cluster.codec, data.path()).await?;
    Ok(match tpch::report("datafusion-distributed", &compared) {
        true => ExitCode::SUCCESS,
        false => ExitCode::FAILURE,
    })
}
