//! [`CudaBackend`]: one CUDA stream of one device, and the [`Backend`] primitives on it. The
//! launch wrappers live in one module per kernel file (`scan.rs` for `kernels/scan.cu`, ...);
//! each checks buffer sizes, then launches ([`launch!`]), taking its outputs `&mut`.

pub(crate) mod launch;

mod bucket_probe;
mod columns;
mod hash_join;
mod keys;
mod merge_join;
mod partition;
mod planes;
mod scan;
mod select;
mod views;

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use cudarc::driver::{CudaEvent, CudaStream};
use datafusion::common::Result;

use super::{
    Backend, FilterInput, Keep, KeyCheck, KeyColumnEncoding, KeyWidth, Looked, MatchIndices,
    Partitioned, ProbeEmit, Sorted, ViewData, check_len, check_positions,
};
use crate::columns::Frame;
use crate::device::{
    self, CudaDevice, DeviceBuffer, HostBlock, HostPool, MemoryBudget, MemoryTracker, driver_error,
};

/// Runs the join primitives on one CUDA stream of one device.
#[derive(Debug, Clone)]
pub struct CudaBackend {
    device: Arc<CudaDevice>,
    stream: Arc<CudaStream>,
    tracker: Arc<MemoryTracker>,
}

impl CudaBackend {
    /// A backend on a new stream of `device`, counting its memory in `tracker`.
    pub fn new(device: Arc<CudaDevice>, tracker: Arc<MemoryTracker>) -> Result<Self> {
        let stream = device.new_stream()?;
        Ok(Self {
            device,
            stream,
            tracker,
        })
    }

    /// The device this backend runs on.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    /// The stream work is enqueued on.
    pub(crate) fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The u64 (`width` 8) or u32 (`width` 4) at `byte_offset` of `buf`, waiting for the queue.
    fn read_scalar(&self, buf: &DeviceBuffer, byte_offset: usize, width: usize) -> Result<u64> {
        let mut bytes = [0u8; 8];
        device::device_to_slice(&self.stream, buf, byte_offset, &mut bytes[..width])?;
        Ok(u64::from_le_bytes(bytes))
    }

    /// Where a match finding's count → scan leaves it: the number of pairs, `offsets[groups]`
    /// (u64, read back, waiting for the queue), and a buffer of that many u32 positions for each
    /// side; an error past 2^32 pairs.
    fn pair_buffers(
        &self,
        offsets: &DeviceBuffer,
        groups: usize,
    ) -> Result<(usize, DeviceBuffer, DeviceBuffer)> {
        let len = self.read_scalar(offsets, groups * 8, 8)? as usize;
        if len > u32::MAX as usize {
            return datafusion::common::resources_err!(
                "join output of {len} rows exceeds 2^32 rows in one piece"
            );
        }
        Ok((len, self.alloc(len * 4)?, self.alloc(len * 4)?))
    }

    /// A match finding's output without pairs.
    fn no_matches(&self) -> Result<MatchIndices<DeviceBuffer>> {
        Ok(MatchIndices {
            build: self.alloc(0)?,
            probe: self.alloc(0)?,
            len: 0,
        })
    }
}

impl Backend for CudaBackend {
    type Buf = DeviceBuffer;
    type Event = CudaEvent;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn fork(&self) -> Result<Self> {
        Self::new(Arc::clone(&self.device), Arc::clone(&self.tracker))
    }

    fn record(&self) -> Result<CudaEvent> {
        let event = self.device.new_event()?;
        event
            .record(&self.stream)
            .map_err(|e| driver_error(e, "record event"))?;
        Ok(event)
    }

    fn wait(&self, event: &CudaEvent) -> Result<()> {
        self.stream
            .wait(event)
            .map_err(|e| driver_error(e, "wait for event"))
    }

    fn is_done(&self, event: &CudaEvent) -> Result<bool> {
        event
            .try_is_complete()
            .map_err(|e| driver_error(e, "query event"))
    }

    fn block_on(&self, event: &CudaEvent) -> Result<()> {
        event
            .synchronize()
            .map_err(|e| driver_error(e, "wait for event"))
    }

    fn elapsed(&self, start: &CudaEvent, end: &CudaEvent) -> Result<Duration> {
        let ms = start
            .elapsed_ms(end)
            .map_err(|e| driver_error(e, "time events"))?;
        Ok(Duration::from_secs_f64(f64::from(ms.max(0.0)) / 1e3))
    }

    fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| driver_error(e, "synchronize"))
    }

    fn tracker(&self) -> &Arc<MemoryTracker> {
        &self.tracker
    }

    fn budget(&self) -> &Arc<MemoryBudget> {
        self.device.budget()
    }

    fn staging(&self) -> &HostPool {
        self.device.staging()
    }

    fn output(&self) -> &HostPool {
        self.device.output()
    }

    fn scalars(&self) -> &HostPool {
        self.device.scalars()
    }

    fn alloc(&self, bytes: usize) -> Result<DeviceBuffer> {
        DeviceBuffer::alloc(self.device.pool(), &self.stream, bytes, &self.tracker)
    }

    fn buf_len(buf: &DeviceBuffer) -> usize {
        buf.len()
    }

    fn copy_to_device(
        &self,
        src: &mut HostBlock,
        src_offset: usize,
        dst: &mut DeviceBuffer,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        device::host_to_device(&self.stream, src, src_offset, dst, dst_offset, len)
    }

    fn copy_to_host(
        &self,
        src: &DeviceBuffer,
        src_offset: usize,
        dst: &mut HostBlock,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        device::device_to_host(&self.stream, src, src_offset, dst, dst_offset, len)
    }

    fn read_u64(&self, src: &DeviceBuffer, index: usize, dst: &mut HostBlock) -> Result<()> {
        scan::read_u64(self, src, index, dst)
    }

    fn copy_within(
        &self,
        src: &DeviceBuffer,
        src_offset: usize,
        dst: &mut DeviceBuffer,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        device::device_to_device(&self.stream, src, src_offset, dst, dst_offset, len)
    }

    fn copy_to_peer(
        &self,
        src: &DeviceBuffer,
        src_offset: usize,
        peer: &Self,
        dst: &mut DeviceBuffer,
        dst_offset: usize,
        len: usize,
    ) -> Result<()> {
        if Arc::ptr_eq(&self.device, &peer.device) {
            return device::device_to_device(&self.stream, src, src_offset, dst, dst_offset, len);
        }
        // Either pool open to the other device: the copy engine reads one and writes the other.
        self.device.pool().grant(peer.device.context())?;
        peer.device.pool().grant(self.device.context())?;
        device::device_to_peer(&self.stream, src, src_offset, dst, dst_offset, len)
    }

    fn upload_parts(&self, parts: &[&[u8]]) -> Result<DeviceBuffer> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let mut b = self.alloc(total)?;
        // Through a pinned block when one is free (the driver stages pageable copies itself, at
        // a fraction of the speed), else straight from the slices.
        match self.staging().try_take(total)? {
            Some(mut block) => {
                let bytes = block.bytes_mut()?;
                let mut at = 0;
                for p in parts {
                    bytes[at..at + p.len()].copy_from_slice(p);
                    at += p.len();
                }
                self.copy_to_device(&mut block, 0, &mut b, 0, total)?;
                block.wait()?;
            }
            None => device::slices_to_device(&self.stream, parts, &mut b)?,
        }
        Ok(b)
    }

    fn download(&self, buf: &DeviceBuffer, out: &mut [u8]) -> Result<()> {
        check_len("download", buf.len(), out.len(), 1)?;
        device::device_to_slice(&self.stream, buf, 0, out)
    }

    fn hash_checked(
        &self,
        check: &[&DeviceBuffer],
        classes: &DeviceBuffer,
        rows: usize,
        mask: u64,
    ) -> Result<DeviceBuffer> {
        let mut out = self.alloc(rows * 8)?;
        keys::hash_checked(self, check, classes, rows, mask, &mut out)?;
        Ok(out)
    }

    fn encode_keys(
        &self,
        values: &DeviceBuffer,
        validity: Option<&DeviceBuffer>,
        rows: usize,
        enc: &KeyColumnEncoding,
        width: KeyWidth,
        acc: Option<DeviceBuffer>,
    ) -> Result<DeviceBuffer> {
        let (mut out, first) = match acc {
            Some(a) => (a, false),
            None => (self.alloc(rows * width.bytes())?, true),
        };
        keys::encode_keys(self, values, validity, rows, enc, width, first, &mut out)?;
        Ok(out)
    }

    fn exclusive_scan(&self, values: &DeviceBuffer, n: usize) -> Result<DeviceBuffer> {
        let mut out = self.alloc((n + 1) * 4)?;
        scan::exclusive_scan(self, values, n, scan::ScanType::U32, &mut out)?;
        Ok(out)
    }

    fn partition(
        &self,
        keys: &DeviceBuffer,
        rows: usize,
        width: KeyWidth,
        bits: u32,
        carry: &[(&DeviceBuffer, usize)],
    ) -> Result<Partitioned<DeviceBuffer>> {
        partition::partition(self, keys, rows, width, bits, carry)
    }

    fn sort(
        &self,
        keys: &DeviceBuffer,
        rows: usize,
        width: KeyWidth,
        bits: u32,
        carry: &[(&DeviceBuffer, usize)],
    ) -> Result<Sorted<DeviceBuffer>> {
        partition::sort(self, keys, rows, width, bits, carry)
    }

    fn merge_join(
        &self,
        build: &Sorted<DeviceBuffer>,
        probe: &Sorted<DeviceBuffer>,
        width: KeyWidth,
    ) -> Result<MatchIndices<DeviceBuffer>> {
        merge_join::merge_join(self, build, probe, width)
    }

    fn index_join(
        &self,
        build: &Sorted<DeviceBuffer>,
        probe_keys: &DeviceBuffer,
        probe_rows: usize,
        width: KeyWidth,
    ) -> Result<MatchIndices<DeviceBuffer>> {
        merge_join::index_join(self, build, probe_keys, probe_rows, width)
    }

    fn route(
        &self,
        keys: &DeviceBuffer,
        rows: usize,
        width: KeyWidth,
        bits: u32,
        carry: &[(&DeviceBuffer, usize)],
    ) -> Result<Partitioned<DeviceBuffer>> {
        partition::route(self, keys, rows, width, bits, carry)
    }

    fn fill(&self, buf: &mut DeviceBuffer, byte: u8) -> Result<()> {
        device::fill(&self.stream, buf, byte)
    }

    fn gather(
        &self,
        src: &DeviceBuffer,
        idx: &DeviceBuffer,
        rows: usize,
        width: usize,
    ) -> Result<DeviceBuffer> {
        let mut out = self.alloc(rows * width)?;
        columns::gather(self, src, idx, rows, width, &mut out)?;
        Ok(out)
    }

    fn gather_planes(
        &self,
        planes: &[(&DeviceBuffer, usize)],
        idx: &DeviceBuffer,
        rows: usize,
    ) -> Result<Vec<DeviceBuffer>> {
        let mut out = planes
            .iter()
            .map(|&(_, w)| self.alloc(rows * w))
            .collect::<Result<Vec<_>>>()?;
        columns::gather_planes(self, planes, idx, rows, &mut out)?;
        Ok(out)
    }

    fn row_positions(&self, rows: usize) -> Result<DeviceBuffer> {
        check_positions(rows)?;
        let mut out = self.alloc(rows * 4)?;
        columns::row_positions(self, rows, &mut out)?;
        Ok(out)
    }

    fn present(&self, idx: &DeviceBuffer, rows: usize) -> Result<DeviceBuffer> {
        let mut out = self.alloc(rows)?;
        columns::present(self, idx, rows, &mut out)?;
        Ok(out)
    }

    fn select_count(&self, flags: &DeviceBuffer, rows: usize, keep: Keep) -> Result<DeviceBuffer> {
        select::select_count(self, flags, rows, keep)
    }

    fn select_write(
        &self,
        flags: &DeviceBuffer,
        rows: usize,
        keep: Keep,
        offsets: &DeviceBuffer,
        window: Range<u64>,
        out: &mut DeviceBuffer,
    ) -> Result<()> {
        select::select_write(self, flags, rows, keep, offsets, window, out)
    }

    fn unpack_bits(&self, bits: &DeviceBuffer, rows: usize) -> Result<DeviceBuffer> {
        let mut out = self.alloc(rows)?;
        columns::unpack_bits(self, bits, rows, &mut out)?;
        Ok(out)
    }

    fn pack_bits(&self, bytes: &DeviceBuffer, rows: usize) -> Result<DeviceBuffer> {
        let mut out = self.alloc(rows.div_ceil(32) * 4)?;
        columns::pack_bits(self, bytes, rows, &mut out)?;
        Ok(out)
    }

    fn unframe(
        &self,
        packed: &DeviceBuffer,
        rows: usize,
        width: usize,
        frame: &Frame,
    ) -> Result<DeviceBuffer> {
        let mut out = self.alloc(rows * width)?;
        columns::unframe(self, packed, rows, width, frame, &mut out)?;
        Ok(out)
    }

    fn hash_join(
        &self,
        build: &Partitioned<DeviceBuffer>,
        probe: &Partitioned<DeviceBuffer>,
        width: KeyWidth,
    ) -> Result<MatchIndices<DeviceBuffer>> {
        hash_join::hash_join(self, build, probe, width)
    }

    fn bucket_count(
        &self,
        build: &Partitioned<DeviceBuffer>,
        probe_keys: &DeviceBuffer,
        rows: usize,
        width: KeyWidth,
        emit: ProbeEmit,
        check: Option<&KeyCheck<'_, DeviceBuffer>>,
        filter: Option<&FilterInput<'_, DeviceBuffer>>,
        visited: Option<&mut DeviceBuffer>,
    ) -> Result<DeviceBuffer> {
        bucket_probe::bucket_count(
            self, build, probe_keys, rows, width, emit, check, filter, visited,
        )
    }

    fn bucket_write(
        &self,
        build: &Partitioned<DeviceBuffer>,
        probe_keys: &DeviceBuffer,
        rows: usize,
        width: KeyWidth,
        emit: ProbeEmit,
        check: Option<&KeyCheck<'_, DeviceBuffer>>,
        filter: Option<&FilterInput<'_, DeviceBuffer>>,
        offsets: &DeviceBuffer,
        window: Range<u64>,
        build_out: &mut DeviceBuffer,
        probe_out: &mut DeviceBuffer,
    ) -> Result<()> {
        bucket_probe::bucket_write(
            self, build, probe_keys, rows, width, emit, check, filter, offsets, window, build_out,
            probe_out,
        )
    }

    fn bucket_lookup(
        &self,
        build: &Partitioned<DeviceBuffer>,
        probe_keys: &DeviceBuffer,
        rows: usize,
        width: KeyWidth,
        exact: bool,
    ) -> Result<Looked<DeviceBuffer>> {
        bucket_probe::bucket_lookup(self, build, probe_keys, rows, width, exact)
    }

    fn view_offsets(
        &self,
        views: &DeviceBuffer,
        validity: Option<&DeviceBuffer>,
        rows: usize,
        data: ViewData<'_, DeviceBuffer>,
    ) -> Result<DeviceBuffer> {
        views::view_offsets(self, views, validity, rows, data)
    }

    fn view_copy(
        &self,
        views: &mut DeviceBuffer,
        validity: Option<&DeviceBuffer>,
        rows: usize,
        offsets: &DeviceBuffer,
        data: ViewData<'_, DeviceBuffer>,
        out: &mut DeviceBuffer,
    ) -> Result<()> {
        views::view_copy(self, views, validity, rows, offsets, data, out)
    }
}
