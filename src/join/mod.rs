//! The join algorithms, written once over [`crate::backend::Backend`]: the transform they share
//! (`transform`), PHJ-OM and SMJ-OM for relations already on the device (`phj`, `smj`, the
//! kernel-level benchmark's algorithms, both materializing from the transformed relations:
//! `materialize`), PHJ-UM, which gathers from the untransformed relations instead (`phj_um`;
//! SMJ-UM is in `smj`), and INLJ, which searches a sorted build side from the probe rows as
//! they are (`inlj`), the streaming engine's bucketed join (`hash`), which also joins
//! on checked keys (`checked`) and runs as HASH or DIRECT (`algorithm`: what
//! `gpu_join.algorithm` chooses between), and LOOKUP over the same tables where build keys are
//! unique, with the late-materializing join chain it makes cheap (`lookup`; library only), and
//! the exchange that deals relations on several devices out by key, so that each device joins
//! its own share (`exchange`; library only).

pub mod algorithm;
mod checked;
mod emission;
pub mod exchange;
pub mod hash;
mod inlj;
mod layout;
pub mod lookup;
mod materialize;
mod phases;
mod phj;
mod phj_um;
pub mod smj;
mod transform;

pub use algorithm::Algorithm;
pub use checked::{CheckedKeys, hash_checked_keys};
pub use emission::Emission;
pub use exchange::{
    DeviceShares, ExchangeSet, KeysFirst, exchange, exchange_partitioned, exchange_sets,
};
pub use inlj::index_nested_loop_join;
pub use layout::{OutputColumn, OutputLayout};
pub use lookup::{Chain, ChainColumn};
pub use phases::Phases;
pub use phj::{
    BuildSide, join_chunk, join_on_device, join_transformed, materialize, partition_bits,
};
pub use phj_um::join_untransformed;
pub use transform::{TransformedRelation, needed, transform};
