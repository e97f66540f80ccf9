//! Arrow arrays ⇄ backend columns, and join-key encoding.

mod fixed;
mod keys;

pub use fixed::{ColumnKind, DeviceColumn, download_column, upload_column};
pub use keys::{Fitted, KeyEncoder, key_type};
