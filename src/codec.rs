//! [`GpuJoinCodec`]: `GpuJoinExec` in DataFusion's protobuf plans (`datafusion-proto`), so
//! that plans holding it can be sent to other processes, as distributed engines do.
//!
//! A node travels with its keys, residual filter, join type, projection, null equality, the
//! join it replaced, fetch, null-aware flag, dynamic filter and the settings the rule gave it
//! (probe chunk rows, memory limit, key hash bits, `distributed`); its inputs travel as
//! DataFusion's own plan nodes. The dynamic filter is encoded as DataFusion encodes `HashJoinExec`'s: decoded
//! through a converter that deduplicates expressions, it is the object the probe scan holds. Where
//! it runs is decided where it is decoded: the decoding session's `gpu_join.backend` (and
//! `gpu_join.device`) choose as the rule would there — its GPU, the host backend, or, with
//! `auto` on a machine without a usable GPU, DataFusion's own join over the same inputs.
//!
//! A [`RuntimeFilterExec`] travels with its filters, encoded as the joins' dynamic filters are:
//! decoded through a deduplicating converter, each is the object its join fills in (through
//! another, a copy that stays `true`, so that the node prunes nothing, and the join builds its
//! build keys' set for no one).
//!
//! The codec wraps another (DataFusion's default, or an engine's own, such as Ballista's):
//! every other node, function and expression goes to it, so it can stand wherever that one
//! stood.
//!
//! ```text
//! let codec = GpuJoinCodec::new(Arc::new(DefaultPhysicalExtensionCodec {}));
//! let bytes = physical_plan_to_bytes_with_extension_codec(plan, &codec)?;
//! let plan = physical_plan_from_bytes_with_extension_codec(&bytes, &task_ctx, &codec)?;
//! ```

use std::fmt;
use std::str::FromStr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use arrow::compute::SortOptions;
use arrow::datatypes::Schema;
use datafusion::common::{JoinSide, JoinType, NullEquality, Result, internal_datafusion_err};
use datafusion::execution::TaskContext;
use datafusion::logical_expr::{AggregateUDF, HigherOrderUDF, ScalarUDF, WindowUDF};
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::DynamicFilterPhysicalExpr;
use datafusion::physical_expr_common::physical_expr::proto_decode::PhysicalExprDecodeCtx;
use datafusion::physical_expr_common::physical_expr::proto_encode::PhysicalExprEncodeCtx;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::joins::PartitionMode;
use datafusion::physical_plan::joins::utils::{ColumnIndex, JoinFilter};
use datafusion_proto::physical_plan::{
    DefaultPhysicalExtensionCodec, PhysicalExtensionCodec, PhysicalPlanDecodeContext,
    PhysicalProtoConverterExtension,
};
use datafusion_proto::protobuf;
use prost::Message;

use crate::config::{Algorithm, MemoryLimit, ProbeColumns};
use crate::exec::{GpuJoinExec, JoinBackend, Replaced};
use crate::rule::{resolve_backend, settings};
use crate::runtime_filter::RuntimeFilterExec;

/// What a [`GpuJoinCodec`] writes before a `GpuJoinExec`; anything else is the wrapped
/// codec's.
const TAG: &[u8] = b"GpuJoinExec/1\0";

/// What it writes before a [`RuntimeFilterExec`].
const RUNTIME_FILTER_TAG: &[u8] = b"RuntimeFilterExec/1\0";

/// A `RuntimeFilterExec` in protobuf: its filters (dynamic filters, encoded as the joins'
/// are, so that a decoded node holds the object its decoded join fills in).
#[derive(Clone, PartialEq, prost::Message)]
struct RuntimeFilterNode {
    #[prost(message, repeated, tag = "1")]
    filters: Vec<protobuf::PhysicalExprNode>,
}

/// A `GpuJoinExec` in protobuf.
#[derive(Clone, PartialEq, prost::Message)]
struct GpuJoinNode {
    #[prost(message, repeated, tag = "1")]
    on: Vec<protobuf::JoinOn>,
    /// DataFusion's name of the join type (`Inner`, `LeftSemi`, ...).
    #[prost(string, tag = "2")]
    join_type: String,
    #[prost(message, optional, tag = "3")]
    filter: Option<protobuf::JoinFilter>,
    #[prost(bool, tag = "4")]
    projected: bool,
    #[prost(uint32, repeated, tag = "5")]
    projection: Vec<u32>,
    #[prost(bool, tag = "6")]
    nulls_equal: bool,
    /// The replaced join: `hash:CollectLeft`, `hash:Partitioned`, `hash:Auto`, `cross`,
    /// `nested_loop`, `piecewise_merge` or `sort_merge` (with `sort_options`).
    #[prost(string, tag = "7")]
    replaced: String,
    #[prost(message, repeated, tag = "8")]
    sort_options: Vec<SortOptionsNode>,
    #[prost(uint64, tag = "9")]
    probe_chunk_rows: u64,
    /// `gpu_join.memory_limit` as it is written (`80%`, `8589934592B`).
    #[prost(string, tag = "10")]
    memory_limit: String,
    #[prost(uint32, tag = "11")]
    key_hash_bits: u32,
    #[prost(uint64, optional, tag = "12")]
    fetch: Option<u64>,
    #[prost(bool, tag = "13")]
    null_aware: bool,
    /// The dynamic filter the node fills for its probe scan, encoded as DataFusion encodes
    /// `HashJoinExec`'s: a converter that deduplicates expressions decodes it as the same
    /// object the scan holds.
    #[prost(message, optional, tag = "14")]
    dynamic_filter: Option<protobuf::PhysicalExprNode>,
    /// `gpu_join.distributed`: the inputs are asked for partitioned on their keys.
    #[prost(bool, tag = "15")]
    distributed: bool,
    /// `gpu_join.pack_uploads` (absent: the default, `true`).
    #[prost(bool, optional, tag = "16")]
    pack_uploads: Option<bool>,
    /// `gpu_join.algorithm` as the setting is written (absent or empty: the default, `auto`).
    #[prost(string, tag = "17")]
    algorithm: String,
    /// `gpu_join.views_on_device` (absent: the default, `true`).
    #[prost(bool, optional, tag = "18")]
    views_on_device: Option<bool>,
    /// `gpu_join.probe_columns` as the setting is written (absent or empty: the default,
    /// `auto`).
    #[prost(string, tag = "19")]
    probe_columns: String,
    /// `gpu_join.view_bytes_on_device` (absent: the default, `true`).
    #[prost(bool, optional, tag = "20")]
    view_bytes_on_device: Option<bool>,
}

#[derive(Clone, PartialEq, prost::Message)]
struct SortOptionsNode {
    #[prost(bool, tag = "1")]
    descending: bool,
    #[prost(bool, tag = "2")]
    nulls_first: bool,
}

/// A `PhysicalExtensionCodec` for `GpuJoinExec`, wrapping another codec for everything else.
///
/// Clones share one count of the joins decoded ([`GpuJoinCodec::decoded`]).
#[derive(Clone)]
pub struct GpuJoinCodec {
    inner: Arc<dyn PhysicalExtensionCodec>,
    decoded: Arc<DecodeCounts>,
}

/// How many joins a [`GpuJoinCodec`] and its clones have decoded, by where they run: what an
/// engine's executors can report to show where their joins ran.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct DecodedJoins {
    /// `GpuJoinExec` on a GPU.
    pub gpu: usize,
    /// `GpuJoinExec` on the host backend.
    pub host: usize,
    /// DataFusion's own join (`auto` without a usable GPU, or `gpu_join.enabled = false`).
    pub datafusion: usize,
}

#[derive(Default)]
struct DecodeCounts {
    gpu: AtomicUsize,
    host: AtomicUsize,
    datafusion: AtomicUsize,
}

impl GpuJoinCodec {
    /// The codec, with `inner` for every other node, function and expression.
    pub fn new(inner: Arc<dyn PhysicalExtensionCodec>) -> Self {
        Self {
            inner,
            decoded: Arc::default(),
        }
    }

    /// The joins this codec and its clones have decoded so far.
    pub fn decoded(&self) -> DecodedJoins {
        let read = |n: &AtomicUsize| n.load(Ordering::Relaxed);
        DecodedJoins {
            gpu: read(&self.decoded.gpu),
            host: read(&self.decoded.host),
            datafusion: read(&self.decoded.datafusion),
        }
    }
}

impl Default for GpuJoinCodec {
    /// Wrapping DataFusion's `DefaultPhysicalExtensionCodec`.
    fn default() -> Self {
        Self::new(Arc::new(DefaultPhysicalExtensionCodec {}))
    }
}

impl fmt::Debug for GpuJoinCodec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GpuJoinCodec")
            .field("inner", &self.inner)
            .finish()
    }
}

fn replaced_name(replaced: &Replaced) -> String {
    match replaced {
        Replaced::HashJoin(mode) => format!("hash:{mode:?}"),
        Replaced::CrossJoin => "cross".into(),
        Replaced::NestedLoopJoin => "nested_loop".into(),
        Replaced::PiecewiseMergeJoin => "piecewise_merge".into(),
        Replaced::SortMergeJoin(_) => "sort_merge".into(),
    }
}

fn replaced_from(name: &str, sort_options: &[SortOptionsNode]) -> Result<Replaced> {
    Ok(match name {
        "hash:CollectLeft" => Replaced::HashJoin(PartitionMode::CollectLeft),
        "hash:Partitioned" => Replaced::HashJoin(PartitionMode::Partitioned),
        "hash:Auto" => Replaced::HashJoin(PartitionMode::Auto),
        "cross" => Replaced::CrossJoin,
        "nested_loop" => Replaced::NestedLoopJoin,
        "piecewise_merge" => Replaced::PiecewiseMergeJoin,
        "sort_merge" => Replaced::SortMergeJoin(
            sort_options
                .iter()
                .map(|o| SortOptions::new(o.descending, o.nulls_first))
                .collect(),
        ),
        other => {
            return Err(internal_datafusion_err!(
                "GpuJoinCodec: unknown replaced join {other:?}"
            ));
        }
    })
}

fn side_to_proto(side: JoinSide) -> i32 {
    match side {
        JoinSide::Left => protobuf::JoinSide::LeftSide as i32,
        JoinSide::Right => protobuf::JoinSide::RightSide as i32,
        JoinSide::None => protobuf::JoinSide::None as i32,
    }
}

fn side_from_proto(side: i32) -> Result<JoinSide> {
    match protobuf::JoinSide::try_from(side) {
        Ok(protobuf::JoinSide::LeftSide) => Ok(JoinSide::Left),
        Ok(protobuf::JoinSide::RightSide) => Ok(JoinSide::Right),
        Ok(protobuf::JoinSide::None) => Ok(JoinSide::None),
        Err(_) => Err(internal_datafusion_err!(
            "GpuJoinCodec: unknown join side {side}"
        )),
    }
}

impl GpuJoinCodec {
    fn encode(
        &self,
        join: &GpuJoinExec,
        converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<GpuJoinNode> {
        let b = join.parts();
        let expr = |e: &Arc<dyn PhysicalExpr>| converter.physical_expr_to_proto(e, self);
        let on =
            b.on.iter()
                .map(|(l, r)| {
                    Ok(protobuf::JoinOn {
                        left: Some(expr(l)?),
                        right: Some(expr(r)?),
                    })
                })
                .collect::<Result<_>>()?;
        let filter = b
            .filter
            .as_ref()
            .map(|f| -> Result<_> {
                Ok(protobuf::JoinFilter {
                    expression: Some(expr(f.expression())?),
                    column_indices: f
                        .column_indices()
                        .iter()
                        .map(|c| protobuf::ColumnIndex {
                            index: c.index as u32,
                            side: side_to_proto(c.side),
                        })
                        .collect(),
                    schema: Some(f.schema().as_ref().try_into()?),
                })
            })
            .transpose()?;
        let sort_options = match &b.replaced {
            Replaced::SortMergeJoin(options) => options
                .iter()
                .map(|o| SortOptionsNode {
                    descending: o.descending,
                    nulls_first: o.nulls_first,
                })
                .collect(),
            _ => vec![],
        };
        Ok(GpuJoinNode {
            on,
            join_type: b.join_type.to_string(),
            filter,
            projected: b.projection.is_some(),
            projection: b.projection.iter().flatten().map(|&i| i as u32).collect(),
            nulls_equal: b.null_equality == NullEquality::NullEqualsNull,
            replaced: replaced_name(&b.replaced),
            sort_options,
            probe_chunk_rows: b.probe_chunk_rows as u64,
            pack_uploads: Some(b.pack_uploads),
            views_on_device: Some(b.views_on_device),
            view_bytes_on_device: Some(b.view_bytes_on_device),
            probe_columns: b.probe_columns.to_string(),
            algorithm: b.algorithm.to_string(),
            memory_limit: b.memory_limit.to_string(),
            key_hash_bits: b.key_hash_bits,
            fetch: b.fetch.map(|f| f as u64),
            null_aware: b.null_aware,
            distributed: b.distributed,
            dynamic_filter: b
                .dynamic_filter
                .as_ref()
                .map(|d| expr(&(Arc::clone(d) as Arc<dyn PhysicalExpr>)))
                .transpose()?,
        })
    }

    fn decode(
        &self,
        node: &GpuJoinNode,
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        let [left, right] = inputs else {
            return Err(internal_datafusion_err!(
                "GpuJoinCodec: a join needs 2 inputs, got {}",
                inputs.len()
            ));
        };
        let decode_ctx = PhysicalPlanDecodeContext::new(ctx, self);
        let expr = |e: Option<&protobuf::PhysicalExprNode>, schema: &Schema| {
            let e =
                e.ok_or_else(|| internal_datafusion_err!("GpuJoinCodec: missing expression"))?;
            converter.proto_to_physical_expr(e, schema, &decode_ctx)
        };
        let (left_schema, right_schema) = (left.schema(), right.schema());
        let on = node
            .on
            .iter()
            .map(|k| {
                Ok((
                    expr(k.left.as_ref(), &left_schema)?,
                    expr(k.right.as_ref(), &right_schema)?,
                ))
            })
            .collect::<Result<Vec<_>>>()?;
        let filter = node
            .filter
            .as_ref()
            .map(|f| -> Result<_> {
                let schema: Schema = f
                    .schema
                    .as_ref()
                    .ok_or_else(|| internal_datafusion_err!("GpuJoinCodec: filter without schema"))?
                    .try_into()?;
                let expression = expr(f.expression.as_ref(), &schema)?;
                let columns = f
                    .column_indices
                    .iter()
                    .map(|c| {
                        Ok(ColumnIndex {
                            index: c.index as usize,
                            side: side_from_proto(c.side)?,
                        })
                    })
                    .collect::<Result<_>>()?;
                Ok(JoinFilter::new(expression, columns, Arc::new(schema)))
            })
            .transpose()?;
        let memory_limit = MemoryLimit::from_str(&node.memory_limit)?;
        let builder = GpuJoinExec::builder(Arc::clone(left), Arc::clone(right), on)
            .with_join_type(JoinType::from_str(&node.join_type)?)
            .with_filter(filter)
            .with_projection(
                node.projected
                    .then(|| node.projection.iter().map(|&i| i as usize).collect()),
            )
            .with_null_equality(if node.nulls_equal {
                NullEquality::NullEqualsNull
            } else {
                NullEquality::NullEqualsNothing
            })
            .with_replaced(replaced_from(&node.replaced, &node.sort_options)?)
            .with_probe_chunk_rows(node.probe_chunk_rows as usize)
            .with_pack_uploads(node.pack_uploads.unwrap_or(true))
            .with_views_on_device(node.views_on_device.unwrap_or(true))
            .with_view_bytes_on_device(node.view_bytes_on_device.unwrap_or(true))
            .with_probe_columns(match node.probe_columns.as_str() {
                "" => ProbeColumns::default(),
                name => name.parse()?,
            })
            .with_algorithm(match node.algorithm.as_str() {
                "" => Algorithm::default(),
                name => name.parse()?,
            })
            .with_memory_limit(memory_limit)
            .with_key_hash_bits(node.key_hash_bits)
            .with_fetch(node.fetch.map(|f| f as usize))
            .with_null_aware(node.null_aware)
            .with_distributed(node.distributed);
        // Where it runs is this session's choice, as the rule would make it here.
        let config = settings(ctx.session_config().options());
        match resolve_backend(&config)? {
            Some(backend) if config.enabled => {
                let dynamic_filter = node
                    .dynamic_filter
                    .as_ref()
                    .map(|d| -> Result<_> {
                        let d = expr(Some(d), &right_schema)?;
                        Arc::downcast::<DynamicFilterPhysicalExpr>(d).map_err(|_| {
                            internal_datafusion_err!(
                                "GpuJoinCodec: the dynamic filter is not a DynamicFilterPhysicalExpr"
                            )
                        })
                    })
                    .transpose()?;
                let builder = builder
                    .with_backend(backend)
                    .with_dynamic_filter(dynamic_filter);
                let join = Arc::new(builder.build()?);
                let count = match backend {
                    JoinBackend::Cuda(_) => &self.decoded.gpu,
                    JoinBackend::Host(_) => &self.decoded.host,
                };
                count.fetch_add(1, Ordering::Relaxed);
                Ok(join)
            }
            _ => {
                let join = builder.runnable_twin()?;
                self.decoded.datafusion.fetch_add(1, Ordering::Relaxed);
                Ok(join)
            }
        }
    }
}

impl PhysicalExtensionCodec for GpuJoinCodec {
    fn try_decode(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn ExecutionPlan>],
        ctx: &TaskContext,
        converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<Arc<dyn ExecutionPlan>> {
        if let Some(node) = buf.strip_prefix(RUNTIME_FILTER_TAG) {
            let node = RuntimeFilterNode::decode(node)
                .map_err(|e| internal_datafusion_err!("GpuJoinCodec: {e}"))?;
            let [input] = inputs else {
                return Err(internal_datafusion_err!(
                    "GpuJoinCodec: a RuntimeFilterExec needs 1 input, got {}",
                    inputs.len()
                ));
            };
            let decode_ctx = PhysicalPlanDecodeContext::new(ctx, self);
            let schema = input.schema();
            let filters = node
                .filters
                .iter()
                .map(|f| converter.proto_to_physical_expr(f, &schema, &decode_ctx))
                .collect::<Result<Vec<_>>>()?;
            return Ok(Arc::new(RuntimeFilterExec::new(Arc::clone(input), filters)));
        }
        match buf.strip_prefix(TAG) {
            Some(node) => {
                let node = GpuJoinNode::decode(node)
                    .map_err(|e| internal_datafusion_err!("GpuJoinCodec: {e}"))?;
                self.decode(&node, inputs, ctx, converter)
            }
            None => self.inner.try_decode(buf, inputs, ctx, converter),
        }
    }

    fn try_encode(
        &self,
        node: Arc<dyn ExecutionPlan>,
        buf: &mut Vec<u8>,
        converter: &dyn PhysicalProtoConverterExtension,
    ) -> Result<()> {
        if let Some(runtime) = node.downcast_ref::<RuntimeFilterExec>() {
            let filters = runtime
                .filters()
                .iter()
                .map(|f| converter.physical_expr_to_proto(f, self))
                .collect::<Result<Vec<_>>>()?;
            buf.extend_from_slice(RUNTIME_FILTER_TAG);
            return RuntimeFilterNode { filters }
                .encode(buf)
                .map_err(|e| internal_datafusion_err!("GpuJoinCodec: {e}"));
        }
        let Some(join) = node.downcast_ref::<GpuJoinExec>() else {
            return self.inner.try_encode(node, buf, converter);
        };
        let message = self.encode(join, converter)?;
        buf.extend_from_slice(TAG);
        message
            .encode(buf)
            .map_err(|e| internal_datafusion_err!("GpuJoinCodec: {e}"))
    }

    fn try_decode_udf(&self, name: &str, buf: &[u8]) -> Result<Arc<ScalarUDF>> {
        self.inner.try_decode_udf(name, buf)
    }

    fn try_encode_udf(&self, node: &ScalarUDF, buf: &mut Vec<u8>) -> Result<()> {
        self.inner.try_encode_udf(node, buf)
    }

    fn try_decode_higher_order_function(
        &self,
        name: &str,
        buf: &[u8],
    ) -> Result<Arc<HigherOrderUDF>> {
        self.inner.try_decode_higher_order_function(name, buf)
    }

    fn try_encode_higher_order_function(
        &self,
        node: &HigherOrderUDF,
        buf: &mut Vec<u8>,
    ) -> Result<()> {
        self.inner.try_encode_higher_order_function(node, buf)
    }

    fn try_decode_expr(
        &self,
        buf: &[u8],
        inputs: &[Arc<dyn PhysicalExpr>],
        ctx: &PhysicalExprDecodeCtx<'_>,
    ) -> Result<Arc<dyn PhysicalExpr>> {
        self.inner.try_decode_expr(buf, inputs, ctx)
    }

    fn try_encode_expr(
        &self,
        node: &Arc<dyn PhysicalExpr>,
        buf: &mut Vec<u8>,
        ctx: &PhysicalExprEncodeCtx<'_>,
    ) -> Result<()> {
        self.inner.try_encode_expr(node, buf, ctx)
    }

    fn try_decode_udaf(&self, name: &str, buf: &[u8]) -> Result<Arc<AggregateUDF>> {
        self.inner.try_decode_udaf(name, buf)
    }

    fn try_encode_udaf(&self, node: &AggregateUDF, buf: &mut Vec<u8>) -> Result<()> {
        self.inner.try_encode_udaf(node, buf)
    }

    fn try_decode_udwf(&self, name: &str, buf: &[u8]) -> Result<Arc<WindowUDF>> {
        self.inner.try_decode_udwf(name, buf)
    }

    fn try_encode_udwf(&self, node: &WindowUDF, buf: &mut Vec<u8>) -> Result<()> {
        self.inner.try_encode_udwf(node, buf)
    }
}
