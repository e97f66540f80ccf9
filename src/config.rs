//! [`GpuJoinConfig`]: the `gpu_join.*` settings, a DataFusion config extension, so that SQL can
//! say `SET gpu_join.enabled = false` or `SET gpu_join.backend = 'host'`.

use std::str::FromStr;

use datafusion::common::config::ConfigExtension;
use datafusion::common::{DataFusionError, Result, extensions_options, plan_err};

extensions_options! {
    /// Settings of the GPU join, under the prefix `gpu_join`.
    pub struct GpuJoinConfig {
        /// Replace eligible hash joins with `GpuJoinExec`.
        pub enabled: bool, default = true
        /// Where `GpuJoinExec` runs: `auto` (the GPU if one is usable, else the host), `cuda`
        /// (the GPU, or an error), or `host` (the same algorithm on the CPU).
        pub backend: String, default = "auto".to_string()
        /// Joins whose build (left) side is estimated to hold fewer rows than this stay on
        /// DataFusion's CPU hash join. On an H200 host with 16 cores the GPU path loses at
        /// 2^22–2^23 build rows and wins from 2^24 on, and TPC-H SF 10's joins (smaller
        /// builds) all run slower on it (BENCHMARKS.md). Unknown sizes count as large.
        pub min_build_rows: usize, default = 1 << 24
        /// The CUDA device ordinal to use.
        pub device: usize, default = 0
        /// Probe rows gathered into one chunk before it is sent to the device.
        pub probe_chunk_rows: usize, default = 1 << 24
    }
}

impl ConfigExtension for GpuJoinConfig {
    const PREFIX: &'static str = "gpu_join";
}

/// The `gpu_join.backend` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendChoice {
    Auto,
    Cuda,
    Host,
}

impl FromStr for BackendChoice {
    type Err = DataFusionError;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "cuda" | "gpu" => Ok(Self::Cuda),
            "host" | "cpu" => Ok(Self::Host),
            other => plan_err!("gpu_join.backend must be auto, cuda or host, not '{other}'"),
        }
    }
}

impl GpuJoinConfig {
    /// The parsed backend setting.
    pub fn backend_choice(&self) -> Result<BackendChoice> {
        self.backend.parse()
    }
}
