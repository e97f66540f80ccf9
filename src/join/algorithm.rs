//! The join algorithms of the streaming engine that `gpu_join.algorithm` chooses between, and
//! how `auto` chooses once a join's build side is in hand.
//!
//! Both bucket the build side once and probe every chunk against it with the same kernels
//! (`hash`); they differ in what a bucket is:
//! - **HASH**: buckets of about two rows, by a hash of the encoded key. Any key.
//! - **DIRECT** (a perfect hash): one bucket per key value, in key order: the key is written so
//!   that the hash gives the value back ([`KeyEncoder::direct`]). A probe key's bucket holds
//!   exactly the build rows of its value, and build rows lie in key order, so probe keys that
//!   come in runs or in order read the table and gather its columns in order. It needs keys
//!   encoded exactly (integers, dates, ...) whose encodings the build side fills densely: at
//!   most [`DIRECT_BUCKETS_PER_ROW`] buckets a build row (4 bytes of bounds each), and at
//!   most 2^31.
//!
//! The setting also names the family's other algorithms ([`Outside`]), which the engine does
//! not run: a join asked to run one runs what `auto` chooses, and EXPLAIN says why, as it does
//! where DIRECT is asked for and the keys do not allow it.

use std::fmt;
use std::str::FromStr;

use datafusion::common::{DataFusionError, Result, config_err};

use crate::columns::KeyEncoder;

/// Most buckets a build row may bring DIRECT (each takes 4 bytes of bucket bounds; HASH takes
/// about half a bucket a row).
pub const DIRECT_BUCKETS_PER_ROW: u64 = 4;

/// The `gpu_join.algorithm` setting.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Algorithm {
    /// DIRECT where the build side's keys allow it, else HASH.
    #[default]
    Auto,
    Hash,
    Direct,
    /// An algorithm of the family that the engine does not run: its joins run what `auto`
    /// chooses.
    Outside(Outside),
}

/// The algorithms of the family the project aims at that the streaming engine does not run.
/// PHJ-OM, PHJ-UM, SMJ-OM, SMJ-UM and INLJ exist for relations already on the device
/// ([`super::join_on_device`], [`super::join_untransformed`], [`super::smj::sort_merge_join`],
/// [`super::smj::sort_merge_join_untransformed`], [`super::index_nested_loop_join`]); the
/// interleave join is not built.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum Outside {
    PhjOm,
    PhjUm,
    SmjOm,
    SmjUm,
    Inlj,
    Interleave,
}

impl Outside {
    const ALL: [Self; 6] = [
        Self::PhjOm,
        Self::PhjUm,
        Self::SmjOm,
        Self::SmjUm,
        Self::Inlj,
        Self::Interleave,
    ];

    /// As the setting is written.
    fn setting(self) -> &'static str {
        match self {
            Self::PhjOm => "phj-om",
            Self::PhjUm => "phj-um",
            Self::SmjOm => "smj-om",
            Self::SmjUm => "smj-um",
            Self::Inlj => "inlj",
            Self::Interleave => "interleave",
        }
    }

    /// The library function that runs it over relations already on the device, where built.
    fn library(self) -> Option<&'static str> {
        match self {
            Self::PhjOm => Some("join::join_on_device"),
            Self::PhjUm => Some("join::join_untransformed"),
            Self::SmjOm => Some("join::smj::sort_merge_join"),
            Self::SmjUm => Some("join::smj::sort_merge_join_untransformed"),
            Self::Inlj => Some("join::index_nested_loop_join"),
            Self::Interleave => None,
        }
    }

    /// Why a join asked to run it runs another, as EXPLAIN shows it.
    fn why_not(self) -> String {
        let name = self.setting().to_ascii_uppercase();
        match self.library() {
            Some(f) => format!(
                "{name} does not run in the streaming engine, only over relations already on the \
                 device: {f}"
            ),
            None => format!("{name} is not built"),
        }
    }
}

impl FromStr for Algorithm {
    type Err = DataFusionError;

    fn from_str(s: &str) -> Result<Self> {
        let name = s.trim().to_ascii_lowercase();
        match name.as_str() {
            "auto" => Ok(Self::Auto),
            "hash" => Ok(Self::Hash),
            "direct" => Ok(Self::Direct),
            other => match Outside::ALL.into_iter().find(|o| o.setting() == other) {
                Some(outside) => Ok(Self::Outside(outside)),
                None => config_err!(
                    "gpu_join.algorithm must be auto, hash, direct, phj-om, phj-um, smj-om, \
                     smj-um, inlj or interleave, not '{other}'"
                ),
            },
        }
    }
}

impl fmt::Display for Algorithm {
    /// As the setting is written: `auto`, `hash`, `direct`, `phj-om`, ...
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Auto => "auto",
            Self::Hash => "hash",
            Self::Direct => "direct",
            Self::Outside(o) => o.setting(),
        })
    }
}

impl Algorithm {
    /// What EXPLAIN shows before a run: the algorithm asked for (`auto` until a build side
    /// decides, and so for an algorithm the engine does not run, with why).
    pub fn planned_name(self) -> String {
        match self {
            Self::Auto => "auto".into(),
            Self::Hash => HASH.into(),
            Self::Direct => DIRECT.into(),
            Self::Outside(o) => format!("auto ({})", o.why_not()),
        }
    }
}

/// What EXPLAIN ANALYZE shows for a HASH run.
pub const HASH: &str = "HASH";
/// What EXPLAIN ANALYZE shows for a DIRECT run.
pub const DIRECT: &str = "DIRECT";

/// The algorithm one execution runs, and its encoder.
#[derive(Debug, Clone)]
pub struct Chosen {
    /// Keys as the algorithm's table takes them (direct for DIRECT).
    pub encoder: KeyEncoder,
    /// What EXPLAIN ANALYZE shows: the name, and why DIRECT was asked for and not run.
    pub shown: String,
}

/// Chooses for a build side of `rows` rows whose keys `encoder` encodes: DIRECT where asked
/// for (or `auto`) and the keys allow it, else HASH; where DIRECT was asked for and cannot
/// run, the reason goes with the name, as it does for an algorithm the engine does not run
/// (which gets `auto`'s choice).
pub fn choose(requested: Algorithm, encoder: KeyEncoder, rows: usize) -> Chosen {
    match requested {
        Algorithm::Hash => return hash(encoder, None),
        Algorithm::Outside(o) => {
            let auto = choose(Algorithm::Auto, encoder, rows);
            return Chosen {
                shown: format!("{} ({})", auto.shown, o.why_not()),
                ..auto
            };
        }
        Algorithm::Auto | Algorithm::Direct => {}
    }
    let buckets = |d: &KeyEncoder| d.direct_bits().map_or(u64::MAX, |bits| 1u64 << bits);
    let limit = DIRECT_BUCKETS_PER_ROW * (rows as u64).max(1);
    let why_not = match encoder.direct() {
        Some(direct) if buckets(&direct) <= limit => {
            return Chosen {
                encoder: direct,
                shown: DIRECT.into(),
            };
        }
        Some(direct) => format!(
            "DIRECT needs at most {DIRECT_BUCKETS_PER_ROW} buckets a build row; the keys span {} \
             values ({} buckets) for {rows} build rows",
            encoder.span(),
            buckets(&direct)
        ),
        None => format!(
            "DIRECT needs keys encoded exactly in at most 2^31 values; these span {}",
            encoder.span()
        ),
    };
    hash(encoder, (requested == Algorithm::Direct).then_some(why_not))
}

fn hash(encoder: KeyEncoder, why_not_direct: Option<String>) -> Chosen {
    Chosen {
        encoder,
        shown: match why_not_direct {
            Some(why) => format!("{HASH} ({why})"),
            None => HASH.into(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::columns::{Fitted, KeyRange};
    use arrow::datatypes::DataType;

    fn encoder(lo: u64, hi: u64) -> KeyEncoder {
        let mut range = KeyRange::new(&DataType::Int64).unwrap();
        range.include(lo, hi);
        match KeyEncoder::from_ranges(&[range], false) {
            Fitted::Encoder(e) => e,
            _ => panic!("encodes"),
        }
    }

    #[test]
    fn names_parse_case_insensitively_and_round_trip() {
        assert_eq!("DIRECT".parse::<Algorithm>().unwrap(), Algorithm::Direct);
        assert_eq!(" Hash ".parse::<Algorithm>().unwrap(), Algorithm::Hash);
        assert_eq!("auto".parse::<Algorithm>().unwrap(), Algorithm::Auto);
        assert_eq!(
            "SMJ-OM".parse::<Algorithm>().unwrap(),
            Algorithm::Outside(Outside::SmjOm)
        );
        for name in [
            "auto",
            "hash",
            "direct",
            "phj-om",
            "phj-um",
            "smj-om",
            "smj-um",
            "inlj",
            "interleave",
        ] {
            let a = name.parse::<Algorithm>().unwrap();
            assert_eq!(a.to_string(), name);
            assert_eq!(a.to_string().parse::<Algorithm>().unwrap(), a);
        }
        let e = "fast".parse::<Algorithm>().unwrap_err().to_string();
        assert!(e.contains("not 'fast'"), "{e}");
    }

    #[test]
    fn algorithms_the_engine_does_not_run_run_autos_choice_and_say_why() {
        let planned = Algorithm::Outside(Outside::PhjOm).planned_name();
        assert!(
            planned.starts_with("auto (PHJ-OM does not run in the streaming engine"),
            "{planned}"
        );
        // Dense keys: auto's DIRECT; sparse ones: auto's HASH; the reason after either.
        let c = choose(Algorithm::Outside(Outside::SmjOm), encoder(0, 999), 1000);
        assert_eq!(c.encoder.direct_bits(), Some(10));
        assert!(
            c.shown
                .starts_with("DIRECT (SMJ-OM does not run in the streaming engine"),
            "{}",
            c.shown
        );
        let c = choose(
            Algorithm::Outside(Outside::Interleave),
            encoder(0, (1 << 20) - 1),
            1000,
        );
        assert_eq!(
            (c.shown.as_str(), c.encoder.direct_bits()),
            ("HASH (INTERLEAVE is not built)", None)
        );
    }

    #[test]
    fn dense_keys_run_direct_and_sparse_ones_hash() {
        // 1000 values over 1000 rows: 1024 buckets.
        let c = choose(Algorithm::Auto, encoder(0, 999), 1000);
        assert_eq!(
            (c.shown.as_str(), c.encoder.direct_bits()),
            (DIRECT, Some(10))
        );
        // 1000 rows over a span of 2^20: too sparse; auto says nothing, direct says why.
        let c = choose(Algorithm::Auto, encoder(0, (1 << 20) - 1), 1000);
        assert_eq!((c.shown.as_str(), c.encoder.direct_bits()), (HASH, None));
        let c = choose(Algorithm::Direct, encoder(0, (1 << 20) - 1), 1000);
        assert!(
            c.shown.starts_with("HASH (DIRECT needs at most 4 buckets"),
            "{}",
            c.shown
        );
        let c = choose(Algorithm::Direct, encoder(0, 1 << 40), 1 << 20);
        assert!(c.shown.contains("at most 2^31 values"), "{}", c.shown);
        // hash is hash, however dense.
        let c = choose(Algorithm::Hash, encoder(0, 999), 1000);
        assert_eq!((c.shown.as_str(), c.encoder.direct_bits()), (HASH, None));
    }
}
