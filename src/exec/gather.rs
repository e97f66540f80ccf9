//! [`HostGather`]: output columns the device does not carry — strings, binary, views,
//! dictionaries, lists, structs, any variable-length or nested type — gathered on the host.
//! (A build side's view columns may instead travel through the device as their views,
//! [`BuildViews`]; this module plans that too and turns the device's views back into arrays.)
//!
//! The device carries positions instead of values: each build row's place among all build
//! rows (the staged `__row` column, moved through the transform like any payload) and each
//! probe row's place in its chunk. A partition's stream turns every output window into the
//! join's rows by taking those columns from the build side ([`HostBuild`]: the collected
//! batches' arrays, interleaved from, with no copy up front) and from its chunk's probe rows
//! ([`ProbeBatches`]: the partition's probe batches held until the chunks that cover them are
//! done, a chunk's rows concatenated at its first window that takes at least a quarter of them;
//! a sparser window, and values too large for one array, string offsets past 2^31, are
//! interleaved from the batches as they are). With `gpu_join.probe_columns` a join takes its
//! fixed-width probe columns this way too, where few probe rows match
//! ([`Carriage`]). A missing side (an outer
//! join's row without a match) has no position, so its columns come out null. This is the
//! unmaterialized (UM) way of the GFTR paper: the wide values never cross PCIe, only 4-byte
//! positions do.
//!
//! ```text
//!  device window: fixed-width columns │ __build_row_id │ __probe_row
//!                                     ▼                ▼
//!     interleave from the build batches       take from the chunk's probe rows
//!                                     ▼                ▼
//!  the join's rows, columns in output order
//! ```

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::{Arc, Mutex};

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, RecordBatch, RecordBatchOptions, UInt32Array,
};
use arrow::buffer::Buffer;
use arrow::compute::nullif;
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt32Type};
use datafusion::common::utils::memory::RecordBatchMemoryCounter;
use datafusion::common::{Result, internal_datafusion_err, internal_err};
use datafusion::execution::memory_pool::MemoryReservation;

use super::build_cache::Kept;
use super::carriage::Carriage;
use super::device_views::{BuildViews, VIEW_BYTES, carried_as_views};
use super::dictionary_gather::{
    compact_dictionary, concat_unmerged, gather_dictionary, gather_dictionary_values,
    interleave_keeping_dictionary, shared_dictionary,
};
use super::view_bytes;
use super::view_gather::{
    ViewBuffers, compact_if, compact_sparse, gather_views, held_bytes, new_bytes,
};
use crate::backend::NO_ROW;
use crate::columns::ColumnKind;
use crate::join::OutputColumn;

/// Where a column of the join's rows comes from.
#[derive(Debug, Clone, Copy)]
enum Source {
    /// Column `k` of the device's window.
    Device(usize),
    /// Column `k` of the held build batches.
    Build(usize),
    /// Column `k` of the held probe batches.
    Probe(usize),
    /// Column `k` of the device's window: the views of build view column `v`.
    Views(usize, usize),
}

/// How a join's rows are made from the device's windows.
#[derive(Debug)]
pub struct HostGather {
    sources: Vec<Source>,
    /// The window's column of build row positions, and of probe row positions.
    build_row: Option<usize>,
    probe_row: Option<usize>,
    /// Input columns held on the host, per side, in the order of the held batches' columns.
    pub build_columns: Vec<usize>,
    pub probe_columns: Vec<usize>,
    /// Build view columns whose views the device carries ([`BuildViews`]).
    pub build_views: Vec<usize>,
    schema: SchemaRef,
}

/// What the device outputs for a join whose rows are `columns` (`schema`), and how the host
/// completes them.
pub struct Gathering {
    pub columns: Vec<OutputColumn>,
    pub schema: SchemaRef,
    pub gather: Option<HostGather>,
}

impl HostGather {
    /// Plans the device's columns for rows `columns` of `schema`: every column the device can
    /// carry stays (but probe columns, where `carriage` takes them on the host), the others
    /// become positions; `build_row_column` is the staged build column that holds build row
    /// positions. Where `carriage` carries views, a build column of a view type stays on the
    /// device as its views.
    pub fn plan(
        columns: &[OutputColumn],
        schema: &SchemaRef,
        build_row_column: usize,
        carriage: Carriage,
    ) -> Gathering {
        let on_host = |i: usize| {
            ColumnKind::of(schema.field(i).data_type()).is_none()
                || (carriage.probe_on_host && matches!(columns[i], OutputColumn::Probe(_)))
        };
        let as_views = |i: usize, c: &OutputColumn| {
            carriage.views_on_device
                && matches!(c, OutputColumn::Build(_))
                && carried_as_views(schema.field(i).data_type())
        };
        if !columns.iter().enumerate().any(|(i, _)| on_host(i)) {
            return Gathering {
                columns: columns.to_vec(),
                schema: Arc::clone(schema),
                gather: None,
            };
        }
        let (mut device, mut fields, mut sources) = (vec![], vec![], vec![]);
        let (mut build_columns, mut probe_columns) = (vec![], vec![]);
        let mut build_views = vec![];
        let held = |held: &mut Vec<usize>, c: usize| match held.iter().position(|&h| h == c) {
            Some(k) => k,
            None => {
                held.push(c);
                held.len() - 1
            }
        };
        for (i, c) in columns.iter().enumerate() {
            sources.push(match *c {
                OutputColumn::Build(b) if as_views(i, c) => {
                    let field = schema.field(i);
                    device.push(*c);
                    fields.push(Field::new(
                        field.name(),
                        DataType::FixedSizeBinary(VIEW_BYTES),
                        field.is_nullable(),
                    ));
                    Source::Views(device.len() - 1, held(&mut build_views, b))
                }
                OutputColumn::Build(b) if on_host(i) => Source::Build(held(&mut build_columns, b)),
                OutputColumn::Probe(p) if on_host(i) => Source::Probe(held(&mut probe_columns, p)),
                c => {
                    device.push(c);
                    fields.push(schema.field(i).clone());
                    Source::Device(device.len() - 1)
                }
            });
        }
        let build_row = (!build_columns.is_empty()).then(|| {
            device.push(OutputColumn::Build(build_row_column));
            fields.push(Field::new("__build_row_id", DataType::UInt32, true));
            device.len() - 1
        });
        let probe_row = (!probe_columns.is_empty()).then(|| {
            match device.iter().position(|&c| c == OutputColumn::ProbeRow) {
                Some(at) => at,
                None => {
                    device.push(OutputColumn::ProbeRow);
                    fields.push(Field::new("__probe_row", DataType::UInt32, false));
                    device.len() - 1
                }
            }
        });
        Gathering {
            columns: device,
            schema: Arc::new(Schema::new(fields)),
            gather: Some(Self {
                sources,
                build_row,
                probe_row,
                build_columns,
                probe_columns,
                build_views,
                schema: Arc::clone(schema),
            }),
        }
    }

    /// The window columns that hold views the device carries: each with its build view column
    /// (an index of [`build_views`](Self::build_views)).
    pub fn device_views(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        self.sources.iter().filter_map(|s| match *s {
            Source::Views(k, v) => Some((k, v)),
            _ => None,
        })
    }

    /// Whether the device carries build row positions for the host's gathers.
    pub fn needs_build_positions(&self) -> bool {
        self.build_row.is_some()
    }

    /// The input columns gathered on the host, as EXPLAIN shows them: `build=[name@index, ..]`,
    /// `probe=[..]` (`left` and `right`: the inputs' schemas); empty where there are none.
    pub fn describe(&self, left: &SchemaRef, right: &SchemaRef) -> String {
        [
            named("build", &self.build_columns, left),
            named("probe", &self.probe_columns, right),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(", ")
    }

    /// The build columns whose views the device carries, as EXPLAIN shows them:
    /// `build=[name@index, ..]`; empty where there are none.
    pub fn describe_views(&self, left: &SchemaRef) -> String {
        named("build", &self.build_views, left).unwrap_or_default()
    }

    /// The schema of the rows it makes.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The join's rows of `window`, a slice of a device window of `window_rows` rows made from
    /// a chunk holding probe rows `chunk` of the partition (both ignored for windows of build
    /// rows alone). `values`: per window column of views whose values the device gathered,
    /// the window's buffer of them ([`view_bytes`]).
    pub fn apply(
        &self,
        window: &RecordBatch,
        values: &[(usize, Buffer)],
        build: &HostBuild,
        probe: &mut ProbeBatches,
        chunk: Range<u64>,
        window_rows: usize,
    ) -> Result<RecordBatch> {
        let rows = window.num_rows();
        let position_column = |column: Option<usize>| -> Result<_> {
            let Some(c) = column else {
                return internal_err!("a gathered column without positions");
            };
            Ok(window.column(c).as_primitive::<UInt32Type>().clone())
        };
        let build_ids = match self.build_row {
            Some(_) => Some(position_column(self.build_row)?),
            None => None,
        };
        let probe_rows = match self.probe_row {
            Some(_) => Some(position_column(self.probe_row)?),
            None => None,
        };
        // The probe columns, taken together (their rows found once).
        let probe_columns: Vec<(usize, &DataType)> = (self.sources.iter().enumerate())
            .filter_map(|(i, source)| match *source {
                Source::Probe(k) => Some((k, self.schema.field(i).data_type())),
                _ => None,
            })
            .collect();
        let mut probe_values = match (&probe_rows, probe_columns.is_empty()) {
            (_, true) => vec![],
            (Some(r), false) => probe.take(&probe_columns, r, chunk, window_rows)?,
            (None, false) => return internal_err!("a gathered column without positions"),
        }
        .into_iter();
        let columns = self
            .sources
            .iter()
            .enumerate()
            .map(|(i, source)| {
                let dt = self.schema.field(i).data_type();
                match (*source, &build_ids) {
                    (Source::Device(k), _) => Ok(Arc::clone(window.column(k))),
                    (Source::Views(k, v), _) => match values.iter().find(|(c, _)| *c == k) {
                        Some((_, bytes)) => {
                            let listed = build.view_buffers(v)?;
                            view_bytes::output(window.column(k), bytes, listed, dt)
                        }
                        None => build.views(v, window.column(k), dt),
                    },
                    (Source::Build(k), Some(ids)) => build.take(k, ids, dt),
                    (Source::Probe(_), _) => probe_values
                        .next()
                        .ok_or_else(|| internal_datafusion_err!("a probe column not taken")),
                    _ => internal_err!("a gathered column without positions"),
                }
            })
            .collect::<Result<Vec<_>>>()?;
        let options = RecordBatchOptions::new().with_row_count(Some(rows));
        Ok(RecordBatch::try_new_with_options(
            Arc::clone(&self.schema),
            columns,
            &options,
        )?)
    }
}

/// `side=[name@index, ..]` for `columns` of `schema`, `None` for no columns.
fn named(side: &str, columns: &[usize], schema: &SchemaRef) -> Option<String> {
    let names: Vec<String> = columns
        .iter()
        .map(|&c| format!("{}@{c}", schema.field(c).name()))
        .collect();
    (!names.is_empty()).then(|| format!("{side}=[{}]", names.join(", ")))
}

/// Data buffers a view array carries at most with no further thought.
const MAX_VIEW_BUFFERS: usize = 16;

/// Data buffers an output batch of `batch_size` rows may carry: twice its rows (and at least
/// [`MAX_VIEW_BUFFERS`]). A build column's buffers are listed in every output array up to this
/// bound ([`HostBuild`]); a concatenated probe chunk above it is compacted ([`compact_views`]).
pub fn view_buffer_bound(batch_size: usize) -> usize {
    MAX_VIEW_BUFFERS.max(batch_size * 2)
}

/// A concatenated view array whose data buffers (every input batch's: concatenating views
/// keeps them all) outnumber twice the output batch size `batch_size`, with its values copied
/// into a few buffers; other arrays as they are. Every `take` from a view array clones its
/// buffer list (24 bytes a buffer), so thousands of tiny input batches made each output batch
/// of a few rows carry thousands of buffers (a test with 7-row batches ran out of 24 GB).
/// Below that bound the list costs at most ~48 bytes an output row, less than compacting: a
/// pass over every view of the build side, on its critical path (+0.4 s at 2^24 rows).
fn compact_views(array: ArrayRef, batch_size: usize) -> ArrayRef {
    compact_if(array, |buffers, _| {
        buffers.len() > view_buffer_bound(batch_size)
    })
}

/// What some held arrays are known to share, found once for a side's columns rather than for
/// every window gathered from them.
#[derive(Debug, Default, Clone, Copy)]
struct Shared<'a> {
    /// Their view buffers, listed once.
    views: Option<&'a ViewBuffers>,
    /// Whether they share one dictionary: `Some(Some(values))` they do, `Some(None)` they do
    /// not, `None` not known (then the arrays a window uses are checked).
    dictionary: Option<Option<&'a ArrayRef>>,
}

/// Where each row's value lies among some held arrays — (array, row), `(0, 0)` for none — and
/// which rows have none.
struct Positions {
    at: Vec<(usize, usize)>,
    missing: Option<BooleanArray>,
}

/// The values at `at` of the `count` arrays `array(i)` (null where a row has none).
///
/// Where the rows are fewer than the arrays, only the arrays they use are gathered from (and
/// whether those share a dictionary is checked unless the whole side's are known to): a
/// window of a few rows from a side held as thousands of small batches touches a few of them,
/// and gathering over all of them (as `interleave` and the dictionary check do) cost time in
/// their number for every window (the differential test's seed 5001201, a semi join over
/// 7-row batches with a residual filter, took over 100 s against DataFusion's 0.2 s).
fn take<'a>(
    count: usize,
    array: impl Fn(usize) -> Option<&'a ArrayRef>,
    at: &Positions,
    dt: &DataType,
    rows: usize,
    shared: Shared<'_>,
) -> Result<ArrayRef> {
    if rows == 0 {
        return Ok(arrow::array::new_empty_array(dt));
    }
    if count == 0 || at.missing.as_ref().is_some_and(|m| m.true_count() == rows) {
        return Ok(arrow::array::new_null_array(dt, rows));
    }
    // Where the rows are fewer than the arrays: the arrays they use, ascending, the rows'
    // places among them, and no listed view buffers (the output would hold them all, and its
    // rows use at most one each) nor a dictionary known not shared by all the arrays.
    let (used, renumbered, shared) = if count > at.at.len() {
        let mut used: Vec<usize> = at.at.iter().map(|&(a, _)| a).collect();
        used.sort_unstable();
        used.dedup();
        let renumbered: Vec<(usize, usize)> = (at.at.iter())
            .map(|&(a, r)| (used.binary_search(&a).unwrap_or_default(), r))
            .collect();
        let shared = Shared {
            views: None,
            dictionary: shared.dictionary.filter(|d| d.is_some()),
        };
        (used, Some(renumbered), shared)
    } else {
        ((0..count).collect(), None, shared)
    };
    let arrays = (used.iter()).map(|&a| array(a).map(|x| x.as_ref() as &dyn Array));
    let Some(arrays) = arrays.collect::<Option<Vec<_>>>() else {
        return internal_err!("a gathered row's batch is not held");
    };
    let taken = gather(&arrays, renumbered.as_deref().unwrap_or(&at.at), dt, shared)?;
    Ok(compact_sparse(match &at.missing {
        Some(missing) => nullif(taken.as_ref(), missing)?,
        None => taken,
    }))
}

/// The rows `at` ((array, row) pairs) of `arrays`, all of type `dt`.
fn gather(
    arrays: &[&dyn Array],
    at: &[(usize, usize)],
    dt: &DataType,
    shared: Shared<'_>,
) -> Result<ArrayRef> {
    if let Some(views) = gather_views(arrays, at, dt, shared.views) {
        return views;
    }
    match shared.dictionary {
        Some(Some(values)) => gather_dictionary(arrays, at, values),
        Some(None) => gather_dictionary_values(arrays, at),
        None => interleave_keeping_dictionary(arrays, at),
    }
}

/// Positions of `rows` rows, `ids` giving each one's place in a sequence held in `pieces`
/// (`piece(p)`: piece `p`'s first row's place and its rows, ascending), `None` for a row that
/// has no place.
/// `guess(id, last)` names a piece at or before the one holding `id` (`last`: the piece of the
/// row before), from which the search goes forward.
fn positions(
    rows: usize,
    ids: impl Iterator<Item = Option<u64>>,
    piece: impl Fn(usize) -> Option<(u64, usize)>,
    mut guess: impl FnMut(u64, usize) -> usize,
) -> Result<Positions> {
    let mut at = Vec::with_capacity(rows);
    let mut missing = vec![];
    let mut last = 0;
    for (i, id) in ids.enumerate() {
        let Some(id) = id else {
            if missing.is_empty() {
                missing = vec![false; rows];
            }
            missing[i] = true;
            at.push((0, 0));
            continue;
        };
        let mut p = guess(id, last);
        while piece(p).is_some_and(|(start, len)| start + len as u64 <= id) {
            p += 1;
        }
        match piece(p) {
            Some((start, _)) if start <= id => at.push((p, (id - start) as usize)),
            _ => return internal_err!("row {id} of a gathered side is not held"),
        }
        last = p;
    }
    Ok(Positions {
        at,
        missing: (!missing.is_empty()).then(|| BooleanArray::from(missing)),
    })
}

/// The build side's columns that the host gathers, held for one execution as the collected
/// batches' own arrays, in collection order (the order the `__row` positions count in), and
/// gathered across them with `interleave`. No value is copied row by row up front:
/// concatenating (and, for views, compacting) every build value was a single-threaded pass on
/// the build side's critical path, seconds for tens of millions of strings. A view column's
/// data buffers are listed once ([`ViewBuffers`]); an output array copies the values it uses
/// out of them where it uses few of their bytes ([`compact_sparse`]), in the output partition
/// that makes it.
#[derive(Debug, Default)]
pub struct HostBuild {
    /// Per column, the batches' arrays.
    columns: Vec<HeldColumn>,
    /// Per view column the device carries ([`HostGather::build_views`]), its data buffers,
    /// and the input column it is.
    views: Vec<(usize, BuildViews)>,
    /// The position of each batch's first row, and its rows.
    pieces: Vec<(u64, usize)>,
    /// `index[i]`: the piece holding row `i << shift`, where the search for a row starts (rows
    /// arrive in no order; the pieces' average length is at least `1 << shift`, so the index
    /// has about one entry a piece).
    index: Vec<u32>,
    shift: u32,
    /// Their memory, in DataFusion's pool (`None` until made, and for a build side that
    /// gathers nothing).
    held: Option<Held>,
}

/// Where the memory of the batches a [`HostBuild`] holds arrays of is counted already.
#[derive(Debug, Clone, Copy)]
pub enum Counted<'a> {
    /// In the collected build partitions' reservations, in order.
    Collected(&'a [&'a MemoryReservation]),
    /// In the build cache's entry, which keeps the batches (`gpu_join.cache_bytes`): arrays of
    /// those batches are counted there, for as long as this holds the entry's reservations,
    /// and only buffers they do not hold (a copy made of them) are reserved.
    Kept(&'a Kept),
}

/// How [`HostBuild::new`] reserves what it holds: the bytes of a column's arrays and of a view
/// column's buffers, and the reservation of bytes.
struct Sizes<'a> {
    arrays: &'a dyn Fn(&[ArrayRef]) -> usize,
    views: &'a dyn Fn(&BuildViews) -> usize,
    reserve: &'a dyn Fn(usize) -> Result<()>,
}

/// A [`HostBuild`]'s memory in the pool.
#[derive(Debug)]
struct Held {
    /// What it reserved itself: bytes nothing else counts.
    _reservation: MemoryReservation,
    /// The bytes it took over from collected build partitions' reservations, each split off
    /// the one at that index (moving bytes between reservations, the pool's count unchanged).
    moved: Mutex<Vec<(usize, MemoryReservation)>>,
    /// Where the cache keeps the batches, its entry's reservations, which count the arrays
    /// held here for as long as this holds them (the entry may go first).
    _kept: Option<Arc<Vec<MemoryReservation>>>,
}

impl Held {
    /// Moves the bytes taken over back to `held` (the reservations they came from), once.
    fn give_back(&self, held: &[&MemoryReservation]) {
        let moved = std::mem::take(&mut *self.moved.lock().unwrap_or_else(|e| e.into_inner()));
        for (at, part) in moved {
            if let Some(h) = held.get(at) {
                h.grow(part.size());
            }
            // Dropping the part gives its bytes to the pool, which `grow` took again.
        }
    }
}

impl HostBuild {
    /// Columns `columns` of `batches`, in order, and the data buffers of view columns
    /// `view_columns` (whose views the device carries), reserved in `reservation`, for output
    /// batches of `batch_size` rows. The batches' memory is counted already ([`Counted`]):
    /// where in the collected build partitions' reservations, which the join lets go of once
    /// the build side is staged, the bytes this holds move from them into `reservation` as far
    /// as they have them ([`give_back`](Self::give_back) returns them where the join does not
    /// start); where in the build cache's entry, which keeps the batches, nothing is reserved
    /// again. The pool counts them once.
    pub fn new<'a>(
        batches: impl Iterator<Item = &'a RecordBatch>,
        columns: &[usize],
        view_columns: &[usize],
        reservation: MemoryReservation,
        counted: Counted<'_>,
        batch_size: usize,
    ) -> Result<Self> {
        let held = match counted {
            Counted::Collected(held) => held,
            Counted::Kept(_) => &[],
        };
        let moved = Mutex::new(vec![]);
        let reserve = |bytes: usize| -> Result<()> {
            let mut left = bytes;
            let mut parts = moved.lock().unwrap_or_else(|e| e.into_inner());
            for (at, h) in held.iter().enumerate() {
                // Only this build changes the collected reservations now.
                let take = left.min(h.size());
                if take > 0 {
                    parts.push((at, h.split(take)));
                    left -= take;
                }
            }
            reservation.try_grow(left)
        };
        // The bytes to reserve for a held column's arrays, and for a view column's buffers:
        // where the cache keeps the batches, only buffers its batches do not hold.
        let kept = match counted {
            Counted::Kept(kept) => {
                let mut counter = RecordBatchMemoryCounter::new();
                for batch in kept.build.iter().flat_map(|p| &p.batches) {
                    counter.count_batch(batch);
                }
                Some(std::cell::RefCell::new(counter))
            }
            Counted::Collected(_) => None,
        };
        let arrays_bytes = |arrays: &[ArrayRef]| match &kept {
            Some(counter) => new_bytes(&mut counter.borrow_mut(), arrays),
            None => held_bytes(arrays),
        };
        let views_bytes = |views: &BuildViews| match &kept {
            Some(_) => 0,
            None => views.held_bytes(),
        };
        let sizes = Sizes {
            arrays: &arrays_bytes,
            views: &views_bytes,
            reserve: &reserve,
        };
        let built = Self::hold(batches, columns, view_columns, &sizes, batch_size);
        let reservation = Held {
            _reservation: reservation,
            moved,
            _kept: match counted {
                Counted::Kept(kept) => Some(Arc::clone(&kept.reservations)),
                Counted::Collected(_) => None,
            },
        };
        match built {
            Ok(mut build) => {
                build.held = Some(reservation);
                Ok(build)
            }
            Err(e) => {
                reservation.give_back(held);
                Err(e)
            }
        }
    }

    /// Returns the bytes [`new`](Self::new) moved from `held` (the same reservations, in the
    /// same order) to them: the join did not start, and the collected batches are held on.
    pub fn give_back(&self, held: &[&MemoryReservation]) {
        if let Some(r) = &self.held {
            r.give_back(held);
        }
    }

    /// [`new`](Self::new)'s columns and view buffers, each reserved as `sizes` says.
    fn hold<'a>(
        batches: impl Iterator<Item = &'a RecordBatch>,
        columns: &[usize],
        view_columns: &[usize],
        sizes: &Sizes<'_>,
        batch_size: usize,
    ) -> Result<Self> {
        let batches: Vec<&RecordBatch> = batches.filter(|b| b.num_rows() > 0).collect();
        let mut at = 0u64;
        let pieces: Vec<(u64, usize)> = batches
            .iter()
            .map(|b| {
                at += b.num_rows() as u64;
                (at - b.num_rows() as u64, b.num_rows())
            })
            .collect();
        let arrays_of = |c: usize| -> Vec<ArrayRef> {
            batches.iter().map(|b| Arc::clone(b.column(c))).collect()
        };
        let columns = columns
            .iter()
            .map(|&c| {
                let arrays = arrays_of(c);
                (sizes.reserve)((sizes.arrays)(&arrays))?;
                let views = ViewBuffers::listed(&arrays)
                    .filter(|l| l.buffers() <= view_buffer_bound(batch_size));
                let each: Vec<&dyn Array> = arrays.iter().map(|a| a.as_ref()).collect();
                let dictionary = shared_dictionary(&each);
                Ok(HeldColumn {
                    arrays,
                    views,
                    dictionary,
                })
            })
            .collect::<Result<_>>()?;
        let views = view_columns
            .iter()
            .map(|&c| {
                let views = BuildViews::new(&arrays_of(c), view_buffer_bound(batch_size))?;
                (sizes.reserve)((sizes.views)(&views))?;
                Ok((c, views))
            })
            .collect::<Result<_>>()?;
        let (index, shift) = Self::index(&pieces, at);
        Ok(Self {
            columns,
            views,
            pieces,
            index,
            shift,
            held: None,
        })
    }

    /// The view columns the device carries, in [`HostGather::build_views`]' order: each input
    /// column with its data buffers.
    pub fn view_columns(&self) -> &[(usize, BuildViews)] {
        &self.views
    }

    /// Input column `c` of a build batch whose first row is build row `first_row`, as the
    /// device carries it: `None` unless it is a view column the device carries, else its views
    /// ([`BuildViews::stage`]).
    pub fn staged_views(
        &self,
        c: usize,
        array: &ArrayRef,
        first_row: usize,
    ) -> Option<Result<ArrayRef>> {
        let (_, views) = self.views.iter().find(|(v, _)| *v == c)?;
        Some(views.stage(array, first_row))
    }

    /// The data buffers of view column `v` (of [`HostGather::build_views`]) that its staged
    /// views name.
    fn view_buffers(&self, v: usize) -> Result<&[Buffer]> {
        match self.views.get(v) {
            Some((_, views)) => Ok(views.buffers()),
            None => internal_err!("no device view column {v}"),
        }
    }

    /// The output array of type `dt` of view column `v` (of [`HostGather::build_views`]) whose
    /// views the device gathered into `column`.
    fn views(&self, v: usize, column: &ArrayRef, dt: &DataType) -> Result<ArrayRef> {
        let Some((_, views)) = self.views.get(v) else {
            return internal_err!("no device view column {v}");
        };
        views.output(column, dt)
    }

    /// The index of `pieces` (of `rows` rows in all) and its shift.
    fn index(pieces: &[(u64, usize)], rows: u64) -> (Vec<u32>, u32) {
        let average = rows / (pieces.len() as u64).max(1);
        let shift = average.max(1).ilog2();
        let mut index = Vec::with_capacity((rows >> shift) as usize + 1);
        let mut p = 0;
        for block in 0..=(rows >> shift) {
            let row = block << shift;
            while pieces
                .get(p)
                .is_some_and(|&(start, len)| start + len as u64 <= row)
            {
                p += 1;
            }
            index.push(p as u32);
        }
        (index, shift)
    }

    /// Column `k`'s values at build positions `ids` (null where an id is null).
    fn take(&self, k: usize, ids: &UInt32Array, dt: &DataType) -> Result<ArrayRef> {
        let Some(column) = self.columns.get(k) else {
            return internal_err!("no gathered build column {k}");
        };
        let ids_at = ids.iter().map(|id| id.map(u64::from));
        let guess = |id: u64, _| {
            let block = (id >> self.shift) as usize;
            self.index
                .get(block)
                .map_or(self.pieces.len(), |&p| p as usize)
        };
        let piece = |p: usize| self.pieces.get(p).copied();
        let at = positions(ids.len(), ids_at, piece, guess)?;
        let shared = Shared {
            views: column.views.as_ref(),
            dictionary: Some(column.dictionary.as_ref()),
        };
        let arrays = &column.arrays;
        take(arrays.len(), |a| arrays.get(a), &at, dt, ids.len(), shared)
    }
}

/// A build column held as its batches' arrays.
#[derive(Debug)]
struct HeldColumn {
    arrays: Vec<ArrayRef>,
    /// Their view buffers, where they are listed in every output array.
    views: Option<ViewBuffers>,
    /// The dictionary they all share, if they are dictionary arrays that do.
    dictionary: Option<ArrayRef>,
}

/// A probe batch's gathered columns, held.
#[derive(Debug)]
struct HeldBatch {
    /// The place of its first row among the partition's probe rows.
    start: u64,
    batch: RecordBatch,
    /// The bytes reserved for it in the memory pool (0 where the pool refused them).
    reserved: usize,
}

/// A partition's probe batches (their gathered columns), held from their arrival until every
/// chunk holding their rows is done.
#[derive(Debug)]
pub struct ProbeBatches {
    batches: VecDeque<HeldBatch>,
    /// The rows of one chunk, each column in one array (made at the chunk's first window that
    /// takes at least a quarter of them), so that a probe row's place in its chunk indexes them
    /// directly.
    /// `None` where the values do not fit one array (string offsets past 2^31): then they are
    /// gathered across the held batches.
    chunk: Option<(Range<u64>, Option<Vec<ArrayRef>>)>,
    /// Probe rows that have arrived.
    rows: u64,
    /// Rows of an output batch.
    batch_size: usize,
    /// Most rows of a window (an output pass).
    pass_rows: usize,
}

impl ProbeBatches {
    /// No batch yet, for output batches of `batch_size` rows from windows of at most
    /// `pass_rows` rows.
    pub fn new(batch_size: usize, pass_rows: usize) -> Self {
        Self {
            batches: VecDeque::new(),
            chunk: None,
            rows: 0,
            batch_size,
            pass_rows,
        }
    }

    /// Holds columns `columns` of the next probe batch, after asking `reserve` to reserve the
    /// bytes they hold; returns whether it did.
    pub fn push(
        &mut self,
        batch: &RecordBatch,
        columns: &[usize],
        reserve: impl FnOnce(usize) -> bool,
    ) -> Result<bool> {
        let held = batch.project(columns)?;
        let bytes = held.get_array_memory_size();
        let reserved = reserve(bytes);
        self.batches.push_back(HeldBatch {
            start: self.rows,
            batch: held,
            reserved: if reserved { bytes } else { 0 },
        });
        self.rows += batch.num_rows() as u64;
        Ok(reserved)
    }

    /// Drops the batches whose rows all lie before row `first` (the first row of the oldest
    /// chunk not done); returns the bytes reserved for them.
    pub fn release(&mut self, first: u64) -> usize {
        let mut bytes = 0;
        while let Some(h) = self.batches.front() {
            if h.start + h.batch.num_rows() as u64 > first {
                break;
            }
            bytes += h.reserved;
            self.batches.pop_front();
        }
        // A chunk's rows concatenated go with its batches.
        if self.chunk.as_ref().is_some_and(|(r, _)| r.end <= first) {
            self.chunk = None;
        }
        bytes
    }

    /// Columns `columns` (held column, type)'s values at `rows`, places in the chunk of probe
    /// rows `chunk` (null at `NO_ROW`), for a window of `window_rows` rows. A window that
    /// takes at least a quarter as many rows as its chunk holds (or as a whole pass holds, where
    /// passes are smaller than chunks) has them from the chunk's rows concatenated once (a
    /// copy of each column, made at the chunk's first such window); a sparser one (a join that
    /// matches few probe rows) takes them from the held batches as they are, copying only the
    /// values it outputs.
    fn take(
        &mut self,
        columns: &[(usize, &DataType)],
        rows: &UInt32Array,
        chunk: Range<u64>,
        window_rows: usize,
    ) -> Result<Vec<ArrayRef>> {
        let valid: Vec<Option<u32>> = rows
            .values()
            .iter()
            .map(|&r| (r != NO_ROW).then_some(r))
            .collect();
        if valid.iter().all(Option::is_none) {
            return Ok(columns
                .iter()
                .map(|(_, dt)| arrow::array::new_null_array(dt, rows.len()))
                .collect());
        }
        let held = (chunk.end - chunk.start).min(self.pass_rows as u64);
        let dense = window_rows.saturating_mul(4) as u64 >= held;
        if self.chunk.as_ref().is_some_and(|(r, _)| *r != chunk) {
            // Another chunk's rows: not to be kept past their own windows.
            self.chunk = None;
        }
        if dense && self.chunk.is_none() {
            self.chunk = Some((chunk.clone(), self.join(&chunk).ok()));
        }
        let Some((_, Some(concatenated))) = &self.chunk else {
            let ids = valid.iter().map(|r| r.map(|r| chunk.start + u64::from(r)));
            let batches = &self.batches;
            let piece = |p: usize| batches.get(p).map(|h| (h.start, h.batch.num_rows()));
            // Ids usually ascend (a window's probe rows): start at the piece of the last id,
            // else search.
            let holds = |p: usize, id: u64| {
                piece(p).is_some_and(|(start, len)| start <= id && id - start < len as u64)
            };
            let guess = |id: u64, last: usize| match (holds(last, id), holds(last + 1, id)) {
                (true, _) => last,
                (_, true) => last + 1,
                _ => batches.partition_point(|h| h.start <= id).saturating_sub(1),
            };
            let at = positions(rows.len(), ids, piece, guess)?;
            return columns
                .iter()
                .map(|&(k, dt)| {
                    let array = |a: usize| batches.get(a).map(|h| h.batch.column(k));
                    take(batches.len(), array, &at, dt, rows.len(), Shared::default())
                })
                .collect();
        };
        let at = UInt32Array::from(valid);
        columns
            .iter()
            .map(|&(k, _)| {
                let Some(column) = concatenated.get(k) else {
                    return internal_err!("no gathered probe column {k}");
                };
                if at.iter().flatten().any(|r| r as usize >= column.len()) {
                    return internal_err!("a probe row past its chunk");
                }
                compact_dictionary(compact_sparse(arrow::compute::take(
                    column.as_ref(),
                    &at,
                    None,
                )?))
            })
            .collect()
    }

    /// The held rows `chunk`, each column in one array.
    fn join(&self, chunk: &Range<u64>) -> Result<Vec<ArrayRef>> {
        let parts: Vec<RecordBatch> = self
            .batches
            .iter()
            .filter(|h| h.start < chunk.end && h.start + h.batch.num_rows() as u64 > chunk.start)
            .map(|h| {
                let from = chunk.start.saturating_sub(h.start) as usize;
                let to = ((chunk.end - h.start) as usize).min(h.batch.num_rows());
                h.batch.slice(from, to - from)
            })
            .collect();
        let held: u64 = parts.iter().map(|b| b.num_rows() as u64).sum();
        if held != chunk.end - chunk.start {
            return internal_err!("probe rows {chunk:?} are not all held");
        }
        let Some(first) = parts.first() else {
            return Ok(vec![]);
        };
        (0..first.num_columns())
            .map(|k| {
                let arrays: Vec<&dyn Array> = parts.iter().map(|b| b.column(k).as_ref()).collect();
                Ok(compact_views(concat_unmerged(&arrays)?, self.batch_size))
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::StringViewArray;

    /// Build views gathered on the host, probe columns staged.
    const HOST_VIEWS: Carriage = Carriage {
        views_on_device: false,
        probe_on_host: false,
    };

    fn strings(values: &[Option<&str>]) -> RecordBatch {
        let a: ArrayRef = Arc::new(StringViewArray::from(values.to_vec()));
        RecordBatch::try_from_iter([("s", a)]).unwrap()
    }

    /// The host build of `columns` and view columns `views` of `batches`, in an unbounded pool.
    fn unbounded<'a>(
        batches: impl Iterator<Item = &'a RecordBatch>,
        columns: &[usize],
        views: &[usize],
        batch_size: usize,
    ) -> HostBuild {
        let counted = Counted::Collected(&[]);
        HostBuild::new(batches, columns, views, reservation(), counted, batch_size).unwrap()
    }

    /// The host build of `batch`'s column 0, reserved in a new consumer of `pool`.
    fn hold_column(
        batch: &RecordBatch,
        pool: &Arc<dyn datafusion::execution::memory_pool::MemoryPool>,
        counted: Counted<'_>,
    ) -> Result<HostBuild> {
        use datafusion::execution::memory_pool::MemoryConsumer;
        let gathered = MemoryConsumer::new("gathered").register(pool);
        HostBuild::new([batch].into_iter(), &[0], &[], gathered, counted, 8192)
    }

    #[test]
    fn gathered_build_columns_take_their_bytes_over_from_the_collected_batches() {
        use datafusion::execution::memory_pool::{GreedyMemoryPool, MemoryConsumer, MemoryPool};
        let batch = strings(&[Some("a string longer than twelve bytes"), None, Some("ab")]);
        let bytes = batch.get_array_memory_size();
        // The pool holds the collected batch and hardly more.
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(bytes + 64));
        let collected = MemoryConsumer::new("collected").register(&pool);
        collected.try_grow(bytes).unwrap();
        let build = hold_column(&batch, &pool, Counted::Collected(&[&collected])).unwrap();
        // Counted once: what the build holds moved over from the batch's reservation.
        assert_eq!(pool.reserved(), bytes);
        assert!(collected.size() < bytes);
        // The join did not start: the bytes go back, once.
        build.give_back(&[&collected]);
        build.give_back(&[&collected]);
        assert_eq!((collected.size(), pool.reserved()), (bytes, bytes));
        drop(build);
        assert_eq!(pool.reserved(), bytes);
        // Taken from several reservations in turn, given back to each.
        collected.free();
        let (a, b) = (
            MemoryConsumer::new("a").register(&pool),
            MemoryConsumer::new("b").register(&pool),
        );
        a.try_grow(bytes / 2).unwrap();
        b.try_grow(bytes - bytes / 2).unwrap();
        let build = hold_column(&batch, &pool, Counted::Collected(&[&a, &b])).unwrap();
        assert_eq!(pool.reserved(), bytes);
        build.give_back(&[&a, &b]);
        assert_eq!((a.size(), b.size()), (bytes / 2, bytes - bytes / 2));
        drop(build);
        assert_eq!(pool.reserved(), bytes);
        // Without reservations to take from, the build reserves its own: the pool refuses it.
        assert!(hold_column(&batch, &pool, Counted::Collected(&[])).is_err());
        assert_eq!(pool.reserved(), bytes);
    }

    #[test]
    fn a_build_side_the_cache_keeps_is_counted_by_its_entry_as_long_as_it_is_held() {
        use super::super::build_cache::CachedPartition;
        use datafusion::execution::memory_pool::{GreedyMemoryPool, MemoryConsumer, MemoryPool};
        let batch = strings(&[Some("a string longer than twelve bytes"), None, Some("ab")]);
        let bytes = batch.get_array_memory_size();
        let pool: Arc<dyn MemoryPool> = Arc::new(GreedyMemoryPool::new(bytes + 64));
        // An entry keeping `batch`, its bytes reserved.
        let kept = || {
            let entry = MemoryConsumer::new("cache entry").register(&pool);
            entry.try_grow(bytes).unwrap();
            Kept {
                build: Arc::new(vec![CachedPartition {
                    batches: vec![batch.clone()],
                    ranges: vec![],
                    rows: 3,
                    longest_key: 0,
                }]),
                reservations: Arc::new(vec![entry]),
            }
        };
        let kept_once = kept();
        // The kept batch's arrays: nothing more to reserve.
        let build = hold_column(&batch, &pool, Counted::Kept(&kept_once)).unwrap();
        assert_eq!(pool.reserved(), bytes);
        // The entry goes (evicted): its bytes stay counted while the build holds its arrays.
        let reservations = Arc::downgrade(&kept_once.reservations);
        drop(kept_once);
        assert_eq!(pool.reserved(), bytes);
        drop(build);
        assert!(reservations.upgrade().is_none());
        assert_eq!(pool.reserved(), 0);
        // A copy of the kept batch (a null-aware join's split, say) is not the entry's: it is
        // reserved, and here refused.
        let kept = kept();
        let copy = strings(&[Some("a string longer than twelve bytes"), None, Some("ab")]);
        assert!(hold_column(&copy, &pool, Counted::Kept(&kept)).is_err());
        assert_eq!(pool.reserved(), bytes);
    }

    #[test]
    fn plans_positions_for_columns_the_device_does_not_carry() {
        let schema = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int32, true),
            Field::new("s", DataType::Utf8View, true),
            Field::new("t", DataType::Utf8View, true),
        ]));
        let columns = [
            OutputColumn::Build(0),
            OutputColumn::Build(1),
            OutputColumn::Probe(2),
        ];
        let g = HostGather::plan(&columns, &schema, 7, HOST_VIEWS);
        assert_eq!(
            g.columns,
            vec![
                OutputColumn::Build(0),
                OutputColumn::Build(7),
                OutputColumn::ProbeRow
            ]
        );
        let gather = g.gather.unwrap();
        assert_eq!(
            (gather.build_columns, gather.probe_columns),
            (vec![1], vec![2])
        );
        // The build side's view column carried by the device as its views: no build row
        // positions then, the probe side's still gathered.
        let g = HostGather::plan(&columns, &schema, 7, Carriage::DEVICE);
        assert_eq!(
            g.columns,
            vec![
                OutputColumn::Build(0),
                OutputColumn::Build(1),
                OutputColumn::ProbeRow
            ]
        );
        assert_eq!(
            g.schema.field(1).data_type(),
            &DataType::FixedSizeBinary(VIEW_BYTES)
        );
        let gather = g.gather.unwrap();
        assert!(!gather.needs_build_positions());
        assert_eq!(
            (
                gather.build_columns,
                gather.probe_columns,
                gather.build_views
            ),
            (vec![], vec![2], vec![1])
        );
        // Nothing to gather: the columns stay as they are.
        let fixed = Arc::new(Schema::new(vec![
            Field::new("a", DataType::Int32, true),
            Field::new("b", DataType::Int64, true),
        ]));
        let both = [OutputColumn::Build(0), OutputColumn::Probe(3)];
        assert!(
            HostGather::plan(&both, &fixed, 7, Carriage::DEVICE)
                .gather
                .is_none()
        );
        // Probe columns taken on the host: a fixed-width one too, the build's stays.
        let probe_on_host = Carriage {
            probe_on_host: true,
            ..Carriage::DEVICE
        };
        let g = HostGather::plan(&both, &fixed, 7, probe_on_host);
        assert_eq!(
            g.columns,
            vec![OutputColumn::Build(0), OutputColumn::ProbeRow]
        );
        let gather = g.gather.unwrap();
        assert_eq!(
            (gather.build_columns, gather.probe_columns),
            (vec![], vec![3])
        );
    }

    #[test]
    fn build_views_staged_and_gathered_by_the_device_become_the_build_rows_values() {
        let long = "a string longer than twelve bytes";
        let build_batches = [
            strings(&[Some("x"), None]),
            strings(&[Some(long), Some("")]),
        ];
        let build = unbounded(build_batches.iter(), &[], &[0], 8192);
        // Staged as the device carries them, then gathered as a left join's device would
        // (build rows 2, none, 0, 1, 3).
        let side = super::super::side::SideColumns::new(&build_batches[0].schema(), None, false);
        assert!(side.staged(&build_batches[0], &[0], 0, None).is_err());
        let staged: Vec<Vec<u8>> = build_batches
            .iter()
            .zip([0, 2])
            .flat_map(|(b, first)| {
                let Ok(columns) = side.staged(b, &[0], first, Some(&build)) else {
                    panic!("staged");
                };
                let super::super::stager::StageColumn::Array(a) = &columns[0] else {
                    panic!("views staged as an array");
                };
                let f = a.as_fixed_size_binary();
                (0..f.len())
                    .map(|i| f.value(i).to_vec())
                    .collect::<Vec<_>>()
            })
            .collect();
        let at = [Some(2), None, Some(0), Some(1), Some(3)];
        let bytes: Vec<u8> = at
            .iter()
            .flat_map(|a| a.map_or(vec![7; 16], |r| staged[r].clone()))
            .collect();
        let valid: Vec<bool> = at.iter().map(|a| a.is_some_and(|r| r != 1)).collect();
        let column = arrow::array::FixedSizeBinaryArray::try_new(
            16,
            arrow::buffer::Buffer::from_vec(bytes),
            Some(valid.into()),
        )
        .unwrap();
        let schema = Arc::new(Schema::new(vec![Field::new("b", DataType::Utf8View, true)]));
        let plan = HostGather::plan(&[OutputColumn::Build(0)], &schema, 1, Carriage::DEVICE);
        let window =
            RecordBatch::try_new(Arc::clone(&plan.schema), vec![Arc::new(column)]).unwrap();
        let out = plan
            .gather
            .unwrap()
            .apply(
                &window,
                &[],
                &build,
                &mut ProbeBatches::new(8192, usize::MAX),
                0..0,
                5,
            )
            .unwrap();
        assert_eq!(
            out.column(0).as_string_view().iter().collect::<Vec<_>>(),
            vec![Some(long), None, Some("x"), None, Some("")]
        );
    }

    /// A reservation in an unbounded pool.
    fn reservation() -> MemoryReservation {
        let pool: Arc<dyn datafusion::execution::memory_pool::MemoryPool> =
            Arc::new(datafusion::execution::memory_pool::UnboundedMemoryPool::default());
        datafusion::execution::memory_pool::MemoryConsumer::new("t").register(&pool)
    }

    #[test]
    fn gathers_across_batches_with_missing_rows_null() {
        let reservation = reservation();
        let long = "a string longer than twelve bytes";
        let build_batches = [
            strings(&[Some("x"), None]),
            strings(&[Some(long), Some("")]),
        ];
        let build = HostBuild::new(
            build_batches.iter(),
            &[0],
            &[],
            reservation,
            Counted::Collected(&[]),
            8192,
        )
        .unwrap();
        let mut probe = ProbeBatches::new(8192, usize::MAX);
        // The first batch reserved, the second refused: only the first's bytes come back.
        assert!(probe.push(&strings(&[Some("p0")]), &[0], |_| true).unwrap());
        assert!(
            !probe
                .push(&strings(&[Some("p1"), Some("p2")]), &[0], |_| false)
                .unwrap()
        );
        let schema = Arc::new(Schema::new(vec![
            Field::new("b", DataType::Utf8View, true),
            Field::new("p", DataType::Utf8View, true),
        ]));
        let plan = HostGather::plan(
            &[OutputColumn::Build(0), OutputColumn::Probe(0)],
            &schema,
            1,
            HOST_VIEWS,
        );
        let window = RecordBatch::try_new(
            Arc::clone(&plan.schema),
            vec![
                Arc::new(UInt32Array::from(vec![Some(2), None, Some(0), Some(1)])),
                Arc::new(UInt32Array::from(vec![0, 1, NO_ROW, 1])),
            ],
        )
        .unwrap();
        // The window's chunk holds the partition's probe rows 1 and 2.
        let out = plan
            .gather
            .unwrap()
            .apply(&window, &[], &build, &mut probe, 1..3, 4)
            .unwrap();
        let b = out.column(0).as_string_view();
        let p = out.column(1).as_string_view();
        assert_eq!(
            b.iter().collect::<Vec<_>>(),
            vec![Some(long), None, Some("x"), None]
        );
        assert_eq!(
            p.iter().collect::<Vec<_>>(),
            vec![Some("p1"), Some("p2"), None, Some("p2")]
        );
        // Rows before row 2 are released with the batch that holds only them (reserved); the
        // second batch, refused, gives back nothing.
        assert!(probe.release(2) > 0);
        let gone = UInt32Array::from(vec![0]);
        let utf8_view = [(0, &DataType::Utf8View)];
        assert!(probe.take(&utf8_view, &gone, 0..3, 1).is_err());
        assert!(probe.take(&utf8_view, &gone, 0..3, 3).is_err());
        assert_eq!(probe.release(3), 0);
    }

    #[test]
    fn probe_rows_taken_from_a_chunk_carry_only_the_bytes_they_use() {
        let values: Vec<String> = (0..4)
            .map(|i| format!("probe value {i} past twelve bytes"))
            .collect();
        let refs: Vec<Option<&str>> = values.iter().map(|v| Some(v.as_str())).collect();
        // One row of four: copied out of the chunk's buffer. Three of four: the chunk's kept.
        // Either from the chunk's rows concatenated (a window of 4 rows) or from the held
        // batch (a window of 0: sparse).
        for (rows, held, window_rows) in [
            (vec![2], values[2].len(), 4),
            (vec![0, 1, 3], 4 * values[0].len(), 4),
            (vec![2], values[2].len(), 0),
            (vec![0, 1, 3], 4 * values[0].len(), 0),
        ] {
            let mut probe = ProbeBatches::new(8192, usize::MAX);
            assert!(probe.push(&strings(&refs), &[0], |_| true).unwrap());
            let taken = probe
                .take(
                    &[(0, &DataType::Utf8View)],
                    &UInt32Array::from(rows.clone()),
                    0..4,
                    window_rows,
                )
                .unwrap();
            let taken = taken[0].as_string_view();
            let bytes: usize = taken.data_buffers().iter().map(|b| b.len()).sum();
            assert_eq!(bytes, held);
            let want: Vec<Option<&str>> = rows
                .iter()
                .map(|&r| Some(values[r as usize].as_str()))
                .collect();
            assert_eq!(taken.iter().collect::<Vec<_>>(), want);
        }
    }

    #[test]
    fn probe_rows_are_taken_alike_from_the_held_batches_and_from_their_chunk() {
        let batch = |values: std::ops::Range<i64>| {
            let a: ArrayRef = Arc::new(arrow::array::Int64Array::from_iter(
                values.clone().map(|v| (v % 3 != 0).then_some(v)),
            ));
            let b: ArrayRef = Arc::new(arrow::array::Int32Array::from_iter_values(
                values.map(|v| v as i32 * 2),
            ));
            RecordBatch::try_from_iter([("a", a), ("b", b)]).unwrap()
        };
        let columns = [(1, &DataType::Int32), (0, &DataType::Int64)];
        // A chunk of probe rows 2..12 of three batches; the window's rows in probe order, with
        // a build row alone (no probe row).
        let rows = UInt32Array::from(vec![0, 0, 3, NO_ROW, 4, 9]);
        // The values, and whether the chunk's rows were concatenated.
        let taken = |window_rows: usize, pass_rows: usize| {
            let mut probe = ProbeBatches::new(8192, pass_rows);
            for b in [batch(0..5), batch(5..8), batch(8..12)] {
                assert!(probe.push(&b, &[0, 1], |_| true).unwrap());
            }
            let values = probe.take(&columns, &rows, 2..12, window_rows).unwrap();
            let concatenated = matches!(&probe.chunk, Some((_, Some(_))));
            // Released with its batches.
            probe.release(12);
            assert!(probe.chunk.is_none());
            (values, concatenated)
        };
        let (sparse, dense) = (taken(2, usize::MAX), taken(6, usize::MAX));
        assert_eq!((sparse.1, dense.1), (false, true));
        assert_eq!(sparse.0, dense.0);
        // Passes of 8 rows: a window of 2 is a quarter of one.
        assert_eq!(taken(2, 8), (dense.0.clone(), true));
        let sparse = sparse.0;
        let b: Vec<Option<i32>> = sparse[0]
            .as_primitive::<arrow::datatypes::Int32Type>()
            .iter()
            .collect();
        assert_eq!(
            b,
            vec![Some(4), Some(4), Some(10), None, Some(12), Some(22)]
        );
        let a: Vec<Option<i64>> = sparse[1]
            .as_primitive::<arrow::datatypes::Int64Type>()
            .iter()
            .collect();
        assert_eq!(a, vec![Some(2), Some(2), Some(5), None, None, Some(11)]);
    }

    #[test]
    fn build_rows_are_found_in_uneven_batches_in_any_order() {
        let sizes = [1usize, 5, 3, 100, 2, 1, 40];
        let mut next = 0;
        let batches: Vec<RecordBatch> = sizes
            .iter()
            .map(|&n| {
                let values: Vec<String> = (next..next + n).map(|i| format!("row {i}")).collect();
                next += n;
                let refs: Vec<Option<&str>> = values.iter().map(|v| Some(v.as_str())).collect();
                strings(&refs)
            })
            .collect();
        let build = unbounded(batches.iter(), &[0], &[], 8192);
        // Every row, in a scrambled order, and one past the end.
        let ids: Vec<u32> = (0..next as u32).map(|i| (i * 37) % next as u32).collect();
        let taken = build
            .take(0, &UInt32Array::from(ids.clone()), &DataType::Utf8View)
            .unwrap();
        let want: Vec<String> = ids.iter().map(|i| format!("row {i}")).collect();
        let got: Vec<&str> = taken.as_string_view().iter().flatten().collect();
        assert_eq!(got, want);
        let past = UInt32Array::from(vec![next as u32]);
        assert!(build.take(0, &past, &DataType::Utf8View).is_err());
    }

    #[test]
    fn a_few_rows_from_many_batches_are_gathered_from_the_batches_they_use() {
        use arrow::array::{DictionaryArray, Int64Array, StringViewArray};
        use arrow::datatypes::Int32Type;
        // One table of 3,000 rows (a view column, a dictionary column, an integer column),
        // held as 1,000 batches of 3 rows, slices of it, as a scan hands them over.
        let n = 3000;
        let words: Vec<String> = (0..n)
            .map(|i| format!("a string longer than 12: {i}"))
            .collect();
        let views: ArrayRef = Arc::new(StringViewArray::from_iter(
            words
                .iter()
                .enumerate()
                .map(|(i, w)| (i % 7 != 0).then_some(w.as_str())),
        ));
        let dictionary: DictionaryArray<Int32Type> =
            (0..n).map(|i| ["x", "y", "z"][i % 3]).collect();
        let dictionary: ArrayRef = Arc::new(dictionary);
        let integers: ArrayRef = Arc::new(Int64Array::from_iter_values(0..n as i64));
        let table = RecordBatch::try_from_iter([
            ("v", Arc::clone(&views)),
            ("d", Arc::clone(&dictionary)),
            ("i", Arc::clone(&integers)),
        ])
        .unwrap();
        let batches: Vec<RecordBatch> = (0..n / 3).map(|b| table.slice(3 * b, 3)).collect();
        let build = unbounded(batches.iter(), &[0, 1, 2], &[], 8192);
        assert!(build.columns[0].views.is_some() && build.columns[1].dictionary.is_some());
        // Windows of fewer rows than batches, with a missing row, out of order.
        for ids in [
            vec![Some(2999), None, Some(4), Some(1500), Some(5)],
            vec![Some(0)],
            vec![Some(1), Some(1), Some(2998)],
        ] {
            let ids = UInt32Array::from(ids);
            for (k, whole) in [&views, &dictionary, &integers].into_iter().enumerate() {
                let got = build.take(k, &ids, whole.data_type()).unwrap();
                let want = arrow::compute::take(whole.as_ref(), &ids, None).unwrap();
                assert_eq!(&got, &want, "column {k}, rows {ids:?}");
            }
        }
        // An empty window is an empty array of each type.
        for (k, whole) in [&views, &dictionary, &integers].into_iter().enumerate() {
            let none = UInt32Array::from(Vec::<u32>::new());
            let got = build.take(k, &none, whole.data_type()).unwrap();
            assert_eq!((got.len(), got.data_type()), (0, whole.data_type()));
        }
        // The dictionary is the table's own, not a copy of it per batch used.
        let got = build
            .take(1, &UInt32Array::from(vec![7, 2000]), dictionary.data_type())
            .unwrap();
        assert!(Arc::ptr_eq(
            got.as_any_dictionary().values(),
            dictionary.as_any_dictionary().values()
        ));
    }

    #[test]
    fn views_gathered_from_many_batches_carry_only_the_bytes_they_use() {
        let values: Vec<String> = (0..100)
            .map(|i| format!("value number {i:04} of many"))
            .collect();
        let batches: Vec<RecordBatch> = values
            .iter()
            .map(|v| strings(&[Some(v.as_str())]))
            .collect();
        assert!(batches[0].column(0).as_string_view().data_buffers().len() == 1);
        let ids = UInt32Array::from(vec![99, 0, 42]);
        let want = vec![
            Some(values[99].as_str()),
            Some(values[0].as_str()),
            Some(values[42].as_str()),
        ];
        let used: usize = [99, 0, 42].iter().map(|&i| values[i].len()).sum();
        // Fewer rows than batches: whether the 100 buffers are listed (batches of 1000 rows)
        // or not (batches of 7: too many to list in every output array), the output holds the
        // three its rows use.
        for batch_size in [7, 1000] {
            let build = unbounded(batches.iter(), &[0], &[], batch_size);
            let taken = build.take(0, &ids, &DataType::Utf8View).unwrap();
            let taken = taken.as_string_view();
            assert_eq!(taken.data_buffers().len(), 3);
            let held: usize = taken.data_buffers().iter().map(|b| b.len()).sum();
            assert_eq!(held, used);
            assert_eq!(taken.iter().collect::<Vec<_>>(), want);
        }
        // As many rows as batches (20 of 5 values, listed): the output holds all 20 buffers,
        // uses a fifth of their bytes, and is copied into one buffer of its own.
        let batches: Vec<RecordBatch> = values
            .chunks(5)
            .map(|five| strings(&five.iter().map(|v| Some(v.as_str())).collect::<Vec<_>>()))
            .collect();
        let build = unbounded(batches.iter(), &[0], &[], 1000);
        let ids: Vec<u32> = (0..20).map(|b| 5 * b + b % 5).collect();
        let taken = build
            .take(0, &UInt32Array::from(ids.clone()), &DataType::Utf8View)
            .unwrap();
        let taken = taken.as_string_view();
        assert_eq!(taken.data_buffers().len(), 1);
        let want: Vec<Option<&str>> = ids
            .iter()
            .map(|&i| Some(values[i as usize].as_str()))
            .collect();
        assert_eq!(taken.iter().collect::<Vec<_>>(), want);
    }
}
