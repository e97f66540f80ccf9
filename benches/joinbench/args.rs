//! The command line of `joinbench`; `--quick` shrinks every default to a smoke run.

use std::path::PathBuf;

use datafusion::common::{DataFusionError, Result};
use datafusion_gpu_join::config::{Algorithm, ProbeColumns};

pub const PARTS: [&str; 8] = [
    "kernel",
    "e2e",
    "types",
    "strings",
    "selective",
    "tpch",
    "scale",
    "devices",
];
pub const SWEEPS: [&str; 14] = [
    "size",
    "payloads",
    "ratio",
    "match",
    "skew",
    "width",
    "sequence",
    "keys",
    "joins",
    "algorithms",
    "sort-merge",
    "phj-um",
    "smj-um",
    "inlj",
];

/// Sweeps run only when named: `standard` is the standard wide workload alone.
pub const EXTRA_SWEEPS: [&str; 1] = ["standard"];

pub const USAGE: &str = "\
cargo bench --bench joinbench -- [options]
  --quick               smoke run: small sizes, results checked (CI)
  --parts LIST          kernel,e2e,types,strings,selective,tpch,scale,devices (default: all
                        but scale and devices; --quick: all)
  --sweeps LIST         size,payloads,ratio,match,skew,width,sequence,keys,joins,algorithms,
                        sort-merge,phj-um,smj-um,inlj (default: all),
                        or standard (the standard wide workload alone)
  --backend B           cuda | host (default: cuda if a GPU is usable)
  --runs N              timed runs per kernel-level case, after a warm-up (5)
  --log2-r N            |R| = 2^N for every sweep but size (26; 4 to 29)
  --min-log2-r N        size sweep from 2^N ... (20)
  --max-log2-r N        ... to 2^N rows in R (27)
  --max-sequence K      join sequences of 1..K dimensions (8)
  --devices-log2-r N    devices: R ⋈ S with |R| = 2^N, |S| = 2|R|, on one device and dealt
                        out over every device (27)
  --e2e-log2-r LIST     end-to-end sizes, log2 |R| (20,22,24,26)
  --e2e-runs N          timed runs per end-to-end query (3)
  --probe-chunk-rows N  gpu_join.probe_chunk_rows end to end (default: the setting's default)
  --e2e-chunks LIST     also run the largest wide case with these log2 chunk sizes (none)
  --e2e-devices LIST    also run every end-to-end case with gpu_join.devices = LIST (0,1 or
                        all), next to one device
  --e2e-explain         print EXPLAIN ANALYZE of every end-to-end query (strings and TPC-H
                        too), rule on and off
  --types-log2-r N      join types, strings and selective joins end to end: |R| = 2^N (24)
  --scale SF            TPC-H scale factor (1)
  --tpch-runs N         timed runs per TPC-H query (3)
  --tpch-queries LIST   TPC-H queries to run, e.g. 7,18 (all)
  --tpch-min-input-rows N|default   gpu_join.min_input_rows for TPC-H (default: the
                        setting's default)
  --tpch-min-build-rows N|default   gpu_join.min_build_rows for TPC-H (default: the
                        setting's default; --quick: 0, so every eligible join takes the GPU path)
  --tpch-devices LIST   gpu_join.devices of TPC-H's rule-on session (0,1 or all; default: one)
  --scale-devices LIST  scale: also the build side 4x the memory limit (and in memory) with
                        gpu_join.devices = LIST
  --tpch-partitions N   TPC-H's target partitions (default: the host's cores)
  --tpch-sort-merge     TPC-H with datafusion.optimizer.prefer_hash_join = false in both
                        sessions: DataFusion plans sort-merge joins, which the rule replaces
  --algorithm NAME      gpu_join.algorithm of every rule-on session (end to end and TPC-H):
                        auto (default), hash or direct
  --no-pack             gpu_join.pack_uploads = false in every rule-on session (end to end
                        and TPC-H): every staged column copied unpacked
  --host-views          gpu_join.views_on_device = false in TPC-H's rule-on session: the
                        build side's view columns gathered on the host by row position
  --host-values         gpu_join.view_bytes_on_device = false in TPC-H's rule-on session: the
                        values of the build views the device carries gathered on the host
  --probe-columns WAY   gpu_join.probe_columns of TPC-H's rule-on session: auto (default),
                        device or host
  --no-runtime-filters  gpu_join.runtime_filters = false in TPC-H's rule-on session: no
                        RuntimeFilterExec, no build keys' set in the dynamic filters
  --no-orient-joins     gpu_join.orient_joins = false in TPC-H's rule-on session: inner and
                        semi joins built where DataFusion builds them
  --tpch-cache BYTES    gpu_join.cache_bytes of TPC-H's rule-on session (1GiB, ...): each query
                        also runs first with the build cache emptied (the median of as many
                        runs), then as usual, its build sides kept from run to run
  --out DIR             where the JSON record and SVG plots go (target/joinbench)";

/// What to run and how big.
#[derive(Debug, Clone)]
pub struct Args {
    pub quick: bool,
    pub parts: Vec<String>,
    pub sweeps: Vec<String>,
    pub backend: String,
    pub runs: usize,
    pub log2_r: u32,
    pub sizes: std::ops::RangeInclusive<u32>,
    pub max_sequence: usize,
    /// log2 |R| of the devices part.
    pub devices_log2_r: u32,
    pub e2e_sizes: Vec<u32>,
    pub e2e_runs: usize,
    /// `gpu_join.probe_chunk_rows` end to end; `None`: the setting's default.
    pub probe_chunk_rows: Option<usize>,
    /// Extra end-to-end runs of the largest wide case, with these log2 chunk sizes.
    pub e2e_chunks: Vec<u32>,
    /// Print EXPLAIN ANALYZE of every end-to-end query (rule on and off).
    pub e2e_explain: bool,
    /// `gpu_join.devices` of a second rule-on run of every end-to-end case.
    pub e2e_devices: Option<String>,
    /// TPC-H with `prefer_hash_join = false` (sort-merge joins).
    pub tpch_sort_merge: bool,
    /// `gpu_join.pack_uploads` of the rule-on sessions (end to end, TPC-H).
    pub pack_uploads: bool,
    /// `gpu_join.views_on_device` of TPC-H's rule-on session.
    pub views_on_device: bool,
    /// `gpu_join.view_bytes_on_device` of TPC-H's rule-on session.
    pub view_bytes_on_device: bool,
    /// `gpu_join.probe_columns` of TPC-H's rule-on session.
    pub probe_columns: ProbeColumns,
    /// `gpu_join.runtime_filters` of TPC-H's rule-on session.
    pub runtime_filters: bool,
    /// `gpu_join.orient_joins` of TPC-H's rule-on session.
    pub orient_joins: bool,
    /// `gpu_join.algorithm` of the rule-on sessions (end to end, TPC-H).
    pub algorithm: Algorithm,
    /// TPC-H's `target_partitions`; `None`: the host's cores.
    pub tpch_partitions: Option<usize>,
    /// `gpu_join.devices` of TPC-H's rule-on session; `None`: the default (one device).
    pub tpch_devices: Option<datafusion_gpu_join::config::DeviceList>,
    /// `gpu_join.devices` of the scale part's extra grace cases; `None`: none run.
    pub scale_devices: Option<datafusion_gpu_join::config::DeviceList>,
    /// log2 |R| of the join-types part.
    pub types_log2_r: u32,
    pub scale: f64,
    pub tpch_runs: usize,
    /// TPC-H queries to run (all if empty).
    pub tpch_queries: Vec<usize>,
    /// `gpu_join.min_build_rows` for TPC-H; `None`: the setting's default.
    pub tpch_min_build_rows: Option<usize>,
    /// `gpu_join.cache_bytes` of TPC-H's rule-on session; `None`: the default (no cache).
    pub tpch_cache: Option<datafusion_gpu_join::config::ByteSize>,
    /// `gpu_join.min_input_rows` for TPC-H; `None`: the setting's default.
    pub tpch_min_input_rows: Option<usize>,
    pub out: PathBuf,
    /// The command line as given.
    pub command: String,
}

fn bad(msg: String) -> DataFusionError {
    DataFusionError::Configuration(format!("{msg}\n{USAGE}"))
}

fn list(v: &str, allowed: &[&str], what: &str) -> Result<Vec<String>> {
    v.split(',')
        .map(|s| match allowed.contains(&s) {
            true => Ok(s.to_string()),
            false => Err(bad(format!("unknown {what} `{s}`"))),
        })
        .collect()
}

impl Args {
    pub fn parse(cuda_present: bool) -> Result<Self> {
        let argv: Vec<String> = std::env::args().skip(1).collect();
        let quick = argv.iter().any(|a| a == "--quick");
        let mut a = Self {
            quick,
            parts: PARTS
                .iter()
                .filter(|p| quick || !matches!(**p, "scale" | "devices"))
                .map(|p| p.to_string())
                .collect(),
            sweeps: SWEEPS.map(String::from).to_vec(),
            backend: if cuda_present { "cuda" } else { "host" }.into(),
            runs: if quick { 2 } else { 5 },
            log2_r: if quick { 12 } else { 26 },
            sizes: if quick { 10..=14 } else { 20..=27 },
            max_sequence: if quick { 3 } else { 8 },
            devices_log2_r: if quick { 12 } else { 27 },
            e2e_sizes: if quick {
                vec![12, 14]
            } else {
                vec![20, 22, 24, 26]
            },
            e2e_runs: if quick { 1 } else { 3 },
            probe_chunk_rows: None,
            e2e_chunks: vec![],
            e2e_explain: false,
            e2e_devices: None,
            tpch_sort_merge: false,
            pack_uploads: true,
            views_on_device: true,
            view_bytes_on_device: true,
            probe_columns: ProbeColumns::Auto,
            runtime_filters: true,
            orient_joins: true,
            algorithm: Algorithm::Auto,
            tpch_partitions: None,
            tpch_devices: None,
            scale_devices: None,
            types_log2_r: if quick { 14 } else { 24 },
            scale: if quick { 0.01 } else { 1.0 },
            tpch_runs: if quick { 1 } else { 3 },
            tpch_queries: vec![],
            tpch_min_build_rows: quick.then_some(0),
            tpch_min_input_rows: None,
            tpch_cache: None,
            out: PathBuf::from("target/joinbench"),
            command: argv.join(" "),
        };
        let mut it = argv.iter();
        while let Some(flag) = it.next() {
            // `cargo bench` passes `--bench` to every bench binary.
            if flag == "--quick" || flag == "--bench" {
                continue;
            }
            if flag == "--e2e-explain" {
                a.e2e_explain = true;
                continue;
            }
            if flag == "--tpch-sort-merge" {
                a.tpch_sort_merge = true;
                continue;
            }
            if flag == "--no-pack" {
                a.pack_uploads = false;
                continue;
            }
            if flag == "--host-views" {
                a.views_on_device = false;
                continue;
            }
            if flag == "--host-values" {
                a.view_bytes_on_device = false;
                continue;
            }
            if flag == "--no-runtime-filters" {
                a.runtime_filters = false;
                continue;
            }
            if flag == "--no-orient-joins" {
                a.orient_joins = false;
                continue;
            }
            if flag == "--help" || flag == "-h" {
                println!("{USAGE}");
                std::process::exit(0);
            }
            let v = it
                .next()
                .ok_or_else(|| bad(format!("{flag} needs a value")))?;
            let num = |v: &str| -> Result<usize> {
                v.parse()
                    .map_err(|_| bad(format!("{flag}: `{v}` is not a number")))
            };
            match flag.as_str() {
                "--parts" => a.parts = list(v, &PARTS, "part")?,
                "--sweeps" => {
                    a.sweeps = list(v, &[&SWEEPS[..], &EXTRA_SWEEPS[..]].concat(), "sweep")?
                }
                "--backend" => a.backend = v.clone(),
                "--algorithm" => a.algorithm = v.parse().map_err(|e| bad(format!("{e}")))?,
                "--tpch-cache" => a.tpch_cache = Some(v.parse().map_err(|e| bad(format!("{e}")))?),
                "--probe-columns" => {
                    a.probe_columns = v.parse().map_err(|e| bad(format!("{e}")))?
                }
                "--runs" => a.runs = num(v)?.max(1),
                "--log2-r" => a.log2_r = num(v)?.clamp(4, 29) as u32,
                "--min-log2-r" => a.sizes = num(v)?.clamp(1, 29) as u32..=*a.sizes.end(),
                "--max-log2-r" => a.sizes = *a.sizes.start()..=num(v)?.clamp(1, 29) as u32,
                "--max-sequence" => a.max_sequence = num(v)?.max(1),
                "--devices-log2-r" => a.devices_log2_r = num(v)?.clamp(4, 29) as u32,
                "--e2e-log2-r" => {
                    a.e2e_sizes = v
                        .split(',')
                        .map(|s| num(s).map(|n| n.clamp(4, 29) as u32))
                        .collect::<Result<_>>()?
                }
                "--e2e-runs" => a.e2e_runs = num(v)?.max(1),
                "--types-log2-r" => a.types_log2_r = num(v)?.clamp(4, 28) as u32,
                "--e2e-devices" => a.e2e_devices = Some(v.clone()),
                "--probe-chunk-rows" => a.probe_chunk_rows = Some(num(v)?.max(1)),
                "--e2e-chunks" => {
                    a.e2e_chunks = v
                        .split(',')
                        .map(|s| num(s).map(|n| n.clamp(10, 30) as u32))
                        .collect::<Result<_>>()?
                }
                "--scale" => {
                    a.scale = v
                        .parse()
                        .map_err(|_| bad(format!("--scale: `{v}` is not a number")))?
                }
                "--tpch-runs" => a.tpch_runs = num(v)?.max(1),
                "--tpch-devices" => {
                    a.tpch_devices = Some(v.parse().map_err(|e| bad(format!("{e}")))?)
                }
                "--scale-devices" => {
                    a.scale_devices = Some(v.parse().map_err(|e| bad(format!("{e}")))?)
                }
                "--tpch-partitions" => a.tpch_partitions = Some(num(v)?.max(1)),
                "--tpch-queries" => {
                    a.tpch_queries = v.split(',').map(num).collect::<Result<_>>()?;
                }
                "--tpch-min-build-rows" => {
                    a.tpch_min_build_rows = match v.as_str() {
                        "default" => None,
                        _ => Some(num(v)?),
                    }
                }
                "--tpch-min-input-rows" => {
                    a.tpch_min_input_rows = match v.as_str() {
                        "default" => None,
                        _ => Some(num(v)?),
                    }
                }
                "--out" => a.out = PathBuf::from(v),
                _ => return Err(bad(format!("unknown option {flag}"))),
            }
        }
        Ok(a)
    }

    pub fn part(&self, name: &str) -> bool {
        self.parts.iter().any(|p| p == name)
    }
}
