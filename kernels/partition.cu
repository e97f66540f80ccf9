// partition.cu — stable radix partitioning of encoded keys (histogram -> scan -> scatter).
//
// A relation is split into 2^bits partitions by partition_of(key). Partition ids wider than
// 8 bits are handled as LSD digits of at most 8 bits, one pass per digit; every pass is a
// stable counting sort, so the result is stable overall and deterministic. Per pass:
//   1. radix_histogram: block b counts the digits of its tile   -> hist[digit * tiles + b]
//   2. exclusive scan of hist (scan.cu)                         -> offsets, digit-major
//   3. radix_scatter: block b ranks its tile's items stably      -> keys_out[pos], dst[i] = pos
//      (per-warp histograms; a ballot per digit bit finds the lanes with equal digits)
// After the passes, compose_dst chains the per-pass destinations into one permutation
// (dst[i] = final position of input row i), which scatter_wN (columns.cu) applies to every
// payload column, and partition_bounds finds where each partition starts.
// Example (bits 1, partition ids {1, 0, 1, 0}): dst {2, 0, 3, 1}, bounds {0, 2, 4}.
#include "common.cuh"

constexpr u32 kPartItems = 16;
constexpr u32 kPartTile = kBlockThreads * kPartItems;
constexpr u32 kMaxRadix = 256;

template <typename K>
__device__ __forceinline__ u32 digit_of(K key, u32 bits, u32 shift, u32 digit_bits) {
    return (partition_of(key, bits) >> shift) & ((1u << digit_bits) - 1u);
}

template <typename K>
__device__ void radix_histogram(const K* keys, u64 n, u32 bits, u32 shift, u32 digit_bits, u32* hist) {
    __shared__ u32 counts[kMaxRadix];
    u32 radix = 1u << digit_bits;
    for (u32 d = threadIdx.x; d < radix; d += blockDim.x) counts[d] = 0;
    __syncthreads();
    u64 base = (u64)blockIdx.x * kPartTile;
    for (int k = 0; k < kPartItems; ++k) {
        u64 i = base + (u64)k * kBlockThreads + threadIdx.x;
        if (i < n) atomicAdd(&counts[digit_of(keys[i], bits, shift, digit_bits)], 1u);
    }
    __syncthreads();
    for (u32 d = threadIdx.x; d < radix; d += blockDim.x) hist[(u64)d * gridDim.x + blockIdx.x] = counts[d];
}

template <typename K>
__device__ void radix_scatter(const K* keys, u64 n, u32 bits, u32 shift, u32 digit_bits,
                              const u32* offsets, K* keys_out, u32* dst) {
    __shared__ u32 warp_hist[kWarps][kMaxRadix];
    const u32 radix = 1u << digit_bits;
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 lt_mask = (1u << lane) - 1u;
    for (u32 d = threadIdx.x; d < radix; d += blockDim.x)
        for (int w = 0; w < kWarps; ++w) warp_hist[w][d] = 0;
    __syncthreads();

    // Phase A: each warp ranks its contiguous run of 32 * kPartItems items, in order.
    const u64 warp_base = (u64)blockIdx.x * kPartTile + (u64)warp * 32 * kPartItems;
    K key[kPartItems];
    u32 digit[kPartItems], rank[kPartItems];
#pragma unroll
    for (int k = 0; k < kPartItems; ++k) {
        u64 i = warp_base + (u64)k * 32 + lane;
        bool live = i < n;
        key[k] = live ? keys[i] : (K)0;
        digit[k] = live ? digit_of(key[k], bits, shift, digit_bits) : 0u;
        // Warp multisplit: lanes with the same digit (and the same liveness) are peers.
        u32 live_lanes = __ballot_sync(kFullMask, live);
        u32 peers = live ? live_lanes : ~live_lanes;
#pragma unroll
        for (u32 b = 0; b < 8; ++b) {
            if (b < digit_bits) {
                u32 bit = (digit[k] >> b) & 1u;
                u32 same = __ballot_sync(kFullMask, bit);
                peers &= bit ? same : ~same;
            }
        }
        u32 before = live ? warp_hist[warp][digit[k]] : 0;
        rank[k] = before + __popc(peers & lt_mask);
        __syncwarp();
        if (live && (peers & lt_mask) == 0) warp_hist[warp][digit[k]] = before + __popc(peers);
        __syncwarp();
    }
    __syncthreads();

    // Phase B: per digit, exclusive prefix over the warps of this block.
    for (u32 d = threadIdx.x; d < radix; d += blockDim.x) {
        u32 run = 0;
        for (int w = 0; w < kWarps; ++w) {
            u32 c = warp_hist[w][d];
            warp_hist[w][d] = run;
            run += c;
        }
    }
    __syncthreads();

    // Phase C: global position = digit's offset for this tile + warp offset + rank.
#pragma unroll
    for (int k = 0; k < kPartItems; ++k) {
        u64 i = warp_base + (u64)k * 32 + lane;
        if (i < n) {
            u32 pos = offsets[(u64)digit[k] * gridDim.x + blockIdx.x] + warp_hist[warp][digit[k]] + rank[k];
            keys_out[pos] = key[k];
            dst[i] = pos;
        }
    }
}

// dst[i] = second[first[i]]: where row i ends after two passes.
extern "C" __global__ void compose_dst(const u32* first, const u32* second, u64 n, u32* dst) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) dst[i] = second[first[i]];
}

// bounds[p] = first row of partition p in the partitioned keys; bounds[2^bits] = n.
template <typename K>
__device__ void partition_bounds(const K* keys, u64 n, u32 bits, u32* bounds) {
    u64 p = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 parts = 1ull << bits;
    if (p > parts) return;
    u64 lo = 0, hi = n;
    while (lo < hi) {
        u64 mid = (lo + hi) / 2;
        if ((u64)partition_of(keys[mid], bits) < p) lo = mid + 1; else hi = mid;
    }
    bounds[p] = (u32)lo;
}

#define PARTITION(K) \
    extern "C" __global__ void radix_histogram_##K(const K* keys, u64 n, u32 bits, u32 shift, u32 digit_bits, u32* hist) { \
        radix_histogram<K>(keys, n, bits, shift, digit_bits, hist); } \
    extern "C" __global__ void radix_scatter_##K(const K* keys, u64 n, u32 bits, u32 shift, u32 digit_bits, \
                                                 const u32* offsets, K* keys_out, u32* dst) { \
        radix_scatter<K>(keys, n, bits, shift, digit_bits, offsets, keys_out, dst); } \
    extern "C" __global__ void partition_bounds_##K(const K* keys, u64 n, u32 bits, u32* bounds) { \
        partition_bounds<K>(keys, n, bits, bounds); }

PARTITION(u32)
PARTITION(u64)
