//! The build cache (`gpu_join.cache_bytes`): build sides that a session's joins collected,
//! kept for its later queries, so that a join whose build input is the same plan over the same
//! data takes the batches kept instead of reading its input again (a dashboard's repeated
//! query skips its dimension scans, filters and aggregates).
//!
//! A build side is kept under an [`Identity`]: the join's own part in what it collects (the
//! columns it computes, its keys) and the session's settings (from `exec::run`), the build
//! input's plan as EXPLAIN VERBOSE shows it with every node's schema, what EXPLAIN leaves out
//! (each expression's structure, with columns by index and literals by type; each function's
//! implementation by address, held; a join filter's columns by side), and the data under it — an in-memory table's arrays by address (the entry
//! holds a weak reference to each, so no other array can take an address while it lives, and
//! goes once nothing but the cache's own kept batches holds the arrays; a table changed by `INSERT` or made again has
//! other arrays), Parquet files by path, size, modification time, entity tag and range. Only
//! plans whose output is a function of that alone are kept: scans of in-memory tables or
//! Parquet files under filters, projections, aggregates, joins, sorts, unions, repartitions
//! and coalesces, without a limit, a function or aggregate that is not immutable (`random()`), or a
//! dynamic filter made outside the build input (by a join above, whose values depend on its
//! own build side); the dynamic filters the build input's own joins make only drop rows those
//! joins drop. Anything else under the build side (a window, a CSV scan, an unknown source,
//! ...) is not kept, and EXPLAIN ANALYZE says why.
//!
//! Entries live in the [`BuildCache`] of the session (a `SessionConfig` extension that
//! [`with_gpu_join_config`](crate::with_gpu_join_config) registers), least recently used first
//! out once `gpu_join.cache_bytes` is reached, and hold the memory reservations of the join that
//! collected them, so that the session's memory pool counts them once. A session whose pool
//! changed since (`SET datafusion.runtime.memory_limit` makes a new one) moves every entry's
//! count into its new pool as its next query reads or stores a build side, dropping the entries
//! that pool refuses.
//! The device's bucketed table is not kept: a hit uploads and buckets the kept batches again.

use std::collections::{HashMap, HashSet};
use std::fmt::Write;
use std::sync::{Arc, Mutex, MutexGuard, Weak};

use arrow::array::{Array, RecordBatch};
use datafusion::common::tree_node::{TreeNode, TreeNodeRecursion};
use datafusion::datasource::memory::MemorySourceConfig;
use datafusion::datasource::object_store::ObjectStoreUrl;
use datafusion::datasource::physical_plan::FileScanConfig;
use datafusion::datasource::source::{DataSource, DataSourceExec};
use datafusion::execution::TaskContext;
use datafusion::execution::memory_pool::{MemoryConsumer, MemoryPool, MemoryReservation};
use datafusion::logical_expr::{AggregateUDF, ScalarUDF, Volatility};
use datafusion::object_store::{ObjectMeta, ObjectStoreExt};
use datafusion::physical_expr::{PhysicalExpr, ScalarFunctionExpr};
use datafusion::physical_plan::aggregates::AggregateExec;
use datafusion::physical_plan::coalesce_partitions::CoalescePartitionsExec;
use datafusion::physical_plan::coop::CooperativeExec;
use datafusion::physical_plan::empty::EmptyExec;
use datafusion::physical_plan::filter::FilterExec;
use datafusion::physical_plan::joins::{
    CrossJoinExec, HashJoinExec, NestedLoopJoinExec, SortMergeJoinExec,
};
use datafusion::physical_plan::placeholder_row::PlaceholderRowExec;
use datafusion::physical_plan::projection::ProjectionExec;
use datafusion::physical_plan::repartition::RepartitionExec;
use datafusion::physical_plan::sorts::sort::SortExec;
use datafusion::physical_plan::sorts::sort_preserving_merge::SortPreservingMergeExec;
use datafusion::physical_plan::union::UnionExec;
use datafusion::physical_plan::{ExecutionPlan, displayable};
use futures::{StreamExt, TryStreamExt};

use super::node::GpuJoinExec;
use super::view_gather::batches_bytes;
use crate::RuntimeFilterExec;
use crate::columns::KeyRange;
use crate::rule::join_parts;

/// One collected build partition: its batches, its key columns' ranges, its rows and the
/// length of its longest checked key (0 where keys are not checked); what the cache keeps of it.
#[derive(Debug, Clone)]
pub(crate) struct CachedPartition {
    pub batches: Vec<RecordBatch>,
    pub ranges: Vec<KeyRange>,
    pub rows: usize,
    pub longest_key: usize,
}

/// What a build side is kept under.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct CacheKey {
    /// The join's part and the build input's plan, files included.
    plan: String,
    /// Rows and column addresses of every in-memory batch under the build input.
    data: Vec<usize>,
}

/// A build input's key, with what must outlive it for the key to stay unique.
pub(crate) struct Identity {
    pub key: CacheKey,
    held: Held,
    /// The files the key names, as DataFusion listed them.
    files: Vec<(ObjectStoreUrl, ObjectMeta)>,
}

impl Identity {
    /// `Err` (why) unless every file the key names is as DataFusion listed it. A directory's
    /// listing may come from DataFusion's list-files cache, which keeps a file's size,
    /// modification time and entity tag after the file is written again: a key of that
    /// listing would be an earlier query's, and its batches stale.
    pub(crate) async fn files_as_listed(
        &self,
        ctx: &TaskContext,
    ) -> std::result::Result<(), String> {
        let mut heads = vec![];
        for (url, listed) in &self.files {
            let store = (ctx.runtime_env().object_store(url)).map_err(|e| e.to_string())?;
            let listed = listed.clone();
            heads.push(async move {
                let now = (store.head(&listed.location).await).map_err(|e| e.to_string())?;
                match same_file(&now, &listed) {
                    true => Ok(()),
                    false => Err(format!("{} changed since it was listed", listed.location)),
                }
            });
        }
        // A few at a time: one request a file where the store is remote.
        (futures::stream::iter(heads).buffer_unordered(FILES_CHECKED_AT_ONCE))
            .try_collect::<Vec<()>>()
            .await
            .map(|_| ())
    }
}

/// Files whose metadata [`Identity::files_as_listed`] asks for at once.
const FILES_CHECKED_AT_ONCE: usize = 16;

/// Whether `now` (an object store's `head`) is the file `listed` (its listing): the same size,
/// and the same entity tag where both have one (some stores quote it in one answer and not in
/// the other), else the same modification time to the second (a `head` may give whole seconds
/// where a listing gives milliseconds).
fn same_file(now: &ObjectMeta, listed: &ObjectMeta) -> bool {
    now.size == listed.size
        && match (&now.e_tag, &listed.e_tag) {
            (Some(a), Some(b)) => a.trim_matches('"') == b.trim_matches('"'),
            _ => now.last_modified.timestamp() == listed.last_modified.timestamp(),
        }
}

/// What a key names by address, held by its entry so that nothing else takes the address:
/// the in-memory arrays, weakly (their buffers are freed where their table drops them, and
/// the entry then goes too), and the functions (one registered again under its name has
/// another implementation).
#[derive(Debug, Default)]
struct Held {
    arrays: Vec<Weak<dyn Array>>,
    functions: Vec<ScalarUDF>,
    aggregates: Vec<AggregateUDF>,
}

/// The address `a` points to, as a key names it.
fn address<T: ?Sized>(a: &Arc<T>) -> usize {
    Arc::as_ptr(a) as *const u8 as usize
}

/// The build sides a session keeps (`gpu_join.cache_bytes`).
#[derive(Debug, Default)]
pub struct BuildCache {
    entries: Mutex<Entries>,
}

#[derive(Debug, Default)]
struct Entries {
    map: HashMap<CacheKey, Entry>,
    bytes: usize,
    /// Ticks at every use, for least-recently-used order.
    clock: u64,
}

#[derive(Debug)]
struct Entry {
    /// The batches, and their memory in the pool; a query that joins them holds that too, so
    /// that the batches stay counted while it holds their arrays, whether the entry goes or
    /// not.
    kept: Kept,
    bytes: usize,
    used: u64,
    held: Held,
    /// The pool the kept reservations are in.
    pool: Arc<dyn MemoryPool>,
}

/// A build side the cache keeps, as a query joins it: its batches and their memory.
#[derive(Debug, Clone)]
pub(crate) struct Kept {
    pub build: Arc<Vec<CachedPartition>>,
    pub reservations: Arc<Vec<MemoryReservation>>,
}

impl Entry {
    /// Whether every array the key names is held by something besides the kept batches of
    /// the cache (`held`: how many of those hold each array, by address): a table, a plan.
    /// Else no query can name it again.
    fn alive(&self, held: &HashMap<usize, usize>) -> bool {
        self.held.arrays.iter().all(|a| {
            let at = a.as_ptr() as *const u8 as usize;
            a.strong_count() > held.get(&at).copied().unwrap_or(0)
        })
    }
}

impl BuildCache {
    fn lock(&self) -> MutexGuard<'_, Entries> {
        // An entry is inserted or removed whole: a panic elsewhere leaves the map consistent.
        self.entries.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Build sides kept.
    pub fn len(&self) -> usize {
        self.lock().map.len()
    }

    /// Whether none is kept.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Bytes of the batches kept.
    pub fn bytes(&self) -> usize {
        self.lock().bytes
    }

    /// Drops every build side kept.
    pub fn clear(&self) {
        let mut entries = self.lock();
        entries.map.clear();
        entries.bytes = 0;
    }

    /// Drops the least recently used entries until at most `limit` bytes are kept.
    pub(crate) fn trim(&self, limit: usize) {
        self.lock().trim(limit);
    }

    /// The build side kept under `key`, if any; first drops entries past `limit` bytes and
    /// counts every entry in `pool`, the session's ([`Entries::count_in`]).
    pub(crate) fn get(
        &self,
        key: &CacheKey,
        limit: usize,
        pool: &Arc<dyn MemoryPool>,
    ) -> Option<Kept> {
        let mut entries = self.lock();
        entries.trim(limit);
        entries.count_in(pool);
        entries.clock += 1;
        let clock = entries.clock;
        let entry = entries.map.get_mut(key)?;
        entry.used = clock;
        Some(entry.kept.clone())
    }

    /// Keeps `build` under `identity` within `limit` bytes, dropping the least recently used
    /// entries to make room, with the memory reservations `take` moves from the join that
    /// collected it (in `pool`, which counts the batches once); gives what is kept, or `Err`
    /// says why it was not kept.
    pub(crate) fn put(
        &self,
        identity: Identity,
        build: Vec<CachedPartition>,
        limit: usize,
        pool: &Arc<dyn MemoryPool>,
        take: impl FnOnce() -> Vec<MemoryReservation>,
    ) -> std::result::Result<Kept, String> {
        // Each buffer counted once (batches that are slices of one share it).
        let bytes = batches_bytes(build.iter().flat_map(|p| &p.batches));
        if bytes > limit {
            return Err(format!(
                "its {bytes} bytes are more than gpu_join.cache_bytes ({limit})"
            ));
        }
        let mut entries = self.lock();
        if let Some(old) = entries.map.remove(&identity.key) {
            entries.bytes -= old.bytes;
        }
        entries.trim(limit - bytes);
        entries.count_in(pool);
        entries.clock += 1;
        let used = entries.clock;
        entries.bytes += bytes;
        let kept = Kept {
            build: Arc::new(build),
            reservations: Arc::new(take()),
        };
        entries.map.insert(
            identity.key,
            Entry {
                kept: kept.clone(),
                bytes,
                used,
                held: identity.held,
                pool: Arc::clone(pool),
            },
        );
        Ok(kept)
    }
}

/// Whether `a` and `b` are one pool (by address: a trait object's vtable pointer may differ
/// between codegen units).
fn same_pool(a: &Arc<dyn MemoryPool>, b: &Arc<dyn MemoryPool>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

impl Entries {
    /// Moves the count of every entry counted in a pool other than `pool` into `pool` (a
    /// session's pool changes with `SET datafusion.runtime.memory_limit`), dropping those it
    /// refuses. A query still joining an entry holds its old count until it ends.
    fn count_in(&mut self, pool: &Arc<dyn MemoryPool>) {
        let Self { map, bytes, .. } = self;
        map.retain(|_, entry| {
            if same_pool(&entry.pool, pool) {
                return true;
            }
            let moved = MemoryConsumer::new("GpuJoinExec build cache").register(pool);
            if moved.try_grow(entry.bytes).is_err() {
                *bytes -= entry.bytes;
                return false;
            }
            entry.kept.reservations = Arc::new(vec![moved]);
            entry.pool = Arc::clone(pool);
            true
        });
    }

    /// Drops the entries no query can name again, then the least recently used ones until at
    /// most `limit` bytes are kept.
    fn trim(&mut self, limit: usize) {
        // An entry's batches may be its table's own arrays (a build side read whole): what
        // they hold does not count, and dropping an entry may free another's.
        loop {
            let mut held: HashMap<usize, usize> = HashMap::new();
            for entry in self.map.values() {
                for batch in entry.kept.build.iter().flat_map(|p| &p.batches) {
                    for c in batch.columns() {
                        *held.entry(address(c)).or_default() += 1;
                    }
                }
            }
            let dead: Vec<CacheKey> = (self.map.iter())
                .filter(|(_, e)| !e.alive(&held))
                .map(|(k, _)| k.clone())
                .collect();
            if dead.is_empty() {
                break;
            }
            for key in dead {
                if let Some(e) = self.map.remove(&key) {
                    self.bytes -= e.bytes;
                }
            }
        }
        while self.bytes > limit {
            let Some(oldest) = self
                .map
                .iter()
                .min_by_key(|(_, e)| e.used)
                .map(|(k, _)| k.clone())
            else {
                break;
            };
            if let Some(e) = self.map.remove(&oldest) {
                self.bytes -= e.bytes;
            }
        }
    }
}

/// What an execution does with the session's build cache.
pub(crate) enum CacheUse {
    /// Nothing: `gpu_join.cache_bytes` is 0, the session has no cache, or the join is a group
    /// of a grace join.
    Off,
    /// The build input cannot be kept: why.
    Unkept(String),
    /// The build input is kept under `identity`, or will be.
    Kept {
        cache: Arc<BuildCache>,
        identity: Identity,
        limit: usize,
    },
}

/// The identity of the build input `plan` of a join whose own part in what it collects is
/// `join`; `Err` says why the input cannot be kept.
pub(crate) fn identify(
    join: &str,
    plan: &Arc<dyn ExecutionPlan>,
) -> std::result::Result<Identity, String> {
    let mut identity = Identity {
        key: CacheKey {
            plan: format!(
                "{join}\n{}",
                displayable(plan.as_ref())
                    .set_show_schema(true)
                    .indent(true)
            ),
            data: vec![],
        },
        held: Held::default(),
        files: vec![],
    };
    let mut filters = DynamicFilters::default();
    visit(plan, &mut identity, &mut filters)?;
    if filters.used.iter().any(|id| !filters.made.contains(id)) {
        return Err("a dynamic filter of a join above under the build side".into());
    }
    Ok(identity)
}

/// The dynamic filters that nodes under a build side make, and those their expressions use.
#[derive(Default)]
struct DynamicFilters {
    made: HashSet<u64>,
    used: HashSet<u64>,
}

/// Checks `plan` and its inputs, adding their data to `identity` and their dynamic filters to
/// `filters`.
fn visit(
    plan: &Arc<dyn ExecutionPlan>,
    identity: &mut Identity,
    filters: &mut DynamicFilters,
) -> std::result::Result<(), String> {
    let node: &dyn ExecutionPlan = plan.as_ref();
    if let Some(source) = node.downcast_ref::<DataSourceExec>() {
        source_identity(source, identity)?;
    } else if !deterministic(node) {
        return Err(format!("{} under the build side", plan.name()));
    }
    if plan.fetch().is_some() {
        // Which rows a limit keeps is not the data's alone.
        return Err(format!("{} with a limit under the build side", plan.name()));
    }
    for made in plan.dynamic_expressions_produced() {
        filters.made.extend(made.expression_id());
    }
    // What EXPLAIN leaves out of a node: its expressions' structure (columns by index,
    // literals with their types) and a join filter's columns (its sides).
    let _ = write!(identity.key.plan, "\n{}:", plan.name());
    // (A join filter's columns EXPLAIN shows by name alone.)
    if let Some(filter) = join_parts(node).and_then(|j| j.filter) {
        let _ = write!(
            identity.key.plan,
            " filter columns {:?} {:?};",
            filter.column_indices(),
            filter.schema()
        );
    }
    let mut refused = None;
    if let Some(aggregate) = node.downcast_ref::<AggregateExec>() {
        // Its functions are not among its expressions (their arguments are).
        for f in aggregate.aggr_expr() {
            let fun = f.fun();
            if fun.signature().volatility != Volatility::Immutable {
                refused = Some(f.name().to_string());
            }
            identity.key.data.push(address(fun.inner()));
            identity.held.aggregates.push(fun.clone());
        }
    }
    let (key, functions) = (&mut identity.key, &mut identity.held.functions);
    plan.apply_expressions(&mut |e| {
        let mut dynamic = false;
        e.apply(|part| {
            if let Some(id) = part.expression_id() {
                filters.used.insert(id);
                dynamic = true;
            }
            if part.is_volatile_node() || changes_between_queries(part) {
                refused = Some(part.to_string());
                return Ok(TreeNodeRecursion::Stop);
            }
            if let Some(f) = part.downcast_ref::<ScalarFunctionExpr>() {
                key.data.push(address(f.fun().inner()));
                functions.push(f.fun().clone());
            }
            Ok(TreeNodeRecursion::Continue)
        })?;
        // A dynamic filter's structure names it by an id of its plan's own: it is written as
        // EXPLAIN shows it (those kept are made inside the build input, and only prune).
        if dynamic {
            let _ = write!(key.plan, " {e};");
        } else {
            let _ = write!(key.plan, " {e:?};");
        }
        Ok(TreeNodeRecursion::Continue)
    })
    .map_err(|e| e.to_string())?;
    if let Some(e) = refused {
        return Err(format!(
            "a function whose value may change from query to query under the build side ({e})"
        ));
    }
    for child in plan.children() {
        visit(child, identity, filters)?;
    }
    Ok(())
}

/// Whether `e` is a function call whose value may differ between queries over the same rows:
/// a function not declared immutable (a stable function is constant within one query only;
/// DataFusion folds its own, such as `now()`, into literals when it plans).
fn changes_between_queries(e: &Arc<dyn PhysicalExpr>) -> bool {
    e.downcast_ref::<ScalarFunctionExpr>()
        .is_some_and(|f| f.fun().signature().volatility != Volatility::Immutable)
}

/// Whether `node`'s output is a function of its inputs' rows and its own expressions alone
/// (with no limit: checked apart): the nodes a build side is kept over, scans aside.
fn deterministic(node: &dyn ExecutionPlan) -> bool {
    #[expect(deprecated)]
    let coalesce_batches =
        node.is::<datafusion::physical_plan::coalesce_batches::CoalesceBatchesExec>();
    coalesce_batches
        || node.is::<FilterExec>()
        || node.is::<ProjectionExec>()
        || node.is::<AggregateExec>()
        || node.is::<RepartitionExec>()
        || node.is::<CoalescePartitionsExec>()
        || node.is::<CooperativeExec>()
        || node.is::<EmptyExec>()
        || node.is::<PlaceholderRowExec>()
        || node.is::<UnionExec>()
        || node.is::<SortExec>()
        || node.is::<SortPreservingMergeExec>()
        || node.is::<HashJoinExec>()
        || node.is::<CrossJoinExec>()
        || node.is::<NestedLoopJoinExec>()
        || node.is::<SortMergeJoinExec>()
        || node.is::<GpuJoinExec>()
        || node.is::<RuntimeFilterExec>()
}

/// Adds a scan's data to `identity`; `Err` where its source cannot be kept.
fn source_identity(
    source: &DataSourceExec,
    identity: &mut Identity,
) -> std::result::Result<(), String> {
    let any: &dyn DataSource = source.data_source().as_ref();
    if let Some(memory) = any.downcast_ref::<MemorySourceConfig>() {
        for partition in memory.partitions() {
            identity.key.data.push(partition.len());
            for batch in partition {
                identity.key.data.push(batch.num_rows());
                for c in batch.columns() {
                    identity.key.data.push(address(c));
                    identity.held.arrays.push(Arc::downgrade(c));
                }
            }
        }
        return Ok(());
    }
    if let Some(files) = any.downcast_ref::<FileScanConfig>() {
        // Parquet alone: how other formats read a file (a CSV quote, a JSON schema) is not all
        // in what the key can see. Parquet's options that change what a scan outputs change its
        // schema (`binary_as_string`, `schema_force_view_types`, `coerce_int96`), which the key
        // holds; the session's `datafusion.execution.parquet.*` are in the key too.
        let format = files.file_source().file_type();
        if !format.eq_ignore_ascii_case("parquet") {
            return Err(format!(
                "a {format} scan under the build side (only Parquet files are kept)"
            ));
        }
        let plan = &mut identity.key.plan;
        let _ = write!(plan, "\nfiles of {}:", files.object_store_url);
        for group in &files.file_groups {
            plan.push_str("\ngroup:");
            for file in group.files() {
                if !file.extensions.is_empty() {
                    // (What a table provider attached, such as a Parquet access plan.)
                    return Err("a file scan with extensions under the build side".into());
                }
                let meta = &file.object_meta;
                (identity.files).push((files.object_store_url.clone(), meta.clone()));
                let _ = write!(
                    plan,
                    " {} {} {} {:?} {:?} {:?} {:?};",
                    meta.location,
                    meta.size,
                    meta.last_modified,
                    meta.e_tag,
                    meta.version,
                    file.range,
                    file.partition_values
                );
            }
        }
        // (Its predicate is among the scan's expressions.)
        return Ok(());
    }
    Err("a data source other than an in-memory table or files under the build side".into())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{Array, Int64Array, RecordBatch};
    use datafusion::execution::memory_pool::{
        GreedyMemoryPool, MemoryConsumer, MemoryPool, MemoryReservation,
    };
    use datafusion::object_store::ObjectMeta;
    use datafusion::object_store::path::Path;

    use super::{BuildCache, CacheKey, CachedPartition, Held, Identity, same_file};

    #[test]
    fn an_entry_read_under_another_pool_moves_its_count_there_or_goes() {
        let column: Arc<dyn Array> = Arc::new(Int64Array::from_iter_values(0..1000));
        let batch = RecordBatch::try_from_iter([("k", Arc::clone(&column))]).unwrap();
        let identity = || Identity {
            key: CacheKey {
                plan: "the plan".into(),
                data: vec![],
            },
            // The table holds `column`, so the entry lives.
            held: Held {
                arrays: vec![Arc::downgrade(&column)],
                functions: vec![],
                aggregates: vec![],
            },
            files: vec![],
        };
        let part = CachedPartition {
            batches: vec![batch],
            ranges: vec![],
            rows: 1000,
            longest_key: 0,
        };
        let pool = |bytes: usize| -> Arc<dyn MemoryPool> { Arc::new(GreedyMemoryPool::new(bytes)) };
        let (first, second, tiny) = (pool(1 << 20), pool(1 << 20), pool(100));
        let reserve = |pool: &Arc<dyn MemoryPool>, bytes: usize| -> MemoryReservation {
            let r = MemoryConsumer::new("collected").register(pool);
            r.try_grow(bytes).unwrap();
            r
        };
        let cache = BuildCache::default();
        let kept = cache
            .put(identity(), vec![part], 1 << 20, &first, || {
                vec![reserve(&first, 8000)]
            })
            .unwrap();
        drop(kept);
        let bytes = cache.bytes();
        assert!(bytes >= 8000, "{bytes}");
        assert_eq!(first.reserved(), 8000);
        // Read in the same pool: nothing moves.
        let kept = cache.get(&identity().key, 1 << 20, &first).unwrap();
        drop(kept);
        assert_eq!((first.reserved(), second.reserved()), (8000, 0));
        // Read under another pool: counted there, no longer in the first once no query holds
        // the old count.
        let kept = cache.get(&identity().key, 1 << 20, &second).unwrap();
        assert_eq!(second.reserved(), bytes);
        assert_eq!(first.reserved(), 0);
        drop(kept);
        assert_eq!(second.reserved(), bytes);
        // Another build side stored in a third pool: both entries are counted there.
        let third = pool(1 << 20);
        let other = || Identity {
            key: CacheKey {
                plan: "another plan".into(),
                data: vec![],
            },
            ..identity()
        };
        let part = cache.get(&identity().key, 1 << 20, &second).unwrap().build[0].clone();
        cache
            .put(other(), vec![part], 1 << 20, &third, || {
                vec![reserve(&third, 8000)]
            })
            .unwrap();
        assert_eq!((cache.len(), second.reserved()), (2, 0));
        assert_eq!(third.reserved(), bytes + 8000);
        // A pool too small for them: the entries go, and their counts with them.
        assert!(cache.get(&identity().key, 1 << 20, &tiny).is_none());
        assert_eq!((cache.len(), cache.bytes()), (0, 0));
        assert_eq!((third.reserved(), tiny.reserved()), (0, 0));
    }

    fn meta(size: u64, millis: i64, e_tag: Option<&str>) -> ObjectMeta {
        ObjectMeta {
            location: Path::from("d.parquet"),
            last_modified: format!(
                "1970-01-01T00:00:{:02}.{:03}Z",
                millis / 1000,
                millis % 1000
            )
            .parse()
            .unwrap(),
            size,
            e_tag: e_tag.map(str::to_string),
            version: None,
        }
    }

    #[test]
    fn a_file_is_the_same_by_size_and_tag_or_by_size_and_second() {
        // Quoted in one answer, not in the other; whole seconds against milliseconds.
        assert!(same_file(
            &meta(10, 0, Some("\"a\"")),
            &meta(10, 5, Some("a"))
        ));
        assert!(same_file(&meta(10, 1000, None), &meta(10, 1250, None)));
        assert!(!same_file(&meta(10, 0, Some("a")), &meta(10, 0, Some("b"))));
        assert!(!same_file(&meta(11, 0, Some("a")), &meta(10, 0, Some("a"))));
        assert!(!same_file(
            &meta(10, 2000, None),
            &meta(10, 1000, Some("a"))
        ));
    }
}
