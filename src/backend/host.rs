//! [`HostBackend`]: the primitives in plain Rust over host memory — the twin of the CUDA
//! kernels (same hash functions, same stable partitioning, same match order), used where
//! there is no GPU and as the reference the CUDA primitives are tested against.

use std::collections::HashMap;
use std::hash::Hash;

use arrow::buffer::MutableBuffer;
use arrow::datatypes::ArrowNativeType;
use datafusion::common::{Result, internal_err};

use super::{
    Backend, JOIN_CHUNK, KeyColumnEncoding, KeyType, KeyWidth, MatchIndices, Partitioned,
    check_carry, check_len,
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

/// Partitions `keys`; also returns, for each position in partition order, the input row it
/// holds (u32 per row), by which the carried columns are gathered.
fn partition<K: EncodedKey>(
    keys: &MutableBuffer,
    rows: usize,
    bits: u32,
) -> (Partitioned<MutableBuffer>, MutableBuffer) {
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
    let parts = Partitioned {
        keys: keys_out,
        bounds: b,
        rows,
        bits,
        carried: vec![],
    };
    (parts, src)
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
            let end = (chunk + JOIN_CHUNK).min(r1);
            for (r, k) in rk.iter().enumerate().take(end).skip(chunk) {
                if *k != K::SENTINEL {
                    table.entry(*k).or_default().push(r as u32);
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
        pieces.push(&buf.as_slice()[..len]);
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
        carry: &[(&MutableBuffer, usize)],
    ) -> Result<Partitioned<MutableBuffer>> {
        check_len("partition", keys.len(), rows, width.bytes())?;
        check_carry(carry.iter().map(|(b, w)| (b.len(), *w)), rows)?;
        let (mut parts, src) = match width {
            KeyWidth::U32 => partition::<u32>(keys, rows, bits),
            KeyWidth::U64 => partition::<u64>(keys, rows, bits),
        };
        parts.carried = carry
            .iter()
            .map(|&(buf, w)| self.gather(buf, &src, rows, w))
            .collect::<Result<_>>()?;
        Ok(parts)
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

#[cfg(test)]
mod tests {
    use super::*;

    fn u32s(v: &[u32]) -> MutableBuffer {
        from_u32s(v)
    }

    fn read_u32(b: &MutableBuffer, n: usize) -> Vec<u32> {
        typed::<u32>(b, n).to_vec()
    }

    #[test]
    fn partition_is_a_stable_counting_sort_by_partition_id() {
        let keys: Vec<u32> = (0..1000).map(|i| (i * 7919) % 501).collect();
        let rows: Vec<u32> = (0..1000).collect();
        let p = HostBackend
            .partition(
                &u32s(&keys),
                keys.len(),
                KeyWidth::U32,
                4,
                &[(&u32s(&rows), 4)],
            )
            .unwrap();
        let out = read_u32(&p.keys, keys.len());
        let src = read_u32(&p.carried[0], keys.len());
        let bounds = read_u32(&p.bounds, 17);
        // Reference: sort row ids by (partition id, row id).
        let mut want: Vec<usize> = (0..keys.len()).collect();
        want.sort_by_key(|&i| (keys[i].partition_of(4), i));
        assert_eq!(src, want.iter().map(|&i| i as u32).collect::<Vec<_>>());
        assert_eq!(out, want.iter().map(|&i| keys[i]).collect::<Vec<_>>());
        for p in 0..16u32 {
            for j in bounds[p as usize]..bounds[p as usize + 1] {
                assert_eq!(out[j as usize].partition_of(4), p);
            }
        }
        assert_eq!(bounds[16], 1000);
    }

    #[test]
    fn hash_join_orders_by_probe_row_then_build_row() {
        let h = HostBackend;
        // build {5, 7, 5}, probe {5, 9, 7, sentinel}
        // Each side carries its row numbers, to map positions back to input rows.
        let b = h
            .partition(
                &u32s(&[5, 7, 5]),
                3,
                KeyWidth::U32,
                1,
                &[(&u32s(&[0, 1, 2]), 4)],
            )
            .unwrap();
        let p = h
            .partition(
                &u32s(&[5, 9, 7, u32::MAX]),
                4,
                KeyWidth::U32,
                1,
                &[(&u32s(&[0, 1, 2, 3]), 4)],
            )
            .unwrap();
        let m = h.hash_join(&b, &p, KeyWidth::U32).unwrap();
        let (bs, ps) = (read_u32(&m.build, m.len), read_u32(&m.probe, m.len));
        let bsrc = read_u32(&b.carried[0], 3);
        let psrc = read_u32(&p.carried[0], 4);
        let pairs: Vec<(u32, u32)> = bs
            .iter()
            .zip(&ps)
            .map(|(&r, &s)| (bsrc[r as usize], psrc[s as usize]))
            .collect();
        let mut sorted = pairs.clone();
        sorted.sort();
        assert_eq!(sorted, vec![(0, 0), (1, 2), (2, 0)]);
        // Within a probe row, build rows ascend.
        for w in pairs.windows(2) {
            if w[0].1 == w[1].1 {
                assert!(w[0].0 < w[1].0);
            }
        }
    }

    #[test]
    fn encode_maps_ranges_and_sentinels() {
        let h = HostBackend;
        let vals: Vec<u8> = [10i32, 12, 11, 99]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let valid = h.upload(&[1, 1, 0, 1]).unwrap();
        let enc = KeyColumnEncoding {
            ty: KeyType::I32,
            min: 10,
            max: 12,
            stride: 1,
        };
        let out = h
            .encode_keys(
                &h.upload(&vals).unwrap(),
                Some(&valid),
                4,
                &enc,
                KeyWidth::U32,
                None,
            )
            .unwrap();
        assert_eq!(read_u32(&out, 4), vec![0, 2, u32::MAX, u32::MAX]);
        // A second column accumulates with its stride.
        let enc2 = KeyColumnEncoding {
            ty: KeyType::I32,
            min: 10,
            max: 12,
            stride: 3,
        };
        let out = h
            .encode_keys(
                &h.upload(&vals).unwrap(),
                None,
                4,
                &enc2,
                KeyWidth::U32,
                Some(out),
            )
            .unwrap();
        assert_eq!(read_u32(&out, 4), vec![0, 8, u32::MAX, u32::MAX]);
    }

    #[test]
    fn scan_gather_and_bits() {
        let h = HostBackend;
        assert_eq!(
            read_u32(&h.exclusive_scan(&u32s(&[3, 1, 3]), 3).unwrap(), 4),
            vec![0, 3, 4, 7]
        );
        assert_eq!(
            read_u32(&h.exclusive_scan(&u32s(&[]), 0).unwrap(), 1),
            vec![0]
        );
        let g = h
            .gather(&u32s(&[7, 8, 9]), &u32s(&[2, 2, 0]), 3, 4)
            .unwrap();
        assert_eq!(read_u32(&g, 3), vec![9, 9, 7]);
        assert!(h.gather(&u32s(&[7]), &u32s(&[3]), 1, 4).is_err());
        let bytes = h
            .unpack_bits(&h.upload(&[0b1010_0101, 0b1]).unwrap(), 9)
            .unwrap();
        assert_eq!(&bytes.as_slice()[..9], &[1, 0, 1, 0, 0, 1, 0, 1, 1]);
        let packed = h.pack_bits(&bytes, 9).unwrap();
        assert_eq!(&packed.as_slice()[..2], &[0b1010_0101, 0b1]);
    }
}
