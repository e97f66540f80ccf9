//! Copies between host and device memory, enqueued on a stream. These wrappers hold the crate's
//! only raw copy calls; each checks the ranges first.
//!
//! A copy to or from a [`HostBlock`] is asynchronous: the block is fenced with an event recorded
//! right after the copy, and its bytes cannot be reached (nor the block reused) until that event
//! completes. A copy from or to plain slices returns only once the host side is done with them:
//! the wrapper waits for its stream.
//!
//! A kernel may also write a pinned block directly ([`mapped_address`]): its stores cross PCIe
//! themselves, so a few bytes never wait behind other queues' large copies on the copy engines.

use std::sync::Arc;

use cudarc::driver::sys::{self, CUevent_flags};
use cudarc::driver::{CudaStream, result};
use datafusion::common::{Result, internal_err};

use super::host_memory::HostBlock;
use super::memory::{DeviceBuffer, bind, driver_error};

fn check(what: &str, len: usize, offset: usize, have: usize) -> Result<()> {
    match offset.checked_add(len) {
        Some(end) if end <= have => Ok(()),
        _ => internal_err!("{what}: {len} bytes at {offset} do not fit a buffer of {have} bytes"),
    }
}

/// Records an event on `stream` after the work enqueued so far.
fn mark(stream: &Arc<CudaStream>) -> Result<cudarc::driver::CudaEvent> {
    let event = stream
        .context()
        .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
        .map_err(|e| driver_error(e, "create event"))?;
    event
        .record(stream)
        .map_err(|e| driver_error(e, "record event"))?;
    Ok(event)
}

/// The device address of bytes `offset..offset + len` of `block`, for a kernel on `stream` to
/// write there, if the block is page-locked memory of `stream`'s context (mapped into the
/// device's address space); `None` otherwise. The caller fences the block after the kernel
/// ([`fence_after`]).
pub fn mapped_address(
    stream: &Arc<CudaStream>,
    block: &mut HostBlock,
    offset: usize,
    len: usize,
) -> Result<Option<u64>> {
    if !block
        .pinned_by()
        .is_some_and(|ctx| Arc::ptr_eq(ctx, stream.context()))
    {
        return Ok(None);
    }
    let host = block.address(offset, len)?;
    bind(stream.context())?;
    let mut device: sys::CUdeviceptr = 0;
    // SAFETY: `host` points into memory allocated by `cuMemHostAlloc` in this context (checked
    // above), and `device` is a valid out-pointer; flags must be 0.
    unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host.cast(), 0) }
        .result()
        .map_err(|e| driver_error(e, "map host memory"))?;
    Ok(Some(device))
}

/// Fences `block` with an event recorded on `stream` after the work enqueued so far (a kernel
/// that writes it through [`mapped_address`]).
pub fn fence_after(stream: &Arc<CudaStream>, block: &mut HostBlock) -> Result<()> {
    block.fence(mark(stream)?);
    Ok(())
}

/// Enqueues a copy of `len` bytes from `src` at `src_offset` into `dst` at `dst_offset`.
pub fn host_to_device(
    stream: &Arc<CudaStream>,
    src: &mut HostBlock,
    src_offset: usize,
    dst: &mut DeviceBuffer,
    dst_offset: usize,
    len: usize,
) -> Result<()> {
    check("copy to device", len, dst_offset, dst.len())?;
    if len == 0 {
        return Ok(());
    }
    let from = src.address(src_offset, len)?;
    bind(stream.context())?;
    // SAFETY: `from..from + len` lies in `src` (checked by `address`) and `dst_offset + len` in
    // `dst` (checked above). `src` is fenced just below, so the host cannot touch or reuse the
    // bytes until the copy has read them; `dst` is freed only after the work that uses it.
    unsafe {
        let bytes = std::slice::from_raw_parts(from.cast_const(), len);
        result::memcpy_htod_async(dst.ptr_mut() + dst_offset as u64, bytes, stream.cu_stream())
    }
    .map_err(|e| driver_error(e, "copy to device"))?;
    src.fence(mark(stream)?);
    Ok(())
}

/// Enqueues a copy of `len` bytes from `src` at `src_offset` into `dst` at `dst_offset`.
pub fn device_to_host(
    stream: &Arc<CudaStream>,
    src: &DeviceBuffer,
    src_offset: usize,
    dst: &mut HostBlock,
    dst_offset: usize,
    len: usize,
) -> Result<()> {
    check("copy to host", len, src_offset, src.len())?;
    if len == 0 {
        return Ok(());
    }
    let to = dst.address(dst_offset, len)?;
    bind(stream.context())?;
    // SAFETY: the ranges are checked as in `host_to_device`; `dst` is fenced just below, so the
    // host reads the bytes only after the copy has written them.
    unsafe {
        let bytes = std::slice::from_raw_parts_mut(to, len);
        result::memcpy_dtoh_async(bytes, src.ptr() + src_offset as u64, stream.cu_stream())
    }
    .map_err(|e| driver_error(e, "copy to host"))?;
    dst.fence(mark(stream)?);
    Ok(())
}

/// Copies host byte slices, one after another, into `dst` from its start; returns once the
/// copies have finished, so the slices may be reused (whether pageable or pinned memory).
pub fn slices_to_device(
    stream: &Arc<CudaStream>,
    parts: &[&[u8]],
    dst: &mut DeviceBuffer,
) -> Result<()> {
    let total = parts.iter().map(|p| p.len()).sum();
    check("copy to device", total, 0, dst.len())?;
    bind(stream.context())?;
    let mut at = 0u64;
    for p in parts.iter().filter(|p| !p.is_empty()) {
        // SAFETY: the parts together fit `dst` (checked above). The stream is synchronized
        // below, before any part is given back to the caller, so every copy has read its part
        // (from pinned memory the copy is asynchronous; from pageable memory the driver takes
        // the bytes before returning).
        unsafe { result::memcpy_htod_async(dst.ptr_mut() + at, p, stream.cu_stream()) }
            .map_err(|e| driver_error(e, "copy to device"))?;
        at += p.len() as u64;
    }
    stream
        .synchronize()
        .map_err(|e| driver_error(e, "synchronize"))
}

/// Copies `dst.len()` bytes of `src` from `src_offset` into pageable host memory, waiting for
/// the work enqueued on `stream` before it and for the copy itself.
pub fn device_to_slice(
    stream: &Arc<CudaStream>,
    src: &DeviceBuffer,
    src_offset: usize,
    dst: &mut [u8],
) -> Result<()> {
    check("copy to host", dst.len(), src_offset, src.len())?;
    if dst.is_empty() {
        return Ok(());
    }
    bind(stream.context())?;
    // SAFETY: the ranges are checked above. The stream is synchronized before `dst` is returned
    // to the caller, so the copy has finished writing it.
    unsafe { result::memcpy_dtoh_async(dst, src.ptr() + src_offset as u64, stream.cu_stream()) }
        .map_err(|e| driver_error(e, "copy to host"))?;
    stream
        .synchronize()
        .map_err(|e| driver_error(e, "synchronize"))
}

/// Enqueues a copy of `len` bytes between two device buffers.
pub fn device_to_device(
    stream: &Arc<CudaStream>,
    src: &DeviceBuffer,
    src_offset: usize,
    dst: &mut DeviceBuffer,
    dst_offset: usize,
    len: usize,
) -> Result<()> {
    check("device copy source", len, src_offset, src.len())?;
    check("device copy target", len, dst_offset, dst.len())?;
    if len == 0 {
        return Ok(());
    }
    bind(stream.context())?;
    // SAFETY: both ranges are checked above and both buffers outlive the enqueued work.
    unsafe {
        result::memcpy_dtod_async(
            dst.ptr_mut() + dst_offset as u64,
            src.ptr() + src_offset as u64,
            len,
            stream.cu_stream(),
        )
    }
    .map_err(|e| driver_error(e, "device copy"))
}

/// Enqueues on `stream` a copy of `len` bytes from `src` into `dst`, which may live on another
/// device than `src` (a peer copy; [`DevicePool::grant`](super::DevicePool::grant) lets it take
/// the direct link). `stream` must belong to `src`'s device; `dst` must be ready for `stream`
/// (allocated on it, or before an event it waits for), and neither buffer may be freed before
/// the copy is done.
pub fn device_to_peer(
    stream: &Arc<CudaStream>,
    src: &DeviceBuffer,
    src_offset: usize,
    dst: &mut DeviceBuffer,
    dst_offset: usize,
    len: usize,
) -> Result<()> {
    check("peer copy source", len, src_offset, src.len())?;
    check("peer copy target", len, dst_offset, dst.len())?;
    if src.context().ordinal() != stream.context().ordinal() {
        return internal_err!("peer copy: the stream is not on the source's device");
    }
    if len == 0 {
        return Ok(());
    }
    bind(stream.context())?;
    let (dst_ctx, src_ctx) = (dst.context().cu_ctx(), src.context().cu_ctx());
    // SAFETY: both ranges are checked above and both contexts are alive (each buffer holds its
    // stream, which holds its context). That both buffers outlive the enqueued copy is the
    // caller's duty under the ownership rule of `backend`: `dst` is freed on another device's
    // stream, which must wait for an event recorded on `stream` after this copy.
    unsafe {
        sys::cuMemcpyPeerAsync(
            dst.ptr_mut() + dst_offset as u64,
            dst_ctx,
            src.ptr() + src_offset as u64,
            src_ctx,
            len,
            stream.cu_stream(),
        )
    }
    .result()
    .map_err(|e| driver_error(e, "peer copy"))
}

/// Enqueues setting every byte of `dst` to zero.
pub fn zero(stream: &Arc<CudaStream>, dst: &mut DeviceBuffer) -> Result<()> {
    fill(stream, dst, 0)
}

/// Enqueues setting every byte of `dst` to `byte`.
pub fn fill(stream: &Arc<CudaStream>, dst: &mut DeviceBuffer, byte: u8) -> Result<()> {
    let len = dst.len();
    bind(stream.context())?;
    // SAFETY: the memset writes the buffer's `len` bytes and no more; `dst` is borrowed mutably,
    // and the ownership rule of `backend` keeps it alive until the stream has done the memset.
    unsafe { result::memset_d8_async(dst.ptr_mut(), byte, len, stream.cu_stream()) }
        .map_err(|e| driver_error(e, "memset"))
}
