//! Staged columns on their way to the device: a host block of staged batches
//! ([`BlockLayout`]) copied raw ([`upload_block`], on an upload queue), then turned into
//! backend columns with bytes for bitmaps and packed values widened again
//! ([`RawColumns::unpack`], on a compute queue), and parts of one relation concatenated
//! ([`concat`]).

use std::collections::HashMap;

use datafusion::common::{Result, internal_err};

use super::block::{BlockLayout, bitmap_bytes};
use super::fixed::{ColumnKind, DeviceColumn};
use super::frame::Frame;
use super::relation::DeviceRelation;
use crate::backend::Backend;
use crate::device::HostBlock;

/// The columns of a staged block as copied.
#[derive(Debug)]
pub struct RawColumns<Buf> {
    pub rows: usize,
    pub columns: Vec<RawColumn<Buf>>,
}

/// One column of a staged block as copied.
#[derive(Debug)]
pub struct RawColumn<Buf> {
    /// The column's index in the relation.
    pub index: usize,
    pub kind: ColumnKind,
    /// Its values (booleans still as bitmaps; packed values as their offsets).
    pub values: Buf,
    /// The validity bitmap, where some row is null.
    pub validity: Option<Buf>,
    /// The frame the values are packed in, if they are.
    pub frame: Option<Frame>,
}

/// Enqueues on `queue` the copies of the first `rows` rows of each column of `block` (laid out
/// by `layout`; `has_nulls[c]`: whether column c's validity was filled in; `frames[c]`: the
/// frame its values are packed in; `indices[c]`: its index in the relation).
pub fn upload_block<B: Backend>(
    queue: &B,
    block: &mut HostBlock,
    layout: &BlockLayout,
    rows: usize,
    has_nulls: &[bool],
    frames: &[Option<Frame>],
    indices: &[usize],
) -> Result<RawColumns<B::Buf>> {
    let n = layout.columns.len();
    if n != has_nulls.len() || n != indices.len() || n != frames.len() {
        return internal_err!("upload_block: layout, null flags, frames and indices differ");
    }
    let columns = layout
        .columns
        .iter()
        .zip(has_nulls)
        .zip(frames)
        .zip(indices)
        .map(|(((col, &has_nulls), frame), &index)| {
            let bytes = match frame {
                Some(f) => rows * f.width,
                None => col.values_bytes(rows),
            };
            let mut values = queue.alloc(bytes)?;
            queue.copy_to_device(block, col.values, &mut values, 0, bytes)?;
            let validity = match col.validity {
                Some(offset) if has_nulls => {
                    let bytes = bitmap_bytes(rows);
                    let mut bits = queue.alloc(bytes)?;
                    queue.copy_to_device(block, offset, &mut bits, 0, bytes)?;
                    Some(bits)
                }
                _ => None,
            };
            Ok(RawColumn {
                index,
                kind: col.kind,
                values,
                validity,
                frame: *frame,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    Ok(RawColumns { rows, columns })
}

impl<Buf> RawColumns<Buf> {
    /// Device bytes of the raw columns.
    pub fn bytes<B: Backend<Buf = Buf>>(&self) -> usize {
        self.columns
            .iter()
            .map(|c| B::buf_len(&c.values) + c.validity.as_ref().map_or(0, B::buf_len))
            .sum()
    }

    /// Bytes packing kept from being copied: what the packed columns' values would have taken
    /// over what they took.
    pub fn bytes_saved(&self) -> usize {
        self.columns
            .iter()
            .filter_map(|c| Some(self.rows * (c.kind.width() - c.frame?.width)))
            .sum()
    }

    /// Enqueues on `queue` the unpacking of bitmaps into bytes and of packed values into
    /// values: backend columns. What was unpacked goes into `keep`: it may be dropped only once
    /// the unpacking has run (it was copied on another queue, which frees in its own order).
    pub fn unpack<B: Backend<Buf = Buf>>(
        self,
        queue: &B,
        keep: &mut Vec<Buf>,
    ) -> Result<DeviceRelation<Buf>> {
        let rows = self.rows;
        let columns = self
            .columns
            .into_iter()
            .map(|raw| {
                let RawColumn {
                    index,
                    kind,
                    values,
                    validity,
                    frame,
                } = raw;
                let values = match (kind, frame) {
                    (ColumnKind::Boolean, _) => {
                        let bytes = queue.unpack_bits(&values, rows)?;
                        keep.push(values);
                        bytes
                    }
                    (ColumnKind::Fixed(w), Some(frame)) => {
                        let wide = queue.unframe(&values, rows, w, &frame)?;
                        keep.push(values);
                        wide
                    }
                    (ColumnKind::Fixed(_), None) => values,
                };
                let validity = match validity {
                    Some(bits) => {
                        let bytes = queue.unpack_bits(&bits, rows)?;
                        keep.push(bits);
                        Some(bytes)
                    }
                    None => None,
                };
                Ok((
                    index,
                    DeviceColumn {
                        kind,
                        values,
                        validity,
                        rows,
                    },
                ))
            })
            .collect::<Result<HashMap<_, _>>>()?;
        Ok(DeviceRelation { columns, rows })
    }
}

/// Enqueues on `queue` the concatenation of relations with the same columns into one. A column
/// that has validity in some part gets validity in all (bytes of 1 where a part had none).
pub fn concat<B: Backend>(
    queue: &B,
    parts: &[DeviceRelation<B::Buf>],
) -> Result<DeviceRelation<B::Buf>> {
    let rows: usize = parts.iter().map(|p| p.rows).sum();
    let Some(first) = parts.first() else {
        return Ok(DeviceRelation {
            columns: HashMap::new(),
            rows: 0,
        });
    };
    let mut columns = HashMap::new();
    for (&index, col) in &first.columns {
        let width = col.kind.width();
        let mut values = queue.alloc(rows * width)?;
        let nullable = parts
            .iter()
            .any(|p| p.columns.get(&index).is_some_and(|c| c.validity.is_some()));
        let mut validity = nullable.then(|| queue.alloc(rows)).transpose()?;
        let mut at = 0;
        for part in parts {
            let Some(c) = part.columns.get(&index) else {
                return internal_err!("concat: a part lacks column {index}");
            };
            queue.copy_within(&c.values, 0, &mut values, at * width, part.rows * width)?;
            if let Some(v) = validity.as_mut() {
                match &c.validity {
                    Some(src) => queue.copy_within(src, 0, v, at, part.rows)?,
                    None => {
                        let ones = queue.upload(&vec![1u8; part.rows])?;
                        queue.copy_within(&ones, 0, v, at, part.rows)?;
                    }
                }
            }
            at += part.rows;
        }
        columns.insert(
            index,
            DeviceColumn {
                kind: col.kind,
                values,
                validity,
                rows,
            },
        );
    }
    Ok(DeviceRelation { columns, rows })
}
