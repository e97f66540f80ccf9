//! The crate's integration suite, one binary (`harness = false`) so that the GPU host needs to
//! run only one DataFusion-sized executable:
//!
//! - `slt`: `sqllogictests/*.slt` with the rule on (labels `gpu`) and off (label `cpu`);
//! - `datafusion_slt`: DataFusion's own `.slt` files (from the `datafusion-sqllogictest` crate)
//!   with the rule forced on, each record against the same file with the rule off;
//! - `differential`: random joins, rule on vs. rule off, same multiset of rows;
//! - `primitives`: each CUDA primitive equals its host twin (GPU only);
//! - `kernels`: every kernel compiles under NVRTC for sm_80 and sm_90 (needs libnvrtc only);
//! - `metrics`: EXPLAIN ANALYZE shows rows, phase times and peak device memory;
//! - `engine`: the streaming engine's contracts (passes, fetch, dynamic filter, memory pool
//!   reservation, nothing left behind after cancelled, failed and concurrent queries);
//! - `runtime_filter`: a join's dynamic filter applied above in-memory scans under its probe
//!   side (`RuntimeFilterExec`);
//! - `orientation`: inner and semi joins built on their smaller side (`gpu_join.orient_joins`);
//! - `build_cache`: build sides kept across a session's queries (`gpu_join.cache_bytes`);
//! - `grace`: build sides larger than the memory limit, joined in groups;
//! - `devices`: joins spread over two devices (two GPUs, or two lanes of the host backend);
//! - `exchange`: relations dealt out by key over several devices (`join::exchange`), joined
//!   share by share;
//! - `sort_merge`: SMJ-OM (`join::smj`) against the join counted in the test, and on CUDA
//!   against its host twin;
//! - `rule`: where the rule puts a join, against what the machine has (`gpu_join.backend`).
//!
//! Usage: `suite [FILTER] [--require-cuda] [--cases N]`. With `--require-cuda` (or
//! `GPU_JOIN_REQUIRE_CUDA=1`) every join runs with `gpu_join.backend = cuda` and a missing GPU
//! fails the run instead of skipping the GPU tests. `GPU_JOIN_REQUIRE_NVRTC=1` makes a missing
//! libnvrtc fail the kernel compile check. The last line reads `N passed, N failed, N skipped`.

mod build_cache;
mod codec;
mod datafusion_slt;
mod devices;
mod differential;
mod engine;
mod exchange;
mod grace;
mod harness;
mod kernels;
mod keyed;
mod metrics;
mod orientation;
mod primitives;
mod relations;
mod rng;
mod rule;
mod runtime_filter;
mod slt;

use harness::{Options, Suite};

fn main() {
    let options = Options::from_env();
    let mut suite = Suite::new(&options);
    kernels::register(&mut suite);
    primitives::register(&mut suite);
    slt::register(&mut suite);
    datafusion_slt::register(&mut suite);
    metrics::register(&mut suite);
    engine::register(&mut suite);
    runtime_filter::register(&mut suite);
    orientation::register(&mut suite);
    build_cache::register(&mut suite);
    grace::register(&mut suite);
    devices::register(&mut suite);
    exchange::register(&mut suite);
    relations::register(&mut suite);
    rule::register(&mut suite);
    codec::register(&mut suite);
    differential::register(&mut suite);
    let code = suite.run();
    // Let the last lanes finish and give pooled memory back, so that a leak check at exit
    // (compute-sanitizer --leak-check full) sees only real leaks.
    let start = std::time::Instant::now();
    while datafusion_gpu_join::exec::lanes_running() > 0 && start.elapsed().as_secs() < 30 {
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    for device in datafusion_gpu_join::device::opened_devices() {
        let _ = device.release_cached_memory();
    }
    std::process::exit(code);
}
