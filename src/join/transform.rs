//! The transform every algorithm starts with: a relation's key columns encoded into one
//! fixed-width key per row, and the keys stably radix-partitioned with every column the join
//! needs moving along. PHJ-OM partitions both sides into partitions of about a thousand rows;
//! the streaming hash join partitions the build side into buckets of about two rows. Either
//! way the result is a [`TransformedRelation`]: keys, partition bounds and columns, all in
//! partition order.

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
        self.columns
            .get(&c)
            .ok_or_else(|| internal_datafusion_err!("transformed relation: no column {c}"))
    }
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
    // A column the output takes twice is moved once.
    let payload = needed(&[], payload);
    let rows = relation.rows;
    let encoded = encode_keys(backend, relation, keys, encoder)?;
    let columns = payload
        .iter()
        .map(|&c| Ok((c, relation.column(c)?)))
        .collect::<Result<Vec<_>>>()?;
    let carry: Vec<_> = columns.iter().flat_map(|(_, col)| col.planes()).collect();
    let mut parts = backend.partition(&encoded, rows, encoder.width(), bits, &carry)?;
    // The carried buffers come back in the order given: each column's values, validity.
    let mut moved = std::mem::take(&mut parts.carried).into_iter();
    let columns = columns
        .into_iter()
        .map(|(c, col)| {
            let col = col.map(rows, |_, _| {
                moved
                    .next()
                    .ok_or_else(|| internal_datafusion_err!("partition lost a column"))
            })?;
            Ok((c, col))
        })
        .collect::<Result<HashMap<_, _>>>()?;
    Ok(TransformedRelation {
        keys: parts,
        columns,
    })
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
