//! The embedded kernel sources and their NVRTC compilation.
//!
//! Each `kernels/*.cu` file becomes one CUDA module. `#include "common.cuh"` (and
//! `"filter.cuh"`) is resolved here by inlining the header, since NVRTC sees only the source
//! string; CCCL headers (CUB) come from
//! the CUDA include directories ([`cuda_include_dirs`]). The tuning constants that kernels and
//! launch wrappers share ([`KERNEL_CONSTANTS`]) are defined here once and passed to NVRTC as
//! `-D` defines. Compiled PTX is cached per process, keyed by file name and architecture. A join
//! with a compiled residual filter gets one more module: `bucket_probe.cu` with the filter's
//! code appended and its kernels made for the join's key width alone ([`compile_filtered`]),
//! cached by that code and width.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock};

use cudarc::nvrtc::{CompileOptions, Ptx};
use datafusion::common::{DataFusionError, Result, exec_datafusion_err};

use crate::backend::{Keep, ProbeEmit};

include!(concat!(env!("OUT_DIR"), "/kernel_sources.rs"));

/// Threads per block of every kernel launch.
pub const BLOCK_THREADS: usize = 256;
/// Items per thread of the scan kernels (scan.cu).
pub const SCAN_ITEMS: usize = 8;
/// Items per thread of the radix partitioning kernels (partition.cu).
pub const PART_ITEMS: usize = 16;
/// Columns one `radix_scatter` launch moves besides the keys (partition.cu).
pub const MAX_PLANES: usize = 8;
/// Build rows one match-finding task of the partitioned hash join loads (hash_join.cu); larger
/// partitions are joined chunk by chunk. Nine rounds of a block: a little more than the 2,048
/// rows a partition of a 2^27-row build side holds on average at 16 bits, so that few such
/// partitions are split, each split probing its partition twice (2^27 ⋈ 2^28 on an H200: match
/// 7.7 ms against 8.5 with chunks of 2,048).
pub const JOIN_CHUNK: usize = 2304;
/// Rows per thread of the gather kernels (columns.cu).
pub const GATHER_ITEMS: usize = 4;
/// Rows per thread of the key encoding kernels (keys.cu).
pub const ENCODE_ITEMS: usize = 4;
/// Probe rows per thread of the sort-merge join's match finding (merge_join.cu): a block takes
/// `BLOCK_THREADS * MERGE_ITEMS` sorted probe rows.
pub const MERGE_ITEMS: usize = 8;
/// Groups of 32 rows in a run: a run of the bucket probe is one block, a warp each group
/// (bucket_probe.cu, so it equals `WARPS`); select.cu's warps take a run in as many rounds.
pub const PROBE_ROUNDS: usize = 8;
/// Warps per block (`kWarps`, derived from `BLOCK_THREADS` on both sides).
pub const WARPS: usize = BLOCK_THREADS / 32;
/// A run of more partitions than this that start at one row is filled by `fill_bounds`
/// (partition.cu).
pub const BOUNDS_RUN: usize = 64;
/// The file a compiled residual filter is appended to (src/filter/).
pub(crate) const FILTERED_MODULE: &str = "bucket_probe.cu";

/// The constants above as the `-D` defines the kernels read (common.cuh).
pub const KERNEL_CONSTANTS: &[(&str, usize)] = &[
    ("GJ_BLOCK_THREADS", BLOCK_THREADS),
    ("GJ_SCAN_ITEMS", SCAN_ITEMS),
    ("GJ_PART_ITEMS", PART_ITEMS),
    ("GJ_MAX_PLANES", MAX_PLANES),
    ("GJ_JOIN_CHUNK", JOIN_CHUNK),
    ("GJ_GATHER_ITEMS", GATHER_ITEMS),
    ("GJ_ENCODE_ITEMS", ENCODE_ITEMS),
    ("GJ_MERGE_ITEMS", MERGE_ITEMS),
    ("GJ_PROBE_ROUNDS", PROBE_ROUNDS),
    ("GJ_BOUNDS_RUN", BOUNDS_RUN),
    ("GJ_NO_ROW", crate::backend::NO_ROW as usize),
    ("GJ_EMIT_PAIRS", ProbeEmit::Pairs as usize),
    ("GJ_EMIT_PAIRS_OR_ALONE", ProbeEmit::PairsOrAlone as usize),
    ("GJ_EMIT_MATCHED", ProbeEmit::Matched as usize),
    ("GJ_EMIT_UNMATCHED", ProbeEmit::Unmatched as usize),
    ("GJ_EMIT_EVERY", ProbeEmit::Every as usize),
    ("GJ_EMIT_NOTHING", ProbeEmit::Nothing as usize),
    ("GJ_KEEP_UNSET", Keep::Unset as usize),
    ("GJ_KEEP_SET", Keep::Set as usize),
    ("GJ_KEEP_ALL", Keep::All as usize),
    ("GJ_CLASS_BITS", crate::backend::CLASS_BITS as usize),
    ("GJ_CHECK_WORDS", crate::backend::KEY_CHECK_WORDS),
    ("GJ_FILTER_COLUMNS", crate::filter::MAX_FILTER_COLUMNS),
];

/// The CUDA modules (kernel files) the crate needs, by file name.
pub(crate) const MODULES: &[&str] = &[
    "bucket_probe.cu",
    "columns.cu",
    "hash_join.cu",
    "keys.cu",
    "merge_join.cu",
    "partition.cu",
    "scan.cu",
    "select.cu",
    "views.cu",
];

/// Include directories for NVRTC: `GPU_JOIN_CUDA_INCLUDE` (colon-separated) if set, else
/// `$CUDA_HOME/include` (or `$CUDA_PATH`, or `/usr/local/cuda`) and its `cccl` subfolder.
pub fn cuda_include_dirs() -> Vec<PathBuf> {
    if let Ok(dirs) = std::env::var("GPU_JOIN_CUDA_INCLUDE") {
        return std::env::split_paths(&dirs).collect();
    }
    let home = std::env::var("CUDA_HOME")
        .or_else(|_| std::env::var("CUDA_PATH"))
        .unwrap_or_else(|_| "/usr/local/cuda".to_string());
    let include = PathBuf::from(home).join("include");
    vec![include.join("cccl"), include]
}

/// The headers kernel files include, inlined in this order.
const HEADERS: &[&str] = &["common.cuh", "filter.cuh"];

/// The source of one kernel file with its headers inlined: the embedded copy, or, if
/// `GPU_JOIN_KERNEL_DIR` is set (for tuning kernels on a GPU host without rebuilding the
/// crate), the file of that name in that directory.
fn source_of(file: &str) -> Result<String> {
    let find = |name: &str| -> Result<String> {
        if let Some(dir) = std::env::var_os("GPU_JOIN_KERNEL_DIR") {
            let path = PathBuf::from(dir).join(name);
            return std::fs::read_to_string(&path)
                .map_err(|e| exec_datafusion_err!("kernel source {}: {e}", path.display()));
        }
        KERNEL_SOURCES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| s.to_string())
            .ok_or_else(|| exec_datafusion_err!("kernel source {name} is not embedded"))
    };
    let mut source = find(file)?;
    for header in HEADERS {
        let include = format!("#include \"{header}\"");
        if source.contains(&include) {
            source = source.replace(&include, &find(header)?);
        }
    }
    Ok(source)
}

/// Compiles one kernel file to PTX for `arch` (e.g. `compute_90`), with a per-process cache.
pub(crate) fn compile(file: &str, arch: &str) -> Result<Ptx> {
    cached(&[file, arch], || compile_uncached(file, arch))
}

/// The PTX `compile` makes, cached per process by `id` (the parts that decide the source and
/// the architecture).
fn cached(id: &[&str], compile: impl FnOnce() -> Result<Ptx>) -> Result<Ptx> {
    static CACHE: OnceLock<Mutex<HashMap<Vec<String>, String>>> = OnceLock::new();
    let cache = CACHE.get_or_init(Default::default);
    let id: Vec<String> = id.iter().map(|s| s.to_string()).collect();
    if let Some(ptx) = cache.lock().map_err(poisoned)?.get(&id) {
        return Ok(Ptx::from_src(ptx.clone()));
    }
    let text = compile()?.to_src();
    cache.lock().map_err(poisoned)?.insert(id, text.clone());
    Ok(Ptx::from_src(text))
}

/// The source of [`FILTERED_MODULE`] with `filter` (a compiled filter's CUDA code) appended and
/// its kernels made for keys of C type `key` (`u32` or `u64`) alone.
fn filtered_source(filter: &str, key: &str) -> Result<String> {
    Ok(format!(
        "#define GJ_FILTER_MODULE 1\n{}{filter}BUCKET_PROBE_FILTERED({key}, CompiledFilter)\n",
        source_of(FILTERED_MODULE)?
    ))
}

/// Compiles [`FILTERED_MODULE`] with `filter` appended, its kernels for keys of C type `key`,
/// for `arch`, with a per-process cache keyed by the three.
pub(crate) fn compile_filtered(filter: &str, key: &str, arch: &str) -> Result<Ptx> {
    cached(&[FILTERED_MODULE, filter, key, arch], || {
        nvrtc(FILTERED_MODULE, filtered_source(filter, key)?, arch)
    })
}

fn compile_uncached(file: &str, arch: &str) -> Result<Ptx> {
    nvrtc(file, source_of(file)?, arch)
}

/// Compiles `source` (of kernel file `file`) for `arch` with the crate's options.
fn nvrtc(file: &str, source: String, arch: &str) -> Result<Ptx> {
    nvrtc_present()?;
    let mut options = vec![
        format!("--gpu-architecture={arch}"),
        "-std=c++17".to_string(),
        // Compiled filters read 128-bit decimals.
        "--device-int128".to_string(),
    ];
    options.extend(
        KERNEL_CONSTANTS
            .iter()
            .map(|(name, value)| format!("-D{name}={value}")),
    );
    // The NaN this host's CPU makes of an operation on numbers (0 / 0), which compiled filters
    // make too (kernels/filter.cuh), so that NaNs compare as DataFusion's do on this host.
    let (nan32, nan64) = host_nans();
    options.push(format!("-DGJ_NAN_F32={nan32}u"));
    options.push(format!("-DGJ_NAN_F64={nan64}ull"));
    // The partition hash's multipliers, which the direct key encoder inverts.
    options.push(format!(
        "-DGJ_PARTITION_MUL_U32={}u",
        crate::backend::PARTITION_MUL_U32
    ));
    options.push(format!(
        "-DGJ_PARTITION_MUL_U64={}ull",
        crate::backend::PARTITION_MUL_U64
    ));
    options.extend(
        cuda_include_dirs()
            .iter()
            .map(|d| format!("-I{}", d.display())),
    );
    let opts = CompileOptions {
        options,
        name: Some(file.to_string()),
        ..Default::default()
    };
    cudarc::nvrtc::compile_ptx_with_opts(source, opts).map_err(|e| match e {
        cudarc::nvrtc::CompileError::CompileError { log, .. } => exec_datafusion_err!(
            "NVRTC failed to compile {file} for {arch}:\n{}",
            log.to_string_lossy()
        ),
        other => exec_datafusion_err!("NVRTC failed on {file}: {other}"),
    })
}

/// The bits of the NaN `0.0 / 0.0` gives on this host, as f32 and f64 (negative on x86-64,
/// positive on Arm).
fn host_nans() -> (u32, u64) {
    let (a32, b32) = (std::hint::black_box(0.0f32), std::hint::black_box(0.0f32));
    let (a64, b64) = (std::hint::black_box(0.0f64), std::hint::black_box(0.0f64));
    ((a32 / b32).to_bits(), (a64 / b64).to_bits())
}

/// Compiles every kernel file for `arch` (`compute_80`, `compute_90`, ...). Needs libnvrtc but
/// no GPU; CI runs it to prove the kernels compile.
pub fn compile_kernels_for_arch(arch: &str) -> Result<()> {
    for file in MODULES {
        compile_uncached(file, arch)?;
    }
    Ok(())
}

/// Compiles the bucket probe module with the compiled residual filter `filter` for `arch`.
/// Needs libnvrtc but no GPU.
pub fn compile_filter_for_arch(filter: &crate::filter::PairFilter, arch: &str) -> Result<()> {
    for key in ["u32", "u64"] {
        nvrtc(FILTERED_MODULE, filtered_source(filter.cuda(), key)?, arch)?;
    }
    Ok(())
}

pub(crate) fn nvrtc_present() -> Result<()> {
    // SAFETY: only probes whether the shared library can be opened; calls nothing in it.
    if unsafe { cudarc::nvrtc::sys::is_culib_present() } {
        Ok(())
    } else {
        Err(exec_datafusion_err!(
            "libnvrtc could not be loaded (install the CUDA toolkit or set LD_LIBRARY_PATH)"
        ))
    }
}

fn poisoned<T>(_: T) -> DataFusionError {
    exec_datafusion_err!("kernel cache lock poisoned")
}
