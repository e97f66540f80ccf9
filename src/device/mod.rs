//! The CUDA runtime, through cudarc: finding a usable device without panicking, compiling the
//! embedded kernels with NVRTC once per process and device, device memory from the crate's own
//! stream-ordered pool with accounting and a per-device budget, pinned host memory pools, the
//! copies between the two, the set of devices a join spreads over, and a measurement of pinned copy bandwidth.
//!
//! cudarc panics when libcuda or libnvrtc cannot be loaded, so every entry point here checks
//! for the libraries first and turns "no library", "no device" and "compile failed" into
//! errors.

mod bandwidth;
mod budget;
mod context;
mod devices;
mod host_memory;
mod kernels;
mod memory;
mod transfer;

pub use bandwidth::{CopyBandwidth, pinned_copy_bandwidth};
pub use budget::{Holder, MemoryBudget, QueryOf, Reservation};
pub use context::{
    CudaDevice, OUTPUT_PAGES, SCALAR_PAGES, STAGING_PAGES, cuda_device, opened_devices, probe_cuda,
};
pub use devices::{Devices, device_count};
pub use host_memory::{HostBlock, HostPool, Pages};
pub use kernels::{
    BLOCK_THREADS, BOUNDS_RUN, ENCODE_ITEMS, GATHER_ITEMS, JOIN_CHUNK, KERNEL_CONSTANTS,
    MAX_PLANES, MERGE_ITEMS, PART_ITEMS, PROBE_ROUNDS, SCAN_ITEMS, WARPS, compile_filter_for_arch,
    compile_kernels_for_arch, cuda_include_dirs,
};
pub use memory::{DeviceBuffer, DevicePool, MemoryTracker, driver_error};
pub use transfer::{
    device_to_device, device_to_host, device_to_peer, device_to_slice, fence_after, fill,
    host_to_device, mapped_address, slices_to_device, zero,
};
