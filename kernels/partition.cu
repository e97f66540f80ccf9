// partition.cu — stable radix partitioning of encoded keys (histogram -> scan -> scatter).
//
// A relation is split into 2^bits partitions by partition_of(key). Partition ids wider than
// 8 bits are handled as LSD digits of at most 8 bits, one pass per digit; every pass is a
// stable counting sort, so the result is stable overall and deterministic. Per pass:
//   1. radix_histogram: block b counts the digits of its tile   -> hist[digit * tiles + b]
//   2. exclusive scan of hist (scan.cu)                         -> offsets, digit-major
//   3. radix_scatter: block b ranks its tile's items stably (per-warp histograms; a ballot per
//      digit bit finds the lanes with equal digits), stages them in shared memory in digit
//      order and writes each digit's run with coalesced stores: keys_out[pos] = key,
//      idx_out[pos] = the input row the key came from (carried through the passes).
// After the passes, idx_out says for every position which input row lands there; gather_wN
// (columns.cu) moves every payload column with it, and partition_bounds finds where each
// partition starts.
// Example (bits 1, partition ids {1, 0, 1, 0}): idx_out {1, 3, 0, 2}, bounds {0, 2, 4}.
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
__device__ void radix_scatter(const K* keys, const u32* idx_in, u64 n, u32 bits, u32 shift, u32 digit_bits,
                              const u32* offsets, K* keys_out, u32* idx_out) {
    __shared__ u32 warp_hist[kWarps][kMaxRadix];
    __shared__ u32 digit_start[kMaxRadix];
    __shared__ u64 stage[kPartTile];  // the tile in digit order: keys, then row ids
    __shared__ u8 stage_digit[kPartTile];
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 lt_mask = (1u << lane) - 1u;
    const u64 tile_base = (u64)blockIdx.x * kPartTile;
    const u32 tile_len = (u32)min((u64)kPartTile, n - tile_base);
    for (u32 d = threadIdx.x; d < kMaxRadix; d += blockDim.x)
        for (int w = 0; w < kWarps; ++w) warp_hist[w][d] = 0;
    __syncthreads();

    // Phase A: each warp ranks its contiguous run of 32 * kPartItems items, in order.
    const u32 warp_first = warp * 32 * kPartItems;
    K key[kPartItems];
    u32 digit[kPartItems], rank[kPartItems];
    // All loads first, so that they are in flight together.
#pragma unroll
    for (int k = 0; k < kPartItems; ++k) {
        u32 j = warp_first + k * 32 + lane;
        key[k] = j < tile_len ? keys[tile_base + j] : (K)0;
    }
#pragma unroll
    for (int k = 0; k < kPartItems; ++k) {
        u32 j = warp_first + k * 32 + lane;
        bool live = j < tile_len;
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

    // Phase B: per digit, exclusive prefix over the warps and the digit's total ...
    for (u32 d = threadIdx.x; d < kMaxRadix; d += blockDim.x) {
        u32 run = 0;
        for (int w = 0; w < kWarps; ++w) {
            u32 c = warp_hist[w][d];
            warp_hist[w][d] = run;
            run += c;
        }
        digit_start[d] = run;
    }
    __syncthreads();
    // ... then where each digit's run starts in the tile: an exclusive scan of the 256 totals,
    // 8 per lane of warp 0, then across its lanes.
    if (warp == 0) {
        constexpr u32 kPerLane = kMaxRadix / 32;
        u32 v[kPerLane], sum = 0;
#pragma unroll
        for (int q = 0; q < kPerLane; ++q) { v[q] = digit_start[lane * kPerLane + q]; sum += v[q]; }
        u32 incl = sum;
        for (int o = 1; o < 32; o <<= 1) {
            u32 t = __shfl_up_sync(kFullMask, incl, o);
            if (lane >= o) incl += t;
        }
        u32 run = incl - sum;
#pragma unroll
        for (int q = 0; q < kPerLane; ++q) { digit_start[lane * kPerLane + q] = run; run += v[q]; }
    }
    __syncthreads();

    // Phase C: stage the keys in digit order, then write each digit's run to its global place,
    // consecutive threads to consecutive addresses; then the same for the row ids.
    K* stage_keys = reinterpret_cast<K*>(stage);
#pragma unroll
    for (int k = 0; k < kPartItems; ++k) {
        u32 j = warp_first + k * 32 + lane;
        if (j < tile_len) {
            u32 at = digit_start[digit[k]] + warp_hist[warp][digit[k]] + rank[k];
            stage_keys[at] = key[k];
            stage_digit[at] = (u8)digit[k];
            rank[k] = at;  // the item's place in the tile, reused for its row id below
        }
    }
    __syncthreads();
    for (u32 j = threadIdx.x; j < tile_len; j += blockDim.x) {
        u32 d = stage_digit[j];
        keys_out[offsets[(u64)d * gridDim.x + blockIdx.x] + j - digit_start[d]] = stage_keys[j];
    }
    __syncthreads();
    u32* stage_idx = reinterpret_cast<u32*>(stage);
    u32 row[kPartItems];
#pragma unroll
    for (int k = 0; k < kPartItems; ++k) {
        u32 j = warp_first + k * 32 + lane;
        row[k] = j < tile_len && idx_in ? idx_in[tile_base + j] : (u32)(tile_base + j);
    }
#pragma unroll
    for (int k = 0; k < kPartItems; ++k) {
        u32 j = warp_first + k * 32 + lane;
        if (j < tile_len) stage_idx[rank[k]] = row[k];
    }
    __syncthreads();
    for (u32 j = threadIdx.x; j < tile_len; j += blockDim.x) {
        u32 d = stage_digit[j];
        idx_out[offsets[(u64)d * gridDim.x + blockIdx.x] + j - digit_start[d]] = stage_idx[j];
    }
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
    extern "C" __global__ void __launch_bounds__(kBlockThreads) radix_scatter_##K(const K* keys, const u32* idx_in, \
        u64 n, u32 bits, u32 shift, u32 digit_bits, const u32* offsets, K* keys_out, u32* idx_out) { \
        radix_scatter<K>(keys, idx_in, n, bits, shift, digit_bits, offsets, keys_out, idx_out); } \
    extern "C" __global__ void partition_bounds_##K(const K* keys, u64 n, u32 bits, u32* bounds) { \
        partition_bounds<K>(keys, n, bits, bounds); }

PARTITION(u32)
PARTITION(u64)
