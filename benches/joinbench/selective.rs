//! Selective joins end to end through SQL: the standard workload's R (|R| = 2^`--types-log2-r`)
//! filtered to one row in `m` by a payload, joined with all of S (|S| = 2|R|, two payloads), so
//! that one probe row in `m` matches, as a filtered dimension joined to a fact table does. Each
//! match rate runs with the probe side's columns staged and gathered by the device
//! (`gpu_join.probe_columns = device`), taken on the host at the probe rows the device returns
//! (`host`), as `auto` chooses, and with the rule off, in the same run: where the two ways cross
//! is what `auto`'s threshold (`exec::carriage`) rests on.

use datafusion::common::{DataFusionError, Result};
use serde_json::json;

use crate::Device;
use crate::args::Args;
use crate::e2e::{context, explain};
use crate::report::{Report, progress};
use crate::sql::{find, rows, run_timed, set_rule};
use crate::workload::{Workload, generate};

/// One build row in `m` kept: the match rates measured.
const KEEP_ONE_IN: [u32; 7] = [1, 2, 4, 8, 16, 64, 256];

/// Where the rule-on runs take the probe columns.
const WAYS: [&str; 3] = ["device", "host", "auto"];

pub async fn run(device: &Device, args: &Args, report: &mut Report) -> Result<()> {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let w = Workload::standard(args.types_log2_r, 2);
    let bar = progress(KEEP_ONE_IN.len() as u64, "selective");
    bar.set_message("generating");
    let ctx = context(device, None, generate(&w), cores)?;
    for m in KEEP_ONE_IN {
        // Payloads are copies of the key: filtering one keeps the keys' spread, and DataFusion
        // infers no filter of S from it.
        let sql = format!(
            "SELECT count(*), sum(r.p1), sum(s.p0), sum(s.p1) FROM r JOIN s ON r.k = s.k \
             WHERE r.p0 % {m} = 0"
        );
        set_rule(&ctx, false).await?;
        bar.set_message(format!("one in {m}: rule off"));
        let off = run_timed(&ctx, &sql, args.e2e_runs).await?;
        let mut on_s = vec![];
        for way in WAYS {
            bar.set_message(format!("one in {m}: probe columns {way}"));
            set_rule(&ctx, true).await?;
            ctx.sql(&format!("SET gpu_join.probe_columns = '{way}'"))
                .await?
                .collect()
                .await?;
            let on = run_timed(&ctx, &sql, args.e2e_runs).await?;
            if args.e2e_explain {
                explain(&ctx, &sql, &format!("probe columns {way}")).await?;
            }
            if find(&on.plan, "GpuJoinExec").is_none() {
                return Err(DataFusionError::Execution(format!(
                    "`{sql}` did not run on GpuJoinExec"
                )));
            }
            if rows(&on.batches)? != rows(&off.batches)? {
                return Err(DataFusionError::Execution(format!(
                    "`{sql}` (probe columns {way}): results differ between rule on and off"
                )));
            }
            on_s.push(on.time.as_secs_f64());
        }
        let off_s = off.time.as_secs_f64();
        report.selective.push(json!({
            "keep_one_in": m, "r_rows": w.r_rows, "s_rows": w.s_rows,
            "backend": device.name(), "partitions": cores, "runs": args.e2e_runs,
            "device_s": on_s[0], "host_s": on_s[1], "auto_s": on_s[2], "rule_off_s": off_s,
        }));
        bar.inc(1);
    }
    bar.finish_and_clear();
    Ok(())
}
