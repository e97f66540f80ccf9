// scan.cu — device-wide exclusive prefix sum, built from cub::BlockScan.
//
// Phases for n elements in tiles of kScanTile:
//   1. scan_reduce_T: each block sums its tile                  -> sums[tile]
//   2. (host recursion) exclusive scan of sums                   -> sums[tile] = carry-in
//   3. scan_tiles_T:  each block scans its tile, adds its carry  -> out[i]
// A single tile skips phases 1-2. `out` has n + 1 elements: out[n] is the total.
// Example: in {3, 1, 3} -> out {0, 3, 4, 7}.
// store_u64 hands one value (such a total) to the host through mapped pinned memory.
#include "common.cuh"
#include <cub/block/block_scan.cuh>
#include <cub/block/block_reduce.cuh>

constexpr u32 kScanTile = kBlockThreads * kScanItems;

template <typename T>
__device__ void scan_reduce(const T* in, u64 n, T* sums) {
    typedef cub::BlockReduce<T, kBlockThreads> Reduce;
    __shared__ typename Reduce::TempStorage tmp;
    u64 base = (u64)blockIdx.x * kScanTile;
    T acc = 0;
    for (int k = 0; k < kScanItems; ++k) {
        u64 i = base + (u64)k * kBlockThreads + threadIdx.x;
        if (i < n) acc += in[i];
    }
    T total = Reduce(tmp).Sum(acc);
    if (threadIdx.x == 0) sums[blockIdx.x] = total;
}

template <typename T>
__device__ void scan_tiles(const T* in, u64 n, const T* carry, T* out) {
    typedef cub::BlockScan<T, kBlockThreads> Scan;
    __shared__ typename Scan::TempStorage tmp;
    u64 base = (u64)blockIdx.x * kScanTile + (u64)threadIdx.x * kScanItems;
    T items[kScanItems];
    for (int k = 0; k < kScanItems; ++k) {
        u64 i = base + k;
        items[k] = i < n ? in[i] : (T)0;
    }
    T block_total;
    Scan(tmp).ExclusiveSum(items, items, block_total);
    T c = carry ? carry[blockIdx.x] : (T)0;
    for (int k = 0; k < kScanItems; ++k) {
        u64 i = base + k;
        if (i < n) out[i] = items[k] + c;
    }
    // The last tile writes the grand total after the last element.
    if (blockIdx.x == gridDim.x - 1 && threadIdx.x == 0) out[n] = c + block_total;
}

extern "C" __global__ void scan_reduce_u32(const u32* in, u64 n, u32* sums) { scan_reduce<u32>(in, n, sums); }
extern "C" __global__ void scan_reduce_u64(const u64* in, u64 n, u64* sums) { scan_reduce<u64>(in, n, sums); }
extern "C" __global__ void scan_tiles_u32(const u32* in, u64 n, const u32* carry, u32* out) { scan_tiles<u32>(in, n, carry, out); }
extern "C" __global__ void scan_tiles_u64(const u64* in, u64 n, const u64* carry, u64* out) { scan_tiles<u64>(in, n, carry, out); }

// *dst = *src, by one thread; `dst` is pinned host memory mapped into the device, so the store
// crosses PCIe by itself instead of queueing behind other streams' copies on a copy engine.
extern "C" __global__ void store_u64(const u64* src, u64* dst) {
    if (blockIdx.x == 0 && threadIdx.x == 0) {
        *dst = *src;
        __threadfence_system();
    }
}
