//! The crate's integration suite, one binary (`harness = false`) so that the GPU host needs to
//! run only one DataFusion-sized executable:
//!
//! - `slt`: `sqllogictests/*.slt` with the rule on (labels `gpu`) and off (label `cpu`);
//! - `differential`: random joins, rule on vs. rule off, same multiset of rows;
//! - `primitives`: each CUDA primitive equals its host twin (GPU only);
//! - `kernels`: every kernel compiles under NVRTC for sm_80 and sm_90 (needs libnvrtc only);
//! - `metrics`: EXPLAIN ANALYZE shows rows, phase times and peak device memory.
//!
//! Usage: `suite [FILTER] [--require-cuda] [--cases N]`. With `--require-cuda` (or
//! `GPU_JOIN_REQUIRE_CUDA=1`) every join runs with `gpu_join.backend = cuda` and a missing GPU
//! fails the run instead of skipping the GPU tests. `GPU_JOIN_REQUIRE_NVRTC=1` makes a missing
//! libnvrtc fail the kernel compile check. The last line reads `N passed, N failed, N skipped`.

mod differential;
mod harness;
mod kernels;
mod metrics;
mod primitives;
mod rng;
mod slt;

use harness::{Options, Suite};

fn main() {
    let options = Options::from_env();
    let mut suite = Suite::new(&options);
    kernels::register(&mut suite);
    primitives::register(&mut suite);
    slt::register(&mut suite);
    metrics::register(&mut suite);
    differential::register(&mut suite);
    std::process::exit(suite.run());
}
