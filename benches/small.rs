//! Criterion suite of small fixed joins, for changes whose effect shows at small sizes (launch
//! and planning overheads): PHJ-OM through the join layer on each usable backend, and a SQL
//! join with the rule on and off. The sweeps and large sizes live in `joinbench`.
//!
//! ```text
//! cargo bench --bench small [-- FILTER]
//! ```

#[path = "joinbench/workload.rs"]
#[allow(dead_code)]
mod workload;

use std::hint::black_box;
use std::sync::Arc;

use arrow::array::RecordBatch;
use arrow::datatypes::{DataType, Field, Schema};
use criterion::{Criterion, criterion_group, criterion_main};
use datafusion::datasource::MemTable;
use datafusion::physical_plan::metrics::ExecutionPlanMetricsSet;
use datafusion::prelude::{SessionConfig, SessionContext};
use datafusion_gpu_join::backend::{Backend, CudaBackend, HostBackend};
use datafusion_gpu_join::columns::{Fitted, KeyEncoder};
use datafusion_gpu_join::join::{BuildSide, OutputColumn, OutputLayout, Phases, join_chunk};
use datafusion_gpu_join::{GpuJoinConfig, gpu_session_context};
use workload::{Tables, Workload, generate};

const LOG2_R: [u32; 2] = [10, 16];

/// R ⋈ S from host batches to host batches (upload, join, download), one payload per side.
fn join_once<B: Backend>(b: &B, t: &Tables) -> usize {
    let layout = OutputLayout {
        schema: Arc::new(Schema::new(vec![
            Field::new("r_k", DataType::Int32, false),
            Field::new("r_p0", DataType::Int32, false),
            Field::new("s_p0", DataType::Int32, false),
        ])),
        columns: vec![
            OutputColumn::Build(0),
            OutputColumn::Build(1),
            OutputColumn::Probe(1),
        ],
        build_keys: vec![0],
        probe_keys: vec![0],
        check: None,
        filter: None,
    };
    let phases = Phases::new(&ExecutionPlanMetricsSet::new());
    let keys = vec![t.r.iter().map(|b| b.column(0)).collect()];
    let Ok(Fitted::Encoder(enc)) = KeyEncoder::fit(&keys, false) else {
        panic!("keys encode");
    };
    let build = BuildSide::new(b, &t.r, &layout, enc, &phases).expect("build");
    let out = join_chunk(b, &build, &t.s, &layout, &phases, 8192).expect("join");
    let rows = out.iter().map(|b| b.num_rows()).sum();
    assert_eq!(rows, t.matches, "join output rows");
    rows
}

fn join_layer(c: &mut Criterion) {
    let cuda = datafusion_gpu_join::device::cuda_device(0)
        .and_then(|d| CudaBackend::new(d, Arc::default()))
        .ok();
    for log2 in LOG2_R {
        let t = generate(&Workload::standard(log2, 1));
        c.bench_function(&format!("phj_om/host/2^{log2}"), |bench| {
            bench.iter(|| black_box(join_once(&HostBackend::default(), &t)))
        });
        match &cuda {
            Some(b) => {
                c.bench_function(&format!("phj_om/cuda/2^{log2}"), |bench| {
                    bench.iter(|| black_box(join_once(b, &t)))
                });
            }
            None => eprintln!("phj_om/cuda/2^{log2}: skipped (no usable CUDA device)"),
        }
    }
}

fn sql(c: &mut Criterion) {
    let runtime = tokio::runtime::Runtime::new().expect("tokio runtime");
    for log2 in LOG2_R {
        let t = generate(&Workload::standard(log2, 1));
        for (label, enabled) in [("rule_on", true), ("rule_off", false)] {
            let mut gpu = GpuJoinConfig::default();
            gpu.enabled = enabled;
            gpu.min_build_rows = 0;
            let ctx: SessionContext =
                gpu_session_context(SessionConfig::new().with_option_extension(gpu));
            let table = |b: &Vec<RecordBatch>| {
                Arc::new(MemTable::try_new(b[0].schema(), vec![b.clone()]).expect("table"))
            };
            ctx.register_table("r", table(&t.r)).expect("register r");
            ctx.register_table("s", table(&t.s)).expect("register s");
            let query = "SELECT count(*), sum(r.p0), sum(s.p0) FROM r JOIN s ON r.k = s.k";
            c.bench_function(&format!("sql/{label}/2^{log2}"), |bench| {
                bench.iter(|| {
                    runtime.block_on(async {
                        black_box(
                            ctx.sql(query)
                                .await
                                .expect("plan")
                                .collect()
                                .await
                                .expect("run"),
                        )
                    })
                })
            });
        }
    }
}

criterion_group! {
    name = small;
    config = Criterion::default().sample_size(20);
    targets = join_layer, sql
}
criterion_main!(small);
