//! The GFTR paper's PK-FK workload, with its knobs: sizes, payload columns per side, |R|:|S|,
//! match ratio, Zipf skew of the foreign keys, 4- or 8-byte keys and payloads; and the star
//! schema of the join-sequence experiment.
//!
//! R holds keys 0..|R| shuffled; S holds foreign keys into R (each R key |S|/|R| times and
//! shuffled, or drawn from a Zipf distribution over R's keys); a share of S's keys is replaced
//! by values no R row has. Every payload column is a copy of its key column. 8-byte keys are
//! spread over 2^46 values (key × 1 000 003), so they need the u64 key path.

use std::sync::Arc;

use arrow::array::{ArrayRef, Int32Array, Int64Array, RecordBatch};
use arrow::datatypes::{DataType, Field, Schema};
use rand::rngs::SmallRng;
use rand::{Rng, SeedableRng};
use rand_distr::{Distribution, Zipf};

/// Rows per generated batch.
pub const BATCH_ROWS: usize = 1 << 20;

/// Spreads 8-byte keys beyond 32 bits.
const WIDE_STRIDE: i64 = 1_000_003;

/// One PK-FK join's inputs.
#[derive(Debug, Clone)]
pub struct Workload {
    pub r_rows: usize,
    pub s_rows: usize,
    /// Payload columns per side.
    pub payloads: usize,
    /// 8-byte keys and payloads (else 4-byte).
    pub wide: bool,
    /// Share of S rows whose key is in R.
    pub match_ratio: f64,
    /// Zipf exponent of S's keys over R's; 0 = every R key equally often.
    pub zipf: f64,
    /// S's rows in key order (a fact table clustered on its foreign key), not shuffled.
    pub sorted_probe: bool,
    /// R's keys are `0, d, 2d, ...` for this `d` (a build side filling `1/d` of its key
    /// range); 1 everywhere but the `algorithms` sweep. Ignored for 8-byte keys.
    pub key_spread: i64,
}

impl Workload {
    /// The paper's standard workload: |R| = 2^log2_r, |S| = 2|R|, 4-byte, uniform, all match.
    pub fn standard(log2_r: u32, payloads: usize) -> Self {
        Self {
            r_rows: 1 << log2_r,
            s_rows: 2 << log2_r,
            payloads,
            wide: false,
            match_ratio: 1.0,
            zipf: 0.0,
            sorted_probe: false,
            key_spread: 1,
        }
    }

    /// Bytes per key and payload value.
    pub fn value_bytes(&self) -> usize {
        if self.wide { 8 } else { 4 }
    }
}

/// Generated tables and what their join must give.
pub struct Tables {
    pub r: Vec<RecordBatch>,
    pub s: Vec<RecordBatch>,
    /// Rows of R ⋈ S.
    pub matches: usize,
    /// Sum of the join key over the rows of R ⋈ S.
    pub key_sum: i128,
}

/// Fisher-Yates with a seeded generator.
fn shuffle(v: &mut [i64], seed: u64) {
    let mut rng = SmallRng::seed_from_u64(seed);
    for i in (1..v.len()).rev() {
        v.swap(i, rng.random_range(0..=i));
    }
}

/// A relation of key column `k` and `payloads` copies `p0..`, in batches of [`BATCH_ROWS`].
pub fn relation(keys: &[i64], payloads: usize, wide: bool) -> Vec<RecordBatch> {
    let ty = if wide {
        DataType::Int64
    } else {
        DataType::Int32
    };
    let mut fields = vec![Field::new("k", ty.clone(), false)];
    fields.extend((0..payloads).map(|i| Field::new(format!("p{i}"), ty.clone(), false)));
    let schema = Arc::new(Schema::new(fields));
    let col: ArrayRef = if wide {
        Arc::new(Int64Array::from(keys.to_vec()))
    } else {
        Arc::new(Int32Array::from_iter_values(keys.iter().map(|&k| k as i32)))
    };
    batches(RecordBatch::try_new(schema, vec![col; payloads + 1]).expect("one schema"))
}

/// `whole` cut into batches of [`BATCH_ROWS`] rows (zero-copy slices).
fn batches(whole: RecordBatch) -> Vec<RecordBatch> {
    (0..whole.num_rows())
        .step_by(BATCH_ROWS)
        .map(|at| whole.slice(at, BATCH_ROWS.min(whole.num_rows() - at)))
        .collect()
}

/// Generates R and S for `w`.
pub fn generate(w: &Workload) -> Tables {
    let scale = if w.wide { WIDE_STRIDE } else { w.key_spread };
    let r_rows = w.r_rows as i64;
    let mut r: Vec<i64> = (0..r_rows).collect();
    shuffle(&mut r, 1);
    // S's keys as indexes into R's key space.
    let mut s: Vec<i64> = if w.zipf > 0.0 {
        let zipf = Zipf::new(w.r_rows as f64, w.zipf).expect("valid Zipf parameters");
        let mut rng = SmallRng::seed_from_u64(2);
        (0..w.s_rows)
            .map(|_| zipf.sample(&mut rng) as i64 - 1)
            .collect()
    } else {
        let mut s: Vec<i64> = (0..w.s_rows as i64).map(|i| i % r_rows.max(1)).collect();
        shuffle(&mut s, 2);
        s
    };
    // The rows are in random order, so replacing a prefix replaces a random share.
    let misses = ((1.0 - w.match_ratio) * w.s_rows as f64).round() as usize;
    for (i, k) in s.iter_mut().take(misses).enumerate() {
        *k = r_rows + i as i64;
    }
    let key_sum = s[misses..].iter().map(|&k| (k * scale) as i128).sum();
    if w.sorted_probe {
        s.sort_unstable();
    }
    for k in r.iter_mut().chain(s.iter_mut()) {
        *k *= scale;
    }
    Tables {
        r: relation(&r, w.payloads, w.wide),
        s: relation(&s, w.payloads, w.wide),
        matches: w.s_rows - misses,
        key_sum,
    }
}

/// SplitMix64: the `i`-th value of stream `seed`.
fn splitmix(seed: u64, i: u64) -> u64 {
    let mut z = seed
        .wrapping_mul(0x9E37_79B9_7F4A_7C15)
        .wrapping_add(i.wrapping_mul(0xBF58_476D_1CE4_E5B9));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// A star schema: a fact table with `k` foreign keys `f0..` (uniform over each dimension's
/// keys) and one payload `p`, and `k` dimension tables of `dim_rows` rows (key `k`, payload
/// `p0` = copy of the key). 4-byte values.
pub struct Star {
    pub fact: Vec<RecordBatch>,
    pub dims: Vec<Vec<RecordBatch>>,
    /// Per dimension, the sum of its foreign key over the fact table.
    pub fk_sums: Vec<i128>,
}

pub fn star(fact_rows: usize, dim_rows: usize, k: usize) -> Star {
    let fks: Vec<Vec<i32>> = (0..k)
        .map(|d| {
            (0..fact_rows as u64)
                .map(|i| (splitmix(d as u64 + 7, i) % dim_rows as u64) as i32)
                .collect()
        })
        .collect();
    let mut fields: Vec<Field> = (0..k)
        .map(|d| Field::new(format!("f{d}"), DataType::Int32, false))
        .collect();
    fields.push(Field::new("p", DataType::Int32, false));
    let schema = Arc::new(Schema::new(fields));
    let mut cols: Vec<ArrayRef> = fks
        .iter()
        .map(|f| Arc::new(Int32Array::from(f.clone())) as ArrayRef)
        .collect();
    cols.push(Arc::new(Int32Array::from_iter_values(0..fact_rows as i32)));
    let fact = batches(RecordBatch::try_new(schema, cols).expect("one schema"));
    let dims = (0..k)
        .map(|d| {
            let mut keys: Vec<i64> = (0..dim_rows as i64).collect();
            shuffle(&mut keys, 100 + d as u64);
            relation(&keys, 1, false)
        })
        .collect();
    let fk_sums = fks
        .iter()
        .map(|f| f.iter().map(|&v| v as i128).sum())
        .collect();
    Star {
        fact,
        dims,
        fk_sums,
    }
}
