//! The CUDA runtime, through cudarc: finding a usable device without panicking, compiling the
//! embedded kernels with NVRTC once per process and device, tracked device memory from the
//! device's stream-ordered pool (which keeps freed memory for reuse), pinned staging, and a
//! measurement of pinned copy bandwidth.
//!
//! cudarc panics when libcuda or libnvrtc cannot be loaded, so every entry point here checks
//! for the libraries first and turns "no library", "no device" and "compile failed" into
//! errors.

mod bandwidth;
mod context;
mod kernels;
mod memory;
mod staging;

pub use bandwidth::{CopyBandwidth, pinned_copy_bandwidth};
pub use context::{CudaDevice, cuda_device, probe_cuda};
pub use kernels::{compile_kernels_for_arch, cuda_include_dirs};
pub use memory::{DeviceBuffer, MemoryTracker, driver_error};
pub use staging::{STAGE_BYTES, StagingPool};
