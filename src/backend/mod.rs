//! The primitives every join algorithm is written in, behind one trait with two twins:
//! [`CudaBackend`] launches the kernels of `kernels/`, [`HostBackend`] runs the same steps in
//! plain Rust. Given the same inputs the two return the same bytes — partitioning is stable and
//! match output has one defined order — and the GPU test suite checks each CUDA primitive
//! against its host twin.
//!
//! Buffers are untyped bytes living on the backend ([`Backend::Buf`]); each primitive states
//! the element type it reads and writes.

mod cuda;
mod host;
mod keys;

use arrow::buffer::{Buffer, MutableBuffer};
use datafusion::common::Result;

pub use cuda::CudaBackend;
pub use host::HostBackend;
pub use keys::{KeyColumnEncoding, KeyType, KeyWidth};

/// Build rows one match-finding task loads into its hash table (`kJoinChunk` in
/// `kernels/hash_join.cu`); larger partitions are joined chunk by chunk.
pub const JOIN_CHUNK: usize = 2048;

/// A relation's encoded keys after stable radix partitioning.
#[derive(Debug)]
pub struct Partitioned<B> {
    /// Encoded keys (u32 or u64) in partition order.
    pub keys: B,
    /// `2^bits + 1` u32 offsets: partition p holds rows `bounds[p]..bounds[p+1]`.
    pub bounds: B,
    /// Number of rows.
    pub rows: usize,
    /// Partition bits: `2^bits` partitions.
    pub bits: u32,
    /// The columns given to [`Backend::partition`] to carry, in partition order like the keys.
    pub carried: Vec<B>,
}

/// Matching pairs of positions in the partitioned build and probe relations.
#[derive(Debug)]
pub struct MatchIndices<B> {
    /// Build-side positions (u32 per match).
    pub build: B,
    /// Probe-side positions (u32 per match).
    pub probe: B,
    /// Number of matches.
    pub len: usize,
}

/// The primitives of the join algorithms, on one kind of memory and processor.
pub trait Backend: Send + Sync + 'static {
    /// A buffer of bytes in this backend's memory.
    type Buf: Send + Sync + 'static;

    /// "cuda" or "host".
    fn name(&self) -> &'static str;

    /// Copies host bytes into a new buffer.
    fn upload(&self, bytes: &[u8]) -> Result<Self::Buf> {
        self.upload_parts(&[bytes])
    }

    /// Copies several host byte slices, one after another, into one new buffer.
    fn upload_parts(&self, parts: &[&[u8]]) -> Result<Self::Buf>;

    /// Copies the first `out.len()` bytes of `buf` to the host.
    fn download(&self, buf: &Self::Buf, out: &mut [u8]) -> Result<()>;

    /// Copies the first `len` bytes of `buf` to the host as buffers of `piece` bytes each (the
    /// last may be shorter): output batches get their own small allocations, which the host
    /// allocator recycles, instead of slices of one huge one.
    fn download_pieces(&self, buf: &Self::Buf, len: usize, piece: usize) -> Result<Vec<Buffer>>;

    /// Waits until all queued work is done (phase timing).
    fn synchronize(&self) -> Result<()>;

    /// Bytes of backend memory held now and at most, if this backend tracks them.
    fn memory_use(&self) -> Option<(usize, usize)>;

    /// Encodes one key column (`rows` values of `enc.ty`, optional validity bytes) into keys of
    /// `width`; `acc` holds the encoding of the previous key columns of a composite key.
    fn encode_keys(
        &self,
        values: &Self::Buf,
        validity: Option<&Self::Buf>,
        rows: usize,
        enc: &KeyColumnEncoding,
        width: KeyWidth,
        acc: Option<Self::Buf>,
    ) -> Result<Self::Buf>;

    /// Exclusive prefix sum of `n` u32 values; the result has `n + 1` values, the last the total.
    fn exclusive_scan(&self, values: &Self::Buf, n: usize) -> Result<Self::Buf>;

    /// Stable radix partitioning of `rows` encoded keys into `2^bits` partitions, carrying
    /// along the columns in `carry` (buffers of `rows` values of 1, 2, 4, 8 or 16 bytes).
    fn partition(
        &self,
        keys: &Self::Buf,
        rows: usize,
        width: KeyWidth,
        bits: u32,
        carry: &[(&Self::Buf, usize)],
    ) -> Result<Partitioned<Self::Buf>>;

    /// `out[i] = src[idx[i]]` for `rows` values of `width` bytes (1, 2, 4, 8 or 16).
    fn gather(
        &self,
        src: &Self::Buf,
        idx: &Self::Buf,
        rows: usize,
        width: usize,
    ) -> Result<Self::Buf>;

    /// One byte (0 or 1) per bit of an LSB-first bitmap of `rows` bits.
    fn unpack_bits(&self, bits: &Self::Buf, rows: usize) -> Result<Self::Buf>;

    /// An LSB-first bitmap (whole u32 words) of `rows` bytes, bit set where the byte is not 0.
    fn pack_bits(&self, bytes: &Self::Buf, rows: usize) -> Result<Self::Buf>;

    /// All pairs of equal keys between two relations partitioned with the same bits, as
    /// positions in each; ordered by partition, build chunk, probe row, build row.
    fn hash_join(
        &self,
        build: &Partitioned<Self::Buf>,
        probe: &Partitioned<Self::Buf>,
        width: KeyWidth,
    ) -> Result<MatchIndices<Self::Buf>>;
}

/// Checks that a buffer of `have` bytes holds `rows` values of `width` bytes.
pub(crate) fn check_len(what: &str, have: usize, rows: usize, width: usize) -> Result<()> {
    let need = rows.checked_mul(width);
    match need {
        Some(need) if need <= have => Ok(()),
        _ => datafusion::common::internal_err!(
            "{what}: buffer of {have} bytes cannot hold {rows} values of {width} bytes"
        ),
    }
}

/// Checks the columns given to [`Backend::partition`] to carry, as (bytes, width) pairs:
/// `rows` values of 1, 2, 4, 8 or 16 bytes each.
pub(crate) fn check_carry(
    carry: impl IntoIterator<Item = (usize, usize)>,
    rows: usize,
) -> Result<()> {
    for (bytes, width) in carry {
        if !matches!(width, 1 | 2 | 4 | 8 | 16) {
            return datafusion::common::internal_err!(
                "partition: cannot carry {width}-byte values"
            );
        }
        check_len("partition carry", bytes, rows, width)?;
    }
    Ok(())
}

/// Host buffers of `piece` bytes being filled, in order, from a longer byte sequence. They are
/// not zeroed first: each byte is written once, by the copy.
pub(crate) struct Pieces {
    piece: usize,
    len: usize,
    written: usize,
    bufs: Vec<MutableBuffer>,
}

impl Pieces {
    /// Empty pieces that will cover `len` bytes.
    pub(crate) fn new(len: usize, piece: usize) -> Self {
        Self {
            piece: piece.max(1),
            len,
            written: 0,
            bufs: vec![],
        }
    }

    /// Appends `src` to the sequence.
    pub(crate) fn push(&mut self, mut src: &[u8]) {
        while !src.is_empty() {
            if self.written.is_multiple_of(self.piece) {
                let size = self.piece.min(self.len.saturating_sub(self.written));
                self.bufs.push(MutableBuffer::with_capacity(size));
            }
            let room = self.piece - self.written % self.piece;
            let n = room.min(src.len());
            let last = self.bufs.last_mut().expect("a piece with room");
            last.extend_from_slice(&src[..n]);
            self.written += n;
            src = &src[n..];
        }
    }

    pub(crate) fn finish(self) -> Vec<Buffer> {
        debug_assert_eq!(self.written, self.len, "pieces not filled");
        self.bufs.into_iter().map(Buffer::from).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::Pieces;

    #[test]
    fn pieces_cut_a_sequence_pushed_in_uneven_parts() {
        let data: Vec<u8> = (0..=255).cycle().take(1000).collect();
        let mut pieces = Pieces::new(data.len(), 300);
        for part in data.chunks(7) {
            pieces.push(part);
        }
        let bufs = pieces.finish();
        let sizes: Vec<usize> = bufs.iter().map(|b| b.len()).collect();
        assert_eq!(sizes, [300, 300, 300, 100]);
        let joined: Vec<u8> = bufs.iter().flat_map(|b| b.as_slice().to_vec()).collect();
        assert_eq!(joined, data);
    }
}
