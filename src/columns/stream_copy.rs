//! [`stream_copy`]: copies rows into a staging block with stores that bypass the CPU's caches
//! (non-temporal stores, on x86-64).
//!
//! What a partition stages is read next by the GPU's copy engine, not by the CPU. A cached
//! store first reads each destination line into the cache (the block is far larger than the
//! caches, so it is never there) and then leaves the line in the cache, where it evicts the
//! batches the CPU is about to read. A streaming store writes the line without reading it:
//! a third less memory traffic for the copy, measured 1.4x faster on one core of the build
//! machine (32 KiB copies of a 1 GiB source into a 64 MiB ring of destinations), on hosts
//! whose every core stages and aggregates at once.

/// Copies below this many bytes are plain copies: streaming stores pay off on whole lines.
const STREAM_MIN_BYTES: usize = 1024;

/// Copies `src` into `dst` (of the same length), with streaming stores where the target
/// allows and the copy is long enough.
pub fn stream_copy(dst: &mut [u8], src: &[u8]) {
    assert_eq!(dst.len(), src.len(), "stream_copy of unequal lengths");
    if dst.len() < STREAM_MIN_BYTES {
        dst.copy_from_slice(src);
        return;
    }
    streamed(dst, src);
}

#[cfg(target_arch = "x86_64")]
fn streamed(dst: &mut [u8], src: &[u8]) {
    use std::arch::x86_64::{_mm_loadu_si128, _mm_sfence, _mm_stream_si128};
    // Plain stores up to the first 16-byte boundary of `dst`, streaming stores of 16 bytes
    // from there, plain stores for the tail.
    let head = dst.as_ptr().align_offset(16).min(dst.len());
    let body = (dst.len() - head) / 16 * 16;
    let (dst_head, rest) = dst.split_at_mut(head);
    let (dst_body, dst_tail) = rest.split_at_mut(body);
    let (src_head, rest) = src.split_at(head);
    let (src_body, src_tail) = rest.split_at(body);
    dst_head.copy_from_slice(src_head);
    for (d, s) in dst_body.chunks_exact_mut(16).zip(src_body.chunks_exact(16)) {
        // SAFETY: `s` is 16 readable bytes (an unaligned load reads any address); `d` is 16
        // writable bytes at a 16-byte-aligned address, since `dst_body` starts at one and
        // the chunks are 16 bytes. SSE2 is part of every x86-64 CPU.
        unsafe { _mm_stream_si128(d.as_mut_ptr().cast(), _mm_loadu_si128(s.as_ptr().cast())) };
    }
    dst_tail.copy_from_slice(src_tail);
    // Streaming stores are weakly ordered: the fence makes them visible before any later
    // store, such as the one that hands the block to the lane.
    // SAFETY: `sfence` needs SSE, which every x86-64 CPU has; it touches no memory.
    unsafe { _mm_sfence() };
}

#[cfg(not(target_arch = "x86_64"))]
fn streamed(dst: &mut [u8], src: &[u8]) {
    dst.copy_from_slice(src);
}

#[cfg(test)]
mod tests {
    use super::stream_copy;

    #[test]
    fn copies_every_byte_at_any_offset_and_length() {
        let src: Vec<u8> = (0..5000u32).map(|i| (i * 31 + 7) as u8).collect();
        for len in [0, 1, 15, 16, 17, 1023, 1024, 1025, 2047, 4000] {
            for offset in 0..17 {
                let mut dst = vec![0xAAu8; len + 40];
                stream_copy(&mut dst[offset..offset + len], &src[3..3 + len]);
                assert_eq!(
                    &dst[offset..offset + len],
                    &src[3..3 + len],
                    "{len} at {offset}"
                );
                assert!(
                    dst[..offset].iter().all(|&b| b == 0xAA),
                    "{len} at {offset}"
                );
                assert!(
                    dst[offset + len..].iter().all(|&b| b == 0xAA),
                    "{len} at {offset}"
                );
            }
        }
    }
}
