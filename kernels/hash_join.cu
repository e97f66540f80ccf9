// hash_join.cu — match finding of the partitioned hash join: count -> scan -> write.
//
// Work is split into tasks. A task joins one chunk of at most kJoinChunk build rows of a
// partition with one tile of at most kJoinSTile probe rows of the same partition, so large or
// skewed partitions become several tasks (sub-partitioning) and blocks get similar work.
//   1. join_task_counts: per partition, ceil(r / CHUNK) * ceil(s / S_TILE) tasks (0 if a side
//      is empty); an exclusive scan gives task offsets, and block b finds its task by binary
//      search in them.
//   2. join_count: the block builds a hash table of its build chunk in shared memory, each warp
//      probes a contiguous run of the tile's probe rows and stores its match count.
//   3. exclusive scan of the counts (scan.cu) -> where each warp writes.
//   4. join_write: the same build and probe, writing (build row, probe row) pairs.
// No atomics decide output positions. The table is built deterministically: rows are inserted
// in rounds of kBlockThreads; in each step every pending row skips to the first empty slot on
// its probe path and bids for it (atomicMin of its row number); the lowest row wins, the others
// go on (linear probing). Equal keys therefore lie along their probe path in row order,
// and the output is: tasks in order, probe rows ascending, build rows ascending — the order
// the host backend produces.
// Example (build keys {5, 7, 5}, probe keys {5, 9}): counts {2, 0}, pairs {(0,0), (2,0)}.
#include "common.cuh"

constexpr u32 kJoinSlots = 2 * kJoinChunk;
constexpr u32 kJoinSTile = 4096;
constexpr u32 kEmptySlot = 0xffffffffu;

extern "C" __global__ void join_task_counts(const u32* r_bounds, const u32* s_bounds, u32 parts, u32* tasks) {
    u32 p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= parts) return;
    u32 r = r_bounds[p + 1] - r_bounds[p], s = s_bounds[p + 1] - s_bounds[p];
    tasks[p] = (r == 0 || s == 0) ? 0u
             : ((r + kJoinChunk - 1) / kJoinChunk) * ((s + kJoinSTile - 1) / kJoinSTile);
}

struct Task { u32 r_begin, r_end, s_begin, s_end; };

__device__ Task find_task(const u32* task_offsets, u32 parts, const u32* r_bounds, const u32* s_bounds) {
    // Last partition whose first task is <= blockIdx.x (skips partitions without tasks).
    u32 lo = 0, hi = parts;
    while (hi - lo > 1) {
        u32 mid = (lo + hi) / 2;
        if (task_offsets[mid] <= blockIdx.x) lo = mid; else hi = mid;
    }
    u32 p = lo;
    u32 local = blockIdx.x - task_offsets[p];
    u32 s_len = s_bounds[p + 1] - s_bounds[p];
    u32 tiles = (s_len + kJoinSTile - 1) / kJoinSTile;
    u32 chunk = local / tiles, tile = local % tiles;
    Task t;
    t.r_begin = r_bounds[p] + chunk * kJoinChunk;
    t.r_end = min(r_bounds[p + 1], t.r_begin + kJoinChunk);
    t.s_begin = s_bounds[p] + tile * kJoinSTile;
    t.s_end = min(s_bounds[p + 1], t.s_begin + kJoinSTile);
    return t;
}

template <typename K>
struct Table {
    u32 row[kJoinSlots];
    K key[kJoinSlots];
};

template <typename K>
__device__ void build_table(Table<K>& t, const K* r_keys, u32 r_begin, u32 r_end) {
    for (u32 s = threadIdx.x; s < kJoinSlots; s += blockDim.x) t.row[s] = kEmptySlot;
    __syncthreads();
    u32 n = r_end - r_begin;
    for (u32 base = 0; base < n; base += blockDim.x) {
        u32 i = base + threadIdx.x;
        K k = i < n ? r_keys[r_begin + i] : key_sentinel<K>();
        bool placed = k == key_sentinel<K>();
        u32 slot = slot_hash(k) & (kJoinSlots - 1);
        while (__syncthreads_or(!placed)) {
            // Skip to the first empty slot (no thread writes `row` in this phase) ...
            if (!placed) while (t.row[slot] != kEmptySlot) slot = (slot + 1) & (kJoinSlots - 1);
            __syncthreads();
            // ... bid for it; the lowest row wins ...
            if (!placed) atomicMin(&t.row[slot], i);
            __syncthreads();
            // ... and the losers go on from there in the next round.
            if (!placed && t.row[slot] == i) { placed = true; t.key[slot] = k; }
        }
    }
    __syncthreads();
}

// Calls emit(build_row_in_chunk) for every match of `k`, in build-row order.
template <typename K, typename F>
__device__ __forceinline__ void probe(const Table<K>& t, K k, F emit) {
    if (k == key_sentinel<K>()) return;
    u32 slot = slot_hash(k) & (kJoinSlots - 1);
    while (true) {
        u32 r = t.row[slot];
        if (r == kEmptySlot) return;
        if (t.key[slot] == k) emit(r);
        slot = (slot + 1) & (kJoinSlots - 1);
    }
}

// The contiguous run of probe rows that warp `warp` of the block handles.
__device__ __forceinline__ void warp_run(const Task& t, u32 warp, u32& begin, u32& end) {
    u32 len = t.s_end - t.s_begin;
    u32 per = ((len + kWarps - 1) / kWarps + 31) & ~31u;
    begin = min(t.s_end, t.s_begin + warp * per);
    end = min(t.s_end, begin + per);
}

template <typename K>
__device__ void join_count(const K* r_keys, const K* s_keys, const u32* task_offsets, u32 parts,
                           const u32* r_bounds, const u32* s_bounds, u64* counts) {
    __shared__ Table<K> table;
    Task t = find_task(task_offsets, parts, r_bounds, s_bounds);
    build_table(table, r_keys, t.r_begin, t.r_end);
    u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31, begin, end;
    warp_run(t, warp, begin, end);
    u64 count = 0;
    for (u32 s = begin + lane; s < end; s += 32) probe(table, s_keys[s], [&](u32) { ++count; });
    for (int o = 16; o > 0; o >>= 1) count += __shfl_down_sync(kFullMask, count, o);
    if (lane == 0) counts[(u64)blockIdx.x * kWarps + warp] = count;
}

template <typename K>
__device__ void join_write(const K* r_keys, const K* s_keys, const u32* task_offsets, u32 parts,
                           const u32* r_bounds, const u32* s_bounds, const u64* offsets,
                           u32* r_out, u32* s_out) {
    __shared__ Table<K> table;
    Task t = find_task(task_offsets, parts, r_bounds, s_bounds);
    build_table(table, r_keys, t.r_begin, t.r_end);
    u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31, begin, end;
    warp_run(t, warp, begin, end);
    u64 base = offsets[(u64)blockIdx.x * kWarps + warp];
    for (u32 round = begin; round < end; round += 32) {
        u32 s = round + lane;
        K k = s < end ? s_keys[s] : key_sentinel<K>();
        u32 c = 0;
        probe(table, k, [&](u32) { ++c; });
        u32 incl = c;
        for (int o = 1; o < 32; o <<= 1) {
            u32 v = __shfl_up_sync(kFullMask, incl, o);
            if (lane >= o) incl += v;
        }
        u64 pos = base + incl - c;
        probe(table, k, [&](u32 r) { r_out[pos] = t.r_begin + r; s_out[pos] = s; ++pos; });
        base += __shfl_sync(kFullMask, incl, 31);
    }
}

#define JOIN(K) \
    extern "C" __global__ void __launch_bounds__(kBlockThreads) join_count_##K(const K* r_keys, const K* s_keys, \
        const u32* task_offsets, u32 parts, const u32* r_bounds, const u32* s_bounds, u64* counts) { \
        join_count<K>(r_keys, s_keys, task_offsets, parts, r_bounds, s_bounds, counts); } \
    extern "C" __global__ void __launch_bounds__(kBlockThreads) join_write_##K(const K* r_keys, const K* s_keys, \
        const u32* task_offsets, u32 parts, const u32* r_bounds, const u32* s_bounds, const u64* offsets, \
        u32* r_out, u32* s_out) { \
        join_write<K>(r_keys, s_keys, task_offsets, parts, r_bounds, s_bounds, offsets, r_out, s_out); }

JOIN(u32)
JOIN(u64)
