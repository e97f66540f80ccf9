//! Launch wrappers of `kernels/bucket_probe.cu`: probing a bucketed build side with a chunk of
//! probe keys (count → scan → windowed write), in probe order, for every join type's
//! [`ProbeEmit`]; with a compiled residual filter, the kernels of that filter's module.

use std::ops::Range;

use cudarc::driver::DeviceRepr;
use datafusion::common::{Result, internal_err};

use super::CudaBackend;
use super::launch::launch;
use super::scan::{ScanType, exclusive_scan};
use crate::backend::{
    Backend, FilterInput, KeyCheck, KeyWidth, Partitioned, ProbeEmit, check_filter,
    check_key_check, check_len, check_visited, check_window, probe_runs,
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

/// The kernel arguments of `filter`, its columns' lengths already checked; each values
/// address must be aligned to its value's width (the kernels read values whole).
fn filter_args(filter: &FilterInput<'_, DeviceBuffer>) -> Result<FilterArgs> {
    let mut args = FilterArgs {
        build: [0; 2 * MAX_FILTER_COLUMNS],
        probe: [0; 2 * MAX_FILTER_COLUMNS],
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

/// Checks the arguments; gives the check bytes' pointers (0 for none).
fn checked(
    build: &Partitioned<DeviceBuffer>,
    probe_keys: &DeviceBuffer,
    rows: usize,
    width: KeyWidth,
    check: Option<KeyCheck<'_, DeviceBuffer>>,
) -> Result<(u64, u64)> {
    check_key_check(
        check.map(|c| (c.build.len(), c.probe.len())),
        build.rows,
        rows,
    )?;
    check_len("bucket probe keys", probe_keys.len(), rows, width.bytes())?;
    check_len(
        "bucket build keys",
        build.keys.len(),
        build.rows,
        width.bytes(),
    )?;
    check_len(
        "bucket bounds",
        build.bounds.len(),
        (1usize << build.bits) + 1,
        4,
    )?;
    Ok(check.map_or((0, 0), |c| (c.build.ptr(), c.probe.ptr())))
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
    check: Option<KeyCheck<'_, DeviceBuffer>>,
    filter: Option<&FilterInput<'_, DeviceBuffer>>,
    visited: Option<&mut DeviceBuffer>,
) -> Result<DeviceBuffer> {
    let (r_check, s_check) = checked(build, probe_keys, rows, width, check)?;
    check_filter(filter, DeviceBuffer::len, build.rows, rows)?;
    check_visited(emit, visited.as_ref().map(|v| v.len()), build.rows)?;
    let (emit, visited) = (emit as u32, visited.map_or(0u64, |v| v.ptr_mut()));
    let runs = probe_runs(rows);
    let mut counts = q.alloc(runs * 8)?;
    let (r_keys, bounds, bits) = (build.keys.ptr(), build.bounds.ptr(), build.bits);
    let (s_keys, n64, counts_ptr) = (probe_keys.ptr(), rows as u64, counts.ptr_mut());
    // A block a run of probe rows, one a thread.
    let grid = runs;
    match filter {
        None => {
            let name = match width {
                KeyWidth::U32 => "bucket_count_u32",
                KeyWidth::U64 => "bucket_count_u64",
            };
            launch!(
                q,
                "bucket_probe.cu",
                name,
                grid,
                r_keys,
                bounds,
                bits,
                s_keys,
                n64,
                r_check,
                s_check,
                emit,
                visited,
                counts_ptr
            );
        }
        Some(f) => {
            let (key, name) = match width {
                KeyWidth::U32 => ("u32", "bucket_count_filtered_u32"),
                KeyWidth::U64 => ("u64", "bucket_count_filtered_u64"),
            };
            let args = filter_args(f)?;
            launch!(
                q,
                filtered(f.filter.cuda(), key),
                name,
                grid,
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
        }
    }
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
    check: Option<KeyCheck<'_, DeviceBuffer>>,
    filter: Option<&FilterInput<'_, DeviceBuffer>>,
    offsets: &DeviceBuffer,
    window: Range<u64>,
    build_out: &mut DeviceBuffer,
    probe_out: &mut DeviceBuffer,
) -> Result<()> {
    let (r_check, s_check) = checked(build, probe_keys, rows, width, check)?;
    check_filter(filter, DeviceBuffer::len, build.rows, rows)?;
    let runs = probe_runs(rows);
    check_len("bucket offsets", offsets.len(), runs + 1, 8)?;
    check_window(&window, &[build_out.len(), probe_out.len()])?;
    let emit = emit as u32;
    let (r_keys, bounds, bits) = (build.keys.ptr(), build.bounds.ptr(), build.bits);
    let (s_keys, n64, offsets_ptr) = (probe_keys.ptr(), rows as u64, offsets.ptr());
    let (lo, hi) = (window.start, window.end);
    let (r_out, s_out) = (build_out.ptr_mut(), probe_out.ptr_mut());
    // A block a run of probe rows, one a thread.
    let grid = runs;
    match filter {
        None => {
            let name = match width {
                KeyWidth::U32 => "bucket_write_u32",
                KeyWidth::U64 => "bucket_write_u64",
            };
            launch!(
                q,
                "bucket_probe.cu",
                name,
                grid,
                r_keys,
                bounds,
                bits,
                s_keys,
                n64,
                r_check,
                s_check,
                emit,
                offsets_ptr,
                lo,
                hi,
                r_out,
                s_out
            );
        }
        Some(f) => {
            let (key, name) = match width {
                KeyWidth::U32 => ("u32", "bucket_write_filtered_u32"),
                KeyWidth::U64 => ("u64", "bucket_write_filtered_u64"),
            };
            let args = filter_args(f)?;
            launch!(
                q,
                filtered(f.filter.cuda(), key),
                name,
                grid,
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
        }
    }
    Ok(())
}
