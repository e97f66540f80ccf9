//! EXPLAIN ANALYZE of a query on `GpuJoinExec` shows its rows, per-phase times, bytes moved and peak device
//! memory; EXPLAIN shows the join type, keys, backend and algorithm. A join whose exact keys
//! turn out wider than 64 bits shows that it ran on hashed keys, not DataFusion's join; a join
//! on string or binary keys shows whether the device checked them (keys of up to 16 bytes) or
//! the host verified them (a longer build key), and gives DataFusion's rows either way.

use arrow::util::pretty::pretty_format_batches;

use crate::harness::{Options, Outcome, Suite, block_on};
use crate::slt::session;

/// Runs the `setup` statements and then `query` in a session with the rule on and in one with
/// it off: the rows of each (pretty-printed), and the `GpuJoinExec` line of the rule-on
/// EXPLAIN ANALYZE.
fn on_and_off(
    options: &Options,
    setup: &[&str],
    query: &str,
) -> Result<(String, String, String), String> {
    let run = |on: bool| {
        let ctx = session(options, on);
        block_on(async {
            for statement in setup {
                ctx.sql(statement).await?.collect().await?;
            }
            let rows = ctx.sql(query).await?.collect().await?;
            let explain = ctx
                .sql(&format!("EXPLAIN ANALYZE {query}"))
                .await?
                .collect()
                .await?;
            Ok::<_, datafusion::common::DataFusionError>((
                pretty_format_batches(&rows)?.to_string(),
                pretty_format_batches(&explain)?.to_string(),
            ))
        })
        .map_err(|e| e.to_string())
    };
    let ((got, text), (want, _)) = (run(true)?, run(false)?);
    let line = text
        .lines()
        .find(|l| l.contains("GpuJoinExec"))
        .ok_or_else(|| format!("no GpuJoinExec in\n{text}"))?;
    Ok((got, want, line.to_string()))
}

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
        for want in ["join_type=Inner", "on=[(k@0, k@0)]", backend, "algorithm=DIRECT", "output_rows=19.98 K", "output_batches=", "build_rows=5.00 K", "probe_rows=20.00 K", "upload_time=", "transform_time=", "match_time=", "materialize_time=", "download_time=", "bytes_uploaded=", "bytes_downloaded=", "peak_device_memory="] {
            if !line.contains(want) {
                return Err(format!("`{want}` missing from: {line}"));
            }
        }
        Ok(Outcome::Passed)
    });
    let options = suite.options.clone();
    suite.add("metrics::wide_keys_hashed_at_run_time", move || {
        if options.require_cuda && !options.cuda_present() {
            return Err("--require-cuda, but no usable CUDA device".into());
        }
        // Two BIGINT keys spanning most of their type: 2 x 64 bits of range, no exact encoding.
        let setup = "CREATE TABLE w AS SELECT value * 4611686018427387 AS x, \
                     9000000000000000000 - value * 4611686018427387 AS y, value AS z \
                     FROM generate_series(-2000, 2000)";
        let query = "SELECT count(*), sum(a.z), sum(b.z) FROM w a JOIN w b \
                     ON a.x = b.x AND a.y = b.y";
        let (got, want, line) = on_and_off(&options, &[setup], query)?;
        if got != want {
            return Err(format!("rule on gave\n{got}\nrule off\n{want}"));
        }
        for want in ["keys=hashed at run time", "output_rows=4.00 K"] {
            if !line.contains(want) {
                return Err(format!("`{want}` missing from: {line}"));
            }
        }
        if line.contains("fallback=") {
            return Err(format!("fell back to DataFusion's join: {line}"));
        }
        Ok(Outcome::Passed)
    });
    let options = suite.options.clone();
    suite.add("metrics::wide_decimal_keys_hashed_at_run_time", move || {
        if options.require_cuda && !options.cuda_present() {
            return Err("--require-cuda, but no usable CUDA device".into());
        }
        // DECIMAL(38, 0) keys beyond 64 bits: no exact encoding, so the join runs hashed (and
        // verified on the host); the same keys within 64 bits are encoded exactly.
        for (scale, hashed) in [("100000000000000000000", true), ("1", false)] {
            let setup = format!(
                "CREATE TABLE w AS SELECT arrow_cast(CAST(value AS DECIMAL(38, 0)) \
                 * CAST('{scale}' AS DECIMAL(38, 0)), 'Decimal128(38, 0)') AS x, \
                 value AS z FROM generate_series(-2000, 2000)"
            );
            let query = "SELECT count(*), sum(a.z), sum(b.z) FROM w a JOIN w b ON a.x = b.x";
            let (got, want, line) = on_and_off(&options, &[setup.as_str()], query)?;
            if got != want {
                return Err(format!("rule on gave\n{got}\nrule off\n{want}"));
            }
            if line.contains("keys=hashed at run time") != hashed || line.contains("fallback=") {
                return Err(format!("scale {scale}: {line}"));
            }
        }
        Ok(Outcome::Passed)
    });
    let options = suite.options.clone();
    suite.add(
        "metrics::byte_keys_checked_on_device_or_verified_on_host",
        move || {
            if options.require_cuda && !options.cuda_present() {
                return Err("--require-cuda, but no usable CUDA device".into());
            }
            // Keys that differ only past their bytes (a trailing NUL), empty and null keys, keys of
            // exactly 16 bytes and non-ASCII ones; then the same with one key of 17 bytes (two
            // words of check bytes).
            let short = "CREATE TABLE t AS SELECT * FROM (VALUES \
                     (x'61', 1), (x'6100', 2), (x'610000', 3), (x'', 4), (NULL, 5), \
                     (x'30313233343536373839616263646566', 6), (x'c39c6ec3af', 7), (x'61', 8)) \
                     AS t(k, v)";
            let long = "CREATE TABLE t AS SELECT * FROM (VALUES \
                     (x'61', 1), (x'6100', 2), (x'', 4), (NULL, 5), \
                     (x'3031323334353637383961626364656667', 6), (x'c39c6ec3af', 7)) AS t(k, v)";
            // Keys of 64 bytes that differ only in their last byte, one of 48 bytes, one a prefix
            // of another: four words of check bytes.
            let longer = "CREATE TABLE t AS SELECT * FROM (VALUES \
                     (x'30313233343536373839616263646566303132333435363738396162636465663031323334353637383961626364656630313233343536373839616263646566', 1), \
                     (x'30313233343536373839616263646566303132333435363738396162636465663031323334353637383961626364656630313233343536373839616263646567', 2), \
                     (x'303132333435363738396162636465663031323334353637383961626364656630313233343536373839616263646566', 3), (x'30313233343536373839616263646566303132333435363738396162636465663031323334353637383961626364656600', 4), (NULL, 5), (x'61', 6)) AS t(k, v)";
            // And one of 65 bytes: verified on the host.
            let longest = "CREATE TABLE t AS SELECT * FROM (VALUES \
                     (x'3031323334353637383961626364656630313233343536373839616263646566303132333435363738396162636465663031323334353637383961626364656630', 1), \
                     (x'30313233343536373839616263646566303132333435363738396162636465663031323334353637383961626364656630313233343536373839616263646566', 2), (x'61', 3), (NULL, 4), \
                     (x'3031323334353637383961626364656630313233343536373839616263646566303132333435363738396162636465663031323334353637383961626364656661', 5)) AS t(k, v)";
            let queries = [
                "SELECT a.v, b.v FROM t a JOIN t b ON a.k = b.k ORDER BY 1, 2",
                "SELECT a.v, b.v FROM t a LEFT JOIN t b ON a.k = b.k ORDER BY 1, 2",
                "SELECT a.v, b.v FROM t a JOIN t b ON a.k IS NOT DISTINCT FROM b.k ORDER BY 1, 2",
                "SELECT a.v, b.v FROM t a JOIN t b \
             ON arrow_cast(a.k, 'Utf8View') = arrow_cast(b.k, 'Utf8View') ORDER BY 1, 2",
            ];
            // 0 hash bits: every key hashes alike, and only the exact comparison decides.
            for (setup, keys, bits) in [
                (short, "keys=hashed, checked on the device", 62),
                (short, "keys=hashed, checked on the device", 0),
                (
                    long,
                    "keys=hashed, checked on the device (keys of up to 32 bytes)",
                    62,
                ),
                (
                    long,
                    "keys=hashed, checked on the device (keys of up to 32 bytes)",
                    0,
                ),
                (
                    longer,
                    "keys=hashed, checked on the device (keys of up to 64 bytes)",
                    0,
                ),
                (longest, "keys=hashed, verified on the host", 62),
                (longest, "keys=hashed, verified on the host", 0),
            ] {
                for query in queries {
                    let bits_setting = format!("SET gpu_join.key_hash_bits = {bits}");
                    let (got, want, line) = on_and_off(&options, &[&bits_setting, setup], query)?;
                    if got != want {
                        return Err(format!(
                            "{query} ({bits} hash bits): rule on gave\n{got}\nrule off\n{want}"
                        ));
                    }
                    if !line.contains(keys) || line.contains("fallback=") {
                        return Err(format!("{query}: `{keys}` missing, or a fallback: {line}"));
                    }
                }
            }
            Ok(Outcome::Passed)
        },
    );
}
