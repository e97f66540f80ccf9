//! [`GpuJoinConfig`]: the `gpu_join.*` settings, a DataFusion config extension, so that SQL can
//! say `SET gpu_join.enabled = false` or `SET gpu_join.memory_limit = '8GiB'`. Typed settings
//! ([`BackendChoice`], [`MemoryLimit`]) are checked when they are set: a bad value makes the
//! `SET` fail and leaves the setting as it was.
//!
//! The settings list themselves under their full names (`gpu_join.backend`), as DataFusion's
//! own do: `SHOW gpu_join.backend` finds them, and engines that send a session's settings to
//! other processes as name–value pairs (Ballista) send them whole. DataFusion's
//! `extensions_options!` lists an extension's settings without its prefix, so the struct and
//! its impls come from [`settings!`] here.
//!
//! Typed settings: [`BackendChoice`], [`MemoryLimit`], [`DeviceList`], [`Algorithm`],
//! [`ProbeColumns`], [`ByteSize`].

use std::any::Any;
use std::fmt;
use std::str::FromStr;

use datafusion::common::config::{
    ConfigEntry, ConfigExtension, ConfigField, ExtensionOptions, Visit,
};
use datafusion::common::{DataFusionError, Result, config_err};

use crate::device::Devices;
pub use crate::exec::ProbeColumns;
pub use crate::join::Algorithm;

/// A config extension struct, its `Default`, and its `ConfigField` and `ExtensionOptions`
/// impls, which list its settings under `<PREFIX>.<name>`, each described by its doc comment.
macro_rules! settings {
    (
        $(#[doc = $struct_doc:literal])*
        pub struct $name:ident {
            $(
                $(#[doc = $doc:literal])*
                pub $field:ident: $ty:ty, default = $default:expr
            )*
        }
    ) => {
        $(#[doc = $struct_doc])*
        #[derive(Debug, Clone)]
        #[non_exhaustive]
        pub struct $name {
            $(
                $(#[doc = $doc])*
                pub $field: $ty,
            )*
        }

        impl Default for $name {
            fn default() -> Self {
                Self { $($field: $default),* }
            }
        }

        impl ConfigField for $name {
            fn set(&mut self, key: &str, value: &str) -> Result<()> {
                let (key, rest) = key.split_once('.').unwrap_or((key, ""));
                match key {
                    $(stringify!($field) => self.$field.set(rest, value),)*
                    _ => config_err!("no setting {}.{key}", <$name as ConfigExtension>::PREFIX),
                }
            }

            fn visit<V: Visit>(&self, v: &mut V, prefix: &str, _description: &'static str) {
                $(
                    let key = match prefix {
                        "" => stringify!($field).to_string(),
                        prefix => format!("{prefix}.{}", stringify!($field)),
                    };
                    self.$field.visit(v, &key, concat!($($doc),*).trim());
                )*
            }
        }

        impl ExtensionOptions for $name {
            fn as_any(&self) -> &dyn Any {
                self
            }

            fn as_any_mut(&mut self) -> &mut dyn Any {
                self
            }

            fn cloned(&self) -> Box<dyn ExtensionOptions> {
                Box::new(self.clone())
            }

            fn set(&mut self, key: &str, value: &str) -> Result<()> {
                ConfigField::set(self, key, value)
            }

            fn entries(&self) -> Vec<ConfigEntry> {
                struct Entries(Vec<ConfigEntry>);
                impl Visit for Entries {
                    fn some<V: fmt::Display>(&mut self, key: &str, value: V, description: &'static str) {
                        self.0.push(ConfigEntry {
                            key: key.to_string(),
                            value: Some(value.to_string()),
                            description,
                        });
                    }

                    fn none(&mut self, key: &str, description: &'static str) {
                        self.0.push(ConfigEntry {
                            key: key.to_string(),
                            value: None,
                            description,
                        });
                    }
                }
                let mut entries = Entries(vec![]);
                self.visit(&mut entries, <$name as ConfigExtension>::PREFIX, "");
                entries.0
            }
        }
    };
}

settings! {
    /// Settings of the GPU join, under the prefix `gpu_join`.
    pub struct GpuJoinConfig {
        /// Replace eligible hash joins with `GpuJoinExec`.
        pub enabled: bool, default = true
        /// Where `GpuJoinExec` runs: `auto` (the GPU if one is usable; without one, joins stay
        /// DataFusion's, unless `min_build_rows` is 0, which puts them on the host), `cuda`
        /// (the GPU, or an error), or `host` (the same algorithm on the CPU).
        pub backend: BackendChoice, default = BackendChoice::Auto
        /// Joins whose build (left) side is estimated to hold fewer rows than this stay on
        /// DataFusion's CPU hash join: probing a table of a few hundred rows (a dimension such
        /// as TPC-H's nation or region) costs the CPU about what staging the probe rows for
        /// the GPU would. Unknown sizes, and inputs that hold a join, count as large. `0` puts
        /// every eligible join on `GpuJoinExec` whatever the sizes, which tests and benchmarks
        /// rely on.
        pub min_build_rows: usize, default = 1000
        /// Joins whose two inputs are estimated to hold fewer rows than this together stay on
        /// DataFusion's CPU hash join: below it the GPU path's fixed costs (a device lane,
        /// copies and launches, a few ms) outweigh what it saves (BENCHMARKS.md has the
        /// crossover measured on a GPU host). Unknown sizes, and inputs that hold a join, count
        /// as large. Not applied when `min_build_rows` is 0.
        pub min_input_rows: usize, default = 1 << 22
        /// The CUDA device ordinal to use (where `devices` is empty).
        pub device: usize, default = 0
        /// The GPUs a join spreads its probe partitions over: empty (the one `device` names),
        /// a list of ordinals (`0,1`), or `all`. Each GPU holds a copy of the build side and
        /// runs its own device lane within its own `memory_limit`; joins that output build
        /// rows after the probe side (left, full, left semi, anti and mark) merge every
        /// device's marks of the build rows before they output them; joins whose probe side is
        /// not estimated at least as large as the build side run on the first.
        /// On the host backend, each listed device is a lane of the host twin (the lanes share
        /// the host's one budget and pinned pools).
        pub devices: DeviceList, default = DeviceList::Device
        /// Pack integer columns (integers, dates, times, timestamps, durations, decimals) whose
        /// values span a narrow range as offsets from a base in 1, 2, 4 or 8 bytes, fewer than
        /// the values take, for the copy to the device, which widens them again (frame of
        /// reference): build blocks in the range of their values, probe blocks in that of the
        /// partition's values before them. `false` copies every value as it is.
        pub pack_uploads: bool, default = true
        /// Carry the build side's string and binary columns that the join outputs (`Utf8View`,
        /// `BinaryView`, and `Utf8`, `LargeUtf8`, `Binary`, `LargeBinary` as views made over
        /// their values buffers, and dictionaries of those with 32- or 64-bit keys as their
        /// values' views) through the device as their 16-byte views, over the build
        /// side's data buffers, which stay in host memory; an execution whose build side fits
        /// the device's memory limit only without them gathers them on the host. `false` always
        /// gathers them on the host by build row position, as every other variable-length
        /// column is (BENCHMARKS.md measures both).
        pub views_on_device: bool, default = true
        /// Where the device carries a build side's views (`views_on_device`), gather the values
        /// they point to on the device too: the build side's data buffers are uploaded once,
        /// and each output window's values come down in one buffer of their own, so the host
        /// copies them in order instead of reading each from the build side at random. The
        /// device gathers a column's values up to a length chosen from it (at most 1 KiB, the
        /// shortest that leaves at most one value in 128 to the host besides the longer ones),
        /// which each window reserves a row; the host copies the longer ones from the build
        /// side into each output batch. A column with more than half its bytes in such values,
        /// or whose buffers hold more than four times its values' bytes and 64 MiB more, keeps
        /// its values on the host, and so does every column of a build side that the memory
        /// limit refuses with its values (not one that only waits for memory). `false` keeps
        /// every column's on the host (BENCHMARKS.md measures both).
        pub view_bytes_on_device: bool, default = true
        /// Where a join's probe columns (those of the probe side it outputs) travel: `device`
        /// (staged with every probe row, gathered by the device), `host` (left in the probe
        /// batches and taken on the host at the probe rows the device returns, where the join
        /// outputs only probe rows that match: inner, left and right semi joins), or `auto`
        /// (the host where the build side's integer-like keys, not floats or hashed keys,
        /// cover under an eighth of their range, or of the range of the key column they cover
        /// most, so that few probe rows are expected to match). Case-insensitive.
        pub probe_columns: ProbeColumns, default = ProbeColumns::Auto
        /// Where a join's dynamic filter reaches a probe scan that cannot apply it (in-memory
        /// tables; Parquet without `datafusion.execution.parquet.pushdown_filters`) through an
        /// aggregate or another join, a `RuntimeFilterExec` above the scan applies it, so that
        /// the rows it prunes cost that work nothing; and a join whose build keys predict few
        /// probe rows matched publishes them as a set (up to 2^18 build rows), where DataFusion
        /// publishes an IN list only up to
        /// `datafusion.optimizer.hash_join_inlist_pushdown_max_distinct_values` rows. `false`:
        /// neither.
        pub runtime_filters: bool, default = true
        /// Where DataFusion builds an inner or left semi join (`WHERE k IN (subquery)`,
        /// `EXISTS`) on its left input because that side holds a join, whose size DataFusion's
        /// statistics cannot tell, build it on its right input instead where that is estimated
        /// at most half as large (a join's output taken as about its largest input's, where its
        /// other inputs are unfiltered; at most an eighth where that largest input is
        /// filtered): a semi join becomes a right semi join with the same output, whose
        /// dynamic filter prunes the side it outputs before that side's joins run; an inner
        /// join streams the larger side through the device instead of collecting it first.
        /// Not where the right input declares an order, nor for an inner join whose left
        /// input carries view columns to its output. `false`: DataFusion's choice.
        pub orient_joins: bool, default = true
        /// The join algorithm: `auto` (DIRECT where the build side's keys allow it, else
        /// HASH), `hash` (the build side bucketed by a hash of its keys) or `direct` (one
        /// bucket per key value, for integer-like keys that fill their range densely: at most
        /// 4 buckets a build row; where they do not, the join runs HASH and EXPLAIN ANALYZE
        /// says why). Case-insensitive. The other algorithms of the family (`phj-om`,
        /// `phj-um`, `smj-om`, `smj-um`, `inlj`, `interleave`) do not run in the engine
        /// (PHJ-OM, PHJ-UM, SMJ-OM, SMJ-UM and INLJ run over relations already on the
        /// device: `join::join_on_device`, `join::join_untransformed`,
        /// `join::smj::sort_merge_join`, `join::smj::sort_merge_join_untransformed`,
        /// `join::index_nested_loop_join`; the interleave join is not built):
        /// a join asked for one runs what `auto` chooses, and EXPLAIN says why.
        pub algorithm: Algorithm, default = Algorithm::Auto
        /// Most probe rows sent to the device in one chunk (chunks start smaller and grow, and
        /// shrink to fit `memory_limit`).
        pub probe_chunk_rows: usize, default = 1 << 24
        /// Device memory that GPU joins may hold at once on a device, shared by every join and
        /// query of the process: a fraction of the device's memory (`0.8`, `80%`) or bytes
        /// (`8GiB`, `512MB`, `1048576`). Work that does not fit waits for memory; output that
        /// does not fit is produced in passes. On the host backend, the fraction is of the
        /// machine's memory. The most recent query's setting applies.
        pub memory_limit: MemoryLimit, default = MemoryLimit::Fraction(0.8)
        /// Bits kept of each key hash (at most 62), where keys without an exact device encoding
        /// (strings, floats, ...) join on a hash. Fewer bits make hash collisions common; tests
        /// lower it to show that a collision never makes a match. Leave it at 62 otherwise.
        pub key_hash_bits: u32, default = 62
        /// The plan is split into stages that a distributed engine's executors run (Ballista,
        /// datafusion-distributed), decoding it with `GpuJoinCodec`. The rule then places
        /// joins by its size gates alone, without looking for a GPU where it plans (each
        /// executor chooses where a join runs as it decodes it); a join asks for its inputs
        /// partitioned on their keys, as `HashJoinExec` does in `Partitioned` mode (without
        /// keys, for its build side in one partition), so that each task holds the build rows
        /// its probe rows can match; and joins that output build rows after the probe (left,
        /// full, left semi, left anti, left mark), which need every probe partition in one
        /// process, stay DataFusion's.
        pub distributed: bool, default = false
        /// Bytes of build sides a session keeps across its queries (`0`, the default: none).
        /// A join whose build input is the same plan over the same data, under the same
        /// session settings, as one a query of the session collected joins the batches kept
        /// instead of reading its input again (in-memory tables are the same where their
        /// batches are the same arrays; Parquet files where path, size, modification time and
        /// entity tag are, as listed and as the object store says now; functions are told
        /// apart by their implementation). Not kept where a
        /// limit, a function or aggregate that is not immutable, a node whose output is not a
        /// function of its input's rows (a window, an unknown node), a file format other than
        /// Parquet, or a dynamic filter made by a join above is under the build side; the
        /// build input's own joins and their dynamic filters may be.
        /// Least recently used entries go first; kept batches stay reserved in the session's
        /// memory pool. EXPLAIN ANALYZE shows `cache=[...]` for each join.
        pub cache_bytes: ByteSize, default = ByteSize(0)
    }
}

impl ConfigExtension for GpuJoinConfig {
    const PREFIX: &'static str = "gpu_join";
}

/// Implements [`ConfigField`] for a setting parsed with `FromStr` and shown with `Display`.
macro_rules! typed_setting {
    ($t:ty) => {
        impl ConfigField for $t {
            fn visit<V: Visit>(&self, v: &mut V, key: &str, description: &'static str) {
                v.some(key, self, description)
            }

            fn set(&mut self, _key: &str, value: &str) -> Result<()> {
                *self = value.parse()?;
                Ok(())
            }
        }
    };
}

/// The `gpu_join.backend` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum BackendChoice {
    #[default]
    Auto,
    Cuda,
    Host,
}

impl FromStr for BackendChoice {
    type Err = DataFusionError;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "auto" => Ok(Self::Auto),
            "cuda" | "gpu" => Ok(Self::Cuda),
            "host" | "cpu" => Ok(Self::Host),
            other => config_err!("gpu_join.backend must be auto, cuda or host, not '{other}'"),
        }
    }
}

impl fmt::Display for BackendChoice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Cuda => "cuda",
            Self::Host => "host",
        })
    }
}

typed_setting!(BackendChoice);
typed_setting!(Algorithm);
typed_setting!(ProbeColumns);

/// The `gpu_join.memory_limit` setting.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum MemoryLimit {
    /// A fraction (0, 1] of the device's memory.
    Fraction(f64),
    /// Bytes.
    Bytes(usize),
}

impl Default for MemoryLimit {
    fn default() -> Self {
        Self::Fraction(0.8)
    }
}

impl MemoryLimit {
    /// The limit in bytes on a device with `total` bytes of memory.
    pub fn bytes(&self, total: usize) -> usize {
        match *self {
            Self::Fraction(f) => (total as f64 * f) as usize,
            Self::Bytes(b) => b,
        }
    }
}

impl FromStr for MemoryLimit {
    type Err = DataFusionError;

    fn from_str(s: &str) -> Result<Self> {
        let t = s.trim().to_ascii_lowercase();
        let bad = || {
            config_err!(
                "gpu_join.memory_limit must be a fraction of device memory (0.8, 80%) or bytes \
                 (8GiB, 512MB, 1048576), not '{s}'"
            )
        };
        if let Some(p) = t.strip_suffix('%') {
            let Ok(p) = p.trim().parse::<f64>() else {
                return bad();
            };
            return if p > 0.0 && p <= 100.0 {
                Ok(Self::Fraction(p / 100.0))
            } else {
                bad()
            };
        }
        let Some((number, unit)) = split_bytes(&t) else {
            return bad();
        };
        match unit {
            None if number <= 1.0 => {
                if number > 0.0 {
                    Ok(Self::Fraction(number))
                } else {
                    bad()
                }
            }
            None => Ok(Self::Bytes(number as usize)),
            Some(scale) => Ok(Self::Bytes((number * scale) as usize)),
        }
    }
}

/// A byte size as written (`8GiB`, `512MB`, `1048576`), lower-cased: its number and its
/// unit's bytes (`None` without a unit); `None` where it is not one.
fn split_bytes(t: &str) -> Option<(f64, Option<f64>)> {
    let digits = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (number, unit) = t.split_at(digits);
    let number = number.parse::<f64>().ok().filter(|n| *n >= 0.0)?;
    let scale = match unit.trim() {
        "" => return Some((number, None)),
        "b" => 1.0,
        "k" | "kb" => 1e3,
        "m" | "mb" => 1e6,
        "g" | "gb" => 1e9,
        "kib" => 1024.0,
        "mib" => 1024.0 * 1024.0,
        "gib" => 1024.0 * 1024.0 * 1024.0,
        "tib" => 1024.0 * 1024.0 * 1024.0 * 1024.0,
        _ => return None,
    };
    Some((number, Some(scale)))
}

impl fmt::Display for MemoryLimit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Fraction(x) => write!(f, "{}%", x * 100.0),
            // With its unit: a bare 0 or 1 would read back as a fraction.
            Self::Bytes(b) => write!(f, "{b}B"),
        }
    }
}

typed_setting!(MemoryLimit);

/// A setting in bytes (`gpu_join.cache_bytes`): written as bytes with or without a unit
/// (`1GiB`, `512MB`, `1048576`, `0`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ByteSize(pub usize);

impl FromStr for ByteSize {
    type Err = DataFusionError;

    fn from_str(s: &str) -> Result<Self> {
        match split_bytes(&s.trim().to_ascii_lowercase()) {
            Some((number, scale)) => Ok(Self((number * scale.unwrap_or(1.0)) as usize)),
            None => config_err!("a size in bytes (1GiB, 512MB, 1048576, 0) is needed, not '{s}'"),
        }
    }
}

impl fmt::Display for ByteSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

typed_setting!(ByteSize);

/// The `gpu_join.devices` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum DeviceList {
    /// The one device `gpu_join.device` names (the setting is empty).
    #[default]
    Device,
    /// Every device the machine has.
    All,
    /// These devices.
    These(Devices),
}

impl DeviceList {
    /// The devices asked for, given `device` (`gpu_join.device`) and, for `all`, how many the
    /// machine has (`None`: it has none, or cannot say).
    pub fn resolve(self, device: usize, count: Option<usize>) -> Result<Devices> {
        match (self, count) {
            (Self::Device, _) | (Self::All, None | Some(0)) => Devices::one(device),
            (Self::All, Some(n)) => Devices::of(0..n.min(Devices::MAX)),
            (Self::These(d), _) => Ok(d),
        }
    }
}

impl FromStr for DeviceList {
    type Err = DataFusionError;

    fn from_str(s: &str) -> Result<Self> {
        match s.trim().to_ascii_lowercase().as_str() {
            "" => Ok(Self::Device),
            "all" => Ok(Self::All),
            list => match list.parse() {
                Ok(d) => Ok(Self::These(d)),
                Err(_) => config_err!(
                    "gpu_join.devices must be empty, all, or a list of device ordinals (0,1), \
                     not '{s}'"
                ),
            },
        }
    }
}

impl fmt::Display for DeviceList {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Device => Ok(()),
            Self::All => f.write_str("all"),
            Self::These(d) => write!(f, "{d}"),
        }
    }
}

typed_setting!(DeviceList);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_limits_parse_as_fractions_or_bytes() {
        let p = |s: &str| s.parse::<MemoryLimit>();
        assert_eq!(p("0.8").unwrap(), MemoryLimit::Fraction(0.8));
        assert_eq!(p("50%").unwrap(), MemoryLimit::Fraction(0.5));
        assert_eq!(p("1").unwrap(), MemoryLimit::Fraction(1.0));
        assert_eq!(p("1048576").unwrap(), MemoryLimit::Bytes(1 << 20));
        assert_eq!(p("8GiB").unwrap(), MemoryLimit::Bytes(8 << 30));
        assert_eq!(p("512 MB").unwrap(), MemoryLimit::Bytes(512_000_000));
        for bad in ["", "0", "-1", "150%", "2 parsecs", "x"] {
            assert!(p(bad).is_err(), "{bad}");
        }
        assert_eq!(MemoryLimit::Fraction(0.5).bytes(1000), 500);
        // As written (EXPLAIN, the codec), every limit reads back as itself.
        for limit in [
            MemoryLimit::Bytes(0),
            MemoryLimit::Bytes(1),
            MemoryLimit::Bytes(1 << 20),
            MemoryLimit::Fraction(0.5),
            MemoryLimit::Fraction(1.0),
        ] {
            assert_eq!(p(&limit.to_string()).unwrap(), limit, "{limit}");
        }
    }

    #[test]
    fn a_bad_setting_is_refused_and_the_old_value_stays() {
        let mut c = GpuJoinConfig::default();
        assert!(ConfigField::set(&mut c, "backend", "tpu").is_err());
        assert_eq!(c.backend, BackendChoice::Auto);
        ConfigField::set(&mut c, "backend", "HOST").unwrap();
        assert_eq!(c.backend, BackendChoice::Host);
        assert!(ConfigField::set(&mut c, "memory_limit", "lots").is_err());
        ConfigField::set(&mut c, "memory_limit", "64MiB").unwrap();
        assert_eq!(c.memory_limit, MemoryLimit::Bytes(64 << 20));
        assert!(ConfigField::set(&mut c, "devices", "gpu0").is_err());
        assert_eq!(c.devices, DeviceList::Device);
    }

    #[test]
    fn device_lists_name_one_device_several_or_all() {
        let p = |s: &str| s.parse::<DeviceList>().unwrap();
        let d = |s: &str| s.parse::<Devices>().unwrap();
        assert_eq!(p(""), DeviceList::Device);
        assert_eq!(p(" ALL "), DeviceList::All);
        assert_eq!(p("1,0"), DeviceList::These(d("0,1")));
        assert_eq!(p("1,0").to_string(), "0,1");
        assert_eq!(DeviceList::Device.resolve(3, Some(8)).unwrap(), d("3"));
        assert_eq!(DeviceList::All.resolve(3, Some(2)).unwrap(), d("0,1"));
        assert_eq!(DeviceList::All.resolve(3, None).unwrap(), d("3"));
        assert_eq!(p("2").resolve(0, Some(1)).unwrap(), d("2"));
    }

    /// A session's settings, listed and applied again by name (as Ballista sends them to its
    /// scheduler and executors), carry `gpu_join`'s; `SHOW` finds them by their full names.
    #[tokio::test]
    async fn settings_are_listed_under_their_full_names() {
        use datafusion::prelude::{SessionConfig, SessionContext};
        let mut from = crate::with_gpu_join_config(SessionConfig::new());
        from.options_mut().set("gpu_join.backend", "host").unwrap();
        from.options_mut()
            .set("gpu_join.min_build_rows", "0")
            .unwrap();
        let entries = from.options().entries();
        let ours: Vec<&str> = entries
            .iter()
            .map(|e| e.key.as_str())
            .filter(|k| !k.starts_with("datafusion."))
            .collect();
        assert!(ours.contains(&"gpu_join.backend"), "{ours:?}");
        assert!(ours.iter().all(|k| k.starts_with("gpu_join.")), "{ours:?}");
        let mut to = crate::with_gpu_join_config(SessionConfig::new());
        for e in &entries {
            if let Some(value) = &e.value {
                to.options_mut().set(&e.key, value).unwrap();
            }
        }
        let to_settings = to.options().extensions.get::<GpuJoinConfig>().unwrap();
        assert_eq!(to_settings.backend, BackendChoice::Host);
        assert_eq!(to_settings.min_build_rows, 0);

        let ctx = SessionContext::new_with_config(from.with_information_schema(true));
        let shown = ctx
            .sql("SHOW gpu_join.backend")
            .await
            .unwrap()
            .collect()
            .await
            .unwrap();
        let shown = arrow::util::pretty::pretty_format_batches(&shown)
            .unwrap()
            .to_string();
        assert!(
            shown.contains("gpu_join.backend") && shown.contains("host"),
            "{shown}"
        );
    }
}
