//! What a run leaves behind: the Markdown tables printed last, one JSON file per run (device,
//! commit, date, parameters, every figure), SVG plots of kernel-level throughput against size
//! and of the end-to-end speed-up, and the progress bars shown while sweeps run.

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use datafusion::common::{DataFusionError, Result};
use indicatif::{ProgressBar, ProgressStyle};
use plotters::prelude::*;
use serde_json::{Value, json};

/// Every record of one run.
pub struct Report {
    pub meta: Value,
    pub kernel: Vec<Value>,
    pub e2e: Vec<Value>,
    pub join_types: Vec<Value>,
    pub strings: Vec<Value>,
    pub selective: Vec<Value>,
    pub tpch: Vec<Value>,
    pub scale: Vec<Value>,
    pub devices: Vec<Value>,
    /// Parts that failed, with their errors.
    pub failures: Vec<String>,
}

/// The median; the mean of the two middle values for an even count.
pub fn median(mut v: Vec<Duration>) -> Duration {
    v.sort();
    let n = v.len();
    match n {
        0 => Duration::ZERO,
        _ if n % 2 == 1 => v[n / 2],
        _ => (v[n / 2 - 1] + v[n / 2]) / 2,
    }
}

/// A progress bar on stderr (hidden when stderr is not a terminal).
pub fn progress(len: u64, what: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template("{prefix:>12} [{bar:30}] {pos}/{len} {elapsed} {msg}")
            .expect("valid template")
            .progress_chars("=> "),
    );
    bar.set_prefix(what.to_string());
    bar
}

/// Now in UTC as `YYYY-MM-DDTHH:MM:SSZ` (civil-from-days, H. Hinnant).
pub fn utc_now() -> String {
    let secs = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs() as i64);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    )
}

fn num(v: &Value, key: &str) -> f64 {
    v[key].as_f64().unwrap_or(f64::NAN)
}

/// A cell: `x` with `digits` decimals, or `-` when absent.
fn cell(v: &Value, key: &str, digits: usize) -> String {
    match v[key].as_f64() {
        Some(x) => format!("{x:.digits$}"),
        None => "-".into(),
    }
}

/// A string field, or empty.
fn text(v: &Value, key: &str) -> String {
    v[key].as_str().unwrap_or("").to_string()
}

/// A Markdown table under a `###` title.
fn table(title: &str, header: &[&str], rows: impl Iterator<Item = Vec<String>>) -> String {
    let mut out = format!(
        "\n### {title}\n\n| {} |\n|{}\n",
        header.join(" | "),
        " --- |".repeat(header.len())
    );
    for row in rows {
        out += &format!("| {} |\n", row.join(" | "));
    }
    out
}

fn gb(v: &Value, key: &str) -> String {
    v[key]
        .as_f64()
        .map_or("-".into(), |b| format!("{:.2}", b / 1e9))
}

impl Report {
    pub fn new(meta: Value) -> Self {
        Self {
            meta,
            kernel: vec![],
            e2e: vec![],
            join_types: vec![],
            strings: vec![],
            selective: vec![],
            tpch: vec![],
            scale: vec![],
            devices: vec![],
            failures: vec![],
        }
    }

    /// The Markdown tables of every part that ran.
    pub fn markdown(&self) -> String {
        let m = &self.meta;
        let mut out = format!(
            "## joinbench: {}, backend {}, {} host cores, commit {}, {}\n\ncommand: `joinbench {}`\n",
            m["device"].as_str().unwrap_or("?"),
            m["backend"].as_str().unwrap_or("?"),
            m["cores"],
            m["commit"].as_str().unwrap_or("?"),
            m["date"].as_str().unwrap_or("?"),
            m["command"].as_str().unwrap_or(""),
        );
        if let Some(b) = m["pinned_h2d_gbps"].as_f64() {
            out += &format!(
                "pinned copy bandwidth measured in this run: host→device {b:.1} GB/s, device→host {:.1} GB/s\n",
                num(m, "pinned_d2h_gbps")
            );
        }
        if !self.kernel.is_empty() {
            out += &table(
                "Kernel level: data on the device, medians over the timed runs (ms; each phase and the total separately)",
                &[
                    "sweep",
                    "x",
                    "case",
                    "algorithm",
                    "transform",
                    "match",
                    "materialize",
                    "total",
                    "G tuples/s",
                    "peak GB",
                ],
                self.kernel.iter().map(|r| {
                    vec![
                        text(r, "sweep"),
                        r["x"].to_string(),
                        text(r, "case"),
                        text(r, "algorithm"),
                        cell(r, "transform_ms", 2),
                        cell(r, "match_ms", 2),
                        cell(r, "materialize_ms", 2),
                        cell(r, "total_ms", 2),
                        cell(r, "gtuples_per_s", 2),
                        gb(r, "peak_device_bytes"),
                    ]
                }),
            );
        }
        if !self.e2e.is_empty() {
            out += &table(
                "End to end through SQL (s): rule on and off, median of the timed runs; operator phases (summed over partitions) and bytes of the last run; PCIe floor = up / h2d + down / d2h, and with both directions overlapped max(up / h2d, down / d2h), over n devices each link's share (up / n, down / n)",
                &[
                    "R rows",
                    "S rows",
                    "payloads",
                    "rule on",
                    "rule off",
                    "speed-up",
                    "upload",
                    "transform",
                    "match",
                    "materialize",
                    "download",
                    "GB up (saved by packing)",
                    "GB down",
                    "PCIe floor",
                    "on / floor",
                    "overlapped floor",
                    "chunk rows",
                    "chunks",
                    "devices (lanes)",
                    "host peak on / off (GB)",
                ],
                self.e2e.iter().map(|r| {
                    vec![
                        format!("2^{}", num(r, "r_rows").log2()),
                        format!("2^{}", num(r, "s_rows").log2()),
                        format!("{p},{p}", p = r["payloads"]),
                        cell(r, "rule_on_s", 3),
                        cell(r, "rule_off_s", 3),
                        format!("{}x", cell(r, "speedup", 2)),
                        cell(r, "upload_s", 3),
                        cell(r, "transform_s", 3),
                        cell(r, "match_s", 3),
                        cell(r, "materialize_s", 3),
                        cell(r, "download_s", 3),
                        format!(
                            "{} ({})",
                            gb(r, "bytes_uploaded"),
                            gb(r, "upload_bytes_saved")
                        ),
                        gb(r, "bytes_downloaded"),
                        cell(r, "pcie_floor_s", 3),
                        cell(r, "over_floor", 1),
                        cell(r, "pcie_floor_overlapped_s", 3),
                        match r["probe_chunk_rows"].as_u64() {
                            Some(n) => format!("2^{}", n.ilog2()),
                            None => "default".into(),
                        },
                        r["chunks"].to_string(),
                        format!(
                            "{} ({})",
                            r["devices"].as_str().unwrap_or("default"),
                            r["device_lanes"]
                        ),
                        format!(
                            "{} / {}",
                            gb(r, "host_peak_on_bytes"),
                            gb(r, "host_peak_off_bytes")
                        ),
                    ]
                }),
            );
        }
        if let Some(first) = self.join_types.first() {
            out += &table(
                &format!(
                    "Join types end to end through SQL, |R| = 2^{}, |S| = 2^{}, {}% of S matching (s): rule on and off, median of the timed runs; rule on over the inner join's rule on",
                    num(first, "r_rows").log2(),
                    num(first, "s_rows").log2(),
                    num(first, "match_ratio") * 100.0
                ),
                &[
                    "SQL",
                    "join type planned",
                    "rule on",
                    "rule off",
                    "speed-up",
                    "over inner",
                ],
                self.join_types.iter().map(|r| {
                    vec![
                        r["asked"].as_str().unwrap_or("").to_string(),
                        r["join_type"].as_str().unwrap_or("").to_string(),
                        cell(r, "rule_on_s", 3),
                        cell(r, "rule_off_s", 3),
                        format!("{}x", cell(r, "speedup", 2)),
                        cell(r, "over_inner", 2),
                    ]
                }),
            );
        }
        if let Some(first) = self.strings.first() {
            out += &table(
                &format!(
                    "Strings end to end through SQL, |R| = 2^{}, |S| = 2^{} (s): rule on and off, median of the timed runs; rule on over the integer-key join's rule on",
                    num(first, "r_rows").log2(),
                    num(first, "s_rows").log2(),
                ),
                &[
                    "join",
                    "rule on",
                    "rule off",
                    "speed-up",
                    "over integer keys",
                ],
                self.strings.iter().map(|r| {
                    vec![
                        r["join"].as_str().unwrap_or("").to_string(),
                        cell(r, "rule_on_s", 3),
                        cell(r, "rule_off_s", 3),
                        format!("{}x", cell(r, "speedup", 2)),
                        cell(r, "over_integer", 2),
                    ]
                }),
            );
        }
        if let Some(first) = self.selective.first() {
            out += &table(
                &format!(
                    "Selective joins end to end through SQL, R filtered to one row in m, |R| = 2^{}, |S| = 2^{} (s): probe columns staged (device), taken on the host (host), as auto chooses, rule off; median of the timed runs",
                    num(first, "r_rows").log2(),
                    num(first, "s_rows").log2(),
                ),
                &[
                    "probe rows matched",
                    "device",
                    "host",
                    "auto",
                    "rule off",
                    "host over device",
                ],
                self.selective.iter().map(|r| {
                    vec![
                        format!("1/{}", r["keep_one_in"]),
                        cell(r, "device_s", 3),
                        cell(r, "host_s", 3),
                        cell(r, "auto_s", 3),
                        cell(r, "rule_off_s", 3),
                        format!("{:.2}", num(r, "host_s") / num(r, "device_s")),
                    ]
                }),
            );
        }
        if !self.tpch.is_empty() {
            let sf = &self.tpch[0]["scale"];
            let set: Vec<String> = ["min_build_rows", "min_input_rows"]
                .iter()
                .filter_map(|k| Some(format!("gpu_join.{k} = {}", self.tpch[0][k].as_u64()?)))
                .collect();
            let mut min = match set.is_empty() {
                true => "default settings".into(),
                false => set.join(", "),
            };
            if self.tpch[0]["sort_merge"].as_bool() == Some(true) {
                min += ", prefer_hash_join = false (sort-merge joins)";
            }
            if let Some(bytes) = self.tpch[0]["cache_bytes"].as_u64() {
                min += &format!(
                    ", gpu_join.cache_bytes = {bytes} (rule on: build sides kept from run to run)"
                );
            }
            out += &table(
                &format!("TPC-H SF {sf}, {min}, median of the timed runs (s)"),
                &[
                    "query",
                    "rule on",
                    "rule off",
                    "speed-up",
                    "joins on GPU",
                    "joins on CPU",
                    "GB up (saved by packing)",
                    "rows",
                    "equal",
                ],
                self.tpch.iter().map(|r| {
                    vec![
                        format!("Q{}", r["query"]),
                        cell(r, "rule_on_s", 3),
                        cell(r, "rule_off_s", 3),
                        format!("{}x", cell(r, "speedup", 2)),
                        r["gpu_joins"].to_string(),
                        r["cpu_joins"].to_string(),
                        format!(
                            "{} ({})",
                            gb(r, "bytes_uploaded"),
                            gb(r, "upload_bytes_saved")
                        ),
                        r["rows"].to_string(),
                        r["equal"].to_string(),
                    ]
                }),
            );
            let sum = |k| self.tpch.iter().map(|r| num(r, k)).sum::<f64>();
            let (on, off) = (sum("rule_on_s"), sum("rule_off_s"));
            let slower = |by: f64| {
                self.tpch
                    .iter()
                    .filter(|r| num(r, "rule_on_s") > by * num(r, "rule_off_s"))
                    .count()
            };
            out += &format!(
                "| total | {on:.3} | {off:.3} | {:.2}x | {} | {} | {:.2} ({:.2}) | | {} queries slower with the rule on, {} by more than 10% |\n",
                off / on,
                sum("gpu_joins"),
                sum("cpu_joins"),
                sum("bytes_uploaded") / 1e9,
                sum("upload_bytes_saved") / 1e9,
                slower(1.0),
                slower(1.1)
            );
            if self.tpch[0].get("first_s").is_some() {
                out += &table(
                    &format!(
                        "TPC-H SF {sf}, rule on with the build cache: first run (cache emptied) \
                         against repeated runs (build sides kept), median (s)"
                    ),
                    &[
                        "query",
                        "first run",
                        "repeated",
                        "first / repeated",
                        "joins that hit",
                        "joins not kept or stored",
                        "rule off",
                    ],
                    self.tpch.iter().map(|r| {
                        vec![
                            format!("Q{}", r["query"]),
                            cell(r, "first_s", 3),
                            cell(r, "rule_on_s", 3),
                            format!("{:.2}x", num(r, "first_s") / num(r, "rule_on_s")),
                            r["builds_kept"].to_string(),
                            r["builds_unkept"].to_string(),
                            cell(r, "rule_off_s", 3),
                        ]
                    }),
                );
                let (first, repeated) = (sum("first_s"), sum("rule_on_s"));
                out += &format!(
                    "| total | {first:.3} | {repeated:.3} | {:.2}x | {} | {} | {off:.3} |\n",
                    first / repeated,
                    sum("builds_kept"),
                    sum("builds_unkept"),
                );
            }
        }
        if !self.scale.is_empty() {
            out += &table(
                "Scale: answers checked against closed forms",
                &[
                    "case",
                    "build rows",
                    "probe rows",
                    "output GB",
                    "memory limit",
                    "time (s)",
                    "chunks",
                    "passes",
                    "peak device GB",
                    "build groups",
                    "device lanes",
                    "correct",
                ],
                self.scale.iter().map(|r| {
                    vec![
                        text(r, "case"),
                        r["build_rows"].to_string(),
                        r["probe_rows"].to_string(),
                        gb(r, "output_bytes"),
                        text(r, "memory_limit"),
                        cell(r, "seconds", 2),
                        r["chunks"].to_string(),
                        r["passes"].to_string(),
                        gb(r, "peak_device_bytes"),
                        r["grace_groups"].to_string(),
                        r["device_lanes"].to_string(),
                        r["correct"].to_string(),
                    ]
                }),
            );
        }
        if !self.devices.is_empty() {
            let one = self
                .devices
                .iter()
                .find(|r| r["devices"] == 1)
                .map(|r| num(r, "total_ms"));
            out += &table(
                "Devices: kernel level on one device, and dealt out over several by key (join::exchange_sets by route, join::exchange_partitioned by partition) and joined on each; wall clock, median of the timed runs (ms)",
                &[
                    "case",
                    "backend",
                    "devices",
                    "order",
                    "exchange",
                    "join (slowest device)",
                    "total",
                    "vs one device",
                    "G tuples/s",
                    "R rows per device",
                    "peer GB/s (one way, each way both at once)",
                ],
                self.devices.iter().map(|r| {
                    let peer = match r["peer_gbps"].as_f64() {
                        Some(p) => format!("{p:.0}, {:.0}", num(r, "peer_both_ways_gbps")),
                        None => String::new(),
                    };
                    vec![
                        text(r, "case"),
                        text(r, "backend"),
                        r["devices"].to_string(),
                        text(r, "order"),
                        match (
                            r["partitioned_ms"].as_f64(),
                            r["partitioning_alone_ms"].as_f64(),
                        ) {
                            (Some(p), Some(a)) => format!(
                                "{} (partitioned: {p:.2}; partitioning alone: {a:.2})",
                                cell(r, "exchange_ms", 2)
                            ),
                            (Some(p), None) => {
                                format!("{} (partitioned: {p:.2})", cell(r, "exchange_ms", 2))
                            }
                            _ => cell(r, "exchange_ms", 2),
                        },
                        cell(r, "join_ms", 2),
                        cell(r, "total_ms", 2),
                        one.map_or(String::new(), |o| format!("{:.2}x", o / num(r, "total_ms"))),
                        cell(r, "gtuples_per_s", 2),
                        r["share_r_rows"].to_string(),
                        peer,
                    ]
                }),
            );
        }
        for f in &self.failures {
            out += &format!("\nFAILED: {f}\n");
        }
        out
    }

    /// Writes `joinbench-<date>.json` and the plots into `dir`; returns the paths written.
    pub fn write(&self, dir: &Path) -> Result<Vec<PathBuf>> {
        std::fs::create_dir_all(dir)?;
        let stamp = self.meta["date"].as_str().unwrap_or("run").replace(':', "");
        let json_path = dir.join(format!("joinbench-{stamp}.json"));
        let doc = json!({"meta": self.meta, "kernel": self.kernel, "e2e": self.e2e,
            "join_types": self.join_types, "strings": self.strings, "selective": self.selective, "tpch": self.tpch, "scale": self.scale, "devices": self.devices, "failures": self.failures});
        std::fs::write(
            &json_path,
            serde_json::to_string_pretty(&doc).map_err(|e| DataFusionError::External(e.into()))?,
        )?;
        let mut written = vec![json_path];
        let sizes: Vec<&Value> = self
            .kernel
            .iter()
            .filter(|r| r["sweep"] == "size")
            .collect();
        if !sizes.is_empty() {
            let series = group(&sizes, |r| {
                let label = format!(
                    "{} {},{} payloads",
                    r["algorithm"].as_str().unwrap_or(""),
                    r["payloads"],
                    r["payloads"]
                );
                (label, num(r, "r_rows").log2(), num(r, "gtuples_per_s"))
            });
            let path = dir.join(format!("throughput-{stamp}.svg"));
            plot(
                &path,
                "Kernel-level throughput, |S| = 2|R|",
                "log2 |R|",
                "G tuples/s",
                &series,
            )?;
            written.push(path);
        }
        if !self.e2e.is_empty() {
            let rows: Vec<&Value> = self.e2e.iter().collect();
            let series = group(&rows, |r| {
                let ratio = num(r, "s_rows") / num(r, "r_rows");
                let label = format!(
                    "{},{} payloads, |S| = {ratio}|R|",
                    r["payloads"], r["payloads"]
                );
                (label, num(r, "r_rows").log2(), num(r, "speedup"))
            });
            let path = dir.join(format!("speedup-{stamp}.svg"));
            plot(
                &path,
                "End-to-end speed-up over DataFusion's HashJoinExec",
                "log2 |R|",
                "speed-up (x)",
                &series,
            )?;
            written.push(path);
        }
        Ok(written)
    }
}

/// Points grouped into named series, in first-seen order.
fn group(
    rows: &[&Value],
    point: impl Fn(&Value) -> (String, f64, f64),
) -> Vec<(String, Vec<(f64, f64)>)> {
    let mut series: Vec<(String, Vec<(f64, f64)>)> = vec![];
    for r in rows {
        let (label, x, y) = point(r);
        match series.iter_mut().find(|(l, _)| *l == label) {
            Some((_, pts)) => pts.push((x, y)),
            None => series.push((label, vec![(x, y)])),
        }
    }
    series
}

fn plot_err(e: impl std::fmt::Debug) -> DataFusionError {
    DataFusionError::Execution(format!("plot: {e:?}"))
}

/// A line plot of `series` as an SVG file.
fn plot(
    path: &Path,
    title: &str,
    x_desc: &str,
    y_desc: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> Result<()> {
    let pts = series.iter().flat_map(|(_, p)| p.iter());
    let (mut x0, mut x1, mut y1) = (f64::MAX, f64::MIN, 0f64);
    for &(x, y) in pts {
        (x0, x1) = (x0.min(x), x1.max(x));
        if y.is_finite() {
            y1 = y1.max(y);
        }
    }
    if x0 >= x1 {
        (x0, x1) = (x0 - 1.0, x0 + 1.0);
    }
    let root = SVGBackend::new(path, (900, 540)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(title, ("sans-serif", 22))
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(60)
        .build_cartesian_2d(x0..x1, 0f64..(y1 * 1.15).max(1.0))
        .map_err(plot_err)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .draw()
        .map_err(plot_err)?;
    for (i, (label, points)) in series.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(plot_err)?
            .label(label.as_str())
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))
            .map_err(plot_err)?;
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .border_style(BLACK)
        .background_style(WHITE.mix(0.9))
        .draw()
        .map_err(plot_err)?;
    root.present().map_err(plot_err)?;
    Ok(())
}
