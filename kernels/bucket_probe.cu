// bucket_probe.cu — probes a bucketed build side with a chunk of probe keys: count -> scan -> write,
// or, where the build keys are unique, one lookup pass (bucket_lookup, at the end).
//
// The build side is partitioned once, by the top `bits` bits of the partition hash, into about
// two rows per bucket (partition.cu); `bounds[b]..bounds[b + 1]` are the build rows of bucket b,
// in input order. A probe key looks only at its own bucket, so probing a chunk costs work in
// proportion to the chunk, however large the build side. Output is in probe order.
//   1. bucket_count: block w handles the run of kProbeRun consecutive probe rows starting at
//      w * kProbeRun, one a thread, and stores how many output rows they make -> counts[w];
//      with `visited`, it also sets visited[r] = 1 for every build row r that a probe row
//      matches.
//   2. exclusive scan of the counts (scan.cu, u64)          -> offsets: where each run's rows go.
//   3. bucket_write: each block finds its run's rows again and writes those whose place p lies
//      in the output window [lo, hi) at p - lo, so an output larger than memory comes in passes.
// What a probe row makes depends on `emit` (ProbeEmit in src/backend/mod.rs): its matching pairs
// (inner and left joins), its pairs or else itself alone (right and full joins), itself once if
// it has a match (semi) or none (anti), itself always (mark), or nothing (the probe only marks
// build rows). Semi, anti and mark stop at the first match. A probe row output without a
// build row gets kNoRow as its build position.
// Rows come out ordered by probe row, then build row (bucket order, which is input order); no
// atomics decide places. A probe row whose bucket is wide (more than kWideBucket rows: a heavy
// key, or any row of a join without keys, whose one bucket is the whole build side) is probed
// by its whole warp, 32 build rows a step, with the same counts, marks and output. Keys equal
// to the sentinel (nulls, out-of-range probe keys) match nothing.
// Hashed keys may come with check bytes (`r_check` in bucket order, `s_check` per probe row, up to
// kCheckWords words of 16 bytes a row; no words when keys are exact): a build row matches only if
// both its encoded key and all its check bytes equal the probe row's, so a hash collision never
// makes a match.
// A join with a compiled residual filter (src/filter/) gets its own copy of this file with the
// filter appended as `CompiledFilter` and, for its key width K alone, the kernels
// bucket_{count,write}_filtered_K, which take
// the filter's columns (FilterArgs, filter.cuh): a pair of equal keys matches only if the filter
// is true for it, before anything is counted, marked or written, so outer, semi, anti and mark
// joins keep their meaning.
// Example (build keys {5, 7, 5} in one bucket, probe keys {5, 9}): pairs: counts {2},
// rows {(0, 0), (2, 0)}; with window [1, 2) only (2, 0) is written. Pairs or alone: counts {3},
// rows {(0, 0), (2, 0), (kNoRow, 1)}. Anti: counts {1}, rows {(kNoRow, 1)}.
#include "common.cuh"
#include "filter.cuh"

constexpr u32 kProbeRun = 32 * kProbeRounds;

// The filter of a join without a residual filter: every pair of equal keys matches.
struct NoFilter {
    __device__ __forceinline__ bool operator()(const FilterArgs&, u32, u64) const { return true; }
};

// Whether two 16-byte check words differ.
__device__ __forceinline__ bool differ(uint4 a, uint4 b) {
    return a.x != b.x || a.y != b.y || a.z != b.z || a.w != b.w;
}

// One probe row (s) as the bucket table compares it: the encoded key, where keys are checked the
// row's first word of check bytes (its other words are read where the first is equal), and the
// join's filter F with its columns.
template <typename K, typename F>
struct ProbeKey {
    K k;
    const CheckWords& r_check;
    const CheckWords& s_check;
    uint4 check;
    u64 s;
    const FilterArgs& args;

    __device__ __forceinline__ ProbeKey(K k, const CheckWords& r_check, const CheckWords& s_check,
                                        bool valid, u64 s, const FilterArgs& args)
        : k(k), r_check(r_check), s_check(s_check),
          check(r_check.words && valid ? s_check.w[0][s] : make_uint4(0, 0, 0, 0)), s(s),
          args(args) {}

    // Whether build row r (a bucket position) holds this key and passes the filter with it.
    __device__ __forceinline__ bool matches(const K* r_keys, u32 r) const {
        if (r_keys[r] != k) return false;
        if (r_check.words) {
            if (differ(r_check.w[0][r], check)) return false;
            // Unrolled, so that the words' addresses are read from the parameters at constant
            // places (a run-time index would copy them to local memory).
#pragma unroll
            for (u32 j = 1; j < kCheckWords; ++j)
                if (j < r_check.words && differ(r_check.w[j][r], s_check.w[j][s])) return false;
        }
        return F()(args, r, s);
    }
};

// The bucket of p's key: build rows [x, y); empty for the sentinel.
template <typename K, typename F>
__device__ __forceinline__ uint2 bucket_of(const u32* bounds, u32 bits, const ProbeKey<K, F>& p) {
    if (p.k == key_sentinel<K>()) return make_uint2(0, 0);
    u32 b = partition_of(p.k, bits);
    return make_uint2(bounds[b], bounds[b + 1]);
}

// Calls stop(build_row) for the build rows of p's bucket that hold p's key, in row order, until
// it returns true.
template <typename K, typename F, typename Stop>
__device__ __forceinline__ void bucket_matches_until(const K* r_keys, uint2 bucket,
                                                     const ProbeKey<K, F>& p, Stop stop) {
    for (u32 r = bucket.x; r < bucket.y; ++r)
        if (p.matches(r_keys, r) && stop(r)) return;
}

// Calls emit(build_row) for every build row of p's bucket that holds p's key, in row order.
template <typename K, typename F, typename Emit>
__device__ __forceinline__ void bucket_matches(const K* r_keys, uint2 bucket,
                                               const ProbeKey<K, F>& p, Emit emit) {
    bucket_matches_until(r_keys, bucket, p, [&](u32 r) { emit(r); return false; });
}

// What a probe row emits: ProbeEmit's values, from the crate (KERNEL_CONSTANTS).
enum : u32 {
    kEmitPairs = GJ_EMIT_PAIRS,
    kEmitPairsOrAlone = GJ_EMIT_PAIRS_OR_ALONE,
    kEmitMatched = GJ_EMIT_MATCHED,
    kEmitUnmatched = GJ_EMIT_UNMATCHED,
    kEmitEvery = GJ_EMIT_EVERY,
    kEmitNothing = GJ_EMIT_NOTHING,
};

// The first build row of p's bucket that holds p's key, or kNoRow.
template <typename K, typename F>
__device__ __forceinline__ u32 first_match(const K* r_keys, uint2 bucket, const ProbeKey<K, F>& p) {
    u32 first = kNoRow;
    bucket_matches_until(r_keys, bucket, p, [&](u32 r) { first = r; return true; });
    return first;
}

// The output rows probe key p makes under `emit`; marks its matches in `visited` if given (only
// with the emits that visit every match: pairs, pairs or alone, nothing).
template <typename K, typename F>
__device__ __forceinline__ u32 rows_of(const K* r_keys, uint2 bucket, const ProbeKey<K, F>& p,
                                       u32 emit, u8* visited) {
    if (emit == kEmitMatched || emit == kEmitUnmatched || emit == kEmitEvery) {
        bool found = first_match(r_keys, bucket, p) != kNoRow;
        return emit == kEmitEvery ? 1u : (found == (emit == kEmitMatched) ? 1u : 0u);
    }
    u32 c = 0;
    bucket_matches(r_keys, bucket, p, [&](u32 r) {
        ++c;
        if (visited) visited[r] = 1;
    });
    if (emit == kEmitNothing) return 0;
    return (emit == kEmitPairsOrAlone && c == 0) ? 1u : c;
}

// Probe rows whose bucket holds more than this many build rows (heavy keys, and every row of a
// join without keys, whose one bucket is the whole build side) are probed by their warp
// together, 32 build rows a step, rather than by their lane alone. Counts, marks and output
// are the same either way.
constexpr u32 kWideBucket = 32;

// Lane `owner`'s probe row, in every lane of the warp.
template <typename K, typename F>
__device__ __forceinline__ ProbeKey<K, F> shfl_key(const ProbeKey<K, F>& p, int owner) {
    ProbeKey<K, F> q = p;
    q.k = __shfl_sync(kFullMask, p.k, owner);
    q.check.x = __shfl_sync(kFullMask, p.check.x, owner);
    q.check.y = __shfl_sync(kFullMask, p.check.y, owner);
    q.check.z = __shfl_sync(kFullMask, p.check.z, owner);
    q.check.w = __shfl_sync(kFullMask, p.check.w, owner);
    q.s = __shfl_sync(kFullMask, p.s, owner);
    return q;
}

// The whole warp tests the build rows of `bucket` against p, 32 at a time (lane i row base + i),
// calling step(mask, matched, r) with the step's ballot until it returns true (it must return
// the same in every lane). Every lane calls it with the same arguments.
template <typename K, typename F, typename Step>
__device__ __forceinline__ void warp_matches_until(const K* r_keys, uint2 bucket,
                                                   const ProbeKey<K, F>& p, Step step) {
    const u32 lane = threadIdx.x & 31;
    for (u32 base = bucket.x; base < bucket.y; base += 32) {
        u32 r = base + lane;
        bool m = r < bucket.y && p.matches(r_keys, r);
        if (step(__ballot_sync(kFullMask, m), m, r)) return;
    }
}

// rows_of, by the whole warp, for one probe row of a wide bucket.
template <typename K, typename F>
__device__ __forceinline__ u32 warp_rows_of(const K* r_keys, uint2 bucket, const ProbeKey<K, F>& p,
                                            u32 emit, u8* visited) {
    if (emit == kEmitMatched || emit == kEmitUnmatched || emit == kEmitEvery) {
        bool found = false;
        warp_matches_until(r_keys, bucket, p, [&](u32 mask, bool, u32) { return found = mask != 0; });
        return emit == kEmitEvery ? 1u : (found == (emit == kEmitMatched) ? 1u : 0u);
    }
    u32 c = 0;
    warp_matches_until(r_keys, bucket, p, [&](u32 mask, bool m, u32 r) {
        c += __popc(mask);
        if (visited && m) visited[r] = 1;
        return false;
    });
    if (emit == kEmitNothing) return 0;
    return (emit == kEmitPairsOrAlone && c == 0) ? 1u : c;
}

// Writes the output rows of one probe row of a wide bucket, by the whole warp, from place q on
// (those in the window [lo, hi)), as bucket_write does for the others.
template <typename K, typename F>
__device__ __forceinline__ void warp_put(const K* r_keys, uint2 bucket, const ProbeKey<K, F>& p,
                                         bool pairs, u64 q, u64 lo, u64 hi, u32* r_out, u32* s_out) {
    const u32 lane = threadIdx.x & 31;
    auto put = [&](u64 at, u32 r) {
        if (at >= lo && at < hi) { r_out[at - lo] = r; s_out[at - lo] = (u32)p.s; }
    };
    if (!pairs) {
        u32 first = kNoRow;
        warp_matches_until(r_keys, bucket, p, [&](u32 mask, bool, u32 r) {
            if (mask) first = __shfl_sync(kFullMask, r, __ffs(mask) - 1);
            return mask != 0;
        });
        if (lane == 0) put(q, first);
        return;
    }
    u64 at = q;
    warp_matches_until(r_keys, bucket, p, [&](u32 mask, bool m, u32 r) {
        if (m) put(at + __popc(mask & ((1u << lane) - 1)), r);
        at += __popc(mask);
        return false;
    });
    if (at == q && lane == 0) put(q, kNoRow);
}

// Block b handles run b: warp w its probe rows first + 32w .. first + 32w + 31, one a lane (the
// warps of a block together: a row's work is never queued behind other rows of its lane).
static_assert(kProbeRounds == kWarps, "a run is one row a thread of a block");

// The output rows of lane's probe row p (bucket `bucket`), serially where its bucket is narrow,
// else by the whole warp with the other wide rows of the warp (`wides`, their lanes); marks
// the build rows matched in `visited` if given. Every lane of the warp calls it.
template <typename K, typename F>
__device__ __forceinline__ u32 row_count(const K* r_keys, const ProbeKey<K, F>& p, uint2 bucket,
                                         bool valid, u32 wides, u32 emit, u8* visited) {
    const u32 lane = threadIdx.x & 31;
    bool wide = (wides >> lane) & 1;
    u32 c = valid && !wide ? rows_of(r_keys, bucket, p, emit, visited) : 0u;
    for (u32 w = wides; w; w &= w - 1) {
        int owner = __ffs(w) - 1;
        ProbeKey<K, F> o = shfl_key(p, owner);
        uint2 b = make_uint2(__shfl_sync(kFullMask, bucket.x, owner),
                             __shfl_sync(kFullMask, bucket.y, owner));
        u32 co = warp_rows_of(r_keys, b, o, emit, visited);
        if ((int)lane == owner) c = co;
    }
    return c;
}

template <typename K, typename F>
__device__ void bucket_count(const K* r_keys, const u32* bounds, u32 bits, const K* s_keys, u64 n,
                             const CheckWords& r_check, const CheckWords& s_check,
                             const FilterArgs& args,
                             u32 emit, u8* visited, u64* counts) {
    __shared__ u64 warp_counts[kWarps];
    const u64 run = blockIdx.x;
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const u64 s = run * kProbeRun + warp * 32 + lane;
    const bool valid = s < n;
    ProbeKey<K, F> p(valid ? s_keys[s] : key_sentinel<K>(), r_check, s_check, valid, s, args);
    uint2 bucket = bucket_of(bounds, bits, p);
    u32 wides = __ballot_sync(kFullMask, bucket.y - bucket.x > kWideBucket);
    u64 count = row_count(r_keys, p, bucket, valid, wides, emit, visited);
    for (int o = 16; o > 0; o >>= 1) count += __shfl_down_sync(kFullMask, count, o);
    if (lane == 0) warp_counts[warp] = count;
    __syncthreads();
    if (threadIdx.x == 0) {
        u64 total = 0;
        for (u32 w = 0; w < kWarps; ++w) total += warp_counts[w];
        counts[run] = total;
    }
}

template <typename K, typename F>
__device__ void bucket_write(const K* r_keys, const u32* bounds, u32 bits, const K* s_keys, u64 n,
                             const CheckWords& r_check, const CheckWords& s_check,
                             const FilterArgs& args,
                             u32 emit, const u64* offsets, u64 lo, u64 hi, u32* r_out,
                             u32* s_out) {
    __shared__ u64 warp_totals[kWarps];
    const u64 run = blockIdx.x;
    const u32 warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    u64 base = offsets[run];
    // The whole block skips a run whose rows all lie outside the window.
    if (offsets[run + 1] <= lo || base >= hi) return;
    const bool pairs = emit == kEmitPairs || emit == kEmitPairsOrAlone;
    const u64 s = run * kProbeRun + warp * 32 + lane;
    const bool valid = s < n;
    ProbeKey<K, F> p(valid ? s_keys[s] : key_sentinel<K>(), r_check, s_check, valid, s, args);
    uint2 bucket = bucket_of(bounds, bits, p);
    const u32 wides = __ballot_sync(kFullMask, bucket.y - bucket.x > kWideBucket);
    u32 c = row_count(r_keys, p, bucket, valid, wides, emit, nullptr);
    // 64-bit: the rows of 32 probe rows may pass 2^32 (a join without keys).
    u64 incl = c;
    for (int o = 1; o < 32; o <<= 1) {
        u64 v = __shfl_up_sync(kFullMask, incl, o);
        if (lane >= o) incl += v;
    }
    if (lane == 31) warp_totals[warp] = incl;
    __syncthreads();
    for (u32 w = 0; w < warp; ++w) base += warp_totals[w];
    u64 q = base + incl - c;
    // Rows of wide buckets, one at a time by the whole warp.
    for (u32 w = wides; w; w &= w - 1) {
        int owner = __ffs(w) - 1;
        u64 qo = __shfl_sync(kFullMask, q, owner);
        u32 co = __shfl_sync(kFullMask, c, owner);
        if (co > 0 && qo < hi && qo + co > lo) {
            ProbeKey<K, F> o = shfl_key(p, owner);
            uint2 b = make_uint2(__shfl_sync(kFullMask, bucket.x, owner),
                                 __shfl_sync(kFullMask, bucket.y, owner));
            warp_put(r_keys, b, o, pairs, qo, lo, hi, r_out, s_out);
        }
    }
    if (((wides >> lane) & 1) == 0 && c > 0 && q < hi && q + c > lo) {
        auto put = [&](u32 r) {
            if (q >= lo && q < hi) { r_out[q - lo] = r; s_out[q - lo] = (u32)s; }
            ++q;
        };
        if (!pairs) {
            put(first_match(r_keys, bucket, p));
        } else {
            u32 matched = 0;
            bucket_matches(r_keys, bucket, p, [&](u32 r) { ++matched; put(r); });
            if (matched == 0) put(kNoRow);
        }
    }
}

// bucket_lookup: each probe row's one build row, in one pass, for a build side whose keys are
// unique (LOOKUP, src/join/lookup.rs): out[s] = the bucket position holding s's key, or kNoRow.
// A thread a probe row. counts[0] += probe rows without a build row, counts[1] += probe rows
// whose key more than one build row holds (out[s] is then the first of them; the caller must
// not use the lookup). With `exact` (a direct table, whose every bucket holds one key value),
// every row of the bucket holds the key, so build keys are not read, except in the bucket the
// sentinel hashes to, which also holds the build rows of null keys. Exact keys only: no check
// bytes, no filter. A thread scans its bucket alone (no warp for wide buckets, as bucket_count
// has): a hashed table's null build keys share one bucket, which a probe key hashing there
// reads through.
template <typename K>
__device__ __forceinline__ void bucket_lookup(const K* r_keys, const u32* bounds, u32 bits,
                                              const K* s_keys, u64 n, u32 exact, u32* out,
                                              u64* counts) {
    const u64 s = (u64)blockIdx.x * kBlockThreads + threadIdx.x;
    u32 found = kNoRow;
    bool repeated = false;
    if (s < n) {
        const K k = s_keys[s];
        if (k != key_sentinel<K>()) {
            const u32 b = partition_of(k, bits);
            const u32 x = bounds[b], y = bounds[b + 1];
            if (exact && b != partition_of(key_sentinel<K>(), bits)) {
                found = x < y ? x : kNoRow;
                repeated = y - x > 1;
            } else {
                for (u32 r = x; r < y; ++r) {
                    if (r_keys[r] != k) continue;
                    if (found != kNoRow) { repeated = true; break; }
                    found = r;
                }
            }
        }
        out[s] = found;
    }
    const u32 missing = __popc(__ballot_sync(kFullMask, s < n && found == kNoRow));
    const u32 repeats = __popc(__ballot_sync(kFullMask, repeated));
    if ((threadIdx.x & 31) == 0) {
        if (missing) atomicAdd(&counts[0], (u64)missing);
        if (repeats) atomicAdd(&counts[1], (u64)repeats);
    }
}

// The kernels bucket_count_NAME and bucket_write_NAME for keys K and filter F; every one takes
// FilterArgs (read by F alone).
#define BUCKET_PROBE(NAME, K, F) \
    extern "C" __global__ void __launch_bounds__(kBlockThreads) bucket_count_##NAME(const K* r_keys, \
        const u32* bounds, u32 bits, const K* s_keys, u64 n, const CheckWords r_check, const CheckWords s_check, \
        const FilterArgs args, u32 emit, u8* visited, u64* counts) { \
        bucket_count<K, F>(r_keys, bounds, bits, s_keys, n, r_check, s_check, args, emit, visited, counts); } \
    extern "C" __global__ void __launch_bounds__(kBlockThreads) bucket_write_##NAME(const K* r_keys, \
        const u32* bounds, u32 bits, const K* s_keys, u64 n, const CheckWords r_check, const CheckWords s_check, \
        const FilterArgs args, u32 emit, const u64* offsets, u64 lo, u64 hi, u32* r_out, u32* s_out) { \
        bucket_write<K, F>(r_keys, bounds, bits, s_keys, n, r_check, s_check, args, emit, offsets, lo, hi, r_out, \
            s_out); }

// The kernels of a join with filter F (instantiated by the code src/device/kernels.rs appends).
#define BUCKET_PROBE_FILTERED(K, F) BUCKET_PROBE(filtered_##K, K, F)

// A module compiled for one filter (src/device/kernels.rs) holds that filter's kernels alone.
#ifndef GJ_FILTER_MODULE
BUCKET_PROBE(u32, u32, NoFilter)
BUCKET_PROBE(u64, u64, NoFilter)

#define BUCKET_LOOKUP(K) \
    extern "C" __global__ void __launch_bounds__(kBlockThreads) bucket_lookup_##K(const K* r_keys, \
        const u32* bounds, u32 bits, const K* s_keys, u64 n, u32 exact, u32* out, u64* counts) { \
        bucket_lookup<K>(r_keys, bounds, bits, s_keys, n, exact, out, counts); }
BUCKET_LOOKUP(u32)
BUCKET_LOOKUP(u64)
#endif
