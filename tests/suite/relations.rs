//! Joins of two relations already on the device, each against the inner join counted in the
//! test (rows, and the sum of both payloads), with 4-byte and 8-byte encoded keys, null keys,
//! keys repeated on both sides, probe keys outside the build side's range and empty sides; on
//! the host backend, and on CUDA (the host twin's output row for row; skipped without a device,
//! failed with `--require-cuda`):
//! - SMJ-OM (`join::smj`), the sort-merge join;
//! - SMJ-UM (`join::smj::sort_merge_join_untransformed`), the same gathering from the
//!   untransformed relations, whose output is also SMJ-OM's row for row;
//! - PHJ-UM (`join::join_untransformed`), the partitioned hash join that gathers from the
//!   untransformed relations, whose output is also PHJ-OM's (`join::join_on_device`) row for
//!   row;
//! - INLJ (`join::index_nested_loop_join`), the index nested loop join: the build side sorted,
//!   searched from the probe rows as they are (with a build side of over 4,096 rows, every tile of
//!   probe rows searches it in device memory; with fewer, in shared memory).

use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::Schema;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use datafusion_gpu_join::backend::{Backend, CudaBackend, HostBackend};
use datafusion_gpu_join::columns::{DeviceRelation, Fitted, KeyEncoder};
use datafusion_gpu_join::device::cuda_device;
use datafusion_gpu_join::join::smj::{sort_merge_join, sort_merge_join_untransformed};
use datafusion_gpu_join::join::{
    BuildSide, OutputColumn, OutputLayout, Phases, index_nested_loop_join, join_on_device,
    join_untransformed,
};

use crate::harness::{Outcome, Suite, TestResult};
use crate::keyed::{expected_join, relation, totals};
use crate::rng::Rng;

/// (R's rows, S's rows), empty sides included. Where S has many rows to R's, each tile of S's
/// sorted rows finds its build rows in a window of shared memory; where R has many to S's, a
/// tile's window is too large for it and is searched in device memory (merge_join.cu).
const SHAPES: &[(usize, usize)] = &[
    (0, 5),
    (3, 0),
    (1, 3),
    (1000, 4097),
    (65_537, 1 << 20),
    (1 << 20, 3000),
];

/// Key spacings: 1 (keys encode in 4 bytes) and 2^33 (their range needs 8 bytes).
const SPACINGS: &[i64] = &[1, 1 << 33];

/// The joins tested here, and PHJ-OM, whose output PHJ-UM's must equal.
#[derive(Clone, Copy, Debug)]
enum Algorithm {
    SmjOm,
    SmjUm,
    PhjUm,
    PhjOm,
    Inlj,
}

impl Algorithm {
    /// The join of `r` with `s` (on the device of `b`) by this algorithm.
    fn join<B: Backend>(
        self,
        b: &B,
        r: &DeviceRelation<B::Buf>,
        s: &DeviceRelation<B::Buf>,
        layout: &OutputLayout,
        encoder: &KeyEncoder,
        phases: &Phases,
    ) -> datafusion::common::Result<DeviceRelation<B::Buf>> {
        match self {
            Self::SmjOm => sort_merge_join(b, r, s, layout, encoder, phases),
            Self::SmjUm => sort_merge_join_untransformed(b, r, s, layout, encoder, phases),
            Self::PhjUm => join_untransformed(b, r, s, layout, encoder, phases),
            Self::Inlj => index_nested_loop_join(b, r, s, layout, encoder, phases),
            Self::PhjOm => {
                let build = BuildSide::from_device(b, r, layout, encoder.clone(), phases)?;
                join_on_device(b, &build, s, layout, phases)
            }
        }
    }
}

pub fn register(suite: &mut Suite) {
    for (name, algorithm) in [
        ("smj_om", Algorithm::SmjOm),
        ("smj_um", Algorithm::SmjUm),
        ("phj_um", Algorithm::PhjUm),
        ("inlj", Algorithm::Inlj),
    ] {
        suite.add(format!("relations::{name}_host"), move || -> TestResult {
            check(&HostBackend::default(), None, algorithm)?;
            Ok(Outcome::Passed)
        });
        let require = suite.options.require_cuda;
        suite.add(
            format!("relations::{name}_cuda_matches_host"),
            move || -> TestResult {
                let device = match cuda_device(0) {
                    Ok(d) => d,
                    Err(e) if require => return Err(format!("--require-cuda, but: {e}")),
                    Err(_) => return Ok(Outcome::Skipped("no CUDA device".into())),
                };
                let dev = CudaBackend::new(device, Default::default()).map_err(err)?;
                check(&dev, Some(&HostBackend::default()), algorithm)?;
                Ok(Outcome::Passed)
            },
        );
    }
}

fn err(e: datafusion::common::DataFusionError) -> String {
    e.to_string()
}

/// R ⋈ S on k, output R.a and S.b.
fn layout(r: &RecordBatch) -> OutputLayout {
    OutputLayout {
        schema: Arc::new(Schema::new(vec![
            r.schema().field(1).clone(),
            r.schema().field(2).clone().with_name("s_b"),
        ])),
        columns: vec![OutputColumn::Build(1), OutputColumn::Probe(2)],
        build_keys: vec![0],
        probe_keys: vec![0],
        check: None,
        filter: None,
    }
}

/// R ⋈ S by `algorithm` on `b`, downloaded.
fn joined<B: Backend>(
    b: &B,
    r: &RecordBatch,
    s: &RecordBatch,
    encoder: &KeyEncoder,
    algorithm: Algorithm,
) -> Result<Vec<RecordBatch>, String> {
    let layout = layout(r);
    let phases = Phases::new(&ExecutionPlanMetricsSet::new());
    let rd = DeviceRelation::upload(b, std::slice::from_ref(r), &[0, 1, 2]).map_err(err)?;
    let sd = DeviceRelation::upload(b, std::slice::from_ref(s), &[0, 1, 2]).map_err(err)?;
    let out = algorithm
        .join(b, &rd, &sd, &layout, encoder, &phases)
        .map_err(err)?;
    out.download(b, &layout.schema, 1 << 20).map_err(err)
}

/// Every shape and spacing: the join's rows and payload sum, (with `host`) the host twin's
/// output row for row, and an UM join's, its OM twin's on the same backend row for row.
fn check<B: Backend>(
    b: &B,
    host: Option<&HostBackend>,
    algorithm: Algorithm,
) -> Result<(), String> {
    for (i, &(r_rows, s_rows)) in SHAPES.iter().enumerate() {
        for (j, &spacing) in SPACINGS.iter().enumerate() {
            let mut rng = Rng::new((i * 2 + j) as u64 + 1);
            let keys = (r_rows as u64 / 2).max(1);
            let r = relation(&mut rng, r_rows, keys, true, spacing, 0);
            // S's keys run past R's range on both sides.
            let s = relation(&mut rng, s_rows, keys + 4, true, spacing, -2 * spacing);
            let what = format!("R {r_rows}, S {s_rows}, spacing {spacing}");
            // Fitted to R's keys; where R has none (an empty build side), to S's, so that the
            // join still runs.
            let fit = |k| KeyEncoder::fit(&[vec![k]], false).map_err(err);
            let encoder = match (fit(r.column(0))?, fit(s.column(0))?) {
                (Fitted::Encoder(e), _) | (_, Fitted::Encoder(e)) => e,
                // No non-null key on either side: nothing to join.
                _ => continue,
            };
            let what = format!("{algorithm:?}, {what}");
            let got = joined(b, &r, &s, &encoder, algorithm).map_err(|e| format!("{what}: {e}"))?;
            let expected = expected_join(std::slice::from_ref(&r), std::slice::from_ref(&s));
            if totals(&got) != expected {
                return Err(format!(
                    "{what} ({:?} keys): {:?} (rows, payload sum), expected {expected:?}",
                    encoder.width(),
                    totals(&got)
                ));
            }
            if let Some(host) = host
                && got != joined(host, &r, &s, &encoder, algorithm)?
            {
                return Err(format!("{what}: the output differs from the host's"));
            }
            let twin = match algorithm {
                Algorithm::PhjUm => Some(Algorithm::PhjOm),
                Algorithm::SmjUm => Some(Algorithm::SmjOm),
                _ => None,
            };
            if let Some(twin) = twin
                && got != joined(b, &r, &s, &encoder, twin)?
            {
                return Err(format!("{what}: the output differs from {twin:?}'s"));
            }
        }
    }
    Ok(())
}
