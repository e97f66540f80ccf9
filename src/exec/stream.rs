//! [`GpuJoinStream`]: one output partition of a `GpuJoinExec`, as a state machine.
//!
//! ```text
//!  Building ──► Reading ──(chunk full or input done)──► Joining ──► Emitting ─┐
//!     │            ▲                                                         │
//!     │            └──────────────(more input)───────────────────────────────┘
//!     ├──(keys too wide)──► Fallback (DataFusion's HashJoinExec stream)
//!     └──(no build key)───► Done ◄──(input done, all emitted)
//! ```
//! Joining runs on a blocking thread (the backend blocks while the GPU works); each CUDA
//! partition has its own stream, so partitions overlap on the device.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arrow::array::RecordBatch;
use arrow::datatypes::SchemaRef;
use datafusion::common::{Result, exec_datafusion_err};
use datafusion::execution::{RecordBatchStream, SendableRecordBatchStream, TaskContext};
use datafusion::physical_plan::ExecutionPlan;
use futures::future::BoxFuture;
use futures::{FutureExt, Stream, StreamExt};

use super::build::SharedBuild;
use super::metrics::GpuJoinMetrics;
use crate::backend::{Backend, CudaBackend};
use crate::join::{OutputLayout, join_chunk};

enum State {
    /// Waiting for the shared build side.
    Building(BoxFuture<'static, Result<Arc<SharedBuild>>>),
    /// Reading probe batches into the current chunk.
    Reading(Arc<SharedBuild>),
    /// Joining a chunk on a blocking thread.
    Joining {
        build: Arc<SharedBuild>,
        task: BoxFuture<'static, Result<Vec<RecordBatch>>>,
        input_done: bool,
    },
    /// Handing out a joined chunk's batches (at most `batch_size` rows each).
    Emitting {
        build: Arc<SharedBuild>,
        batches: VecDeque<RecordBatch>,
        input_done: bool,
    },
    /// Running DataFusion's hash join instead.
    Fallback(SendableRecordBatchStream),
    Done,
}

/// The output stream of one partition of a `GpuJoinExec`.
pub struct GpuJoinStream {
    schema: SchemaRef,
    partition: usize,
    right: Arc<dyn ExecutionPlan>,
    ctx: Arc<TaskContext>,
    probe: Option<SendableRecordBatchStream>,
    chunk: Vec<RecordBatch>,
    chunk_rows: usize,
    chunk_limit: usize,
    batch_size: usize,
    layout: Arc<OutputLayout>,
    metrics: GpuJoinMetrics,
    /// This partition's own CUDA stream, made on first use.
    cuda: Option<CudaBackend>,
    state: State,
}

impl GpuJoinStream {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        schema: SchemaRef,
        partition: usize,
        right: Arc<dyn ExecutionPlan>,
        ctx: Arc<TaskContext>,
        build: BoxFuture<'static, Result<Arc<SharedBuild>>>,
        chunk_limit: usize,
        layout: Arc<OutputLayout>,
        metrics: GpuJoinMetrics,
    ) -> Self {
        let batch_size = ctx.session_config().batch_size().max(1);
        Self {
            schema,
            partition,
            right,
            ctx,
            probe: None,
            chunk: vec![],
            chunk_rows: 0,
            chunk_limit: chunk_limit.max(1),
            batch_size,
            layout,
            metrics,
            cuda: None,
            state: State::Building(build),
        }
    }

    /// Sends the buffered chunk to a blocking thread to be joined.
    fn start_join(&mut self, build: Arc<SharedBuild>, input_done: bool) -> Result<State> {
        let chunk = std::mem::take(&mut self.chunk);
        self.chunk_rows = 0;
        let layout = Arc::clone(&self.layout);
        let metrics = self.metrics.clone();
        let batch_size = self.batch_size;
        let cuda = match (&*build, &self.cuda) {
            (SharedBuild::Cuda(base, _), None) => {
                self.cuda = Some(base.fork()?);
                self.cuda.clone()
            }
            _ => self.cuda.clone(),
        };
        let b = Arc::clone(&build);
        let task = tokio::task::spawn_blocking(move || {
            let phases = &metrics.phases;
            match (&*b, cuda) {
                (SharedBuild::Host(host, side), _) => {
                    join_chunk(host, side, &chunk, &layout, phases, batch_size)
                }
                (SharedBuild::Cuda(_, side), Some(cuda)) => {
                    let out = join_chunk(&cuda, side, &chunk, &layout, phases, batch_size);
                    if let Some((_, peak)) = cuda.memory_use() {
                        metrics.peak_device_memory.set_max(peak);
                    }
                    out
                }
                _ => Err(exec_datafusion_err!(
                    "GpuJoinStream: no backend for this build state"
                )),
            }
        })
        .map(|r| r.map_err(|e| exec_datafusion_err!("join task failed: {e}"))?)
        .boxed();
        Ok(State::Joining {
            build,
            task,
            input_done,
        })
    }

    fn poll_state(&mut self, cx: &mut Context<'_>) -> Poll<Option<Result<RecordBatch>>> {
        loop {
            match std::mem::replace(&mut self.state, State::Done) {
                State::Building(mut fut) => match fut.poll_unpin(cx) {
                    Poll::Pending => {
                        self.state = State::Building(fut);
                        return Poll::Pending;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Some(Err(e))),
                    Poll::Ready(Ok(build)) => match &*build {
                        SharedBuild::Empty => return Poll::Ready(None),
                        SharedBuild::Fallback(join) => {
                            self.state = State::Fallback(
                                join.execute(self.partition, Arc::clone(&self.ctx))?,
                            );
                        }
                        _ => {
                            self.probe =
                                Some(self.right.execute(self.partition, Arc::clone(&self.ctx))?);
                            self.state = State::Reading(build);
                        }
                    },
                },
                State::Reading(build) => {
                    let Some(probe) = self.probe.as_mut() else {
                        return Poll::Ready(Some(Err(exec_datafusion_err!(
                            "probe stream missing"
                        ))));
                    };
                    match probe.poll_next_unpin(cx) {
                        Poll::Pending => {
                            self.state = State::Reading(build);
                            return Poll::Pending;
                        }
                        Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                        Poll::Ready(Some(Ok(batch))) => {
                            self.metrics.probe_rows.add(batch.num_rows());
                            if batch.num_rows() > 0 {
                                self.chunk_rows += batch.num_rows();
                                self.chunk.push(batch);
                            }
                            self.state = if self.chunk_rows >= self.chunk_limit {
                                self.start_join(build, false)?
                            } else {
                                State::Reading(build)
                            };
                        }
                        Poll::Ready(None) if self.chunk.is_empty() => return Poll::Ready(None),
                        Poll::Ready(None) => self.state = self.start_join(build, true)?,
                    }
                }
                State::Joining {
                    build,
                    mut task,
                    input_done,
                } => match task.poll_unpin(cx) {
                    Poll::Pending => {
                        self.state = State::Joining {
                            build,
                            task,
                            input_done,
                        };
                        return Poll::Pending;
                    }
                    Poll::Ready(Err(e)) => return Poll::Ready(Some(Err(e))),
                    Poll::Ready(Ok(batches)) => {
                        self.state = State::Emitting {
                            build,
                            batches: batches.into(),
                            input_done,
                        }
                    }
                },
                State::Emitting {
                    build,
                    mut batches,
                    input_done,
                } => {
                    if let Some(out) = batches.pop_front() {
                        self.state = State::Emitting {
                            build,
                            batches,
                            input_done,
                        };
                        return Poll::Ready(Some(Ok(out)));
                    }
                    if input_done {
                        return Poll::Ready(None);
                    }
                    self.state = State::Reading(build);
                }
                State::Fallback(mut s) => {
                    let out = s.poll_next_unpin(cx);
                    self.state = State::Fallback(s);
                    return out;
                }
                State::Done => return Poll::Ready(None),
            }
        }
    }
}

impl Stream for GpuJoinStream {
    type Item = Result<RecordBatch>;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let timer = self.metrics.baseline.elapsed_compute().clone();
        let _guard = timer.timer();
        let poll = self.poll_state(cx);
        self.metrics.baseline.record_poll(poll)
    }
}

impl RecordBatchStream for GpuJoinStream {
    fn schema(&self) -> SchemaRef {
        Arc::clone(&self.schema)
    }
}
