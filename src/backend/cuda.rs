//! [`CudaBackend`]: safe wrappers that launch the kernels of `kernels/` on one CUDA stream.
//! Each wrapper checks buffer sizes first, then launches; the launch itself is the only
//! `unsafe` (in [`launch!`]).

use std::sync::Arc;

use cudarc::driver::{
    CudaStream, DevicePtr, DevicePtrMut, DeviceRepr, LaunchConfig, PinnedHostSlice, PushKernelArg,
};
use datafusion::common::{Result, internal_datafusion_err, internal_err};

use super::Pieces;
use super::{
    Backend, KeyColumnEncoding, KeyWidth, MatchIndices, Partitioned, check_carry, check_len,
};
use crate::device::{CudaDevice, DeviceBuffer, MemoryTracker, STAGE_BYTES, driver_error};
use arrow::buffer::Buffer;

const BLOCK: u32 = 256;
/// Items per block of the scan kernels (`kScanTile` in scan.cu).
const SCAN_TILE: usize = 2048;
/// Items per block of the partitioning kernels (`kPartTile` in partition.cu).
const PART_TILE: usize = 4096;
/// Warps per block of the join kernels (`kWarps` in common.cuh).
const WARPS: usize = 8;
/// Rows per thread of the gather kernels (`kGatherItems` in columns.cu).
const GATHER_ITEMS: usize = 4;
/// Largest radix digit of one partitioning pass.
const DIGIT_BITS: u32 = 8;

/// Launches `$module::$name` on `$self`'s stream with `$grid` blocks of `BLOCK` threads.
macro_rules! launch {
    ($self:ident, $module:expr, $name:expr, $grid:expr, $($arg:expr),* $(,)?) => {{
        let name: &str = &$name;
        let f = $self.device.function($module, name)?;
        let mut b = $self.stream.launch_builder(&f);
        $( b.arg($arg); )*
        let grid = u32::try_from($grid).map_err(|_| datafusion::common::exec_datafusion_err!("{name}: grid too large"))?;
        if grid > 0 {
            let cfg = LaunchConfig { grid_dim: (grid, 1, 1), block_dim: (BLOCK, 1, 1), shared_mem_bytes: 0 };
            let profile = profiling().then(|| $self.synchronize().map(|_| std::time::Instant::now())).transpose()?;
            // SAFETY: the arguments match the kernel's signature in kernels/$module, and the
            // calling wrapper checked that every buffer holds the elements the kernel touches.
            unsafe { b.launch(cfg) }.map_err(|e| driver_error(e, name))?;
            if let Some(start) = profile {
                $self.synchronize()?;
                eprintln!("gpu_join kernel {name:<24} grid {grid:>9} {:>9.3} ms", start.elapsed().as_secs_f64() * 1e3);
            }
        }
    }};
}

/// Whether `GPU_JOIN_PROFILE=1`: every kernel is synchronized and timed on stderr.
fn profiling() -> bool {
    static ON: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *ON.get_or_init(|| std::env::var("GPU_JOIN_PROFILE").is_ok_and(|v| v == "1"))
}

/// Runs the join primitives on one CUDA stream of one device.
#[derive(Debug, Clone)]
pub struct CudaBackend {
    device: Arc<CudaDevice>,
    stream: Arc<CudaStream>,
    tracker: Arc<MemoryTracker>,
}

fn blocks(n: usize, per_block: usize) -> usize {
    n.div_ceil(per_block)
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

    /// The same device and memory accounting on a new stream.
    pub fn fork(&self) -> Result<Self> {
        Self::new(Arc::clone(&self.device), Arc::clone(&self.tracker))
    }

    /// The device this backend runs on.
    pub fn device(&self) -> &Arc<CudaDevice> {
        &self.device
    }

    fn alloc(&self, bytes: usize) -> Result<DeviceBuffer> {
        DeviceBuffer::alloc(&self.stream, bytes, &self.tracker)
    }

    fn zeros(&self, bytes: usize) -> Result<DeviceBuffer> {
        let mut b = self.alloc(bytes)?;
        self.stream
            .memset_zeros(b.slice_mut())
            .map_err(|e| driver_error(e, "memset"))?;
        Ok(b)
    }

    fn read_u64_at(&self, buf: &DeviceBuffer, byte_offset: usize, width: usize) -> Result<u64> {
        let mut bytes = [0u8; 8];
        let view = buf.slice().slice(byte_offset..byte_offset + width);
        self.stream
            .memcpy_dtoh(&view, &mut bytes[..width])
            .map_err(|e| driver_error(e, "download"))?;
        self.synchronize()?;
        Ok(u64::from_le_bytes(bytes))
    }

    /// Exclusive scan of `n` values of `ty` ("u32" or "u64"); `n + 1` values out.
    fn scan(&self, values: &DeviceBuffer, n: usize, ty: &str) -> Result<DeviceBuffer> {
        let w = if ty == "u64" { 8 } else { 4 };
        check_len("scan", values.len(), n, w)?;
        let out = self.zeros((n + 1) * w)?;
        if n == 0 {
            return Ok(out);
        }
        let tiles = blocks(n, SCAN_TILE);
        let n64 = n as u64;
        if tiles == 1 {
            launch!(
                self,
                "scan.cu",
                format!("scan_tiles_{ty}"),
                1,
                values.slice(),
                &n64,
                &0u64,
                out.slice()
            );
        } else {
            let sums = self.alloc(tiles * w)?;
            launch!(
                self,
                "scan.cu",
                format!("scan_reduce_{ty}"),
                tiles,
                values.slice(),
                &n64,
                sums.slice()
            );
            let carry = self.scan(&sums, tiles, ty)?;
            launch!(
                self,
                "scan.cu",
                format!("scan_tiles_{ty}"),
                tiles,
                values.slice(),
                &n64,
                carry.slice(),
                out.slice()
            );
        }
        Ok(out)
    }

    /// One stable counting-sort pass over `keys` on digit `(pid >> shift) & (2^digit_bits - 1)`
    /// of the partition id; returns the keys and every plane (values, width) in its order.
    #[allow(clippy::too_many_arguments)]
    fn partition_pass(
        &self,
        keys: &DeviceBuffer,
        rows: usize,
        width: KeyWidth,
        bits: u32,
        shift: u32,
        digit_bits: u32,
        planes: &[(&DeviceBuffer, usize)],
    ) -> Result<(DeviceBuffer, Vec<DeviceBuffer>)> {
        let k = width.suffix();
        let tiles = blocks(rows, PART_TILE);
        let radix = 1usize << digit_bits;
        let n64 = rows as u64;
        let hist = self.alloc(radix * tiles * 4)?;
        launch!(
            self,
            "partition.cu",
            format!("radix_histogram_{k}"),
            tiles,
            keys.slice(),
            &n64,
            &bits,
            &shift,
            &digit_bits,
            hist.slice()
        );
        let offsets = self.scan(&hist, radix * tiles, "u32")?;
        let mut keys_out = self.alloc(rows * width.bytes())?;
        let mut moved = planes
            .iter()
            .map(|&(_, w)| self.alloc(rows * w))
            .collect::<Result<Vec<_>>>()?;
        let name = format!("radix_scatter_{k}");
        // At most MAX_PLANES per launch; every launch writes the same keys (at least one runs).
        let groups = planes.len().div_ceil(MAX_PLANES).max(1);
        for g in 0..groups {
            let lo = (g * MAX_PLANES).min(planes.len());
            let hi = ((g + 1) * MAX_PLANES).min(planes.len());
            let mut arg = Planes::default();
            let mut guards = Vec::with_capacity(2 * (hi - lo));
            for (p, (&(input, w), out)) in planes[lo..hi]
                .iter()
                .zip(moved[lo..hi].iter_mut())
                .enumerate()
            {
                let (ptr, guard) = input.slice().device_ptr(&self.stream);
                arg.input[p] = ptr;
                guards.push(guard);
                let (ptr, guard) = out.slice_mut().device_ptr_mut(&self.stream);
                arg.output[p] = ptr;
                guards.push(guard);
                arg.width[p] = w as u32;
            }
            arg.count = (hi - lo) as u32;
            launch!(
                self,
                "partition.cu",
                name,
                tiles,
                keys.slice(),
                &n64,
                &bits,
                &shift,
                &digit_bits,
                offsets.slice(),
                keys_out.slice_mut(),
                &arg
            );
            // Dropping the guards records this launch's reads and writes of every plane.
            drop(guards);
        }
        Ok((keys_out, moved))
    }
}

/// Planes one `radix_scatter` launch moves (`kMaxPlanes` in partition.cu).
const MAX_PLANES: usize = 8;

/// The `Planes` argument of `radix_scatter` (partition.cu), passed by value: device pointers
/// and value widths of the columns one launch moves besides the keys.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct Planes {
    input: [u64; MAX_PLANES],
    output: [u64; MAX_PLANES],
    width: [u32; MAX_PLANES],
    count: u32,
}

// SAFETY: `Planes` is plain old data laid out like `struct Planes` in kernels/partition.cu
// (repr(C): 8 + 8 pointers, 8 widths, a count); the pointers it holds are kept valid and
// ordered on the stream by the guards `partition_pass` holds across the launch.
unsafe impl DeviceRepr for Planes {}

impl Backend for CudaBackend {
    type Buf = DeviceBuffer;

    fn name(&self) -> &'static str {
        "cuda"
    }

    fn upload_parts(&self, parts: &[&[u8]]) -> Result<DeviceBuffer> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let mut b = self.alloc(total)?;
        if total < 2 * STAGE_BYTES {
            let mut at = 0;
            for p in parts.iter().filter(|p| !p.is_empty()) {
                let mut view = b.slice_mut().slice_mut(at..at + p.len());
                self.stream
                    .memcpy_htod(*p, &mut view)
                    .map_err(|e| driver_error(e, "upload"))?;
                at += p.len();
            }
            return Ok(b);
        }
        // Through a pair of pinned buffers: the host fills one while the device copies from
        // the other (pageable copies are staged by the driver at a third of the speed).
        let pool = self.device.staging();
        let mut staging = pool.take(self.stream.context())?;
        let result = (|| -> Result<()> {
            let mut parts = parts.iter().copied();
            let (mut src, mut at, mut which): (&[u8], usize, usize) = (&[], 0, 0);
            while at < total {
                let pinned = &mut staging.0[which];
                // Waits for the copy this buffer last fed to finish.
                let dst = pinned
                    .as_mut_slice()
                    .map_err(|e| driver_error(e, "upload"))?;
                let mut fill = 0;
                while fill < STAGE_BYTES && at + fill < total {
                    while src.is_empty() {
                        src = parts.next().ok_or_else(|| {
                            internal_datafusion_err!("upload_parts: parts end before their total")
                        })?;
                    }
                    let n = (STAGE_BYTES - fill).min(src.len());
                    dst[fill..fill + n].copy_from_slice(&src[..n]);
                    (fill, src) = (fill + n, &src[n..]);
                }
                let mut view = b.slice_mut().slice_mut(at..at + fill);
                let copied = match fill == STAGE_BYTES {
                    true => self.stream.memcpy_htod(&*pinned, &mut view),
                    // A short last chunk goes as a plain slice, which cudarc does not track:
                    // the synchronize below waits for it.
                    false => match pinned.as_slice() {
                        Ok(s) => self.stream.memcpy_htod(&s[..fill], &mut view),
                        Err(e) => Err(e),
                    },
                };
                copied.map_err(|e| driver_error(e, "upload"))?;
                (at, which) = (at + fill, 1 - which);
            }
            self.synchronize()
        })();
        pool.put(staging);
        result?;
        Ok(b)
    }

    fn download(&self, buf: &DeviceBuffer, out: &mut [u8]) -> Result<()> {
        check_len("download", buf.len(), out.len(), 1)?;
        if !out.is_empty() {
            let view = buf.slice().slice(0..out.len());
            self.stream
                .memcpy_dtoh(&view, out)
                .map_err(|e| driver_error(e, "download"))?;
        }
        self.synchronize()
    }

    fn download_pieces(&self, buf: &DeviceBuffer, len: usize, piece: usize) -> Result<Vec<Buffer>> {
        check_len("download_pieces", buf.len(), len, 1)?;
        let mut pieces = Pieces::new(len, piece);
        let full = len / STAGE_BYTES;
        if full > 0 {
            let pool = self.device.staging();
            let mut staging = pool.take(self.stream.context())?;
            let result = (|| -> Result<()> {
                let issue = |pinned: &mut PinnedHostSlice<u8>, c: usize| {
                    let view = buf.slice().slice(c * STAGE_BYTES..(c + 1) * STAGE_BYTES);
                    self.stream
                        .memcpy_dtoh(&view, pinned)
                        .map_err(|e| driver_error(e, "download"))
                };
                issue(&mut staging.0[0], 0)?;
                for c in 0..full {
                    let [a, b] = &mut staging.0;
                    let (ready, next) = if c % 2 == 0 { (a, b) } else { (b, a) };
                    if c + 1 < full {
                        issue(next, c + 1)?;
                    }
                    // Waits for chunk c only; chunk c + 1 is in flight meanwhile.
                    let src = ready.as_slice().map_err(|e| driver_error(e, "download"))?;
                    pieces.push(src);
                }
                Ok(())
            })();
            pool.put(staging);
            result?;
        }
        let tail = full * STAGE_BYTES;
        if tail < len {
            let mut rest = vec![0u8; len - tail];
            let view = buf.slice().slice(tail..len);
            self.stream
                .memcpy_dtoh(&view, &mut rest)
                .map_err(|e| driver_error(e, "download"))?;
            self.synchronize()?;
            pieces.push(&rest);
        }
        Ok(pieces.finish())
    }

    fn synchronize(&self) -> Result<()> {
        self.stream
            .synchronize()
            .map_err(|e| driver_error(e, "synchronize"))
    }

    fn memory_use(&self) -> Option<(usize, usize)> {
        Some((self.tracker.current(), self.tracker.peak()))
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
        check_len("encode_keys values", values.len(), rows, enc.ty.bytes())?;
        if let Some(v) = validity {
            check_len("encode_keys validity", v.len(), rows, 1)?;
        }
        let first: i32 = acc.is_none().into();
        let out = match acc {
            Some(a) => {
                check_len("encode_keys accumulator", a.len(), rows, width.bytes())?;
                a
            }
            None => self.alloc(rows * width.bytes())?,
        };
        let name = format!("encode_keys_{}_{}", enc.ty.suffix(), width.suffix());
        let n64 = rows as u64;
        match validity {
            Some(v) => launch!(
                self,
                "keys.cu",
                name,
                blocks(rows, BLOCK as usize),
                values.slice(),
                v.slice(),
                &n64,
                &enc.min,
                &enc.max,
                &enc.stride,
                &first,
                out.slice()
            ),
            None => launch!(
                self,
                "keys.cu",
                name,
                blocks(rows, BLOCK as usize),
                values.slice(),
                &0u64,
                &n64,
                &enc.min,
                &enc.max,
                &enc.stride,
                &first,
                out.slice()
            ),
        }
        Ok(out)
    }

    fn exclusive_scan(&self, values: &DeviceBuffer, n: usize) -> Result<DeviceBuffer> {
        self.scan(values, n, "u32")
    }

    fn partition(
        &self,
        keys: &DeviceBuffer,
        rows: usize,
        width: KeyWidth,
        bits: u32,
        carry: &[(&DeviceBuffer, usize)],
    ) -> Result<Partitioned<DeviceBuffer>> {
        let n64 = rows as u64;
        check_len("partition", keys.len(), rows, width.bytes())?;
        check_carry(carry.iter().map(|(b, w)| (b.len(), *w)), rows)?;
        if bits > 2 * DIGIT_BITS {
            return internal_err!(
                "partition: at most {} bits, asked for {bits}",
                2 * DIGIT_BITS
            );
        }
        let parts = 1usize << bits;
        if rows == 0 {
            return Ok(Partitioned {
                keys: self.alloc(0)?,
                bounds: self.zeros((parts + 1) * 4)?,
                rows,
                bits,
                carried: carry.iter().map(|_| self.alloc(0)).collect::<Result<_>>()?,
            });
        }
        // One pass per digit of at most 8 bits, low digit first; the carried columns follow.
        let first_bits = bits.min(DIGIT_BITS);
        let (mut keys_out, mut moved) =
            self.partition_pass(keys, rows, width, bits, 0, first_bits, carry)?;
        if bits > first_bits {
            let planes: Vec<_> = moved.iter().zip(carry).map(|(b, &(_, w))| (b, w)).collect();
            let (k, m) = self.partition_pass(
                &keys_out,
                rows,
                width,
                bits,
                first_bits,
                bits - first_bits,
                &planes,
            )?;
            (keys_out, moved) = (k, m);
        }
        let bounds = self.alloc((parts + 1) * 4)?;
        launch!(
            self,
            "partition.cu",
            format!("partition_bounds_{}", width.suffix()),
            blocks(parts + 1, BLOCK as usize),
            keys_out.slice(),
            &n64,
            &bits,
            bounds.slice()
        );
        Ok(Partitioned {
            keys: keys_out,
            bounds,
            rows,
            bits,
            carried: moved,
        })
    }

    fn gather(
        &self,
        src: &DeviceBuffer,
        idx: &DeviceBuffer,
        rows: usize,
        width: usize,
    ) -> Result<DeviceBuffer> {
        let n64 = rows as u64;
        check_len("gather idx", idx.len(), rows, 4)?;
        let out = self.alloc(rows * width)?;
        launch!(
            self,
            "columns.cu",
            format!("gather_w{width}"),
            blocks(rows, BLOCK as usize * GATHER_ITEMS),
            src.slice(),
            idx.slice(),
            &n64,
            out.slice()
        );
        Ok(out)
    }

    fn unpack_bits(&self, bits: &DeviceBuffer, rows: usize) -> Result<DeviceBuffer> {
        let n64 = rows as u64;
        check_len("unpack_bits", bits.len(), rows.div_ceil(8), 1)?;
        let out = self.alloc(rows)?;
        launch!(
            self,
            "columns.cu",
            "unpack_bits",
            blocks(rows, BLOCK as usize),
            bits.slice(),
            &n64,
            out.slice()
        );
        Ok(out)
    }

    fn pack_bits(&self, bytes: &DeviceBuffer, rows: usize) -> Result<DeviceBuffer> {
        let n64 = rows as u64;
        check_len("pack_bits", bytes.len(), rows, 1)?;
        let out = self.alloc(rows.div_ceil(32) * 4)?;
        launch!(
            self,
            "columns.cu",
            "pack_bits",
            blocks(rows, BLOCK as usize),
            bytes.slice(),
            &n64,
            out.slice()
        );
        Ok(out)
    }

    fn hash_join(
        &self,
        build: &Partitioned<DeviceBuffer>,
        probe: &Partitioned<DeviceBuffer>,
        width: KeyWidth,
    ) -> Result<MatchIndices<DeviceBuffer>> {
        if build.bits != probe.bits {
            return internal_err!(
                "hash_join: build has {} partition bits, probe {}",
                build.bits,
                probe.bits
            );
        }
        let empty = |s: &Self| {
            Ok(MatchIndices {
                build: s.alloc(0)?,
                probe: s.alloc(0)?,
                len: 0,
            })
        };
        if build.rows == 0 || probe.rows == 0 {
            return empty(self);
        }
        let parts = 1u32 << build.bits;
        let k = width.suffix();
        // Tasks: per partition, build chunks x probe tiles; block b runs task b.
        let tasks = self.alloc(parts as usize * 4)?;
        launch!(
            self,
            "hash_join.cu",
            "join_task_counts",
            blocks(parts as usize, BLOCK as usize),
            build.bounds.slice(),
            probe.bounds.slice(),
            &parts,
            tasks.slice()
        );
        let task_offsets = self.scan(&tasks, parts as usize, "u32")?;
        let task_count = self.read_u64_at(&task_offsets, parts as usize * 4, 4)? as usize;
        if task_count == 0 {
            return empty(self);
        }
        // Count: matches per warp of each task.
        let counts = self.alloc(task_count * WARPS * 8)?;
        launch!(
            self,
            "hash_join.cu",
            format!("join_count_{k}"),
            task_count,
            build.keys.slice(),
            probe.keys.slice(),
            task_offsets.slice(),
            &parts,
            build.bounds.slice(),
            probe.bounds.slice(),
            counts.slice()
        );
        // Scan: where each warp writes.
        let offsets = self.scan(&counts, task_count * WARPS, "u64")?;
        let len = self.read_u64_at(&offsets, task_count * WARPS * 8, 8)? as usize;
        if len > u32::MAX as usize {
            return datafusion::common::resources_err!(
                "join output of {len} rows exceeds 2^32 rows in one chunk"
            );
        }
        // Write: the pairs, at exactly the counted positions.
        let r_out = self.alloc(len * 4)?;
        let s_out = self.alloc(len * 4)?;
        launch!(
            self,
            "hash_join.cu",
            format!("join_write_{k}"),
            task_count,
            build.keys.slice(),
            probe.keys.slice(),
            task_offsets.slice(),
            &parts,
            build.bounds.slice(),
            probe.bounds.slice(),
            offsets.slice(),
            r_out.slice(),
            s_out.slice()
        );
        Ok(MatchIndices {
            build: r_out,
            probe: s_out,
            len,
        })
    }
}
