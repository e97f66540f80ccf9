// hash_join.cu — match finding of the partitioned hash join: count -> scan -> write.
//
// Work is split into tasks. A task joins one chunk of at most kJoinChunk build rows of a
// partition with one tile of at most kJoinSTile probe rows of the same partition, so large or
// skewed partitions become several tasks (sub-partitioning) and blocks get similar work. A
// partition's rows may lie in several segments (Side, below): a task's chunk and tile are
// counted in the partition's rows, whatever segments they fall in.
//   1. join_task_counts: per partition, ceil(r / CHUNK) * ceil(s / S_TILE) tasks (0 if a side
//      is empty); an exclusive scan gives task offsets, and block b finds its task by binary
//      search in them.
//   2. join_count: the block builds a hash table of its build chunk in shared memory, each warp
//      probes a contiguous run of the tile's probe rows and stores its match count. Each thread
//      loads all of its build keys, and each lane all of its probe keys, before it uses any, so
//      that a block waits for global memory once per segment instead of once per round.
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

// Slots of a task's table: a power of two, at most 56.25 % full with a chunk of 2,304 rows.
constexpr u32 kJoinSlots = 4096;
constexpr u32 kJoinSTile = 4096;
constexpr u32 kEmptySlot = 0xffffffffu;
// Build keys a thread holds at once: a task's chunk, kBlockThreads rows a round.
constexpr u32 kBuildRounds = kJoinChunk / kBlockThreads;
// Probe keys a lane holds at once: a warp's run of a tile (warp_run), 32 rows a round.
constexpr u32 kProbeKeys = kJoinSTile / kWarps / 32;
static_assert(kJoinChunk % kBlockThreads == 0, "a chunk is whole rounds of a block");
static_assert((kJoinSlots & (kJoinSlots - 1)) == 0 && 3 * kJoinChunk <= 2 * kJoinSlots,
              "a table is a power of two of slots, at most two thirds full");
static_assert(kJoinSTile % (kWarps * 32) == 0, "a tile is whole rounds of every warp");

// Where one side's partitions lie: `segs` arrays of parts + 1 u32, back to back; segment k of
// partition p is rows bounds[k * (parts + 1) + p] .. bounds[k * (parts + 1) + p + 1]. A
// partition's rows, numbered 0, 1, ... within it, are its segments' rows in turn, and each
// segment's rows lie after the previous segment's, so that numbers and positions rise together.
// A side partitioned on one device has one segment; a device's share of a relation dealt out by
// partition (join::exchange) has one per source device.
struct Side {
    const u32* bounds;
    u32 segs, parts;
    __device__ __forceinline__ const u32* segment(u32 k) const { return bounds + (u64)k * (parts + 1); }
    __device__ __forceinline__ u32 len(u32 p) const {
        u32 n = 0;
        for (u32 k = 0; k < segs; ++k) n += segment(k)[p + 1] - segment(k)[p];
        return n;
    }
    // Calls f(first, last) for the positions [first, last) of partition p's rows numbered
    // [v_begin, v_end), one call per segment they touch, in order (the same on every thread).
    template <typename F>
    __device__ __forceinline__ void runs(u32 p, u32 v_begin, u32 v_end, F f) const {
        u32 v = 0;
        for (u32 k = 0; k < segs && v < v_end; ++k) {
            u32 first = segment(k)[p], len = segment(k)[p + 1] - first;
            u32 lo = max(v_begin, v), hi = min(v_end, v + len);
            if (lo < hi) f(first + (lo - v), first + (hi - v));
            v += len;
        }
    }
};

extern "C" __global__ void join_task_counts(const u32* r_bounds, u32 r_segs, const u32* s_bounds, u32 s_segs,
                                            u32 parts, u32* tasks) {
    u32 p = blockIdx.x * blockDim.x + threadIdx.x;
    if (p >= parts) return;
    u32 r = Side{r_bounds, r_segs, parts}.len(p), s = Side{s_bounds, s_segs, parts}.len(p);
    tasks[p] = (r == 0 || s == 0) ? 0u
             : ((r + kJoinChunk - 1) / kJoinChunk) * ((s + kJoinSTile - 1) / kJoinSTile);
}

// A task: partition p's build rows numbered [r_begin, r_end) and probe rows [s_begin, s_end).
struct Task { u32 p, r_begin, r_end, s_begin, s_end; };

__device__ Task find_task(const u32* task_offsets, const Side& r, const Side& s) {
    // Last partition whose first task is <= blockIdx.x (skips partitions without tasks).
    u32 lo = 0, hi = r.parts;
    while (hi - lo > 1) {
        u32 mid = (lo + hi) / 2;
        if (task_offsets[mid] <= blockIdx.x) lo = mid; else hi = mid;
    }
    u32 p = lo;
    u32 local = blockIdx.x - task_offsets[p];
    u32 r_len = r.len(p), s_len = s.len(p);
    u32 tiles = (s_len + kJoinSTile - 1) / kJoinSTile;
    u32 chunk = local / tiles, tile = local % tiles;
    Task t;
    t.p = p;
    t.r_begin = chunk * kJoinChunk;
    t.r_end = min(r_len, t.r_begin + kJoinChunk);
    t.s_begin = tile * kJoinSTile;
    t.s_end = min(s_len, t.s_begin + kJoinSTile);
    return t;
}

// A build chunk's table in shared memory: kJoinSlots slots, each empty or holding one build
// row's position and key. Rows bid for a slot (bid), the lowest position wins and writes its key
// (claim). (Packing a 4-byte key and its position into one 8-byte slot, so that a bid placed both
// and a probe step read one word, measured slower on an H200.)
template <typename K>
struct Table {
    u32 row[kJoinSlots];
    K key[kJoinSlots];
    __device__ __forceinline__ void clear(u32 s) { row[s] = kEmptySlot; }
    __device__ __forceinline__ bool taken(u32 s) const { return row[s] != kEmptySlot; }
    __device__ __forceinline__ void bid(u32 s, u32 r) { atomicMin(&row[s], r); }
    __device__ __forceinline__ bool claim(u32 s, u32 r, K k) {
        if (row[s] != r) return false;
        key[s] = k;
        return true;
    }
    // False for an empty slot; else its row and key.
    __device__ __forceinline__ bool at(u32 s, u32& r, K& k) const {
        r = row[s];
        if (r == kEmptySlot) return false;
        k = key[s];
        return true;
    }
};

// The table of the task's build rows, inserted in row order: equal keys lie along their probe
// path in row order.
template <typename K>
__device__ void build_table(Table<K>& t, const K* r_keys, const Side& r, const Task& task) {
    for (u32 s = threadIdx.x; s < kJoinSlots; s += kBlockThreads) t.clear(s);
    __syncthreads();
    r.runs(task.p, task.r_begin, task.r_end, [&](u32 first, u32 last) {
        // A segment holds at most a chunk's rows: every key of this thread's rounds at once ...
        K keys[kBuildRounds];
#pragma unroll
        for (u32 j = 0; j < kBuildRounds; ++j) {
            u32 i = first + j * kBlockThreads + threadIdx.x;
            keys[j] = i < last ? r_keys[i] : key_sentinel<K>();
        }
        // ... then inserted round by round, in row order.
#pragma unroll
        for (u32 j = 0; j < kBuildRounds; ++j) {
            u32 base = first + j * kBlockThreads;
            if (base >= last) break;  // the same on every thread
            u32 i = base + threadIdx.x;
            K k = keys[j];
            bool placed = k == key_sentinel<K>();
            u32 slot = slot_hash(k) & (kJoinSlots - 1);
            while (__syncthreads_or(!placed)) {
                // Skip to the first empty slot (no thread writes a slot in this phase) ...
                if (!placed) while (t.taken(slot)) slot = (slot + 1) & (kJoinSlots - 1);
                __syncthreads();
                // ... bid for it; the lowest row wins ...
                if (!placed) t.bid(slot, i);
                __syncthreads();
                // ... and the losers go on from there in the next round.
                if (!placed) placed = t.claim(slot, i, k);
            }
        }
    });
    __syncthreads();
}

// Calls emit(build_row) for every match of `k`, in build-row order.
template <typename K, typename F>
__device__ __forceinline__ void probe(const Table<K>& t, K k, F emit) {
    if (k == key_sentinel<K>()) return;
    u32 slot = slot_hash(k) & (kJoinSlots - 1), r;
    K key;
    while (t.at(slot, r, key)) {
        if (key == k) emit(r);
        slot = (slot + 1) & (kJoinSlots - 1);
    }
}

// Lane `lane`'s probe keys of the rows [first, last) (at most a warp's run): row first + 32j + lane
// in keys[j], the sentinel (which matches nothing) past `last`.
template <typename K>
__device__ __forceinline__ void load_probe_keys(const K* s_keys, u32 first, u32 last, u32 lane,
                                                K (&keys)[kProbeKeys]) {
#pragma unroll
    for (u32 j = 0; j < kProbeKeys; ++j) {
        u32 i = first + j * 32 + lane;
        keys[j] = i < last ? s_keys[i] : key_sentinel<K>();
    }
}

// The probe rows (numbers in the task's partition) that warp `warp` of the block handles.
__device__ __forceinline__ void warp_run(const Task& t, u32 warp, u32& begin, u32& end) {
    u32 len = t.s_end - t.s_begin;
    u32 per = ((len + kWarps - 1) / kWarps + 31) & ~31u;
    begin = min(t.s_end, t.s_begin + warp * per);
    end = min(t.s_end, begin + per);
}

template <typename K>
__device__ void join_count(const K* r_keys, const K* s_keys, const u32* task_offsets, const Side& r,
                           const Side& s, u64* counts) {
    __shared__ Table<K> table;
    Task t = find_task(task_offsets, r, s);
    build_table(table, r_keys, r, t);
    u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31, begin, end;
    warp_run(t, warp, begin, end);
    u64 count = 0;
    s.runs(t.p, begin, end, [&](u32 first, u32 last) {
        K keys[kProbeKeys];
        load_probe_keys(s_keys, first, last, lane, keys);
#pragma unroll
        for (u32 j = 0; j < kProbeKeys; ++j) probe(table, keys[j], [&](u32) { ++count; });
    });
    for (int o = 16; o > 0; o >>= 1) count += __shfl_down_sync(kFullMask, count, o);
    if (lane == 0) counts[(u64)blockIdx.x * kWarps + warp] = count;
}

template <typename K>
__device__ void join_write(const K* r_keys, const K* s_keys, const u32* task_offsets, const Side& r,
                           const Side& s, const u64* offsets, u32* r_out, u32* s_out) {
    __shared__ Table<K> table;
    Task t = find_task(task_offsets, r, s);
    build_table(table, r_keys, r, t);
    u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31, begin, end;
    warp_run(t, warp, begin, end);
    u64 base = offsets[(u64)blockIdx.x * kWarps + warp];
    s.runs(t.p, begin, end, [&](u32 first, u32 last) {
        K keys[kProbeKeys];
        load_probe_keys(s_keys, first, last, lane, keys);
#pragma unroll
        for (u32 j = 0; j < kProbeKeys; ++j) {
            u32 round = first + j * 32;
            if (round >= last) break;  // the same on every lane
            u32 i = round + lane;
            K k = keys[j];
            // The first probe counts the matches and keeps the first; a key with one match
            // (a foreign key's) is written without a second probe.
            u32 c = 0, only = kEmptySlot;
            probe(table, k, [&](u32 row) { if (c++ == 0) only = row; });
            u32 incl = c;
            for (int o = 1; o < 32; o <<= 1) {
                u32 v = __shfl_up_sync(kFullMask, incl, o);
                if (lane >= o) incl += v;
            }
            u64 pos = base + incl - c;
            if (c == 1) { r_out[pos] = only; s_out[pos] = i; }
            else if (c > 1) probe(table, k, [&](u32 row) { r_out[pos] = row; s_out[pos] = i; ++pos; });
            base += __shfl_sync(kFullMask, incl, 31);
        }
    });
}

#define JOIN(K) \
    extern "C" __global__ void __launch_bounds__(kBlockThreads) join_count_##K(const K* r_keys, const K* s_keys, \
        const u32* task_offsets, u32 parts, const u32* r_bounds, u32 r_segs, const u32* s_bounds, u32 s_segs, \
        u64* counts) { \
        join_count<K>(r_keys, s_keys, task_offsets, Side{r_bounds, r_segs, parts}, Side{s_bounds, s_segs, parts}, \
                      counts); } \
    extern "C" __global__ void __launch_bounds__(kBlockThreads) join_write_##K(const K* r_keys, const K* s_keys, \
        const u32* task_offsets, u32 parts, const u32* r_bounds, u32 r_segs, const u32* s_bounds, u32 s_segs, \
        const u64* offsets, u32* r_out, u32* s_out) { \
        join_write<K>(r_keys, s_keys, task_offsets, Side{r_bounds, r_segs, parts}, Side{s_bounds, s_segs, parts}, \
                      offsets, r_out, s_out); }

JOIN(u32)
JOIN(u64)
