//! [`CheckedKeys`]: a hashed key checked on the device (one string or binary column, see
//! `exec::key_check`). Each side stages it as two columns: its length classes (a byte a row, in
//! the key column) and its check bytes (16 bytes a row). On the device the classes are replaced
//! by the keys' hashes ([`hash_checked_keys`]), which the join then encodes like any integer
//! key, and a match must agree on the check bytes too ([`KeyCheck`](crate::backend::KeyCheck)).

use datafusion::common::{Result, internal_err};

use super::layout::OutputLayout;
use crate::backend::Backend;
use crate::columns::{ColumnKind, DeviceRelation};

/// Where a join's checked key lives on each side, and the bits its hashes keep.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CheckedKeys {
    /// The build side's column of check bytes.
    pub build: usize,
    /// The probe side's column of check bytes.
    pub probe: usize,
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
    /// Enqueues on `backend` the hashing of a staged relation's checked key: its key column
    /// `key` (length classes, with validity where nulls never match) becomes the keys' hashes
    /// (u64, same validity), from the classes and the check bytes of column `check`. The class
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
            let (classes, check) = (relation.column(key)?, relation.column(check)?);
            if classes.kind != ColumnKind::Fixed(1) || check.kind != ColumnKind::Fixed(16) {
                return internal_err!(
                    "a checked key staged as {:?} and {:?}",
                    classes.kind,
                    check.kind
                );
            }
            backend.hash_checked(&check.values, &classes.values, rows, self.mask)?
        };
        let Some(column) = relation.columns.get_mut(&key) else {
            return internal_err!("no checked key column {key}");
        };
        column.kind = ColumnKind::Fixed(8);
        keep.push(std::mem::replace(&mut column.values, hashes));
        Ok(())
    }
}
