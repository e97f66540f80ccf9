//! The dynamic filter a `GpuJoinExec` pushes into its probe side, as `HashJoinExec` does
//! (`joins/hash_join/shared_bounds.rs` of DataFusion 55): a placeholder (`true`) wired into the
//! probe scan at planning time, filled in once the build side has been read.
//!
//! What it becomes: for every key column the build side's `[min, max]` bounds, and, for a small
//! build side with one key column (at most
//! `datafusion.optimizer.hash_join_inlist_pushdown_max_distinct_values` rows and
//! `hash_join_inlist_pushdown_max_size` bytes of keys), `key IN (the build keys)` as well.
//! HashJoinExec publishes a lookup into its hash table for larger build sides; this join's
//! table is on the device, so where a `RuntimeFilterExec` under the probe side applies the
//! filter (`gpu_join.runtime_filters`) and the build side's keys predict few probe rows
//! matched (`exec::carriage`'s prediction, at most [`KEY_SET_MAX_ROWS`] build rows), it
//! publishes the build keys' set instead ([`KeySetExpr`]). Building the set costs about a
//! millisecond per 4,000 keys before the probe side starts, so it is not built for a scan
//! that would ignore it. Composite keys publish no IN list. Float keys publish
//! neither (their comparisons tell `-0.0` from `0.0`, which the join does not). The filter stays
//! `true` for an empty build side, as HashJoinExec leaves it. Rows the scan prunes never reach
//! the join, so they never cross PCIe.
//!
//! Gates, as HashJoinExec's: `datafusion.optimizer.enable_join_dynamic_filter_pushdown`; a join
//! type for which a probe row without a match adds nothing to the output (not right, full,
//! right anti or right mark joins). Null-equal joins (`IS NOT DISTINCT FROM`), where a null
//! probe key can match, push none.

use std::sync::Arc;

use arrow::array::ArrayRef;
use arrow::datatypes::Schema;
use datafusion::common::Result;
use datafusion::common::config::ConfigOptions;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{
    BinaryExpr, DynamicFilterPhysicalExpr, InListExpr, lit,
};
use datafusion::physical_plan::joins::utils::JoinOn;

use super::carriage;
use super::key_set::KeySetExpr;
use crate::columns::KeyRange;

/// Most build rows whose keys a join publishes as a set ([`KeySetExpr`]): the set is built on
/// the host once per execution, in about a millisecond per 4,000 keys (TPC-H Q9's 108,782
/// took 25 ms on an H200 host).
pub const KEY_SET_MAX_ROWS: usize = 1 << 18;

/// A fresh placeholder over the probe keys of `on`.
pub(crate) fn placeholder(on: &JoinOn) -> Arc<DynamicFilterPhysicalExpr> {
    let probe_keys = on.iter().map(|(_, r)| Arc::clone(r)).collect();
    Arc::new(DynamicFilterPhysicalExpr::new(probe_keys, lit(true)))
}

/// Whether the session lets joins push dynamic filters.
pub(crate) fn enabled(config: &ConfigOptions) -> bool {
    config.optimizer.enable_join_dynamic_filter_pushdown
}

/// What the build side says about its keys.
pub(crate) struct BuildKeys<'a> {
    /// Per key column, its range.
    pub ranges: &'a [KeyRange],
    /// Per key column, its arrays (one per build batch).
    pub arrays: Vec<Vec<ArrayRef>>,
    pub rows: usize,
    /// Whether the build keys may be published as a set (`gpu_join.runtime_filters`, and a
    /// `RuntimeFilterExec` applies the filter).
    pub key_set: bool,
}

fn and(a: Arc<dyn PhysicalExpr>, b: Arc<dyn PhysicalExpr>) -> Arc<dyn PhysicalExpr> {
    Arc::new(BinaryExpr::new(a, Operator::And, b))
}

/// Fills in `filter` from the build side and marks it complete.
pub(crate) fn publish(
    filter: &DynamicFilterPhysicalExpr,
    on: &JoinOn,
    probe_schema: &Schema,
    build: &BuildKeys<'_>,
    config: &ConfigOptions,
) -> Result<()> {
    let mut terms: Vec<Arc<dyn PhysicalExpr>> = vec![];
    for ((_, probe_key), range) in on.iter().zip(build.ranges) {
        if let Some((min, max)) = range.bounds()? {
            let ge = Arc::new(BinaryExpr::new(
                Arc::clone(probe_key),
                Operator::GtEq,
                lit(min),
            ));
            let le = Arc::new(BinaryExpr::new(
                Arc::clone(probe_key),
                Operator::LtEq,
                lit(max),
            ));
            terms.push(and(ge, le));
        }
    }
    if let Some(in_list) = in_list(on, probe_schema, build, config)? {
        terms.push(in_list);
    }
    if let Some(expr) = terms.into_iter().reduce(and) {
        filter.update(expr)?;
    }
    filter.mark_complete();
    Ok(())
}

/// `key IN (build keys)` for a small build side with one key column.
fn in_list(
    on: &JoinOn,
    probe_schema: &Schema,
    build: &BuildKeys<'_>,
    config: &ConfigOptions,
) -> Result<Option<Arc<dyn PhysicalExpr>>> {
    let ([(_, probe_key)], [arrays]) = (on.as_slice(), build.arrays.as_slice()) else {
        return Ok(None);
    };
    // `IN` compares floats in total order, where `-0.0` is not `0.0` as the join finds it.
    if arrays.first().is_some_and(|a| a.data_type().is_floating()) {
        return Ok(None);
    }
    let bytes: usize = arrays.iter().map(|a| a.get_array_memory_size()).sum();
    let opt = &config.optimizer;
    let small = build.rows <= opt.hash_join_inlist_pushdown_max_distinct_values
        && bytes <= opt.hash_join_inlist_pushdown_max_size;
    // Few probe rows expected to match: the set prunes the rest before they cost anything.
    let spans: Vec<u64> = build
        .ranges
        .iter()
        .filter_map(KeyRange::value_span)
        .collect();
    let selective = build.key_set
        && build.rows <= KEY_SET_MAX_ROWS
        && carriage::few_match(&spans, build.rows).is_some();
    if build.rows == 0 || !(small || selective) {
        return Ok(None);
    }
    let refs: Vec<&dyn arrow::array::Array> = arrays.iter().map(|a| a.as_ref()).collect();
    let values = arrow::compute::concat(&refs)?;
    if small {
        return Ok(Some(Arc::new(InListExpr::try_new_from_array(
            Arc::clone(probe_key),
            values,
            false,
            probe_schema,
        )?)));
    }
    Ok(Some(Arc::new(KeySetExpr::try_new(
        Arc::clone(probe_key),
        values,
    )?)))
}
