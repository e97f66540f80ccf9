//! The join algorithms, written once over [`crate::backend::Backend`].

mod phases;
mod phj;

pub use phases::Phases;
pub use phj::{BuildSide, OutputColumn, OutputLayout, join_chunk, join_on_device, partition_bits};
