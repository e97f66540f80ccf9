// merge_join.cu — match finding of the sort-merge join: sorted search -> count -> scan -> write.
//
// Both relations come sorted by their sort key, sort_key(key) = partition_of(key, 32), stably
// (partition.cu's passes over all 32 bits of the partition hash: Backend::sort). For 4-byte keys
// that hash is a bijection, so a run of equal sort keys holds one key; for 8-byte keys it is the
// hash's top 32 bits, so a run may hold several keys, and each build key of the run is compared.
//   1. merge_count: a thread per probe row finds the first build row whose sort key is not below
//      its own (binary search; the probe rows are sorted too, so a warp's searches share their
//      path through the cache but for its last steps), counts the build rows of that run that
//      hold its key, and each warp stores its total.
//   2. exclusive scan of the warps' totals (scan.cu, u64)              -> where each warp writes.
//   3. merge_write: the same search; a warp scan of the counts gives each row its place, and it
//      writes its (build row, probe row) pairs.
// No atomics decide output positions: pairs come ordered by probe row, then build row, the
// order the host backend produces. The sentinel key (null, or outside the build side's range)
// matches nothing. A probe row's matches are written by its thread alone, so a key that many
// build and probe rows share makes long threads (no load-balancing search).
// Example (sort keys = keys; build {5, 5, 7}, probe {5, 9}): counts {2, 0}, pairs {(0,0), (1,0)}.
#include "common.cuh"

template <typename K> __device__ __forceinline__ u32 sort_key(K k) { return partition_of(k, 32u); }

// The first of build rows [0, n) whose sort key is not below h.
template <typename K>
__device__ __forceinline__ u64 first_not_below(const K* __restrict__ keys, u64 n, u32 h) {
    u64 lo = 0, hi = n;
    while (lo < hi) {
        u64 mid = (lo + hi) >> 1;
        if (sort_key(keys[mid]) < h) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

// Probe row i's matches: its first candidate build row (in *first) and how many build rows of
// its sort-key run hold its key. Rows past the probe side count none.
template <typename K>
__device__ __forceinline__ u32 matches_of(const K* __restrict__ r, u64 r_rows, const K* __restrict__ s,
                                          u64 s_rows, u64 i, K* key, u64* first) {
    *first = r_rows;
    if (i >= s_rows) return 0;
    K k = s[i];
    *key = k;
    if (k == key_sentinel<K>()) return 0;
    u32 h = sort_key(k);
    u64 b = first_not_below(r, r_rows, h);
    *first = b;
    u32 c = 0;
    for (u64 j = b; j < r_rows; ++j) {
        K rk = r[j];
        if (sort_key(rk) != h) break;
        c += rk == k;
    }
    return c;
}

template <typename K>
__device__ void merge_count(const K* __restrict__ r, u64 r_rows, const K* __restrict__ s, u64 s_rows,
                            u64* __restrict__ counts) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    K key;
    u64 first;
    u64 c = matches_of(r, r_rows, s, s_rows, i, &key, &first);
#pragma unroll
    for (int d = 16; d > 0; d >>= 1) c += __shfl_down_sync(kFullMask, c, d);
    if ((threadIdx.x & 31) == 0) counts[i >> 5] = c;
}

template <typename K>
__device__ void merge_write(const K* __restrict__ r, u64 r_rows, const K* __restrict__ s, u64 s_rows,
                            const u64* __restrict__ offsets, u32* __restrict__ r_out, u32* __restrict__ s_out) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    K key;
    u64 first;
    u32 c = matches_of(r, r_rows, s, s_rows, i, &key, &first);
    // Inclusive scan of the warp's counts: this row's place is the warp's offset plus the
    // counts of the lanes before it.
    u64 inclusive = c;
    u32 lane = threadIdx.x & 31;
#pragma unroll
    for (int d = 1; d < 32; d <<= 1) {
        u64 v = __shfl_up_sync(kFullMask, inclusive, d);
        if (lane >= (u32)d) inclusive += v;
    }
    if (c == 0) return;
    u64 at = offsets[i >> 5] + inclusive - c;
    u32 h = sort_key(key);
    for (u64 j = first; j < r_rows; ++j) {
        K rk = r[j];
        if (sort_key(rk) != h) break;
        if (rk == key) {
            r_out[at] = (u32)j;
            s_out[at] = (u32)i;
            ++at;
        }
    }
}

extern "C" __global__ void merge_count_u32(const u32* r, u64 r_rows, const u32* s, u64 s_rows, u64* counts) {
    merge_count(r, r_rows, s, s_rows, counts);
}
extern "C" __global__ void merge_count_u64(const u64* r, u64 r_rows, const u64* s, u64 s_rows, u64* counts) {
    merge_count(r, r_rows, s, s_rows, counts);
}
extern "C" __global__ void merge_write_u32(const u32* r, u64 r_rows, const u32* s, u64 s_rows, const u64* offsets,
                                           u32* r_out, u32* s_out) {
    merge_write(r, r_rows, s, s_rows, offsets, r_out, s_out);
}
extern "C" __global__ void merge_write_u64(const u64* r, u64 r_rows, const u64* s, u64 s_rows, const u64* offsets,
                                           u32* r_out, u32* s_out) {
    merge_write(r, r_rows, s, s_rows, offsets, r_out, s_out);
}
