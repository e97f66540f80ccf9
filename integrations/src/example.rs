//! The command line the `ballista` and `distributed` examples share.
//!
//! ```text
//! --scale SF            TPC-H scale factor (default 1)
//! --nodes N             executors or workers (default 2)
//! --set KEY=VALUE       a session setting, repeatable (gpu_join.backend=host, ...)
//! ```

use datafusion::common::{DataFusionError, Result};

/// The examples' options.
#[derive(Debug, Clone)]
pub struct Options {
    /// TPC-H scale factor.
    pub scale: f64,
    /// Executors (Ballista) or workers (datafusion-distributed).
    pub nodes: usize,
    /// Session settings, in order.
    pub settings: Vec<(String, String)>,
}

impl Options {
    /// Parses `args` (without the program name).
    pub fn parse(args: impl IntoIterator<Item = String>) -> Result<Self> {
        let mut options = Options {
            scale: 1.0,
            nodes: 2,
            settings: vec![],
        };
        let mut args = args.into_iter();
        while let Some(arg) = args.next() {
            let mut value = || {
                args.next()
                    .ok_or_else(|| DataFusionError::Configuration(format!("{arg} needs a value")))
            };
            let bad =
                |e: &dyn std::fmt::Display| DataFusionError::Configuration(format!("{arg}: {e}"));
            match arg.as_str() {
                "--scale" => options.scale = value()?.parse().map_err(|e| bad(&e))?,
                "--nodes" => match value()?.parse() {
                    Ok(0) => return Err(bad(&"a cluster needs at least one node")),
                    Ok(n) => options.nodes = n,
                    Err(e) => return Err(bad(&e)),
                },
                "--set" => {
                    let setting = value()?;
                    let (key, value) = setting
                        .split_once('=')
                        .ok_or_else(|| bad(&"expected KEY=VALUE"))?;
                    options.settings.push((key.into(), value.into()));
                }
                _ => {
                    return Err(DataFusionError::Configuration(format!(
                        "unknown argument {arg} (--scale SF, --nodes N, --set KEY=VALUE)"
                    )));
                }
            }
        }
        Ok(options)
    }

    /// The settings as the clusters' `start` functions take them.
    pub fn settings(&self) -> Vec<(&str, &str)> {
        self.settings
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect()
    }
}
