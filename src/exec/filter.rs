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
//! publishes the build keys' set instead ([`KeySetExpr`]). The set is built before the probe
//! side starts (a bitmap or a hash set of integer keys; for other types an IN list's hashed
//! set, about a millisecond per 4,000 keys), so it is not built for a scan that would ignore
//! it. A key of several columns publishes no IN list, but may publish the
//! set of the column whose build rows cover least of its range. Float keys publish
//! neither (their comparisons tell `-0.0` from `0.0`, which the join does not). The filter stays
//! `true` for an empty build side, as HashJoinExec leaves it. Rows the scan prunes never reach
//! the join, so they never cross PCIe.
//!
//! Gates, as HashJoinExec's: `datafusion.optimizer.enable_join_dynamic_filter_pushdown`; a join
//! type for which a probe row without a match adds nothing to the output (not right, full,
//! right anti or right mark joins). Null-equal joins (`IS NOT DISTINCT FROM`), where a null
//! probe key can match, push none. One more of this join's own: a probe side under which two
//! columns share a key column's name gets none ([`keys_named_once_below`]), since DataFusion's
//! pushdown finds a filter's columns by name.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, LazyLock, Mutex};

use arrow::array::ArrayRef;
use arrow::datatypes::Schema;
use datafusion::common::Result;
use datafusion::common::config::ConfigOptions;
use datafusion::logical_expr::Operator;
use datafusion::physical_expr::PhysicalExpr;
use datafusion::physical_expr::expressions::{
    BinaryExpr, DynamicFilterPhysicalExpr, InListExpr, lit,
};
use datafusion::physical_expr::utils::collect_columns;
use datafusion::physical_plan::ExecutionPlan;
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::joins::utils::JoinOn;
use datafusion::physical_plan::projection::ProjectionExec;

use super::carriage;
use super::key_set::KeySetExpr;
use crate::columns::KeyRange;

/// Most build rows whose keys a join publishes as a set ([`KeySetExpr`]): the set is built on
/// the host once per execution (as an IN list's hashed set, TPC-H Q9's 108,782 keys took 25 ms
/// on an H200 host; integer keys now go into a bitmap or a hash set of their own).
pub const KEY_SET_MAX_ROWS: usize = 1 << 18;

/// A fresh placeholder over the probe keys of `on`, remembered as a join's, and as one whose
/// join stages its probe scans' rows itself where `staged` ([`applied_above_scans`]).
pub(crate) fn placeholder(on: &JoinOn, staged: bool) -> Arc<DynamicFilterPhysicalExpr> {
    let probe_keys = on.iter().map(|(_, r)| Arc::clone(r)).collect();
    let filter = Arc::new(DynamicFilterPhysicalExpr::new(probe_keys, lit(true)));
    if let Some(id) = filter.expression_id()
        && let Ok(mut ids) = JOIN_FILTERS.lock()
    {
        ids.insert(id, staged);
    }
    filter
}

/// How many of the latest joins' placeholders [`applied_above_scans`] knows: a plan's filter
/// pushdown asks about its placeholders right after making them.
const JOIN_FILTERS_KEPT: usize = 1 << 16;

/// The expression ids of the latest placeholders joins made (DataFusion numbers dynamic
/// filters from one process-wide counter, and keeps the number through remapping and
/// updates), each with whether its join stages its probe scans' rows itself.
static JOIN_FILTERS: LazyLock<Mutex<RecentIds>> = LazyLock::new(Default::default);

/// A bounded map of ids: the latest [`JOIN_FILTERS_KEPT`].
#[derive(Default)]
struct RecentIds {
    order: VecDeque<u64>,
    staged: HashMap<u64, bool>,
}

impl RecentIds {
    fn insert(&mut self, id: u64, staged: bool) {
        if self.staged.insert(id, staged).is_none() {
            self.order.push_back(id);
        }
        while self.order.len() > JOIN_FILTERS_KEPT {
            if let Some(old) = self.order.pop_front() {
                self.staged.remove(&old);
            }
        }
    }

    /// Whether `expr` is a join's placeholder, and if so whether its join stages its rows.
    fn of(expr: &dyn PhysicalExpr) -> Option<bool> {
        expr.downcast_ref::<DynamicFilterPhysicalExpr>()?;
        let id = expr.expression_id()?;
        JOIN_FILTERS.lock().ok()?.staged.get(&id).copied()
    }
}

/// Whether a `RuntimeFilterExec` applies `expr`: only the dynamic filters of `GpuJoinExec`s
/// (made by [`placeholder`]), not DataFusion's own (an aggregate's bounds, a TopK's threshold,
/// a `HashJoinExec`'s), which hold only under conditions DataFusion keeps for its own
/// consumers; and not that of a join that reads its probe scans through projections and
/// repartitions alone, which stages such rows' keys (only those where few match) for less
/// than testing each against a set on the CPU costs (about 20 ns a row).
pub(crate) fn applied_above_scans(expr: &dyn PhysicalExpr) -> bool {
    RecentIds::of(expr) == Some(false)
}

/// Whether the session lets joins push dynamic filters.
pub(crate) fn enabled(config: &ConfigOptions) -> bool {
    config.optimizer.enable_join_dynamic_filter_pushdown
}

/// Whether no schema under a join's probe side, `probe`'s own included, has two columns with
/// the name of a column the join's probe keys (of `on`) come from. DataFusion's filter
/// pushdown carries a filter into most nodes' inputs by column name (`FilterRemapper`), so
/// where two columns share a key's name the filter may land on the other one: a join whose
/// output holds `l.k2` and `r.k2`, under a repartition, gets a filter on `r.k2` remapped onto
/// `l.k2`, which a `RuntimeFilterExec` under it would then apply. Such a join publishes no
/// filter. The names are followed through projections, which rename columns, and aggregates
/// (as their output names them and as their groups' columns do).
pub(crate) fn keys_named_once_below(probe: &Arc<dyn ExecutionPlan>, on: &JoinOn) -> bool {
    let names = on
        .iter()
        .flat_map(|(_, key)| collect_columns(key))
        .map(|c| c.name().to_string())
        .collect();
    named_once(probe, &names)
}

/// [`keys_named_once_below`] for the columns named `names` in `plan`'s output.
fn named_once(plan: &Arc<dyn ExecutionPlan>, names: &HashSet<String>) -> bool {
    if names.is_empty() {
        return true;
    }
    let schema = plan.schema();
    let twice = |name: &String| schema.fields().iter().filter(|f| f.name() == name).count() > 1;
    if names.iter().any(twice) {
        return false;
    }
    // The names of the input columns these come from.
    let from = |exprs: &mut dyn Iterator<Item = (&Arc<dyn PhysicalExpr>, &String)>| {
        exprs
            .filter(|(_, alias)| names.contains(*alias))
            .flat_map(|(e, _)| collect_columns(e))
            .map(|c| c.name().to_string())
            .collect::<HashSet<_>>()
    };
    let below = if let Some(p) = plan.downcast_ref::<ProjectionExec>() {
        from(&mut p.expr().iter().map(|e| (&e.expr, &e.alias)))
    } else if let Some(a) = plan.downcast_ref::<AggregateExec>() {
        // An aggregate passes a filter on by its output's names, which its groups' columns
        // may not share: both.
        let mut groups = a.group_expr().expr().iter().map(|(e, alias)| (e, alias));
        from(&mut groups).union(names).cloned().collect()
    } else {
        names.clone()
    };
    plan.children().into_iter().all(|c| named_once(c, &below))
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
    // DataFusion's IN list where it publishes one (a Parquet scan prunes row groups with a
    // short one), else the set where one is wanted.
    if let Some(in_list) = in_list(on, probe_schema, build, config)? {
        terms.push(in_list);
    } else if let Some(set) = key_set(on, build)? {
        terms.push(set);
    }
    // No term (an empty or all-null build side, float keys): `true`, set all the same, so that
    // a plan executed again holds none of an earlier execution's terms.
    filter.update(terms.into_iter().reduce(and).unwrap_or_else(|| lit(true)))?;
    filter.mark_complete();
    Ok(())
}

/// `key IN (build keys)` for a small build side with one key column, as `HashJoinExec`
/// publishes it.
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
    if build.rows == 0
        || build.rows > opt.hash_join_inlist_pushdown_max_distinct_values
        || bytes > opt.hash_join_inlist_pushdown_max_size
    {
        return Ok(None);
    }
    Ok(Some(Arc::new(InListExpr::try_new_from_array(
        Arc::clone(probe_key),
        concat(arrays)?,
        false,
        probe_schema,
    )?)))
}

/// `key IN (n build keys)` ([`KeySetExpr`]) for the key column whose build rows cover least of
/// its range, where they predict few probe rows matched (a probe row whose value in one key
/// column is not among the build side's cannot match). `None` where a set is not wanted, the
/// build side is empty or larger than [`KEY_SET_MAX_ROWS`], or no exactly encoded column
/// predicts it (floats and hashed keys do not).
fn key_set(on: &JoinOn, build: &BuildKeys<'_>) -> Result<Option<Arc<dyn PhysicalExpr>>> {
    if !build.key_set || build.rows == 0 || build.rows > KEY_SET_MAX_ROWS {
        return Ok(None);
    }
    let widest = build
        .ranges
        .iter()
        .enumerate()
        .filter_map(|(i, r)| r.value_span().map(|span| (i, span)))
        .max_by_key(|&(_, span)| span);
    let Some((column, span)) = widest else {
        return Ok(None);
    };
    if carriage::few_match(&[span], build.rows).is_none() {
        return Ok(None);
    }
    let (Some((_, probe_key)), Some(arrays)) = (on.get(column), build.arrays.get(column)) else {
        return Ok(None);
    };
    Ok(Some(Arc::new(KeySetExpr::try_new(
        Arc::clone(probe_key),
        concat(arrays)?,
    )?)))
}

/// One build key column's arrays as one array.
fn concat(arrays: &[ArrayRef]) -> Result<ArrayRef> {
    let refs: Vec<&dyn arrow::array::Array> = arrays.iter().map(|a| a.as_ref()).collect();
    Ok(arrow::compute::concat(&refs)?)
}
