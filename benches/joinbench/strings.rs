//! Strings (and other keys) end to end through SQL: the standard workload (|R| =
//! 2^`--types-log2-r`, |S| = 2|R|, every S row matching), joined eighteen ways with the rule on
//! and off in the same run:
//!
//! - on its 4-byte integer keys (the baseline);
//! - on 16-byte string keys, 8 hex digits of the key after a fixed 8-byte prefix (`Utf8View`,
//!   checked on the device: staged as check bytes and length classes, hashed on the device);
//! - on 36-byte string keys (the length of a UUID's text: the 16-byte key and a fixed suffix),
//!   checked on the device in three words of check bytes;
//! - on the 16-byte string keys as `Dictionary(Int32, Utf8)`;
//! - on integer keys, carrying those dictionary strings a side;
//! - on 8-byte float keys (the key / 4 as `DOUBLE`, encoded exactly by their bits);
//! - on integer keys, carrying one string payload a side of 32 bytes on average (`Utf8View`):
//!   three times, the build side's payloads carried through the device as their views with
//!   their values gathered on the device (`gpu_join.views_on_device` and
//!   `gpu_join.view_bytes_on_device`, the defaults), as their views with the values gathered on
//!   the host, then gathered on the host by row position (the probe side's are gathered on the
//!   host in all three);
//! - the same payloads as `Utf8` (with offsets): the build side's carried through the device as
//!   views over their values buffers, with their values gathered on the device, then gathered
//!   on the host by row position; then the build side's alone, and the probe side's alone;
//! - `Utf8` payloads of which about 1 in 256 is 300 copies of the hex number (about 1,800
//!   bytes, longer than the device gathers): the device gathers the others and the host copies
//!   those, then the host gathers all by row position;
//! - a dimension of 1,024 rows joined with S on a low-cardinality key (S's key modulo 1,024),
//!   as an integer, as 16-byte strings (`Utf8View`) and as a dictionary of them (each S batch's
//!   dictionary holds the values of its rows, at most 1,024): how far the checked string keys
//!   are from integer keys, which is all that encoding such keys as integer codes against the
//!   build side could gain.
//!
//! Each query sums the payloads so that every output row is read. `--e2e-explain` prints each
//! query's EXPLAIN ANALYZE, rule on and off. Reports both times, the
//! speed-up, and each join's rule-on time over the integer join's (the issue's target: string
//! keys at ≥ 50 % of the integer keys' throughput, i.e. at most 2x its time).

use std::sync::Arc;

use datafusion::common::{DataFusionError, Result};
use datafusion::datasource::MemTable;
use serde_json::json;

use crate::Device;
use crate::args::Args;
use crate::e2e::{context, explain, partitions};
use crate::report::{Report, progress};
use crate::sql::{find, rows, run_timed, set_rule};
use crate::workload::{Workload, generate};

/// The columns both tables get, made by SQL from their own `k` and `p0`.
const COLUMNS: &str = "k, p0, arrow_cast(concat('prefix__', lpad(to_hex(k), 8, '0')), 'Utf8View') AS ks, \
     arrow_cast(repeat(to_hex(abs(p0)), 2 + abs(p0) % 5), 'Utf8View') AS pay, \
     CAST(k AS DOUBLE) / 4 AS kf, \
     arrow_cast(concat('prefix__', lpad(to_hex(k), 8, '0'), '-0000-4000-8000-000000000000'), 'Utf8View') AS kl, \
     arrow_cast(concat('prefix__', lpad(to_hex(k), 8, '0')), 'Dictionary(Int32, Utf8)') AS kd, \
     arrow_cast(repeat(to_hex(abs(p0)), 2 + abs(p0) % 5), 'Utf8') AS payo, \
     arrow_cast(repeat(to_hex(abs(p0)), CASE WHEN p0 % 256 = 0 THEN 300 ELSE 2 + abs(p0) % 5 END), 'Utf8') AS payl, \
     k % 1024 AS kc, \
     arrow_cast(concat('prefix__', lpad(to_hex(k % 1024), 8, '0')), 'Utf8View') AS kcs, \
     arrow_cast(concat('prefix__', lpad(to_hex(k % 1024), 8, '0')), 'Dictionary(Int32, Utf8)') AS kcd";

/// The tables with string columns, made from `r` and `s` by SQL before anything is timed (then
/// dealt out again over one partition per core: a `CREATE TABLE AS` may leave them in one).
fn setup() -> [(&'static str, String); 3] {
    [
        ("rs", format!("SELECT {COLUMNS} FROM r")),
        ("ss", format!("SELECT {COLUMNS} FROM s")),
        // A dimension of 1,024 rows, one per low-cardinality key (R's keys are 0 to |R| - 1).
        (
            "dim",
            "SELECT kc, kcs, kcd, p0 FROM rs WHERE k < 1024".into(),
        ),
    ]
}

/// The joins: name, SQL, and how the build side's views travel: `gpu_join.views_on_device`,
/// `gpu_join.view_bytes_on_device`.
const QUERIES: [(&str, &str, (bool, bool)); 18] = [
    (
        "integer keys",
        "SELECT count(*), sum(r.p0), sum(s.p0) FROM rs r JOIN ss s ON r.k = s.k",
        (true, true),
    ),
    (
        "16-byte string keys",
        "SELECT count(*), sum(r.p0), sum(s.p0) FROM rs r JOIN ss s ON r.ks = s.ks",
        (true, true),
    ),
    (
        "36-byte string keys",
        "SELECT count(*), sum(r.p0), sum(s.p0) FROM rs r JOIN ss s ON r.kl = s.kl",
        (true, true),
    ),
    (
        "16-byte dictionary string keys",
        "SELECT count(*), sum(r.p0), sum(s.p0) FROM rs r JOIN ss s ON r.kd = s.kd",
        (true, true),
    ),
    (
        "8-byte float keys",
        "SELECT count(*), sum(r.p0), sum(s.p0) FROM rs r JOIN ss s ON r.kf = s.kf",
        (true, true),
    ),
    (
        "integer keys, dictionary string payloads",
        "SELECT count(*), sum(length(r.kd)), sum(length(s.kd)) FROM rs r JOIN ss s ON r.k = s.k",
        (true, true),
    ),
    (
        "integer keys, string payloads (build values gathered on the device)",
        PAYLOADS,
        (true, true),
    ),
    (
        "integer keys, string payloads (build views on the device, values gathered on the host)",
        PAYLOADS,
        (true, false),
    ),
    (
        "integer keys, string payloads (build views gathered on the host)",
        PAYLOADS,
        (false, false),
    ),
    (
        "integer keys, Utf8 payloads (build values gathered on the device)",
        OFFSET_PAYLOADS,
        (true, true),
    ),
    (
        "integer keys, Utf8 payloads (build values gathered on the host)",
        OFFSET_PAYLOADS,
        (false, false),
    ),
    (
        "integer keys, Utf8 build payloads only (values gathered on the device)",
        "SELECT count(*), sum(length(r.payo)), sum(s.p0) FROM rs r JOIN ss s ON r.k = s.k",
        (true, true),
    ),
    (
        "integer keys, Utf8 probe payloads only (taken on the host)",
        "SELECT count(*), sum(r.p0), sum(length(s.payo)) FROM rs r JOIN ss s ON r.k = s.k",
        (true, true),
    ),
    (
        "integer keys, Utf8 payloads, 1 in 256 of about 1.8 KB (build values gathered on the device, the long ones copied by the host)",
        LONG_PAYLOADS,
        (true, true),
    ),
    (
        "integer keys, Utf8 payloads, 1 in 256 of about 1.8 KB (build values gathered on the host)",
        LONG_PAYLOADS,
        (false, false),
    ),
    (
        "low-cardinality integer keys (a dimension of 1,024 rows)",
        "SELECT count(*), sum(d.p0), sum(f.p0) FROM dim d JOIN ss f ON d.kc = f.kc",
        (true, true),
    ),
    (
        "low-cardinality 16-byte string keys (a dimension of 1,024 rows)",
        "SELECT count(*), sum(d.p0), sum(f.p0) FROM dim d JOIN ss f ON d.kcs = f.kcs",
        (true, true),
    ),
    (
        "low-cardinality 16-byte dictionary string keys (a dimension of 1,024 rows)",
        "SELECT count(*), sum(d.p0), sum(f.p0) FROM dim d JOIN ss f ON d.kcd = f.kcd",
        (true, true),
    ),
];

/// The join carrying a string payload a side.
const PAYLOADS: &str =
    "SELECT count(*), sum(length(r.pay)), sum(length(s.pay)) FROM rs r JOIN ss s ON r.k = s.k";

/// The join carrying the same payloads as `Utf8`, with offsets: the device carries the build
/// side's as views over their values buffers, or the host gathers them by row position.
const OFFSET_PAYLOADS: &str =
    "SELECT count(*), sum(length(r.payo)), sum(length(s.payo)) FROM rs r JOIN ss s ON r.k = s.k";

/// The join carrying `Utf8` payloads of which about 1 in 256 (the rows whose `p0` is a
/// multiple of 256) is 300 copies of the hex number, about 1,800 bytes: longer than the device
/// gathers, so the host copies those and the device the others.
const LONG_PAYLOADS: &str =
    "SELECT count(*), sum(length(r.payl)), sum(length(s.payl)) FROM rs r JOIN ss s ON r.k = s.k";

pub async fn run(device: &Device, args: &Args, report: &mut Report) -> Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let w = Workload::standard(args.types_log2_r, 2);
    let bar = progress(QUERIES.len() as u64, "strings");
    bar.set_message("generating");
    let ctx = context(device, None, generate(&w), cores)?;
    for (name, sql) in setup() {
        let batches = ctx.sql(&sql).await?.collect().await?;
        let schema = batches[0].schema();
        let table = MemTable::try_new(schema, partitions(batches, cores))?;
        ctx.register_table(name, Arc::new(table))?;
    }
    let mut integer_on = None;
    for (name, sql, (views_on_device, view_bytes_on_device)) in QUERIES {
        bar.set_message(format!("{name}: rule on"));
        set_rule(&ctx, true).await?;
        for set in [
            format!("SET gpu_join.views_on_device = {views_on_device}"),
            format!("SET gpu_join.view_bytes_on_device = {view_bytes_on_device}"),
        ] {
            ctx.sql(&set).await?.collect().await?;
        }
        let on = run_timed(&ctx, sql, args.e2e_runs).await?;
        if args.e2e_explain {
            explain(&ctx, sql, "rule on").await?;
        }
        if find(&on.plan, "GpuJoinExec").is_none() {
            return Err(DataFusionError::Execution(format!(
                "`{sql}` ({name}) did not run on GpuJoinExec"
            )));
        }
        set_rule(&ctx, false).await?;
        bar.set_message(format!("{name}: rule off"));
        let off = run_timed(&ctx, sql, args.e2e_runs).await?;
        if args.e2e_explain {
            explain(&ctx, sql, "rule off").await?;
        }
        if rows(&on.batches)? != rows(&off.batches)? {
            return Err(DataFusionError::Execution(format!(
                "`{sql}`: results differ between rule on and off"
            )));
        }
        let (on_s, off_s) = (on.time.as_secs_f64(), off.time.as_secs_f64());
        let integer_s = *integer_on.get_or_insert(on_s);
        report.strings.push(json!({
            "join": name, "query": sql, "r_rows": w.r_rows, "s_rows": w.s_rows,
            "backend": device.name(), "partitions": cores, "runs": args.e2e_runs,
            "views_on_device": views_on_device,
            "view_bytes_on_device": view_bytes_on_device,
            "rule_on_s": on_s, "rule_off_s": off_s, "speedup": off_s / on_s,
            "over_integer": on_s / integer_s,
        }));
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(())
}
