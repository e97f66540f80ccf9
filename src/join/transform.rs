//! The transform every algorithm starts with: a relation's key columns encoded into one
//! fixed-width key per row, and the keys stably radix-partitioned with every column the join
//! needs moving along. PHJ-OM partitions both sides into partitions of about a thousand rows;
//! the streaming hash join partitions the build side into buckets of about two rows. Either
//! way the result is a [`TransformedRelation`]: keys, partition bounds and columns, all in
//! partition order. SMJ-OM sorts instead (`join::smj`), moving its columns the same way
//! ([`Carry`]: the columns as the planes a radix pass carries, and back).

use std::collections::HashMap;

use datafusion::common::{Result, internal_datafusion_err};

use crate::backend::{Backend, Partitioned};
use crate::columns::{DeviceColumn, DeviceRelation, KeyEncoder};

/// A relation transformed for a join: its partitioned keys and its needed columns, each in
/// partition order.
#[derive(Debug)]
pub struct TransformedRelation<B: Backend> {
    pub keys: Partitioned<B::Buf>,
    pub columns: HashMap<usize, DeviceColumn<B::Buf>>,
}

impl<B: Backend> TransformedRelation<B> {
    /// Rows of the relation.
    pub fn rows(&self) -> usize {
        self.keys.rows
    }

    /// The column with index `c`, or an internal error if it was not carried.
    pub fn column(&self, c: usize) -> Result<&DeviceColumn<B::Buf>> {
        column_of(&self.columns, c)
    }
}

/// Column `c` of a transformed relation's `columns` (partitioned or sorted), or an internal
/// error if it was not carried.
pub(crate) fn column_of<Buf>(
    columns: &HashMap<usize, DeviceColumn<Buf>>,
    c: usize,
) -> Result<&DeviceColumn<Buf>> {
    columns
        .get(&c)
        .ok_or_else(|| internal_datafusion_err!("transformed relation: no column {c}"))
}

/// Encodes the `keys` columns of `relation` with `encoder` and partitions them into `2^bits`
/// partitions, moving every column in `payload` with them. Enqueued on `backend`.
pub fn transform<B: Backend>(
    backend: &B,
    relation: &DeviceRelation<B::Buf>,
    keys: &[usize],
    payload: &[usize],
    encoder: &KeyEncoder,
    bits: u32,
) -> Result<TransformedRelation<B>> {
    let encoded = encode_keys(backend, relation, keys, encoder)?;
    let carry = Carry::of(relation, payload)?;
    let mut parts = backend.partition(
        &encoded,
        relation.rows,
        encoder.width(),
        bits,
        &carry.planes(),
    )?;
    let columns = carry.moved(std::mem::take(&mut parts.carried))?;
    Ok(TransformedRelation {
        keys: parts,
        columns,
    })
}

/// The columns a transform moves with the keys (a column the output takes twice is moved
/// once), as the planes a partitioning or sorting pass carries, and back.
pub(crate) struct Carry<'a, Buf> {
    rows: usize,
    columns: Vec<(usize, &'a DeviceColumn<Buf>)>,
}

impl<'a, Buf> Carry<'a, Buf> {
    /// The columns `payload` of `relation`.
    pub(crate) fn of(relation: &'a DeviceRelation<Buf>, payload: &[usize]) -> Result<Self> {
        let columns = needed(&[], payload)
            .into_iter()
            .map(|c| Ok((c, relation.column(c)?)))
            .collect::<Result<Vec<_>>>()?;
        Ok(Self {
            rows: relation.rows,
            columns,
        })
    }

    /// Each column's planes (values, then validity), with their widths.
    pub(crate) fn planes(&self) -> Vec<(&'a Buf, usize)> {
        self.columns
            .iter()
            .flat_map(|(_, col)| col.planes())
            .collect()
    }

    /// The columns again, from the moved planes in the order [`planes`](Self::planes) gave
    /// them.
    pub(crate) fn moved(self, planes: Vec<Buf>) -> Result<HashMap<usize, DeviceColumn<Buf>>> {
        let mut moved = planes.into_iter();
        self.columns
            .into_iter()
            .map(|(c, col)| {
                let col = col.map(self.rows, |_, _| {
                    moved
                        .next()
                        .ok_or_else(|| internal_datafusion_err!("a radix pass lost a column"))
                })?;
                Ok((c, col))
            })
            .collect()
    }
}

/// The `keys` columns of `relation` encoded with `encoder`, one key per row. Enqueued on
/// `backend`.
pub(crate) fn encode_keys<B: Backend>(
    backend: &B,
    relation: &DeviceRelation<B::Buf>,
    keys: &[usize],
    encoder: &KeyEncoder,
) -> Result<B::Buf> {
    let key_bufs = keys
        .iter()
        .map(|&c| {
            let col = relation.column(c)?;
            Ok((&col.values, col.validity.as_ref()))
        })
        .collect::<Result<Vec<_>>>()?;
    encoder.encode(backend, &key_bufs, relation.rows)
}

/// The columns of a relation that a join reads: its keys and the columns the output takes.
pub fn needed(keys: &[usize], payload: &[usize]) -> Vec<usize> {
    let mut needed: Vec<usize> = keys.iter().chain(payload).copied().collect();
    needed.sort_unstable();
    needed.dedup();
    needed
}
