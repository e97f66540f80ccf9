// partition.cu — stable radix partitioning of encoded keys (histogram -> scan -> scatter), and
// routing: the same pass by a key's route (RouteDigit) instead of a digit of its partition id.
//
// A relation is split into 2^bits partitions (bits <= 32) by partition_of(key). Partition ids
// wider than 8 bits are handled as LSD digits of at most 8 bits, one pass per digit; every pass
// is a stable counting sort, so the result is stable overall and deterministic. Per pass:
//   1. radix_histogram: block b counts the digits of its tile   -> hist[digit * tiles + b]
//   2. exclusive scan of hist (scan.cu)                         -> offsets, digit-major
//   3. radix_scatter: block b ranks its tile's items stably (per-warp histograms; a ballot per
//      digit bit finds the lanes with equal digits), then moves the keys and every plane it is
//      given (the columns that follow the keys) by staging them in shared memory in digit
//      order and writing each digit's run with coalesced stores; the next plane's loads are in
//      flight while one plane is written. A pass over 4-byte keys that moves at most one column
//      besides them runs radix_scatter_narrow_u32, the same code compiled for more blocks an SM.
// Columns moved in the passes are read and written in order (no random gathers);
// partition_bounds finally finds where each partition starts.
// Example (bits 1, keys with partition ids {1, 0, 1, 0}, a column {a, b, c, d}): the column
// comes out {b, d, a, c}, bounds {0, 2, 4}.
#include "common.cuh"

constexpr u32 kPartTile = kBlockThreads * kPartItems;
constexpr u32 kMaxRadix = 256;
// Scatter blocks resident per SM the register budget is cut for: 2 (128 registers a thread),
// and 3 (80 registers) in the `_narrow` kernels, which the caller runs for passes over 4-byte
// keys that move at most one column besides the keys. On an H200, with the next move's loads
// in flight and 4-byte keys, 2 beat 3 with two moves or more, and 3 beat 2 with none or one
// (8-byte keys spill at 80 registers). Their shared memory, ~46 KB a block, fits 3 blocks an
// SM with the largest carveout, which CudaDevice asks for.
constexpr u32 kScatterBlocksPerSm = 2;
constexpr u32 kNarrowScatterBlocksPerSm = 3;

// What a pass sorts by: bits [shift, shift + digit_bits) of a key's partition id (its top `bits`
// hash bits).
struct PartitionDigit {
    u32 bits, shift, digit_bits;
    template <typename K>
    __device__ __forceinline__ u32 operator()(K key) const {
        return (partition_of(key, bits) >> shift) & ((1u << digit_bits) - 1u);
    }
};

// What a route pass sorts by: a key's route, the top digit_bits (0 to 8) bits of slot_hash. That
// hash is independent of the partition hash, so the rows of one route still spread over every
// partition and bucket of a join that partitions them again (join::exchange deals routes to
// devices). Mirrored by EncodedKey::route_of in src/backend/host/keys.rs.
struct RouteDigit {
    u32 digit_bits;
    template <typename K>
    __device__ __forceinline__ u32 operator()(K key) const {
        return digit_bits == 0 ? 0u : slot_hash(key) >> (32 - digit_bits);
    }
};

template <typename K, typename Digit>
__device__ void radix_histogram(const K* keys, u64 n, Digit digit_of, u32* hist) {
    __shared__ u32 counts[kMaxRadix];
    u32 radix = 1u << digit_of.digit_bits;
    for (u32 d = threadIdx.x; d < radix; d += blockDim.x) counts[d] = 0;
    __syncthreads();
    u64 base = (u64)blockIdx.x * kPartTile;
    // Every load first, so that the tile's reads are in flight together.
    K key[kPartItems];
#pragma unroll
    for (int k = 0; k < kPartItems; ++k) {
        u64 i = base + (u64)k * kBlockThreads + threadIdx.x;
        key[k] = i < n ? keys[i] : (K)0;
    }
#pragma unroll
    for (int k = 0; k < kPartItems; ++k) {
        u64 i = base + (u64)k * kBlockThreads + threadIdx.x;
        if (i < n) atomicAdd(&counts[digit_of(key[k])], 1u);
    }
    __syncthreads();
    for (u32 d = threadIdx.x; d < radix; d += blockDim.x) hist[(u64)d * gridDim.x + blockIdx.x] = counts[d];
}

// The block's tile in digit order, in shared memory (~46 KB): one plane of values at a time,
// for every item its place in that order, for every place its digit, and where each digit's
// run goes in the output.
struct TileStage {
    u64 values[kPartTile];
    union {
        u32 warp_hist[kWarps][kMaxRadix];  // while ranking: per warp, items seen per digit
        u16 place[kPartTile];              // then: item j (input order) goes to values[place[j]]
    };
    u32 digit_start[kMaxRadix];  // a digit's first place in the tile
    u32 dest_base[kMaxRadix];    // a digit's place in the output minus its place in the tile
    u8 digit[kPartTile];         // digit of values[i]
};

// Writes the staged tile (values of type T) to `out`: consecutive threads to consecutive
// addresses of each digit's run. `part` of `parts` selects one 8-byte half of 16-byte values.
template <typename T>
__device__ __forceinline__ void write_staged(const TileStage& st, T* out, u32 parts, u32 part, u32 tile_len) {
    const T* values = reinterpret_cast<const T*>(st.values);
    __syncthreads();
#pragma unroll 4
    for (u32 j = threadIdx.x; j < tile_len; j += kBlockThreads)
        out[(u64)(st.dest_base[st.digit[j]] + j) * parts + part] = values[j];
    __syncthreads();
}

// One column move of a scatter: `width`-byte values (1, 2, 4 or 8); a 16-byte plane is two
// moves, of the `part`th of `parts` = 2 8-byte halves of each value.
struct Move {
    const void* in;
    void* out;
    u32 width, parts, part;
};

// The m-th move of `planes`.
__device__ __forceinline__ Move move_at(const Planes& planes, u32 m) {
    for (u32 p = 0; p < planes.count; ++p) {
        u32 halves = planes.width[p] == 16 ? 2u : 1u;
        if (m < halves) return Move{planes.in[p], planes.out[p], halves == 2 ? 8u : planes.width[p], halves, m};
        m -= halves;
    }
    return Move{nullptr, nullptr, 0, 1, 0};
}

template <typename T>
__device__ __forceinline__ void load_values(const T* in, u32 parts, u32 part, u64 tile_base, u32 tile_len,
                                            u64 (&v)[kPartItems]) {
#pragma unroll
    for (int k = 0; k < kPartItems; ++k) {
        u32 j = k * kBlockThreads + threadIdx.x;
        if (j < tile_len) v[k] = (u64)in[(tile_base + j) * parts + part];
    }
}

// Issues the loads of this thread's values of a move (items k * kBlockThreads + threadIdx.x).
__device__ __forceinline__ void load_move(const Move& mv, u64 (&v)[kPartItems], u64 tile_base, u32 tile_len) {
    switch (mv.width) {
        case 1: load_values<u8>((const u8*)mv.in, 1, 0, tile_base, tile_len, v); break;
        case 2: load_values<u16>((const u16*)mv.in, 1, 0, tile_base, tile_len, v); break;
        case 4: load_values<u32>((const u32*)mv.in, 1, 0, tile_base, tile_len, v); break;
        default: load_values<u64>((const u64*)mv.in, mv.parts, mv.part, tile_base, tile_len, v); break;
    }
}

// Puts this thread's loaded values at their places in the tile's digit order.
template <typename T>
__device__ __forceinline__ void stage_values(TileStage& st, const u64 (&v)[kPartItems], u32 tile_len) {
    T* values = reinterpret_cast<T*>(st.values);
#pragma unroll
    for (int k = 0; k < kPartItems; ++k) {
        u32 j = k * kBlockThreads + threadIdx.x;
        if (j < tile_len) values[st.place[j]] = (T)v[k];
    }
}

template <typename K, typename Digit>
__device__ void radix_scatter(const K* keys, u64 n, Digit digit_of, const u32* offsets, K* keys_out,
                              const Planes& planes) {
    static_assert(kBlockThreads == kMaxRadix, "one thread per digit");
    __shared__ TileStage st;
    auto& warp_hist = st.warp_hist;
    auto& digit_start = st.digit_start;
    const u32 lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const u32 lt_mask = (1u << lane) - 1u;
    const u32 digit_bits = digit_of.digit_bits;
    const u32 radix = 1u << digit_bits;
    const u64 tile_base = (u64)blockIdx.x * kPartTile;
    const u32 tile_len = (u32)min((u64)kPartTile, n - tile_base);
    // Where this block's run of digit threadIdx.x starts in the output; loaded now, used later.
    const u32 my_offset = threadIdx.x < radix ? offsets[(u64)threadIdx.x * gridDim.x + blockIdx.x] : 0u;
    for (int w = 0; w < kWarps; ++w) warp_hist[w][threadIdx.x] = 0;
    __syncthreads();

    // Phase A: each warp ranks its contiguous run of 32 * kPartItems items, in order. Digits are
    // recomputed from the keys when needed rather than kept, to save registers.
    const u32 warp_first = warp * 32 * kPartItems;
    K key[kPartItems];
    u32 place[kPartItems];  // first the rank among the warp's items of the same digit
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
        u32 digit = live ? digit_of(key[k]) : 0u;
        // Warp multisplit: lanes with the same digit (and the same liveness) are peers.
        u32 live_lanes = __ballot_sync(kFullMask, live);
        u32 peers = live ? live_lanes : ~live_lanes;
#pragma unroll
        for (u32 b = 0; b < 8; ++b) {
            if (b < digit_bits) {
                u32 bit = (digit >> b) & 1u;
                u32 same = __ballot_sync(kFullMask, bit);
                peers &= bit ? same : ~same;
            }
        }
        u32 before = live ? warp_hist[warp][digit] : 0;
        place[k] = before + __popc(peers & lt_mask);
        __syncwarp();
        if (live && (peers & lt_mask) == 0) warp_hist[warp][digit] = before + __popc(peers);
        __syncwarp();
    }
    __syncthreads();

    // Phase B: per digit, exclusive prefix over the warps and the digit's total ...
    {
        const u32 d = threadIdx.x;
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
    st.dest_base[threadIdx.x] = my_offset - digit_start[threadIdx.x];

    // Phase C: every item's place in the tile (digit order); the keys are staged there and
    // written run by run, then each plane the same way.
    K* staged_keys = reinterpret_cast<K*>(st.values);
#pragma unroll
    for (int k = 0; k < kPartItems; ++k) {
        u32 digit = digit_of(key[k]);
        place[k] += digit_start[digit] + warp_hist[warp][digit];
    }
    __syncthreads();  // warp_hist is read; its memory now holds the places
#pragma unroll
    for (int k = 0; k < kPartItems; ++k) {
        u32 j = warp_first + k * 32 + lane;
        if (j < tile_len) {
            st.place[j] = (u16)place[k];
            st.digit[place[k]] = (u8)digit_of(key[k]);
            staged_keys[place[k]] = key[k];
        }
    }
    // The planes, one move at a time; each move's loads are in flight while the keys or the
    // move before it are written out.
    u32 moves = 0;
    for (u32 p = 0; p < planes.count; ++p) moves += planes.width[p] == 16 ? 2 : 1;
    u64 v[kPartItems];
    if (moves > 0) load_move(move_at(planes, 0), v, tile_base, tile_len);
    // A route pass keeps no keys (keys_out is null, the same for the whole block); the barrier
    // write_staged opens with is kept, for the places and digits every thread wrote above.
    if (keys_out != nullptr) write_staged<K>(st, keys_out, 1, 0, tile_len);
    else __syncthreads();
    for (u32 m = 0; m < moves; ++m) {
        const Move mv = move_at(planes, m);
        switch (mv.width) {
            case 1: stage_values<u8>(st, v, tile_len); break;
            case 2: stage_values<u16>(st, v, tile_len); break;
            case 4: stage_values<u32>(st, v, tile_len); break;
            default: stage_values<u64>(st, v, tile_len); break;
        }
        if (m + 1 < moves) load_move(move_at(planes, m + 1), v, tile_base, tile_len);
        switch (mv.width) {
            case 1: write_staged<u8>(st, (u8*)mv.out, 1, 0, tile_len); break;
            case 2: write_staged<u16>(st, (u16*)mv.out, 1, 0, tile_len); break;
            case 4: write_staged<u32>(st, (u32*)mv.out, 1, 0, tile_len); break;
            default: write_staged<u64>(st, (u64*)mv.out, mv.parts, mv.part, tile_len); break;
        }
    }
}

// bounds[p] = first row of partition p in the partitioned keys, bounds[2^bits] = n. Row i
// (0 <= i <= n) writes the bounds of the partitions that start at it: those after row i-1's
// partition up to row i's own (for i = n, up to 2^bits), so every bound is written once. A
// block takes kPartTile rows, a thread every kBlockThreads-th of them. A run of more than
// kBoundsRun partitions (empty partitions, e.g. when few distinct keys meet many bits) is
// handed to fill_bounds instead, so that no thread writes a long run alone.
struct BoundsRun { u64 first, last; u32 value, pad; };

template <typename K>
__device__ void partition_bounds(const K* keys, u64 n, u32 bits, u32* bounds, BoundsRun* runs, u32* run_count) {
    const u64 base = (u64)blockIdx.x * kPartTile + threadIdx.x;
    // Every load first, so that the block's reads are in flight together.
    K key[kPartItems], prev[kPartItems];
#pragma unroll
    for (int k = 0; k < kPartItems; ++k) {
        u64 i = base + (u64)k * kBlockThreads;
        key[k] = i < n ? keys[i] : (K)0;
        prev[k] = i > 0 && i <= n ? keys[i - 1] : (K)0;
    }
#pragma unroll
    for (int k = 0; k < kPartItems; ++k) {
        u64 i = base + (u64)k * kBlockThreads;
        if (i > n) break;
        u64 first = i == 0 ? 0 : (u64)partition_of(prev[k], bits) + 1;
        u64 last = i == n ? (1ull << bits) : (u64)partition_of(key[k], bits);
        if (last + 1 - first <= kBoundsRun) {
            for (u64 p = first; p <= last; ++p) bounds[p] = (u32)i;
        } else {
            u32 at = atomicAdd(run_count, 1u);
            runs[at] = BoundsRun{first, last, (u32)i, 0};
        }
    }
}

// Writes the long runs partition_bounds set aside: block b takes runs b, b + gridDim.x, ...
extern "C" __global__ void fill_bounds(const BoundsRun* runs, const u32* run_count, u32* bounds) {
    for (u32 r = blockIdx.x; r < *run_count; r += gridDim.x) {
        BoundsRun run = runs[r];
        for (u64 p = run.first + threadIdx.x; p <= run.last; p += blockDim.x) bounds[p] = run.value;
    }
}

// bounds[r] = offsets[r * tiles] for r = 0 .. 2^bits: where each route starts once routed, read
// off the exclusive scan of a route pass's histogram (digit-major, its last value the row count).
extern "C" __global__ void route_bounds(const u32* offsets, u64 tiles, u32 bits, u32* bounds) {
    u32 r = blockIdx.x * blockDim.x + threadIdx.x;
    if (r <= (1u << bits)) bounds[r] = offsets[(u64)r * tiles];
}

#define PARTITION(K) \
    extern "C" __global__ void radix_histogram_##K(const K* keys, u64 n, u32 bits, u32 shift, u32 digit_bits, u32* hist) { \
        radix_histogram<K>(keys, n, PartitionDigit{bits, shift, digit_bits}, hist); } \
    extern "C" __global__ void __launch_bounds__(kBlockThreads, kScatterBlocksPerSm) radix_scatter_##K(const K* keys, u64 n, u32 bits, \
        u32 shift, u32 digit_bits, const u32* offsets, K* keys_out, Planes planes) { \
        radix_scatter<K>(keys, n, PartitionDigit{bits, shift, digit_bits}, offsets, keys_out, planes); } \
    extern "C" __global__ void route_histogram_##K(const K* keys, u64 n, u32 bits, u32* hist) { \
        radix_histogram<K>(keys, n, RouteDigit{bits}, hist); } \
    extern "C" __global__ void __launch_bounds__(kBlockThreads, kScatterBlocksPerSm) route_scatter_##K(const K* keys, u64 n, \
        u32 bits, const u32* offsets, K* keys_out, Planes planes) { \
        radix_scatter<K>(keys, n, RouteDigit{bits}, offsets, keys_out, planes); } \
    extern "C" __global__ void partition_bounds_##K(const K* keys, u64 n, u32 bits, u32* bounds, BoundsRun* runs, \
        u32* run_count) { \
        partition_bounds<K>(keys, n, bits, bounds, runs, run_count); }

PARTITION(u32)
PARTITION(u64)

// The scatters of 4-byte keys for passes that move at most one column besides the keys.
extern "C" __global__ void __launch_bounds__(kBlockThreads, kNarrowScatterBlocksPerSm) radix_scatter_narrow_u32(
    const u32* keys, u64 n, u32 bits, u32 shift, u32 digit_bits, const u32* offsets, u32* keys_out, Planes planes) {
    radix_scatter<u32>(keys, n, PartitionDigit{bits, shift, digit_bits}, offsets, keys_out, planes);
}
extern "C" __global__ void __launch_bounds__(kBlockThreads, kNarrowScatterBlocksPerSm) route_scatter_narrow_u32(
    const u32* keys, u64 n, u32 bits, const u32* offsets, u32* keys_out, Planes planes) {
    radix_scatter<u32>(keys, n, RouteDigit{bits}, offsets, keys_out, planes);
}
