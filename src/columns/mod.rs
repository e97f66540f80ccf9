//! Arrow arrays ⇄ backend columns and relations, columns laid out in host blocks (what crosses
//! PCIe, packed where values span a narrow range), and join-key encoding.

mod block;
mod fixed;
mod frame;
mod keys;
mod relation;
mod staged;
mod stream_copy;

pub use block::{
    BlockColumn, BlockLayout, BlockRows, bitmap_bytes, block_arrays, clear_bitmaps, copy_off,
    stage_column, stage_packed, stage_validity, values_range, widen_column,
};
pub use fixed::{ColumnKind, DeviceColumn, download_column, upload_column, value_bytes};
pub use frame::{Frame, ValueSpan, pack_values, span_of, unpack_values};
pub use keys::{Fitted, KeyEncoder, KeyRange, key_type};
pub use relation::DeviceRelation;
pub use staged::{RawColumn, RawColumns, concat, upload_block};
