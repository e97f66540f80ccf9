//! `joinbench`: the measurement system the crate is steered by (issue 3, BENCHMARKS.md).
//!
//! 1. Kernel level (`kernel.rs`): the GFTR paper's PK-FK experiments with the data already on
//!    the device — size, payload columns, |R|:|S|, match ratio, Zipf skew, 4/8-byte values,
//!    join sequences.
//! 2. End to end (`e2e.rs`): the same tables through SQL with the rule on and off, and the
//!    PCIe floor from the pinned copy bandwidth measured in the same run.
//! 3. Join types (`join_types.rs`) and strings (`strings.rs`) through SQL, rule on and off: each
//!    join type's time over the inner join's; string keys and string payloads against
//!    integer keys.
//!    Selective joins (`selective.rs`): a filtered build side at match rates from 1 to 1/256,
//!    probe columns staged or taken on the host.
//! 4. TPC-H (`tpch.rs`): the 22 queries with the rule on and off, results compared.
//! 5. Scale (`scale.rs`): output 8x the memory limit, and a 2^32-row probe side, checked against
//!    closed-form answers (only when named, or with `--quick`).
//! 6. Devices (`devices.rs`): the kernel-level join on one device, and dealt out by key over
//!    every device and joined on each (only when named, or with `--quick`).
//!
//! Prints a Markdown table per part last and writes a JSON record and SVG plots (`report.rs`).
//! Everything runs on the host backend too (`--backend host`, the default without a GPU).
//! `--quick` is CI's smoke run: small sizes, results checked, times not. See `args.rs`.

mod args;
mod devices;
mod e2e;
mod join_types;
mod kernel;
mod report;
mod scale;
mod selective;
mod sql;
mod strings;
mod tpch;
mod workload;

use std::sync::Arc;

use datafusion::common::{DataFusionError, Result};
use datafusion_gpu_join::device::{CudaDevice, cuda_device, pinned_copy_bandwidth};
use serde_json::json;

use crate::args::Args;
use crate::report::{Report, utc_now};

/// Where the joins run.
pub enum Device {
    Cuda(Arc<CudaDevice>),
    Host,
}

impl Device {
    /// The `gpu_join.backend` value that selects it.
    pub fn backend(&self) -> &'static str {
        match self {
            Self::Cuda(_) => "cuda",
            Self::Host => "host",
        }
    }

    /// How reports name it.
    pub fn name(&self) -> String {
        match self {
            Self::Cuda(d) => format!("cuda:0 ({})", d.name()),
            Self::Host => "host".into(),
        }
    }
}

/// The commit measured: `JOINBENCH_COMMIT` (set by scripts/gpu-check.sh from the bundle), else
/// `git describe`, else "unknown".
fn commit() -> String {
    if let Ok(c) = std::env::var("JOINBENCH_COMMIT") {
        return c;
    }
    std::process::Command::new("git")
        .args(["describe", "--always", "--dirty"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_else(|| "unknown".into())
}

#[tokio::main]
async fn main() -> Result<()> {
    let probe = cuda_device(0);
    let gpu = probe.as_ref().ok().cloned();
    let args = Args::parse(gpu.is_some())?;
    let device = match (args.backend.as_str(), probe) {
        ("cuda", Ok(d)) => Device::Cuda(d),
        ("cuda", Err(e)) => return Err(e),
        ("host", _) => Device::Host,
        (other, _) => {
            return Err(DataFusionError::Configuration(format!(
                "--backend {other}: expected cuda or host"
            )));
        }
    };
    let bandwidth = match &device {
        Device::Cuda(d) if args.part("e2e") => Some(pinned_copy_bandwidth(
            d,
            if args.quick { 64 << 20 } else { 1 << 30 },
            5,
        )?),
        _ => None,
    };
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut report = Report::new(json!({
        "device": gpu.as_ref().map_or("no GPU".to_string(), |d| d.name().to_string()),
        "backend": device.name(), "commit": commit(), "date": utc_now(), "cores": cores,
        "command": args.command, "quick": args.quick,
        "pinned_h2d_gbps": bandwidth.map(|b| b.host_to_device / 1e9),
        "pinned_d2h_gbps": bandwidth.map(|b| b.device_to_host / 1e9),
    }));
    eprintln!(
        "joinbench: {} on {}, parts {:?}",
        device.name(),
        report.meta["device"],
        args.parts
    );
    let kernel = match args.part("kernel") {
        true => kernel::run(&device, &args, &mut report),
        false => Ok(()),
    };
    let e2e = match args.part("e2e") {
        true => e2e::run(&device, &args, bandwidth, &mut report).await,
        false => Ok(()),
    };
    let types = match args.part("types") {
        true => join_types::run(&device, &args, &mut report).await,
        false => Ok(()),
    };
    let strings = match args.part("strings") {
        true => strings::run(&device, &args, &mut report).await,
        false => Ok(()),
    };
    let selective = match args.part("selective") {
        true => selective::run(&device, &args, &mut report).await,
        false => Ok(()),
    };
    let tpch = match args.part("tpch") {
        true => tpch::run(&device, &args, &mut report).await,
        false => Ok(()),
    };
    let scale = match args.part("scale") {
        true => scale::run(&device, &args, &mut report).await,
        false => Ok(()),
    };
    let spread = match args.part("devices") {
        true => devices::run(&device, &args, &mut report),
        false => Ok(()),
    };
    for (part, result) in [
        ("kernel level", kernel),
        ("end to end", e2e),
        ("join types", types),
        ("strings", strings),
        ("selective joins", selective),
        ("TPC-H", tpch),
        ("scale", scale),
        ("devices", spread),
    ] {
        if let Err(e) = result {
            report.failures.push(format!("{part}: {e}"));
        }
    }
    let written = report.write(&args.out)?;
    for path in written {
        println!("wrote {}", path.display());
    }
    println!("\n{}", report.markdown());
    match report.failures.is_empty() {
        true => Ok(()),
        false => Err(DataFusionError::Execution(report.failures.join("; "))),
    }
}
