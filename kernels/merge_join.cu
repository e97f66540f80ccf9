// merge_join.cu — match finding of the sort-merge join: sorted search -> count -> scan -> write;
// and of the index nested loop join (INLJ), the same search from probe rows in any order.
//
// Both relations come sorted by their sort key, partition_of(key, bits), stably (partition.cu's
// passes: Backend::sort), with bits chosen for runs of a few build rows (join::smj); for INLJ
// (`indexed`), only the build side, the index, whose every row is each tile's window. A run of
// equal sort keys may hold several keys, so each build key of a probe row's run is compared
// with its own (but with 32 bits and 4-byte keys, where the sort key is a bijection).
//   1. merge_count: a block takes a tile of kMergeTile probe rows. The probe rows are sorted, so
//      the build rows they can match lie in one window: from the first build row whose sort key
//      is not below the tile's first to the first above its last (two binary searches). A
//      window of at most kMergeWindow rows has its keys loaded into shared memory; each
//      probe row finds its run there by binary search (in global memory, within the window,
//      where the window is larger), counts the build rows of the run that hold its key, and
//      each group of 32 consecutive probe rows (a warp's) stores its total.
//   2. exclusive scan of the groups' totals (scan.cu, u64)          -> where each group writes.
//   3. merge_write: the same search; a warp scan of the counts gives each row its place, and it
//      writes its (build row, probe row) pairs.
// No atomics decide output positions: pairs come ordered by probe row, then build row, the
// order the host backend produces. The sentinel key (null, or outside the build side's range)
// matches nothing. A probe row's matches are written by its thread alone, so a key that many
// build and probe rows share makes long threads (no load-balancing search).
// Example (sort keys = keys; build {5, 5, 7}, probe {5, 9}): the rows count 2 and 0 (their
// group stores 2), pairs {(0,0), (1,0)}.
#include "common.cuh"

// Probe rows of a block (a thread's kMergeItems rows lie kBlockThreads apart, so that each
// group of 32 consecutive rows is one warp's).
constexpr u32 kMergeTile = kBlockThreads * kMergeItems;
// Most build rows a block's window holds in shared memory (their keys).
constexpr u32 kMergeWindow = 4096;

// The first of build rows [lo, hi) whose sort key is not below h (hi if none).
template <typename K>
__device__ __forceinline__ u64 first_not_below(const K* __restrict__ keys, u64 lo, u64 hi, u32 bits, u32 h) {
    while (lo < hi) {
        u64 mid = (lo + hi) >> 1;
        if (partition_of(keys[mid], bits) < h) lo = mid + 1;
        else hi = mid;
    }
    return lo;
}

// The build rows a block's probe tile can match, and (where they fit) their keys.
template <typename K>
struct Window {
    const K* keys;  // build row lo's key at keys[0]: shared memory where `shared`, else global
    u64 lo, hi;
    u32 bits;
    bool shared;
    // One key of a 4-byte key's run: its sort key is a bijection.
    bool exact;
};

// Finds the window of the tile [t0, t1) of probe rows (t0 < t1) and loads it if it fits: every
// build row where the probe rows come in any order (`indexed`). Every thread of the block calls
// it.
template <typename K>
__device__ Window<K> tile_window(const K* __restrict__ r, u64 r_rows, const K* __restrict__ s, u64 t0, u64 t1,
                                 u32 bits, u32 indexed, K* win) {
    __shared__ u64 bounds[2];
    if (threadIdx.x == 0 && indexed) {
        bounds[0] = 0;
        bounds[1] = r_rows;
    } else if (threadIdx.x == 0) {
        u32 first = partition_of(s[t0], bits), last = partition_of(s[t1 - 1], bits);
        u64 lo = first_not_below(r, 0, r_rows, bits, first);
        bool top = bits == 32 ? last == 0xffffffffu : last == (1u << bits) - 1u;
        bounds[0] = lo;
        bounds[1] = top ? r_rows : first_not_below(r, lo, r_rows, bits, last + 1);
    }
    __syncthreads();
    Window<K> w;
    w.lo = bounds[0];
    w.hi = bounds[1];
    w.bits = bits;
    w.exact = sizeof(K) == 4 && bits == 32;
    w.shared = w.hi - w.lo <= kMergeWindow;
    if (w.shared) {
        for (u64 j = w.lo + threadIdx.x; j < w.hi; j += blockDim.x) win[j - w.lo] = r[j];
        w.keys = win;
    } else {
        w.keys = r + w.lo;
    }
    __syncthreads();
    return w;
}

// Probe row i's matches in the window: its run's first build row (*first, counted from the
// window's first) and how many build rows of the run hold its key. Rows past the probe side
// count none.
template <typename K>
__device__ __forceinline__ u32 matches_of(const Window<K>& w, const K* __restrict__ s, u64 s_rows, u64 i, K* key,
                                          u64* first) {
    *first = 0;
    if (i >= s_rows) return 0;
    K k = s[i];
    *key = k;
    if (k == key_sentinel<K>()) return 0;
    u32 h = partition_of(k, w.bits);
    u64 n = w.hi - w.lo;
    u64 b = first_not_below(w.keys, 0, n, w.bits, h);
    *first = b;
    u32 c = 0;
    for (u64 j = b; j < n; ++j) {
        K rk = w.keys[j];
        if (partition_of(rk, w.bits) != h) break;
        c += w.exact || rk == k;
    }
    return c;
}

template <typename K>
__device__ void merge_count(const K* __restrict__ r, u64 r_rows, const K* __restrict__ s, u64 s_rows, u32 bits,
                            u32 indexed, u64* __restrict__ counts) {
    __shared__ K win[kMergeWindow];
    u64 t0 = (u64)blockIdx.x * kMergeTile;
    u64 t1 = min(t0 + kMergeTile, s_rows);
    Window<K> w = tile_window(r, r_rows, s, t0, t1, bits, indexed, win);
#pragma unroll 1
    for (u32 item = 0; item < kMergeItems; ++item) {
        u64 i = t0 + (u64)item * kBlockThreads + threadIdx.x;
        K key;
        u64 first;
        u64 c = matches_of(w, s, s_rows, i, &key, &first);
#pragma unroll
        for (int d = 16; d > 0; d >>= 1) c += __shfl_down_sync(kFullMask, c, d);
        if ((threadIdx.x & 31) == 0) counts[i >> 5] = c;
    }
}

template <typename K>
__device__ void merge_write(const K* __restrict__ r, u64 r_rows, const K* __restrict__ s, u64 s_rows, u32 bits,
                            u32 indexed, const u64* __restrict__ offsets, u32* __restrict__ r_out,
                            u32* __restrict__ s_out) {
    __shared__ K win[kMergeWindow];
    u64 t0 = (u64)blockIdx.x * kMergeTile;
    u64 t1 = min(t0 + kMergeTile, s_rows);
    Window<K> w = tile_window(r, r_rows, s, t0, t1, bits, indexed, win);
    u32 lane = threadIdx.x & 31;
    u64 n = w.hi - w.lo;
#pragma unroll 1
    for (u32 item = 0; item < kMergeItems; ++item) {
        u64 i = t0 + (u64)item * kBlockThreads + threadIdx.x;
        K key;
        u64 first;
        u32 c = matches_of(w, s, s_rows, i, &key, &first);
        // Inclusive scan of the group's counts: this row's place is the group's offset plus the
        // counts of the lanes before it.
        u64 inclusive = c;
#pragma unroll
        for (int d = 1; d < 32; d <<= 1) {
            u64 v = __shfl_up_sync(kFullMask, inclusive, d);
            if (lane >= (u32)d) inclusive += v;
        }
        if (c == 0) continue;
        u64 at = offsets[i >> 5] + inclusive - c;
        u32 h = partition_of(key, w.bits);
        for (u64 j = first; j < n; ++j) {
            K rk = w.keys[j];
            if (partition_of(rk, w.bits) != h) break;
            if (w.exact || rk == key) {
                r_out[at] = (u32)(w.lo + j);
                s_out[at] = (u32)i;
                ++at;
            }
        }
    }
}

extern "C" __global__ void merge_count_u32(const u32* r, u64 r_rows, const u32* s, u64 s_rows, u32 bits, u32 indexed,
                                           u64* counts) {
    merge_count(r, r_rows, s, s_rows, bits, indexed, counts);
}
extern "C" __global__ void merge_count_u64(const u64* r, u64 r_rows, const u64* s, u64 s_rows, u32 bits, u32 indexed,
                                           u64* counts) {
    merge_count(r, r_rows, s, s_rows, bits, indexed, counts);
}
extern "C" __global__ void merge_write_u32(const u32* r, u64 r_rows, const u32* s, u64 s_rows, u32 bits, u32 indexed,
                                           const u64* offsets, u32* r_out, u32* s_out) {
    merge_write(r, r_rows, s, s_rows, bits, indexed, offsets, r_out, s_out);
}
extern "C" __global__ void merge_write_u64(const u64* r, u64 r_rows, const u64* s, u64 s_rows, u32 bits, u32 indexed,
                                           const u64* offsets, u32* r_out, u32* s_out) {
    merge_write(r, r_rows, s, s_rows, bits, indexed, offsets, r_out, s_out);
}
