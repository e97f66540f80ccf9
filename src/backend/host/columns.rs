//! Host twin of `kernels/columns.cu` and `kernels/scan.cu`: gathers, the validity of a side
//! that may be missing, validity bitmaps to bytes and back, and the exclusive scan.

use datafusion::common::{Result, internal_err};

use crate::backend::NO_ROW;

/// Exclusive prefix sum; `values.len() + 1` values out, the last the total.
pub(crate) fn exclusive_scan(values: &[u32]) -> Vec<u32> {
    let mut out = Vec::with_capacity(values.len() + 1);
    let mut run = 0u32;
    for &v in values {
        out.push(run);
        run = run.wrapping_add(v);
    }
    out.push(run);
    out
}

/// `out[i] = src[idx[i]]` for values of `width` bytes; zeros where `idx[i]` is [`NO_ROW`].
pub(crate) fn gather(src: &[u8], idx: &[u32], width: usize, out: &mut [u8]) -> Result<()> {
    if !matches!(width, 1 | 2 | 4 | 8 | 16) {
        return internal_err!("gather: cannot move {width}-byte values");
    }
    let src_rows = src.len() / width;
    if idx.iter().any(|&p| p != NO_ROW && p as usize >= src_rows) {
        return internal_err!("gather: index out of range");
    }
    for (i, &from) in idx.iter().enumerate() {
        if from == NO_ROW {
            out[i * width..(i + 1) * width].fill(0);
            continue;
        }
        let from = from as usize;
        out[i * width..(i + 1) * width].copy_from_slice(&src[from * width..(from + 1) * width]);
    }
    Ok(())
}

/// One byte per position: 0 where it is [`NO_ROW`], else 1.
pub(crate) fn present(idx: &[u32], out: &mut [u8]) {
    for (o, &i) in out.iter_mut().zip(idx) {
        *o = u8::from(i != NO_ROW);
    }
}

/// One byte (0 or 1) per bit of an LSB-first bitmap.
pub(crate) fn unpack_bits(bits: &[u8], rows: usize, out: &mut [u8]) {
    for (i, o) in out[..rows].iter_mut().enumerate() {
        *o = (bits[i >> 3] >> (i & 7)) & 1;
    }
}

/// An LSB-first bitmap of `bytes`, bit set where the byte is not 0.
pub(crate) fn pack_bits(bytes: &[u8], out: &mut [u8]) {
    for (i, &b) in bytes.iter().enumerate() {
        if b != 0 {
            out[i >> 3] |= 1 << (i & 7);
        }
    }
}
