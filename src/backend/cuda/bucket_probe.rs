//! Launch wrappers of `kernels/bucket_probe.cu`: probing a bucketed build side with a chunk of
//! probe keys (count → scan → windowed write), in probe order, for every join type's
//! [`ProbeEmit`]; with a compiled residual filter, the kernels of that filter's module.

use std::ops::Range;

use cudarc::driver::{CudaFunction, DeviceRepr};
use datafusion::common::{Result, internal_err};

use super::CudaBackend;
use super::keys::CheckWords;
use super::launch::launch;
use super::scan::{ScanType, exclusive_scan};
use crate::backend::{
    Backend, FilterInput, KeyCheck, KeyWidth, Looked, Partitioned, ProbeEmit, check_bucket_probe,
    check_len, check_visited, check_window, probe_runs,
};
use crate::device::DeviceBuffer;
use crate::filter::MAX_FILTER_COLUMNS;

/// `FilterArgs` of `kernels/filter.cuh`: per side, each filter column's values and validity
/// addresses (0 for none), in slot order.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
struct FilterArgs {
    build: [u64; 2 * MAX_FILTER_COLUMNS],
    probe: [u64; 2 * MAX_FILTER_COLUMNS],
}

// SAFETY: `FilterArgs` is `#[repr(C)]` plain data (u64 addresses) with the layout of the
// kernels' `FilterArgs` (two arrays of 2 * GJ_FILTER_COLUMNS pointers, GJ_FILTER_COLUMNS being
// MAX_FILTER_COLUMNS through KERNEL_CONSTANTS), so passing it by value as a kernel argument
// copies exactly what the kernel reads.
unsafe impl DeviceRepr for FilterArgs {}

/// The kernel arguments of `filter` (zeros without one), its columns' lengths already checked;
/// each values address must be aligned to its value's width (the kernels read values whole).
fn filter_args(filter: Option<&FilterInput<'_, DeviceBuffer>>) -> Result<FilterArgs> {
    let mut args = FilterArgs {
        build: [0; 2 * MAX_FILTER_COLUMNS],
        probe: [0; 2 * MAX_FILTER_COLUMNS],
    };
    let Some(filter) = filter else {
        return Ok(args);
    };
    let sides = [
        (&mut args.build, &filter.build, &filter.filter.build_columns),
        (&mut args.probe, &filter.probe, &filter.filter.probe_columns),
    ];
    for (out, columns, types) in sides {
        for (slot, ((values, validity), (_, ty))) in columns.iter().zip(types).enumerate() {
            if values.ptr() % ty.width() as u64 != 0 {
                return internal_err!("bucket probe filter: a column of {ty:?} is misaligned");
            }
            out[2 * slot] = values.ptr();
            out[2 * slot + 1] = validity.map_or(0, |v| v.ptr());
        }
    }
    Ok(args)
}

/// Checks the arguments; gives each side's words of check bytes (none for exact keys).
fn checked(
    build: &Partitioned<DeviceBuffer>,
    probe_keys: &DeviceBuffer,
    (rows, width): (usize, KeyWidth),
    check: Option<&KeyCheck<'_, DeviceBuffer>>,
    filter: Option<&FilterInput<'_, DeviceBuffer>>,
) -> Result<(CheckWords, CheckWords)> {
    let len = DeviceBuffer::len;
    check_bucket_probe(build, probe_keys, (rows, width), check, filter, len)?;
    match check {
        Some(c) => Ok((CheckWords::of(&c.build)?, CheckWords::of(&c.probe)?)),
        None => Ok((CheckWords::of(&[])?, CheckWords::of(&[])?)),
    }
}

/// The two kernels of the bucket probe.
#[derive(Clone, Copy)]
enum Op {
    Count,
    Write,
}

/// Kernel `op` for keys of `width`: `bucket_probe.cu`'s, or with a filter that filter's module's.
fn kernel(
    q: &CudaBackend,
    op: Op,
    width: KeyWidth,
    filter: Option<&FilterInput<'_, DeviceBuffer>>,
) -> Result<(CudaFunction, &'static str)> {
    let (key, name) = match (op, width, filter.is_some()) {
        (Op::Count, KeyWidth::U32, false) => ("u32", "bucket_count_u32"),
        (Op::Count, KeyWidth::U64, false) => ("u64", "bucket_count_u64"),
        (Op::Write, KeyWidth::U32, false) => ("u32", "bucket_write_u32"),
        (Op::Write, KeyWidth::U64, false) => ("u64", "bucket_write_u64"),
        (Op::Count, KeyWidth::U32, true) => ("u32", "bucket_count_filtered_u32"),
        (Op::Count, KeyWidth::U64, true) => ("u64", "bucket_count_filtered_u64"),
        (Op::Write, KeyWidth::U32, true) => ("u32", "bucket_write_filtered_u32"),
        (Op::Write, KeyWidth::U64, true) => ("u64", "bucket_write_filtered_u64"),
    };
    let f = match filter {
        None => q.device().function("bucket_probe.cu", name)?,
        Some(f) => q.device().filtered_function(f.filter.cuda(), key, name)?,
    };
    Ok((f, name))
}

/// Output rows per run of probe rows, scanned: `runs + 1` u64 values.
#[allow(clippy::too_many_arguments)]
pub(crate) fn bucket_count(
    q: &CudaBackend,
    build: &Partitioned<DeviceBuffer>,
    probe_keys: &DeviceBuffer,
    rows: usize,
    width: KeyWidth,
    emit: ProbeEmit,
    check: Option<&KeyCheck<'_, DeviceBuffer>>,
    filter: Option<&FilterInput<'_, DeviceBuffer>>,
    visited: Option<&mut DeviceBuffer>,
) -> Result<DeviceBuffer> {
    let (r_check, s_check) = checked(build, probe_keys, (rows, width), check, filter)?;
    check_visited(emit, visited.as_ref().map(|v| v.len()), build.rows)?;
    let (emit, visited) = (emit as u32, visited.map_or(0u64, |v| v.ptr_mut()));
    let runs = probe_runs(rows);
    let mut counts = q.alloc(runs * 8)?;
    let (r_keys, bounds, bits) = (build.keys.ptr(), build.bounds.ptr(), build.bits);
    let (s_keys, n64, counts_ptr) = (probe_keys.ptr(), rows as u64, counts.ptr_mut());
    let (f, name) = kernel(q, Op::Count, width, filter)?;
    let args = filter_args(filter)?;
    // A block a run of probe rows, one a thread.
    launch!(
        @with q,
        f,
        name,
        runs,
        r_keys,
        bounds,
        bits,
        s_keys,
        n64,
        r_check,
        s_check,
        args,
        emit,
        visited,
        counts_ptr
    );
    let mut offsets = q.alloc((runs + 1) * 8)?;
    exclusive_scan(q, &counts, runs, ScanType::U64, &mut offsets)?;
    Ok(offsets)
}

/// The counted output rows whose place lies in `window`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn bucket_write(
    q: &CudaBackend,
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
    let (r_check, s_check) = checked(build, probe_keys, (rows, width), check, filter)?;
    let runs = probe_runs(rows);
    check_len("bucket offsets", offsets.len(), runs + 1, 8)?;
    check_window(&window, &[build_out.len(), probe_out.len()])?;
    let emit = emit as u32;
    let (r_keys, bounds, bits) = (build.keys.ptr(), build.bounds.ptr(), build.bits);
    let (s_keys, n64, offsets_ptr) = (probe_keys.ptr(), rows as u64, offsets.ptr());
    let (lo, hi) = (window.start, window.end);
    let (r_out, s_out) = (build_out.ptr_mut(), probe_out.ptr_mut());
    let (f, name) = kernel(q, Op::Write, width, filter)?;
    let args = filter_args(filter)?;
    launch!(
        @with q,
        f,
        name,
        runs,
        r_keys,
        bounds,
        bits,
        s_keys,
        n64,
        r_check,
        s_check,
        args,
        emit,
        offsets_ptr,
        lo,
        hi,
        r_out,
        s_out
    );
    Ok(())
}

/// Each probe key's one build position, for a build side with unique keys (`bucket_lookup`).
pub(crate) fn bucket_lookup(
    q: &CudaBackend,
    build: &Partitioned<DeviceBuffer>,
    probe_keys: &DeviceBuffer,
    rows: usize,
    width: KeyWidth,
    exact: bool,
) -> Result<Looked<DeviceBuffer>> {
    check_bucket_probe(
        build,
        probe_keys,
        (rows, width),
        None,
        None,
        DeviceBuffer::len,
    )?;
    let mut positions = q.alloc(rows * 4)?;
    let mut counts = q.alloc(16)?;
    q.fill(&mut counts, 0)?;
    let name = match width {
        KeyWidth::U32 => "bucket_lookup_u32",
        KeyWidth::U64 => "bucket_lookup_u64",
    };
    let (r_keys, bounds, bits) = (build.keys.ptr(), build.bounds.ptr(), build.bits);
    let (s_keys, n64, exact) = (probe_keys.ptr(), rows as u64, u32::from(exact));
    let (out, counts_ptr) = (positions.ptr_mut(), counts.ptr_mut());
    // A thread a probe row.
    launch!(
        q,
        "bucket_probe.cu",
        name,
        rows.div_ceil(crate::device::BLOCK_THREADS),
        r_keys,
        bounds,
        bits,
        s_keys,
        n64,
        exact,
        out,
        counts_ptr
    );
    Ok(Looked { positions, counts })
}
