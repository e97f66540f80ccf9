// common.cuh — types, hash functions and tuning constants shared by every kernel.
//
// The host backend (src/backend/host/) mirrors each function here bit for bit:
// partition ids and hash-table slots must agree between the two backends.
#pragma once

typedef unsigned char u8;
typedef unsigned short u16;
typedef unsigned int u32;
typedef unsigned long long u64;
typedef signed char i8;
typedef short i16;
typedef int i32;
typedef long long i64;

// Tuning constants shared with the Rust launch wrappers come from the crate as -D defines
// (`KERNEL_CONSTANTS` in src/device/kernels.rs), so the two sides cannot drift apart.
#ifndef GJ_BLOCK_THREADS
#error "compile with the -D defines of KERNEL_CONSTANTS (src/device/kernels.rs)"
#endif
// (An enum, so that a file that does not use a constant gets no warning about it.)
enum : u32 {
    // Threads per block of every kernel that works on tiles.
    kBlockThreads = GJ_BLOCK_THREADS,
    kWarps = GJ_BLOCK_THREADS / 32,
    // Items per thread of the scan kernels (scan.cu).
    kScanItems = GJ_SCAN_ITEMS,
    // Items per thread of the radix partitioning kernels (partition.cu).
    kPartItems = GJ_PART_ITEMS,
    // Columns one radix_scatter launch moves besides the keys (partition.cu).
    kMaxPlanes = GJ_MAX_PLANES,
    // Build rows one match-finding task of the partitioned hash join loads (hash_join.cu).
    kJoinChunk = GJ_JOIN_CHUNK,
    // Rows per thread of the gather kernels (columns.cu).
    kGatherItems = GJ_GATHER_ITEMS,
    // Rows per thread of the key encoding kernels (keys.cu).
    kEncodeItems = GJ_ENCODE_ITEMS,
    // Probe rows per thread of the sort-merge join's match finding (merge_join.cu).
    kMergeItems = GJ_MERGE_ITEMS,
    // Groups of 32 rows in a run: a block of bucket_probe.cu (a warp each), a warp of select.cu.
    kProbeRounds = GJ_PROBE_ROUNDS,
    // A run of more partitions than this that start at one row goes to fill_bounds (partition.cu).
    kBoundsRun = GJ_BOUNDS_RUN,
    // The position of a row that is not there: the build side of a probe row without a match.
    kNoRow = GJ_NO_ROW,
    // Low bits of a checked key's hash that hold its length class (keys.cu).
    kClassBits = GJ_CLASS_BITS,
    // Words of 16 check bytes a checked key's rows carry at most (keys.cu, bucket_probe.cu).
    kCheckWords = GJ_CHECK_WORDS,
    // All lanes of a warp.
    kFullMask = 0xffffffffu,
};

// One side's check bytes of a checked key (keys.cu, bucket_probe.cu): `words` planes of 16 bytes
// a row, plane j holding bytes 16j..16j+15 of each row's key, zero-padded; no words where keys
// are exact. The same layout as `CheckWords` in src/backend/cuda/keys.rs.
struct CheckWords {
    const uint4* w[kCheckWords];
    u32 words;
};

// The columns one launch moves (radix_scatter besides the keys, gather_planes), passed by
// value: plane p's `width`-byte values (1, 2, 4, 8 or 16) go from in[p] to out[p]. The same
// layout as `Planes` in src/backend/cuda/planes.rs.
struct Planes {
    const void* in[kMaxPlanes];
    void* out[kMaxPlanes];
    u32 width[kMaxPlanes];
    u32 count;
};

// An encoded key equal to all ones never matches: null keys, and probe keys outside the
// build side's value range, are encoded as this sentinel.
template <typename K> __device__ __forceinline__ K key_sentinel() { return (K)~(K)0; }

// Partition id of an encoded key: the top `bits` bits (0 to 32) of a multiplicative (Fibonacci)
// hash, whose multipliers the crate defines (PARTITION_MUL_U32/U64 in src/backend/mod.rs: the
// direct key encoder inverts the 32-bit one).
__device__ __forceinline__ u32 partition_of(u32 k, u32 bits) {
    return bits == 0 ? 0u : (u32)((k * (u32)GJ_PARTITION_MUL_U32) >> (32 - bits));
}
__device__ __forceinline__ u32 partition_of(u64 k, u32 bits) {
    return bits == 0 ? 0u : (u32)((k * (u64)GJ_PARTITION_MUL_U64) >> (64 - bits));
}

// Hash-table slot hash: the murmur3 finalizers, independent of the partition hash. Its top bits
// are also a key's route (RouteDigit, partition.cu).
__device__ __forceinline__ u32 slot_hash(u32 k) {
    k ^= k >> 16; k *= 0x85EBCA6Bu; k ^= k >> 13; k *= 0xC2B2AE35u; k ^= k >> 16;
    return k;
}
__device__ __forceinline__ u32 slot_hash(u64 k) {
    k ^= k >> 33; k *= 0xFF51AFD7ED558CCDull; k ^= k >> 33; k *= 0xC4CEB9FE1A85EC53ull; k ^= k >> 33;
    return (u32)k;
}
