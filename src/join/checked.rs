//! [`CheckedKeys`]: a hashed key checked on the device (one string or binary column, see
//! `exec::key_check`). Each side stages it as its length classes (a byte a row, in the key
//! column) and its check bytes: one to four columns (words) of 16 bytes a row, word j holding
//! bytes 16j..16j + 15 of each key, as many as the build side's longest key needs (a key of up
//! to 16 bytes, one; of 36 bytes, three). On the device the classes are replaced
//! by the keys' hashes ([`hash_checked_keys`]), which the join then encodes like any integer
//! key, and a match must agree on the check bytes too ([`KeyCheck`](crate::backend::KeyCheck)).

use datafusion::common::{Result, internal_err};

use super::layout::OutputLayout;
use crate::backend::Backend;
use crate::columns::{ColumnKind, DeviceRelation};

/// Where a join's checked key lives on each side, and the bits its hashes keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckedKeys {
    /// The build side's first column of check bytes (the others follow it).
    pub build: usize,
    /// The probe side's first column of check bytes (the others follow it).
    pub probe: usize,
    /// The columns (words of 16 bytes) of check bytes on each side.
    pub words: usize,
    /// The hash bits kept (all 62 but in tests that force collisions).
    pub mask: u64,
}

/// Where `layout`'s key is checked, enqueues on `backend` the hashing of `relation`'s staged
/// key ([`CheckedKeys::hash`]): the join's build side if `build`, else a probe chunk. Nothing
/// for other keys.
pub fn hash_checked_keys<B: Backend>(
    backend: &B,
    layout: &OutputLayout,
    build: bool,
    relation: &mut DeviceRelation<B::Buf>,
    keep: &mut Vec<B::Buf>,
) -> Result<()> {
    let Some(check) = &layout.check else {
        return Ok(());
    };
    let (keys, column) = match build {
        true => (&layout.build_keys, check.build),
        false => (&layout.probe_keys, check.probe),
    };
    let [key] = keys.as_slice() else {
        return internal_err!("a checked key of {} columns", keys.len());
    };
    check.hash(backend, relation, *key, column, keep)
}

impl CheckedKeys {
    /// The build side's columns of check bytes.
    pub fn build_columns(&self) -> std::ops::Range<usize> {
        self.build..self.build + self.words
    }

    /// The probe side's columns of check bytes.
    pub fn probe_columns(&self) -> std::ops::Range<usize> {
        self.probe..self.probe + self.words
    }

    /// Enqueues on `backend` the hashing of a staged relation's checked key: its key column
    /// `key` (length classes, with validity where nulls never match) becomes the keys' hashes
    /// (u64, same validity), from the classes and the check bytes of columns `check` on. The class
    /// bytes go into `keep`: they were copied on another queue and may be freed only once the
    /// hashing has run.
    fn hash<B: Backend>(
        &self,
        backend: &B,
        relation: &mut DeviceRelation<B::Buf>,
        key: usize,
        check: usize,
        keep: &mut Vec<B::Buf>,
    ) -> Result<()> {
        let rows = relation.rows;
        let hashes = {
            let classes = relation.column(key)?;
            let words = (check..check + self.words)
                .map(|c| relation.column(c))
                .collect::<Result<Vec<_>>>()?;
            if classes.kind != ColumnKind::Fixed(1)
                || words.iter().any(|w| w.kind != ColumnKind::Fixed(16))
            {
                return internal_err!("a checked key staged as {:?}", classes.kind);
            }
            let words: Vec<&B::Buf> = words.iter().map(|w| &w.values).collect();
            backend.hash_checked(&words, &classes.values, rows, self.mask)?
        };
        let Some(column) = relation.columns.get_mut(&key) else {
            return internal_err!("no checked key column {key}");
        };
        column.kind = ColumnKind::Fixed(8);
        keep.push(std::mem::replace(&mut column.values, hashes));
        Ok(())
    }
}
