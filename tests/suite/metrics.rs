//! EXPLAIN ANALYZE of a query on `GpuJoinExec` shows its rows, per-phase times, bytes moved and peak device
//! memory; EXPLAIN shows the join type, keys, backend and algorithm.

use arrow::util::pretty::pretty_format_batches;

use crate::harness::{Outcome, Suite, block_on};
use crate::slt::session;

pub fn register(suite: &mut Suite) {
    let options = suite.options.clone();
    suite.add("metrics::explain_analyze_shows_phases", move || {
        if options.require_cuda && !options.cuda_present() {
            return Err("--require-cuda, but no usable CUDA device".into());
        }
        let ctx = session(&options, true);
        let text = block_on(async {
            ctx.sql("CREATE TABLE a AS SELECT value AS k, value * 2 AS v FROM generate_series(1, 5000)").await?.collect().await?;
            ctx.sql("CREATE TABLE b AS SELECT value % 1000 AS k, value AS w FROM generate_series(1, 20000)").await?.collect().await?;
            let out = ctx.sql("EXPLAIN ANALYZE SELECT count(*), sum(a.v + b.w) FROM a JOIN b ON a.k = b.k").await?.collect().await?;
            Ok::<_, datafusion::common::DataFusionError>(pretty_format_batches(&out)?.to_string())
        })
        .map_err(|e| e.to_string())?;
        let line = text.lines().find(|l| l.contains("GpuJoinExec")).ok_or_else(|| format!("no GpuJoinExec in\n{text}"))?;
        let backend = if options.backend() == "cuda" { "backend=cuda:0" } else { "backend=host" };
        for want in ["join_type=Inner", "on=[(k@0, k@0)]", backend, "algorithm=HASH", "output_rows=19.98 K", "output_batches=", "build_rows=5.00 K", "probe_rows=20.00 K", "upload_time=", "transform_time=", "match_time=", "materialize_time=", "download_time=", "bytes_uploaded=", "bytes_downloaded=", "peak_device_memory="] {
            if !line.contains(want) {
                return Err(format!("`{want}` missing from: {line}"));
            }
        }
        Ok(Outcome::Passed)
    });
}
