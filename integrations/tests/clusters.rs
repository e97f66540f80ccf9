//! Ballista and datafusion-distributed clusters in this process run TPC-H Q3, Q5 and Q10 at
//! scale factor 0.01, and their answers must equal a local `SessionContext`'s.
//!
//! - With `gpu_join.backend = host` and `gpu_join.min_build_rows = 0`, every join the
//!   executors decode is `GpuJoinExec` on the host backend.
//! - With `gpu_join.backend = auto`, an executor decodes the joins the scheduler placed as
//!   `GpuJoinExec` on its GPU where it has one, and as DataFusion's own join where it has none.

use datafusion_gpu_join::DecodedJoins;
use datafusion_gpu_join_integrations::tpch::{self, Compared};
use datafusion_gpu_join_integrations::{ballista, distributed};

const SCALE: f64 = 0.01;

/// Every join on the host backend.
const HOST: [(&str, &str); 2] = [
    ("gpu_join.backend", "host"),
    ("gpu_join.min_build_rows", "0"),
];

/// The executors choose; the gates let every join with a build side through.
const AUTO: [(&str, &str); 3] = [
    ("gpu_join.backend", "auto"),
    ("gpu_join.min_build_rows", "1"),
    ("gpu_join.min_input_rows", "1"),
];

fn gpu_present() -> bool {
    datafusion_gpu_join::device::cuda_device(0).is_ok()
}

/// Fails unless every answer is equal and every query's joins ran where `want` says.
fn check(compared: &[Compared], want: fn(&DecodedJoins) -> bool) {
    assert_eq!(compared.len(), tpch::QUERIES.len());
    for c in compared {
        assert!(
            c.equal,
            "Q{}: the answer differs from DataFusion's: {c:?}",
            c.query
        );
        assert!(c.rows > 0, "Q{}: no rows: {c:?}", c.query);
        assert!(
            want(&c.joins),
            "Q{}: joins decoded where they should not be: {c:?}",
            c.query
        );
    }
}

fn on_host(j: &DecodedJoins) -> bool {
    j.host > 0 && j.gpu == 0 && j.datafusion == 0
}

fn where_the_executor_chose(j: &DecodedJoins) -> bool {
    match gpu_present() {
        true => j.gpu > 0 && j.host == 0 && j.datafusion == 0,
        false => j.datafusion > 0 && j.gpu == 0 && j.host == 0,
    }
}

async fn on_ballista(settings: &[(&str, &str)]) -> Vec<Compared> {
    let data = tempfile::tempdir().unwrap();
    tpch::write_tables(data.path(), SCALE, 4).unwrap();
    let cluster = ballista::start(2, 2, settings).await.unwrap();
    tpch::compare_with_local(&cluster.client, &cluster.codec, data.path())
        .await
        .unwrap()
}

async fn on_distributed(settings: &[(&str, &str)]) -> Vec<Compared> {
    let data = tempfile::tempdir().unwrap();
    tpch::write_tables(data.path(), SCALE, 4).unwrap();
    let cluster = distributed::start(3, 1 << 16, settings).await.unwrap();
    tpch::compare_with_local(&cluster.client, &cluster.codec, data.path())
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ballista_executors_run_gpu_joins_on_the_host_backend() {
    check(&on_ballista(&HOST).await, on_host);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn ballista_executors_choose_where_joins_run() {
    check(&on_ballista(&AUTO).await, where_the_executor_chose);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn distributed_workers_run_gpu_joins_on_the_host_backend() {
    check(&on_distributed(&HOST).await, on_host);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn distributed_workers_choose_where_joins_run() {
    check(&on_distributed(&AUTO).await, where_the_executor_chose);
}
