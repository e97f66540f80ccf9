//! TPC-H tables written as Parquet files, the queries the examples run over them, and the
//! comparison of a cluster's answers with a local `SessionContext`'s.

use std::fs::File;
use std::path::Path;

use arrow::array::RecordBatch;
use arrow::error::ArrowError;
use arrow::util::display::{ArrayFormatter, FormatOptions};
use datafusion::common::{DataFusionError, Result};
use datafusion::parquet::arrow::ArrowWriter;
use datafusion::prelude::{ParquetReadOptions, SessionContext};
use datafusion_gpu_join::{DecodedJoins, GpuJoinCodec};
use tpchgen::generators::{
    CustomerGenerator, LineItemGenerator, NationGenerator, OrderGenerator, RegionGenerator,
    SupplierGenerator,
};
use tpchgen_arrow::{
    CustomerArrow, LineItemArrow, NationArrow, OrderArrow, RegionArrow, SupplierArrow,
};

/// The TPC-H queries the examples run (the benchmark's own files): Q3, Q5 and Q10, with two,
/// five and three joins.
pub const QUERIES: [(usize, &str); 3] = [
    (3, include_str!("../../benches/joinbench/tpch/q03.sql")),
    (5, include_str!("../../benches/joinbench/tpch/q05.sql")),
    (10, include_str!("../../benches/joinbench/tpch/q10.sql")),
];

/// The tables those queries read.
const TABLES: [&str; 6] = [
    "customer", "orders", "lineitem", "supplier", "nation", "region",
];

/// Writes the tables at scale factor `sf` under `dir`, one folder per table and, for all but
/// `nation` and `region`, `files` Parquet files per table (so that scans split across tasks).
pub fn write_tables(dir: &Path, sf: f64, files: usize) -> Result<()> {
    let files = files.max(1) as i32;
    for table in TABLES {
        let parts = match table {
            "nation" | "region" => 1,
            _ => files,
        };
        let folder = dir.join(table);
        std::fs::create_dir_all(&folder)?;
        for part in 1..=parts {
            let mut batches: Box<
                dyn Iterator<Item = std::result::Result<RecordBatch, ArrowError>>,
            > = match table {
                "customer" => Box::new(CustomerArrow::new(CustomerGenerator::new(sf, part, parts))),
                "orders" => Box::new(OrderArrow::new(OrderGenerator::new(sf, part, parts))),
                "lineitem" => Box::new(LineItemArrow::new(LineItemGenerator::new(sf, part, parts))),
                "supplier" => Box::new(SupplierArrow::new(SupplierGenerator::new(sf, part, parts))),
                "nation" => Box::new(NationArrow::new(NationGenerator::new(sf, part, parts))),
                _ => Box::new(RegionArrow::new(RegionGenerator::new(sf, part, parts))),
            };
            let Some(first) = batches.next().transpose()? else {
                continue;
            };
            let file = File::create(folder.join(format!("part-{part}.parquet")))?;
            let mut writer = ArrowWriter::try_new(file, first.schema(), None)?;
            writer.write(&first)?;
            for batch in batches {
                writer.write(&batch?)?;
            }
            writer.close()?;
        }
    }
    Ok(())
}

/// Registers the tables written under `dir` in `ctx`.
pub async fn register(ctx: &SessionContext, dir: &Path) -> Result<()> {
    for table in TABLES {
        let path = dir.join(table);
        let path = path
            .to_str()
            .ok_or_else(|| DataFusionError::Execution(format!("{path:?} is not UTF-8")))?;
        ctx.register_parquet(table, path, ParquetReadOptions::default())
            .await?;
    }
    Ok(())
}

/// One query's answer on a cluster against a local `SessionContext`.
#[derive(Debug)]
pub struct Compared {
    /// The TPC-H query number.
    pub query: usize,
    /// Rows in the cluster's answer.
    pub rows: usize,
    /// Whether the two answers hold the same rows.
    pub equal: bool,
    /// The joins the cluster's executors decoded while running it, by where they ran.
    pub joins: DecodedJoins,
}

/// Registers the tables written under `dir` in `cluster` and in a local session, runs every
/// query of [`QUERIES`] on both and compares the answers; `codec` is the one the cluster's
/// executors decode with.
pub async fn compare_with_local(
    cluster: &SessionContext,
    codec: &GpuJoinCodec,
    dir: &Path,
) -> Result<Vec<Compared>> {
    register(cluster, dir).await?;
    let local = local_context(dir).await?;
    compare(cluster, &local, codec).await
}

/// Runs every query of [`QUERIES`] on `cluster` and on `local`, and compares the answers;
/// `codec` is the one the cluster's executors decode with.
pub async fn compare(
    cluster: &SessionContext,
    local: &SessionContext,
    codec: &GpuJoinCodec,
) -> Result<Vec<Compared>> {
    let mut out = vec![];
    for (query, sql) in QUERIES {
        let before = codec.decoded();
        let got = rows(&cluster.sql(sql).await?.collect().await?)?;
        let after = codec.decoded();
        let want = rows(&local.sql(sql).await?.collect().await?)?;
        out.push(Compared {
            query,
            rows: got.len(),
            equal: got == want,
            joins: DecodedJoins {
                gpu: after.gpu - before.gpu,
                host: after.host - before.host,
                datafusion: after.datafusion - before.datafusion,
            },
        });
    }
    Ok(out)
}

/// Prints one line per query, then `results equal: true` or `results equal: false`; returns
/// whether every answer was equal.
pub fn report(engine: &str, compared: &[Compared]) -> bool {
    for c in compared {
        let j = &c.joins;
        println!(
            "{engine} TPC-H Q{}: {} rows, equal: {}; joins the executors decoded: {} GpuJoinExec \
             on a GPU, {} GpuJoinExec on the host backend, {} DataFusion joins",
            c.query, c.rows, c.equal, j.gpu, j.host, j.datafusion
        );
    }
    let equal = compared.iter().all(|c| c.equal);
    println!("results equal: {equal}");
    equal
}

/// Every row of `batches` as one string, sorted, so that answers compare whatever their
/// batching and the order of ties.
fn rows(batches: &[RecordBatch]) -> Result<Vec<String>> {
    let options = FormatOptions::default().with_null("NULL");
    let mut rows = vec![];
    for batch in batches {
        let columns = batch
            .columns()
            .iter()
            .map(|c| ArrayFormatter::try_new(c.as_ref(), &options))
            .collect::<std::result::Result<Vec<_>, _>>()?;
        for row in 0..batch.num_rows() {
            let cells: Vec<String> = columns.iter().map(|c| c.value(row).to_string()).collect();
            rows.push(cells.join("|"));
        }
    }
    rows.sort();
    Ok(rows)
}

/// The local oracle: DataFusion's own joins over the same files.
pub async fn local_context(dir: &Path) -> Result<SessionContext> {
    let ctx = SessionContext::new();
    register(&ctx, dir).await?;
    Ok(ctx)
}
