//! Arrow arrays ⇄ backend columns and relations, and join-key encoding.

mod fixed;
mod keys;
mod relation;

pub use fixed::{ColumnKind, DeviceColumn, download_column, upload_column};
pub use keys::{Fitted, KeyEncoder, key_type};
pub use relation::DeviceRelation;
