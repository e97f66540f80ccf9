//! [`HostBackend`]: the primitives in plain Rust over host memory — the twin of the CUDA
//! kernels (same hash functions, same stable partitioning, same match order), used where
//! there is no GPU and as the reference the CUDA primitives are tested against.

use std::collections::HashMap;
use std::hash::Hash;

use arrow::buffer::MutableBuffer;
use arrow::datatypes::ArrowNativeType;
use datafusion::common::{Result, internal_err};

use super::{
    Backend, JOIN_CHUNK, KeyColumnEncoding, KeyType, KeyWidth, MatchIndices, Partitioned, check_len,
};

/// Runs the join primitives on the CPU.
#[derive(Debug, Default, Clone)]
pub struct HostBackend;

/// An encoded key type (u32 or u64) with the hash functions of `kernels/common.cuh`.
trait EncodedKey: ArrowNativeType + Eq + Hash {
    const SENTINEL: Self;
    fn partition_of(self, bits: u32) -> u32;
}

impl EncodedKey for u32 {
    const SENTINEL: Self = u32::MAX;
    fn partition_of(self, bits: u32) -> u32 {
        if bits == 0 {
            0
        } else {
            self.wrapping_mul(0x9E37_79B1) >> (32 - bits)
        }
    }
}

impl EncodedKey for u64 {
    const SENTINEL: Self = u64::MAX;
    fn partition_of(self, bits: u32) -> u32 {
        if bits == 0 {
            0
        } else {
            (self.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> (64 - bits)) as u32
        }
    }
}

fn zeroed(bytes: usize) -> MutableBuffer {
    MutableBuffer::from_len_zeroed(bytes)
}

/// The first `rows` values of `buf` as `T`s.
fn typed<T: ArrowNativeType>(buf: &MutableBuffer, rows: usize) -> &[T] {
    let bytes = &buf.as_slice()[..rows * std::mem::size_of::<T>()];
    // SAFETY: `T` is a primitive Arrow type (any bit pattern is a value), and MutableBuffer
    // allocations are 64-byte aligned, so the whole slice is aligned for `T`.
    let (prefix, values, suffix) = unsafe { bytes.align_to::<T>() };
    assert!(
        prefix.is_empty() && suffix.is_empty(),
        "host buffers are 64-byte aligned"
    );
    values
}

/// The first `rows` values of `buf` as mutable `T`s.
fn typed_mut<T: ArrowNativeType>(buf: &mut MutableBuffer, rows: usize) -> &mut [T] {
    let bytes = &mut buf.as_slice_mut()[..rows * std::mem::size_of::<T>()];
    // SAFETY: as in `typed`.
    let (prefix, values, suffix) = unsafe { bytes.align_to_mut::<T>() };
    assert!(
        prefix.is_empty() && suffix.is_empty(),
        "host buffers are 64-byte aligned"
    );
    values
}

/// The first `rows` values of a key column, widened to 64 bits (sign-extended if signed).
fn widened(values: &MutableBuffer, ty: KeyType, rows: usize) -> Vec<u64> {
    match ty {
        KeyType::I8 => typed::<i8>(values, rows)
            .iter()
            .map(|&v| v as i64 as u64)
            .collect(),
        KeyType::I16 => typed::<i16>(values, rows)
            .iter()
            .map(|&v| v as i64 as u64)
            .collect(),
        KeyType::I32 => typed::<i32>(values, rows)
            .iter()
            .map(|&v| v as i64 as u64)
            .collect(),
        KeyType::I64 => typed::<i64>(values, rows)
            .iter()
            .map(|&v| v as u64)
            .collect(),
        KeyType::U8 => typed::<u8>(values, rows)
            .iter()
            .map(|&v| v as u64)
            .collect(),
        KeyType::U16 => typed::<u16>(values, rows)
            .iter()
            .map(|&v| v as u64)
            .collect(),
        KeyType::U32 => typed::<u32>(values, rows)
            .iter()
            .map(|&v| v as u64)
            .collect(),
        KeyType::U64 => typed::<u64>(values, rows).to_vec(),
    }
}

fn encode<K: EncodedKey + TryFrom<u64>>(
    values: &MutableBuffer,
    validity: Option<&MutableBuffer>,
    rows: usize,
    enc: &KeyColumnEncoding,
    acc: Option<MutableBuffer>,
) -> MutableBuffer {
    let first = acc.is_none();
    let mut out = acc.unwrap_or_else(|| zeroed(rows * K::get_byte_width()));
    let values = widened(values, enc.ty, rows);
    let out_keys = typed_mut::<K>(&mut out, rows);
    for (i, (o, &v)) in out_keys.iter_mut().zip(&values).enumerate() {
        let valid = validity.is_none_or(|b| b.as_slice()[i] != 0);
        let prev = if first { K::usize_as(0) } else { *o };
        *o = if !valid || !enc.in_range(v) || prev == K::SENTINEL {
            K::SENTINEL
        } else {
            let d = v.wrapping_sub(enc.min).wrapping_mul(enc.stride);
            // Truncation as in the kernel's `(K)(d * stride)`; the encoder guarantees it fits.
            let add = K::usize_as(d as usize);
            K::usize_as(prev.as_usize().wrapping_add(add.as_usize()))
        };
    }
    out
}

fn partition<K: EncodedKey>(
    keys: &MutableBuffer,
    rows: usize,
    bits: u32,
) -> Partitioned<MutableBuffer> {
    let keys = typed::<K>(keys, rows);
    let parts = 1usize << bits;
    let mut bounds = vec![0u32; parts + 1];
    for k in keys {
        bounds[k.partition_of(bits) as usize + 1] += 1;
    }
    for p in 0..parts {
        bounds[p + 1] += bounds[p];
    }
    let mut next = bounds.clone();
    let mut keys_out = zeroed(rows * K::get_byte_width());
    let mut src = zeroed(rows * 4);
    {
        let ko = typed_mut::<K>(&mut keys_out, rows);
        let from = typed_mut::<u32>(&mut src, rows);
        for (i, k) in keys.iter().enumerate() {
            let p = k.partition_of(bits) as usize;
            let pos = next[p];
            next[p] += 1;
            ko[pos as usize] = *k;
            from[pos as usize] = i as u32;
        }
    }
    let mut b = zeroed((parts + 1) * 4);
    typed_mut::<u32>(&mut b, parts + 1).copy_from_slice(&bounds);
    Partitioned {
        keys: keys_out,
        src,
        bounds: b,
        rows,
        bits,
    }
}

fn hash_join<K: EncodedKey>(
    build: &Partitioned<MutableBuffer>,
    probe: &Partitioned<MutableBuffer>,
) -> (Vec<u32>, Vec<u32>) {
    let rk = typed::<K>(&build.keys, build.rows);
    let sk = typed::<K>(&probe.keys, probe.rows);
    let parts = 1usize << build.bits;
    let rb = typed::<u32>(&build.bounds, parts + 1);
    let sb = typed::<u32>(&probe.bounds, parts + 1);
    let (mut r_out, mut s_out) = (Vec::new(), Vec::new());
    let mut table: HashMap<K, Vec<u32>> = HashMap::new();
    for p in 0..parts {
        let (r0, r1, s0, s1) = (
            rb[p] as usize,
            rb[p + 1] as usize,
            sb[p] as usize,
            sb[p + 1] as usize,
        );
        if r0 == r1 || s0 == s1 {
            continue;
        }
        for chunk in (r0..r1).step_by(JOIN_CHUNK) {
            table.clear();
            for r in chunk..(chunk + JOIN_CHUNK).min(r1) {
                if rk[r] != K::SENTINEL {
                    table.entry(rk[r]).or_default().push(r as u32);
                }
            }
            for (s, k) in sk.iter().enumerate().take(s1).skip(s0) {
                if let Some(rows) = table.get(k) {
                    for &r in rows {
                        r_out.push(r);
                        s_out.push(s as u32);
                    }
                }
            }
        }
    }
    (r_out, s_out)
}

fn from_u32s(v: &[u32]) -> MutableBuffer {
    let mut b = zeroed(v.len().max(1) * 4);
    typed_mut::<u32>(&mut b, v.len()).copy_from_slice(v);
    b
}

fn move_values(
    width: usize,
    rows: usize,
    f: impl Fn(usize) -> (usize, usize),
    src: &MutableBuffer,
    out: &mut MutableBuffer,
) {
    let (s, o) = (src.as_slice(), out.as_slice_mut());
    for i in 0..rows {
        let (from, to) = f(i);
        o[to * width..(to + 1) * width].copy_from_slice(&s[from * width..(from + 1) * width]);
    }
}

impl Backend for HostBackend {
    type Buf = MutableBuffer;

    fn name(&self) -> &'static str {
        "host"
    }

    fn upload(&self, bytes: &[u8]) -> Result<MutableBuffer> {
        let mut b = zeroed(bytes.len().max(1));
        b.as_slice_mut()[..bytes.len()].copy_from_slice(bytes);
        Ok(b)
    }

    fn upload_parts(&self, parts: &[&[u8]]) -> Result<MutableBuffer> {
        let total: usize = parts.iter().map(|p| p.len()).sum();
        let mut b = MutableBuffer::with_capacity(total.max(1));
        for p in parts {
            b.extend_from_slice(p);
        }
        if total == 0 {
            b.push(0u8);
        }
        Ok(b)
    }

    fn download(&self, buf: &MutableBuffer, out: &mut [u8]) -> Result<()> {
        check_len("download", buf.len(), out.len(), 1)?;
        out.copy_from_slice(&buf.as_slice()[..out.len()]);
        Ok(())
    }

    fn download_pieces(
        &self,
        buf: &MutableBuffer,
        len: usize,
        piece: usize,
    ) -> Result<Vec<arrow::buffer::Buffer>> {
        check_len("download_pieces", buf.len(), len, 1)?;
        let mut pieces = super::Pieces::new(len, piece);
        pieces.write(0, &buf.as_slice()[..len]);
        Ok(pieces.finish())
    }

    fn synchronize(&self) -> Result<()> {
        Ok(())
    }

    fn memory_use(&self) -> Option<(usize, usize)> {
        None
    }

    fn encode_keys(
        &self,
        values: &MutableBuffer,
        validity: Option<&MutableBuffer>,
        rows: usize,
        enc: &KeyColumnEncoding,
        width: KeyWidth,
        acc: Option<MutableBuffer>,
    ) -> Result<MutableBuffer> {
        check_len("encode_keys values", values.len(), rows, enc.ty.bytes())?;
        if let Some(v) = validity {
            check_len("encode_keys validity", v.len(), rows, 1)?;
        }
        if let Some(a) = &acc {
            check_len("encode_keys accumulator", a.len(), rows, width.bytes())?;
        }
        Ok(match width {
            KeyWidth::U32 => encode::<u32>(values, validity, rows, enc, acc),
            KeyWidth::U64 => encode::<u64>(values, validity, rows, enc, acc),
        })
    }

    fn exclusive_scan(&self, values: &MutableBuffer, n: usize) -> Result<MutableBuffer> {
        check_len("exclusive_scan", values.len(), n, 4)?;
        let mut out = Vec::with_capacity(n + 1);
        let mut run = 0u32;
        for &v in typed::<u32>(values, n) {
            out.push(run);
            run = run.wrapping_add(v);
        }
        out.push(run);
        Ok(from_u32s(&out))
    }

    fn partition(
        &self,
        keys: &MutableBuffer,
        rows: usize,
        width: KeyWidth,
        bits: u32,
    ) -> Result<Partitioned<MutableBuffer>> {
        check_len("partition", keys.len(), rows, width.bytes())?;
        Ok(match width {
            KeyWidth::U32 => partition::<u32>(keys, rows, bits),
            KeyWidth::U64 => partition::<u64>(keys, rows, bits),
        })
    }

    fn gather(
        &self,
        src: &MutableBuffer,
        idx: &MutableBuffer,
        rows: usize,
        width: usize,
    ) -> Result<MutableBuffer> {
        check_len("gather idx", idx.len(), rows, 4)?;
        let ix = typed::<u32>(idx, rows);
        let src_rows = src.len() / width.max(1);
        if ix.iter().any(|&p| p as usize >= src_rows) {
            return internal_err!("gather: index out of range");
        }
        let mut out = zeroed((rows * width).max(1));
        move_values(width, rows, |i| (ix[i] as usize, i), src, &mut out);
        Ok(out)
    }

    fn unpack_bits(&self, bits: &MutableBuffer, rows: usize) -> Result<MutableBuffer> {
        check_len("unpack_bits", bits.len(), rows.div_ceil(8), 1)?;
        let mut out = zeroed(rows.max(1));
        let b = bits.as_slice();
        for (i, o) in out.as_slice_mut()[..rows].iter_mut().enumerate() {
            *o = (b[i >> 3] >> (i & 7)) & 1;
        }
        Ok(out)
    }

    fn pack_bits(&self, bytes: &MutableBuffer, rows: usize) -> Result<MutableBuffer> {
        check_len("pack_bits", bytes.len(), rows, 1)?;
        let mut out = zeroed(rows.div_ceil(32).max(1) * 4);
        let o = out.as_slice_mut();
        for (i, &b) in bytes.as_slice()[..rows].iter().enumerate() {
            if b != 0 {
                o[i >> 3] |= 1 << (i & 7);
            }
        }
        Ok(out)
    }

    fn hash_join(
        &self,
        build: &Partitioned<MutableBuffer>,
        probe: &Partitioned<MutableBuffer>,
        width: KeyWidth,
    ) -> Result<MatchIndices<MutableBuffer>> {
        if build.bits != probe.bits {
            return internal_err!(
                "hash_join: build has {} partition bits, probe {}",
                build.bits,
                probe.bits
            );
        }
        let (r, s) = match width {
            KeyWidth::U32 => hash_join::<u32>(build, probe),
            KeyWidth::U64 => hash_join::<u64>(build, probe),
        };
        Ok(MatchIndices {
            len: r.len(),
            build: from_u32s(&r),
            probe: from_u32s(&s),
        })
    }
}
