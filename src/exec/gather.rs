//! [`HostGather`]: output columns the device does not carry — strings, binary, views,
//! dictionaries, lists, structs, any variable-length or nested type — gathered on the host.
//!
//! The device carries positions instead of values: each build row's place among all build
//! rows (the staged `__row` column, moved through the transform like any payload) and each
//! probe row's place in its chunk. A partition's stream turns every output window into the
//! join's rows by gathering those columns from the build side's batches ([`HostBuild`], held
//! once per execution) and from its own probe batches ([`ProbeBatches`], held until the chunks
//! that cover them are done). A missing side (an outer join's row without a match) has no
//! position, so its columns come out null. This is the unmaterialized (UM) way of the GFTR
//! paper: the wide values never cross PCIe, only 4-byte positions do.
//!
//! ```text
//!  device window: fixed-width columns │ __build_row_id │ __probe_row
//!                                     ▼                ▼
//!         interleave from the build batches   interleave from the chunk's probe batches
//!                                     ▼                ▼
//!  the join's rows, columns in output order
//! ```

use std::collections::VecDeque;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray, BooleanArray, RecordBatch, RecordBatchOptions, UInt32Array,
};
use arrow::compute::{interleave, nullif};
use arrow::datatypes::{DataType, Field, Schema, SchemaRef, UInt32Type};
use datafusion::common::{Result, internal_err};
use datafusion::execution::memory_pool::MemoryReservation;

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
    /// carry stays, the others become positions; `build_row_column` is the staged build column
    /// that holds build row positions.
    pub fn plan(
        columns: &[OutputColumn],
        schema: &SchemaRef,
        build_row_column: usize,
    ) -> Gathering {
        let on_host = |i: usize| ColumnKind::of(schema.field(i).data_type()).is_none();
        if !(0..columns.len()).any(on_host) {
            return Gathering {
                columns: columns.to_vec(),
                schema: Arc::clone(schema),
                gather: None,
            };
        }
        let (mut device, mut fields, mut sources) = (vec![], vec![], vec![]);
        let (mut build_columns, mut probe_columns) = (vec![], vec![]);
        let held = |held: &mut Vec<usize>, c: usize| match held.iter().position(|&h| h == c) {
            Some(k) => k,
            None => {
                held.push(c);
                held.len() - 1
            }
        };
        for (i, c) in columns.iter().enumerate() {
            sources.push(match *c {
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
                schema: Arc::clone(schema),
            }),
        }
    }

    /// The input columns gathered on the host, as EXPLAIN shows them: `build=[name@index, ..]`,
    /// `probe=[..]` (`left` and `right`: the inputs' schemas).
    pub fn describe(&self, left: &SchemaRef, right: &SchemaRef) -> String {
        let side = |name: &str, columns: &[usize], schema: &SchemaRef| {
            let names: Vec<String> = columns
                .iter()
                .map(|&c| format!("{}@{c}", schema.field(c).name()))
                .collect();
            (!names.is_empty()).then(|| format!("{name}=[{}]", names.join(", ")))
        };
        [
            side("build", &self.build_columns, left),
            side("probe", &self.probe_columns, right),
        ]
        .into_iter()
        .flatten()
        .collect::<Vec<_>>()
        .join(", ")
    }

    /// The schema of the rows it makes.
    pub fn schema(&self) -> &SchemaRef {
        &self.schema
    }

    /// The join's rows of one device window of a chunk whose first row is probe row
    /// `chunk_first_row` of the partition (ignored for windows of build rows alone).
    pub fn apply(
        &self,
        window: &RecordBatch,
        build: &HostBuild,
        probe: &ProbeBatches,
        chunk_first_row: u64,
    ) -> Result<RecordBatch> {
        let rows = window.num_rows();
        let position_column = |column: Option<usize>| -> Result<_> {
            let Some(c) = column else {
                return internal_err!("a gathered column without positions");
            };
            Ok(window.column(c).as_primitive::<UInt32Type>().clone())
        };
        let build_at = match self.build_row {
            Some(_) => Some(build.indices(&position_column(self.build_row)?)?),
            None => None,
        };
        let probe_at = match self.probe_row {
            Some(_) => Some(probe.indices(&position_column(self.probe_row)?, chunk_first_row)?),
            None => None,
        };
        let columns = self
            .sources
            .iter()
            .enumerate()
            .map(|(i, source)| {
                let dt = self.schema.field(i).data_type();
                match (*source, &build_at, &probe_at) {
                    (Source::Device(k), _, _) => Ok(Arc::clone(window.column(k))),
                    (Source::Build(k), Some(at), _) => {
                        take(build.batches.iter().map(|b| b.column(k)), at, dt, rows)
                    }
                    (Source::Probe(k), _, Some(at)) => {
                        take(probe.batches.iter().map(|(_, b)| b.column(k)), at, dt, rows)
                    }
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

/// Where each row's value lies among some held arrays — (array, row), `(0, 0)` for none — and
/// which rows have none.
struct Positions {
    at: Vec<(usize, usize)>,
    missing: Option<BooleanArray>,
}

/// The values at `at` of the arrays (null where a row has none).
fn take<'a>(
    arrays: impl Iterator<Item = &'a ArrayRef>,
    at: &Positions,
    dt: &DataType,
    rows: usize,
) -> Result<ArrayRef> {
    let arrays: Vec<&dyn Array> = arrays.map(|a| a.as_ref()).collect();
    if arrays.is_empty() || at.missing.as_ref().is_some_and(|m| m.true_count() == rows) {
        return Ok(arrow::array::new_null_array(dt, rows));
    }
    let taken = interleave(&arrays, &at.at)?;
    Ok(match &at.missing {
        Some(missing) => nullif(taken.as_ref(), missing)?,
        None => taken,
    })
}

/// Positions of `rows` rows, `ids` giving each one's place in a sequence held in `pieces`
/// (each with the place of its first row, ascending), `None` for a row that has no place.
fn positions<'a>(
    rows: usize,
    ids: impl Iterator<Item = Option<u64>>,
    pieces: impl Iterator<Item = (u64, &'a RecordBatch)>,
) -> Result<Positions> {
    let pieces: Vec<(u64, usize)> = pieces.map(|(s, b)| (s, b.num_rows())).collect();
    let mut at = Vec::with_capacity(rows);
    let mut missing = vec![];
    for (i, id) in ids.enumerate() {
        let Some(id) = id else {
            if missing.is_empty() {
                missing = vec![false; rows];
            }
            missing[i] = true;
            at.push((0, 0));
            continue;
        };
        let piece = pieces.partition_point(|&(s, _)| s <= id);
        match piece.checked_sub(1).map(|p| (p, pieces[p])) {
            Some((p, (start, len))) if id - start < len as u64 => {
                at.push((p, (id - start) as usize))
            }
            _ => return internal_err!("row {id} of a gathered side is not held"),
        }
    }
    Ok(Positions {
        at,
        missing: (!missing.is_empty()).then(|| BooleanArray::from(missing)),
    })
}

/// The build side's columns that the host gathers, held for one execution: the collected
/// batches' columns in collection order, the order the `__row` positions count in.
#[derive(Debug, Default)]
pub struct HostBuild {
    batches: Vec<RecordBatch>,
    /// The position of each batch's first row.
    starts: Vec<u64>,
    /// Their memory, in DataFusion's pool.
    reservation: Option<MemoryReservation>,
}

impl HostBuild {
    /// Columns `columns` of `batches`, in order, reserved in `reservation`.
    pub fn new<'a>(
        batches: impl Iterator<Item = &'a RecordBatch>,
        columns: &[usize],
        reservation: MemoryReservation,
    ) -> Result<Self> {
        let mut held = Self::default();
        let mut at = 0u64;
        for b in batches {
            held.starts.push(at);
            at += b.num_rows() as u64;
            let b = b.project(columns)?;
            reservation.try_grow(b.get_array_memory_size())?;
            held.batches.push(b);
        }
        held.reservation = Some(reservation);
        Ok(held)
    }

    fn indices(&self, ids: &UInt32Array) -> Result<Positions> {
        let pieces = self.starts.iter().copied().zip(self.batches.iter());
        positions(ids.len(), ids.iter().map(|id| id.map(u64::from)), pieces)
    }
}

/// A partition's probe batches (their gathered columns), held from their arrival until every
/// chunk holding their rows is done.
#[derive(Debug, Default)]
pub struct ProbeBatches {
    /// Each batch with the place of its first row among the partition's probe rows.
    batches: VecDeque<(u64, RecordBatch)>,
    /// Probe rows that have arrived.
    rows: u64,
}

impl ProbeBatches {
    /// Holds columns `columns` of the next probe batch; returns the bytes it holds.
    pub fn push(&mut self, batch: &RecordBatch, columns: &[usize]) -> Result<usize> {
        let held = batch.project(columns)?;
        let bytes = held.get_array_memory_size();
        self.batches.push_back((self.rows, held));
        self.rows += batch.num_rows() as u64;
        Ok(bytes)
    }

    /// Drops the batches whose rows all lie before row `first` (the first row of the oldest
    /// chunk not done); returns the bytes they held.
    pub fn release(&mut self, first: u64) -> usize {
        let mut bytes = 0;
        while let Some((start, b)) = self.batches.front() {
            if start + b.num_rows() as u64 > first {
                break;
            }
            bytes += b.get_array_memory_size();
            self.batches.pop_front();
        }
        bytes
    }

    fn indices(&self, rows: &UInt32Array, chunk_first_row: u64) -> Result<Positions> {
        let ids = rows.values().iter().map(|&r| match r {
            NO_ROW => None,
            r => Some(chunk_first_row + u64::from(r)),
        });
        let pieces = self.batches.iter().map(|(s, b)| (*s, b));
        positions(rows.len(), ids, pieces)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::StringViewArray;

    fn strings(values: &[Option<&str>]) -> RecordBatch {
        let a: ArrayRef = Arc::new(StringViewArray::from(values.to_vec()));
        RecordBatch::try_from_iter([("s", a)]).unwrap()
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
        let g = HostGather::plan(&columns, &schema, 7);
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
        // Nothing to gather: the columns stay as they are.
        let fixed = Arc::new(Schema::new(vec![Field::new("a", DataType::Int32, true)]));
        assert!(HostGather::plan(&columns[..1], &fixed, 7).gather.is_none());
    }

    #[test]
    fn gathers_across_batches_with_missing_rows_null() {
        let pool: Arc<dyn datafusion::execution::memory_pool::MemoryPool> =
            Arc::new(datafusion::execution::memory_pool::UnboundedMemoryPool::default());
        let reservation =
            datafusion::execution::memory_pool::MemoryConsumer::new("t").register(&pool);
        let long = "a string longer than twelve bytes";
        let build_batches = [
            strings(&[Some("x"), None]),
            strings(&[Some(long), Some("")]),
        ];
        let build = HostBuild::new(build_batches.iter(), &[0], reservation).unwrap();
        let mut probe = ProbeBatches::default();
        probe.push(&strings(&[Some("p0")]), &[0]).unwrap();
        probe
            .push(&strings(&[Some("p1"), Some("p2")]), &[0])
            .unwrap();
        let schema = Arc::new(Schema::new(vec![
            Field::new("b", DataType::Utf8View, true),
            Field::new("p", DataType::Utf8View, true),
        ]));
        let plan = HostGather::plan(
            &[OutputColumn::Build(0), OutputColumn::Probe(0)],
            &schema,
            1,
        );
        let window = RecordBatch::try_new(
            Arc::clone(&plan.schema),
            vec![
                Arc::new(UInt32Array::from(vec![Some(2), None, Some(0), Some(1)])),
                Arc::new(UInt32Array::from(vec![0, 1, NO_ROW, 1])),
            ],
        )
        .unwrap();
        // The window's chunk starts at the partition's probe row 1.
        let out = plan
            .gather
            .unwrap()
            .apply(&window, &build, &probe, 1)
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
        // Rows before row 2 are released with the batch that holds only them.
        assert!(probe.release(2) > 0);
        let gone = UInt32Array::from(vec![0]);
        assert!(probe.indices(&gone, 0).is_err());
    }
}
