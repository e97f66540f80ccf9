//! Where a join's output columns travel, beyond what their types decide ([`Carriage`]), and
//! the `gpu_join.probe_columns` setting ([`ProbeColumns`]): a join's probe columns are staged
//! with every probe row and gathered by the device, or left in the partition's probe batches
//! and taken on the host at the probe row positions the device returns.
//!
//! Staging a probe column costs every probe row (read, packed, copied, uploaded, and its
//! output downloaded); taking it on the host costs only the rows the join outputs. A join that
//! matches few of its probe rows (a filtered dimension joined to a fact table: TPC-H's `part`
//! rows of one brand against all of `lineitem`) spends less on the host. `auto` predicts the
//! share of probe rows that match from the build side's exact keys, once they are collected:
//! its rows over the values their range spans ([`on_host`]). A probe key drawn from that range
//! matches at about that rate; build keys that repeat make it an overestimate, and probe keys
//! that fall only where the build keys are (a probe side already filtered by them) an
//! underestimate. A key of several columns is judged by the column whose values the build rows
//! cover most (a pair matches only where each column does; their product, which the pairs of
//! a foreign key fill sparsely, would predict almost no match where every row matches). Keys
//! joined on a hash, and float keys (whose range is of bit patterns), say nothing of it
//! ([`KeyRange::value_span`](crate::columns::KeyRange::value_span)), so their probe columns
//! stay on the device.

use std::fmt;
use std::str::FromStr;

use datafusion::common::{DataFusionError, Result, config_err};

/// Below this predicted share of probe rows matched, `auto` takes the probe columns on the
/// host (BENCHMARKS.md measures both ways across match rates).
pub const MOST_MATCHED_ON_HOST: f64 = 0.125;

/// How one plan of a join carries the columns the device could carry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Carriage {
    /// The build side's view columns travel as their views (`gpu_join.views_on_device`).
    pub views_on_device: bool,
    /// Every probe column the join outputs is taken on the host by probe row position.
    pub probe_on_host: bool,
}

impl Carriage {
    /// The plan a join starts from: views on the device, probe columns staged.
    pub const DEVICE: Self = Self {
        views_on_device: true,
        probe_on_host: false,
    };
}

/// The `gpu_join.probe_columns` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ProbeColumns {
    /// On the host where the build side's keys predict few probe rows matched, else staged.
    #[default]
    Auto,
    /// Always staged and gathered by the device.
    Device,
    /// Always taken on the host (where the join outputs only probe rows that match).
    Host,
}

impl FromStr for ProbeColumns {
    type Err = DataFusionError;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "device" => Ok(Self::Device),
            "host" => Ok(Self::Host),
            other => {
                config_err!("gpu_join.probe_columns must be auto, device or host, not '{other}'")
            }
        }
    }
}

impl fmt::Display for ProbeColumns {
    /// As the setting is written: `auto`, `device`, `host`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Device => "device",
            Self::Host => "host",
        })
    }
}

/// Why an execution takes its probe columns on the host, or `None` where it stages them:
/// `rows` build rows whose exact key columns' values span `spans` values each, for the
/// columns whose range tells (`None` for keys joined on a hash).
pub fn on_host(setting: ProbeColumns, spans: Option<&[u64]>, rows: usize) -> Option<String> {
    match setting {
        ProbeColumns::Device => None,
        ProbeColumns::Host => Some("gpu_join.probe_columns = host".into()),
        ProbeColumns::Auto => few_match(spans?, rows),
    }
}

/// Why few probe rows are expected to match (less than [`MOST_MATCHED_ON_HOST`] of them), or
/// `None`: `rows` build rows whose exact key columns' values span `spans` values each. A key
/// of several columns is judged by the column the build rows cover most.
pub fn few_match(spans: &[u64], rows: usize) -> Option<String> {
    let span = spans.iter().copied().min()?;
    let share = rows as f64 / span.max(1) as f64;
    (share < MOST_MATCHED_ON_HOST).then(|| {
        format!(
            "{rows} build keys over a range of {span} values: about {:.2}% of probe rows match",
            share * 100.0
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_setting_reads_as_written() {
        assert_eq!("HOST".parse::<ProbeColumns>().unwrap(), ProbeColumns::Host);
        assert_eq!(
            " device ".parse::<ProbeColumns>().unwrap(),
            ProbeColumns::Device
        );
        assert_eq!("auto".parse::<ProbeColumns>().unwrap(), ProbeColumns::Auto);
        assert!("gpu".parse::<ProbeColumns>().is_err());
        assert_eq!(ProbeColumns::Host.to_string(), "host");
    }

    #[test]
    fn auto_takes_probe_columns_on_the_host_where_few_probe_rows_match() {
        // TPC-H Q17 at SF 30: 6,090 parts of one brand and container among 6 million.
        let why = on_host(ProbeColumns::Auto, Some(&[6_000_000]), 6_090).unwrap();
        assert!(why.contains("about 0.10% of probe rows match"), "{why}");
        // A whole dimension, or a quarter of its keys: staged.
        assert_eq!(on_host(ProbeColumns::Auto, Some(&[1 << 20]), 1 << 20), None);
        assert_eq!(on_host(ProbeColumns::Auto, Some(&[1 << 20]), 1 << 18), None);
        // A pair of columns (TPC-H Q9's part and supplier keys): judged by the one covered
        // most, not by their product, which 319,404 rows fill to 0.02 %.
        assert_eq!(
            on_host(ProbeColumns::Auto, Some(&[199_960, 10_000]), 319_404),
            None
        );
        let why = on_host(ProbeColumns::Auto, Some(&[199_960, 10_000]), 1_000).unwrap();
        assert!(why.contains("range of 10000 values: about 10.00%"), "{why}");
        // Hashed keys predict nothing.
        assert_eq!(on_host(ProbeColumns::Auto, None, 10), None);
        assert_eq!(on_host(ProbeColumns::Device, Some(&[1 << 40]), 10), None);
        assert!(on_host(ProbeColumns::Host, None, 1 << 20).is_some());
    }
}
