//! LOOKUP: inner joins against build sides whose keys are unique (a dimension's primary key),
//! each probe row finding its one build row in a single pass, and the join chain this makes
//! cheap: a [`Chain`] of such joins that copies the columns of the relation it starts from
//! once, at its end (late materialization).
//!
//! ```text
//!  a chain's rows ──► key columns (the base's through the selection, or joined ones) ─► encode
//!                 ──► bucket_lookup: each row's one build position or none (one pass over the
//!                     table, no count, no scan, no second probe)
//!                 ──► every row found: nothing moves. Else present → select: the rows kept,
//!                     and the selection and the joined columns gathered by them
//!                 ──► the build columns the join takes, gathered by position, appended
//!  finish ──────────► the base columns the output takes, gathered by the selection (copied
//!                     where it is none), with the joined columns
//! ```
//!
//! A chain is a base relation (a fact table on the device), the selection of its rows still in
//! the chain (`None`: every row, in order), and the columns its joins gathered for those rows.
//! Rows keep the base's order. A join where every row finds its build row costs in proportion
//! to the chain's rows and the columns it takes, not to the base columns the chain carries
//! (one where some rows leave also gathers the selection and the columns joined so far), so a
//! fact table joined with k dimensions costs about k times one join, where joins that each
//! output every column they carry cost more per join the longer the chain. A build side where
//! a probed key has several rows, or whose keys are checked by bytes or a filter, is no
//! lookup: [`Chain::join`] says so and changes nothing.
//!
//! Example: base rows 0..4 with foreign keys [7, 9, 7, 8], a dimension with keys {7, 8}: the
//! lookup finds rows [a, none, a, b], the selection becomes [0, 2, 3] and the joined column
//! takes the dimension's payload at [a, a, b].

use std::ops::Deref;

use datafusion::common::{Result, internal_err};

use super::hash::BucketTable;
use crate::backend::{Backend, Keep};
use crate::columns::{DeviceColumn, DeviceRelation};

/// A column of a chain's rows.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChainColumn {
    /// Column `c` of the base relation.
    Base(usize),
    /// The `i`-th column the chain's joins took, in the order they took them.
    Joined(usize),
}

/// Rows of a base relation, selected and in order, with the columns joins took for them.
///
/// A fact table joined with a dimension on the host backend (the same code runs on
/// [`CudaBackend`](crate::backend::CudaBackend)):
///
/// ```
/// # use std::sync::Arc;
/// # use arrow::array::{ArrayRef, Int32Array, RecordBatch};
/// # use arrow::datatypes::{DataType, Field, Schema};
/// use datafusion_gpu_join::backend::HostBackend;
/// use datafusion_gpu_join::columns::{DeviceRelation, Fitted, KeyEncoder};
/// use datafusion_gpu_join::join::hash::BucketTable;
/// use datafusion_gpu_join::join::{Chain, ChainColumn, OutputColumn, OutputLayout};
/// # fn batch(cols: &[(&str, Vec<i32>)]) -> RecordBatch {
/// #     let fields: Vec<Field> = cols.iter().map(|(n, _)| Field::new(*n, DataType::Int32, false)).collect();
/// #     let arrays: Vec<ArrayRef> = cols.iter().map(|(_, v)| Arc::new(Int32Array::from(v.clone())) as ArrayRef).collect();
/// #     RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).unwrap()
/// # }
/// # fn main() -> datafusion::common::Result<()> {
/// let b = HostBackend::default();
/// let fact = batch(&[("fk", vec![7, 9, 7, 8]), ("p", vec![0, 1, 2, 3])]);
/// let dim_batch = batch(&[("k", vec![8, 7]), ("v", vec![80, 70])]);
/// let base = DeviceRelation::upload(&b, &[fact], &[0, 1])?;
/// let dim = DeviceRelation::upload(&b, std::slice::from_ref(&dim_batch), &[0, 1])?;
/// // The dimension bucketed by its key (column 0), carrying its payload (column 1).
/// let Fitted::Encoder(keys) = KeyEncoder::fit(&[vec![dim_batch.column(0)]], false)? else {
///     unreachable!("Int32 keys encode")
/// };
/// let layout = OutputLayout {
///     schema: dim_batch.schema(),
///     columns: vec![OutputColumn::Build(1)],
///     build_keys: vec![0],
///     probe_keys: vec![0],
///     check: None,
///     filter: None,
/// };
/// let table = BucketTable::build(&b, &dim, &layout, keys)?;
/// let mut chain = Chain::new(&base);
/// assert!(chain.join(&b, &table, &[ChainColumn::Base(0)], &[1])?);
/// assert_eq!(chain.rows(), 3); // fk 9 has no dimension row
/// let out = chain.finish(&b, &[ChainColumn::Base(1), ChainColumn::Joined(0)])?;
/// let schema = Arc::new(Schema::new(vec![
///     Field::new("p", DataType::Int32, false),
///     Field::new("v", DataType::Int32, false),
/// ]));
/// let rows = out.download(&b, &schema, 1024)?;
/// assert_eq!(rows[0], batch(&[("p", vec![0, 2, 3]), ("v", vec![70, 70, 80])]));
/// # Ok(())
/// # }
/// ```
#[derive(Debug)]
pub struct Chain<'a, Buf> {
    base: &'a DeviceRelation<Buf>,
    /// The base rows in the chain (u32 each, ascending); `None`: all of them.
    selection: Option<Buf>,
    rows: usize,
    joined: Vec<DeviceColumn<Buf>>,
}

/// A column borrowed from where it lies, or gathered for the chain's rows.
enum Held<'a, Buf> {
    Borrowed(&'a DeviceColumn<Buf>),
    Owned(DeviceColumn<Buf>),
}

impl<Buf> Held<'_, Buf> {
    /// The column as one of its own: gathered already, or copied.
    fn into_owned<B: Backend<Buf = Buf>>(self, backend: &B) -> Result<DeviceColumn<Buf>> {
        match self {
            Held::Owned(c) => Ok(c),
            Held::Borrowed(c) => c.map(c.rows, |b, w| {
                let mut copy = backend.alloc(c.rows * w)?;
                backend.copy_within(b, 0, &mut copy, 0, c.rows * w)?;
                Ok(copy)
            }),
        }
    }
}

impl<Buf> Deref for Held<'_, Buf> {
    type Target = DeviceColumn<Buf>;

    fn deref(&self) -> &DeviceColumn<Buf> {
        match self {
            Held::Borrowed(c) => c,
            Held::Owned(c) => c,
        }
    }
}

impl<'a, Buf> Chain<'a, Buf> {
    /// Every row of `base`, no column joined yet.
    pub fn new(base: &'a DeviceRelation<Buf>) -> Self {
        Self {
            base,
            selection: None,
            rows: base.rows,
            joined: vec![],
        }
    }

    /// Rows in the chain.
    pub fn rows(&self) -> usize {
        self.rows
    }

    /// Columns the chain's joins took.
    pub fn joined(&self) -> usize {
        self.joined.len()
    }

    /// Column `c` for the chain's rows.
    fn column<B: Backend<Buf = Buf>>(&self, backend: &B, c: ChainColumn) -> Result<Held<'_, Buf>> {
        match c {
            ChainColumn::Base(c) => {
                let col = self.base.column(c)?;
                match &self.selection {
                    None => Ok(Held::Borrowed(col)),
                    Some(sel) => {
                        Ok(Held::Owned(col.map(self.rows, |b, w| {
                            backend.gather(b, sel, self.rows, w)
                        })?))
                    }
                }
            }
            ChainColumn::Joined(i) => match self.joined.get(i) {
                Some(col) => Ok(Held::Borrowed(col)),
                None => internal_err!("chain: no joined column {i} of {}", self.joined.len()),
            },
        }
    }

    /// Inner-joins the chain's rows with `table` on `key` (the chain's columns, in the order
    /// of the table's build keys, each of its key's type), appending the table's build columns
    /// `take` (indices of the build relation the table was built from, carried by it). Rows
    /// without a build row leave the chain. Gives `false`, with the chain unchanged, where
    /// `table` is no lookup: a key of a probed row is held by several build rows, or the table
    /// checks keys by bytes or a filter. Waits for the lookup's counts. On an error the chain
    /// is unchanged too.
    pub fn join<B: Backend<Buf = Buf>>(
        &mut self,
        backend: &B,
        table: &BucketTable<B>,
        key: &[ChainColumn],
        take: &[usize],
    ) -> Result<bool> {
        if !table.keys_alone() {
            return Ok(false);
        }
        let encoder = table.encoder();
        let held = (key.iter())
            .map(|&c| self.column(backend, c))
            .collect::<Result<Vec<_>>>()?;
        let types: Vec<_> = encoder.key_types().collect();
        let widths_agree = (held.iter().zip(&types)).all(|(c, t)| c.kind.width() == t.bytes());
        if held.len() != types.len() || !widths_agree {
            return internal_err!(
                "chain: key columns of {:?} for a table keyed by {types:?}",
                held.iter().map(|c| c.kind).collect::<Vec<_>>()
            );
        }
        let keys: Vec<_> = (held.iter())
            .map(|c| (&c.values, c.validity.as_ref()))
            .collect();
        let encoded = table.encode_keys(backend, &keys, self.rows)?;
        drop(held);
        let relation = table.relation();
        let looked = (backend.bucket_lookup(
            &relation.keys,
            &encoded,
            self.rows,
            encoder.width(),
            encoder.direct_bits().is_some(),
        ))?;
        let mut counts = [0u8; 16];
        backend.download(&looked.counts, &mut counts)?;
        let count = |i: usize| u64::from_le_bytes(counts[8 * i..8 * i + 8].try_into().unwrap());
        let (missing, repeated) = (count(0), count(1));
        if repeated > 0 {
            return Ok(false);
        }
        let Some(kept) = (self.rows as u64).checked_sub(missing) else {
            return internal_err!("chain: {missing} of {} rows without a build row", self.rows);
        };
        let kept = kept as usize;
        // What the chain becomes, made before any of it is changed.
        let (positions, selection, joined) = if missing == 0 {
            (looked.positions, None, vec![])
        } else {
            // The rows that found their build row, in order.
            let flags = backend.present(&looked.positions, self.rows)?;
            let offsets = backend.select_count(&flags, self.rows, Keep::Set)?;
            let mut idx = backend.alloc(kept * 4)?;
            let window = 0..kept as u64;
            backend.select_write(&flags, self.rows, Keep::Set, &offsets, window, &mut idx)?;
            let positions = backend.gather(&looked.positions, &idx, kept, 4)?;
            let joined = (self.joined.iter())
                .map(|c| c.map(kept, |b, w| backend.gather(b, &idx, kept, w)))
                .collect::<Result<Vec<_>>>()?;
            let selection = match &self.selection {
                Some(sel) => backend.gather(sel, &idx, kept, 4)?,
                None => idx,
            };
            (positions, Some(selection), joined)
        };
        let taken = (take.iter())
            .map(|&c| {
                let col = relation.column(c)?;
                col.map(kept, |b, w| backend.gather(b, &positions, kept, w))
            })
            .collect::<Result<Vec<_>>>()?;
        if let Some(selection) = selection {
            self.selection = Some(selection);
            self.joined = joined;
            self.rows = kept;
        }
        self.joined.extend(taken);
        Ok(true)
    }

    /// The chain's rows as a relation of `columns` (column `i` of the output is `columns[i]`):
    /// base columns gathered by the selection, or copied where every base row is in the chain;
    /// joined columns moved (each at most once).
    pub fn finish<B: Backend<Buf = Buf>>(
        mut self,
        backend: &B,
        columns: &[ChainColumn],
    ) -> Result<DeviceRelation<Buf>> {
        let rows = self.rows;
        let mut joined: Vec<Option<DeviceColumn<Buf>>> = std::mem::take(&mut self.joined)
            .into_iter()
            .map(Some)
            .collect();
        let out = (columns.iter().enumerate())
            .map(|(i, &c)| {
                let col = match c {
                    ChainColumn::Base(_) => self.column(backend, c)?.into_owned(backend)?,
                    ChainColumn::Joined(j) => match joined.get_mut(j).and_then(Option::take) {
                        Some(col) => col,
                        None => return internal_err!("chain: joined column {j} absent or taken"),
                    },
                };
                Ok((i, col))
            })
            .collect::<Result<_>>()?;
        Ok(DeviceRelation { columns: out, rows })
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::array::{ArrayRef, AsArray, Int32Array, RecordBatch};
    use arrow::datatypes::{DataType, Field, Int32Type, Schema};

    use super::*;
    use crate::backend::HostBackend;
    use crate::columns::{Fitted, KeyEncoder};
    use crate::join::{OutputColumn, OutputLayout};

    fn batch(columns: &[(&str, Vec<Option<i32>>)]) -> RecordBatch {
        let fields: Vec<Field> = (columns.iter())
            .map(|(n, _)| Field::new(*n, DataType::Int32, true))
            .collect();
        let arrays: Vec<ArrayRef> = (columns.iter())
            .map(|(_, v)| Arc::new(Int32Array::from(v.clone())) as ArrayRef)
            .collect();
        RecordBatch::try_new(Arc::new(Schema::new(fields)), arrays).unwrap()
    }

    /// A table of `dim` (key column 0, payload column 1), direct or hashed.
    fn table(b: &HostBackend, dim: &RecordBatch, direct: bool) -> BucketTable<HostBackend> {
        let Fitted::Encoder(enc) = KeyEncoder::fit(&[vec![dim.column(0)]], false).unwrap() else {
            panic!("keys encode");
        };
        let enc = if direct { enc.direct().unwrap() } else { enc };
        let relation = DeviceRelation::upload(b, std::slice::from_ref(dim), &[0, 1]).unwrap();
        let layout = OutputLayout {
            schema: dim.schema(),
            columns: vec![OutputColumn::Build(1)],
            build_keys: vec![0],
            probe_keys: vec![0],
            check: None,
            filter: None,
        };
        BucketTable::build(b, &relation, &layout, enc).unwrap()
    }

    fn values(
        b: &HostBackend,
        rel: &DeviceRelation<crate::backend::HostBuffer>,
        n: usize,
    ) -> Vec<Vec<Option<i32>>> {
        let fields: Vec<Field> = (0..n)
            .map(|i| Field::new(format!("c{i}"), DataType::Int32, true))
            .collect();
        let batches = rel
            .download(b, &Arc::new(Schema::new(fields)), 1 << 20)
            .unwrap();
        (0..n)
            .map(|c| {
                (batches.iter())
                    .flat_map(|x| {
                        x.column(c)
                            .as_primitive::<Int32Type>()
                            .iter()
                            .collect::<Vec<_>>()
                    })
                    .collect()
            })
            .collect()
    }

    #[test]
    fn a_chain_joins_unique_dimensions_and_keeps_base_order() {
        let b = HostBackend::default();
        for direct in [false, true] {
            let fact = batch(&[
                (
                    "f0",
                    vec![Some(7), Some(9), Some(7), Some(8), None, Some(8)],
                ),
                (
                    "f1",
                    vec![Some(1), Some(2), Some(3), Some(1), Some(2), Some(4)],
                ),
                (
                    "p",
                    vec![Some(0), Some(1), Some(2), Some(3), Some(4), Some(5)],
                ),
            ]);
            let base = DeviceRelation::upload(&b, std::slice::from_ref(&fact), &[0, 1, 2]).unwrap();
            let d0 = batch(&[("k", vec![Some(8), Some(7)]), ("v", vec![Some(80), None])]);
            let d1 = batch(&[
                ("k", vec![Some(3), Some(1), Some(4), Some(2)]),
                ("v", vec![Some(30), Some(10), Some(40), Some(20)]),
            ]);
            let mut chain = Chain::new(&base);
            assert!(
                chain
                    .join(&b, &table(&b, &d0, direct), &[ChainColumn::Base(0)], &[1])
                    .unwrap()
            );
            // f0 = 9 has no dimension row, a null key none.
            assert_eq!(chain.rows(), 4);
            assert!(
                chain
                    .join(&b, &table(&b, &d1, direct), &[ChainColumn::Base(1)], &[1])
                    .unwrap()
            );
            let cols = [
                ChainColumn::Base(2),
                ChainColumn::Joined(0),
                ChainColumn::Joined(1),
            ];
            let out = chain.finish(&b, &cols).unwrap();
            assert_eq!(
                values(&b, &out, 3),
                vec![
                    vec![Some(0), Some(2), Some(3), Some(5)],
                    vec![None, None, Some(80), Some(80)],
                    vec![Some(10), Some(30), Some(10), Some(40)],
                ],
                "direct: {direct}"
            );
        }
    }

    #[test]
    fn null_build_keys_match_nothing_in_a_direct_table() {
        let b = HostBackend::default();
        // Build keys {0, 2, 3, null}: 2 bits, and the sentinel (the null key) hashes to the
        // bucket of key 1, which no build row holds.
        let dim = batch(&[
            ("k", vec![Some(0), Some(2), Some(3), None]),
            ("v", vec![Some(10), Some(20), Some(30), Some(99)]),
        ]);
        for direct in [false, true] {
            let fact = batch(&[("f", vec![Some(0), Some(1), Some(2), Some(3)])]);
            let base = DeviceRelation::upload(&b, std::slice::from_ref(&fact), &[0]).unwrap();
            let mut chain = Chain::new(&base);
            let table = table(&b, &dim, direct);
            assert!(
                chain
                    .join(&b, &table, &[ChainColumn::Base(0)], &[1])
                    .unwrap()
            );
            let out = chain
                .finish(&b, &[ChainColumn::Base(0), ChainColumn::Joined(0)])
                .unwrap();
            assert_eq!(
                values(&b, &out, 2),
                vec![
                    vec![Some(0), Some(2), Some(3)],
                    vec![Some(10), Some(20), Some(30)]
                ],
                "direct: {direct}"
            );
        }
    }

    #[test]
    fn key_columns_must_be_the_tables() {
        let b = HostBackend::default();
        let dim = batch(&[("k", vec![Some(1)]), ("v", vec![Some(1)])]);
        let fact = batch(&[("f", vec![Some(1)])]);
        let base = DeviceRelation::upload(&b, std::slice::from_ref(&fact), &[0]).unwrap();
        let mut chain = Chain::new(&base);
        let table = table(&b, &dim, false);
        assert!(chain.join(&b, &table, &[], &[1]).is_err());
        let two = [ChainColumn::Base(0), ChainColumn::Base(0)];
        assert!(chain.join(&b, &table, &two, &[1]).is_err());
        assert_eq!((chain.rows(), chain.joined()), (1, 0));
    }

    #[test]
    fn a_key_held_twice_is_no_lookup_and_every_row_found_moves_nothing() {
        let b = HostBackend::default();
        for direct in [false, true] {
            let fact = batch(&[("f", vec![Some(1), Some(2), Some(1)])]);
            let base = DeviceRelation::upload(&b, std::slice::from_ref(&fact), &[0]).unwrap();
            let twice = batch(&[
                ("k", vec![Some(1), Some(2), Some(1)]),
                ("v", vec![Some(1); 3]),
            ]);
            let mut chain = Chain::new(&base);
            assert!(
                !chain
                    .join(
                        &b,
                        &table(&b, &twice, direct),
                        &[ChainColumn::Base(0)],
                        &[1]
                    )
                    .unwrap()
            );
            assert_eq!((chain.rows(), chain.joined()), (3, 0));
            // A key held twice that no row probes does not matter.
            let unprobed = batch(&[
                ("k", vec![Some(1), Some(2), Some(5), Some(5)]),
                ("v", vec![Some(10), Some(20), Some(50), Some(50)]),
            ]);
            assert!(
                chain
                    .join(
                        &b,
                        &table(&b, &unprobed, direct),
                        &[ChainColumn::Base(0)],
                        &[1]
                    )
                    .unwrap()
            );
            assert!(chain.selection.is_none(), "every row found: no selection");
            let out = chain
                .finish(&b, &[ChainColumn::Joined(0), ChainColumn::Base(0)])
                .unwrap();
            assert_eq!(
                values(&b, &out, 2),
                vec![
                    vec![Some(10), Some(20), Some(10)],
                    vec![Some(1), Some(2), Some(1)]
                ]
            );
        }
    }
}
