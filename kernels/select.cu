// select.cu — positions of the rows whose flag byte passes a test: count -> scan -> write.
//
// What a join emits from its build side once every probe row has been seen: the build rows
// never matched (left, full and left anti joins), the matched ones (left semi), or all of them
// (left mark, whose flag is then the mark).
//   1. select_count: warp w counts the passing rows of its run of kProbeRun rows -> counts[w].
//   2. exclusive scan of the counts (scan.cu, u64)          -> offsets: where each run's go.
//   3. select_write: each warp writes the positions of its run's passing rows whose place p lies
//      in the output window [lo, hi) at p - lo, so that the output can come in passes.
// keep (Keep in src/backend/mod.rs, its values from the crate): rows whose flag is 0, rows whose
// flag is not 0, or every row. Positions come out ascending.
// Example (flags {1, 0, 0, 1}, keep 0): counts {2}, positions {1, 2}.
#include "common.cuh"

constexpr u32 kSelectRun = 32 * kProbeRounds;

__device__ __forceinline__ bool passes(const u8* flags, u64 i, u64 n, u32 keep) {
    return i < n && (keep == GJ_KEEP_ALL || (flags[i] != 0) == (keep == GJ_KEEP_SET));
}

extern "C" __global__ void __launch_bounds__(kBlockThreads) select_count(const u8* flags, u64 n, u32 keep, u64* counts) {
    const u64 run = (u64)blockIdx.x * kWarps + (threadIdx.x >> 5);
    const u32 lane = threadIdx.x & 31;
    const u64 first = run * kSelectRun;
    if (first >= n) return;
    u64 count = 0;
    for (u32 round = 0; round < kProbeRounds; ++round)
        count += __popc(__ballot_sync(kFullMask, passes(flags, first + round * 32 + lane, n, keep)));
    if (lane == 0) counts[run] = count;
}

extern "C" __global__ void __launch_bounds__(kBlockThreads) select_write(const u8* flags, u64 n, u32 keep,
        const u64* offsets, u64 lo, u64 hi, u32* out) {
    const u64 run = (u64)blockIdx.x * kWarps + (threadIdx.x >> 5);
    const u32 lane = threadIdx.x & 31;
    const u64 first = run * kSelectRun;
    if (first >= n) return;
    u64 base = offsets[run];
    if (offsets[run + 1] <= lo || base >= hi) return;
    for (u32 round = 0; round < kProbeRounds; ++round) {
        u64 i = first + round * 32 + lane;
        bool pass = passes(flags, i, n, keep);
        u32 mask = __ballot_sync(kFullMask, pass);
        u64 p = base + __popc(mask & ((1u << lane) - 1u));
        if (pass && p >= lo && p < hi) out[p - lo] = (u32)i;
        base += __popc(mask);
    }
}
