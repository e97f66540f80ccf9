// common.cuh — types, hash functions and tuning constants shared by every kernel.
//
// The host backend (src/backend/host.rs) mirrors each function here bit for bit:
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

// Threads per block of every kernel that works on tiles.
constexpr u32 kBlockThreads = 256;
constexpr u32 kWarps = kBlockThreads / 32;
constexpr u32 kFullMask = 0xffffffffu;

// An encoded key equal to all ones never matches: null keys, and probe keys outside the
// build side's value range, are encoded as this sentinel.
template <typename K> __device__ __forceinline__ K key_sentinel() { return (K)~(K)0; }

// Partition id of an encoded key: the top `bits` bits of a multiplicative (Fibonacci) hash.
__device__ __forceinline__ u32 partition_of(u32 k, u32 bits) {
    return bits == 0 ? 0u : (u32)((k * 0x9E3779B1u) >> (32 - bits));
}
__device__ __forceinline__ u32 partition_of(u64 k, u32 bits) {
    return bits == 0 ? 0u : (u32)((k * 0x9E3779B97F4A7C15ull) >> (64 - bits));
}

// Hash-table slot hash: the murmur3 finalizers, independent of the partition hash.
__device__ __forceinline__ u32 slot_hash(u32 k) {
    k ^= k >> 16; k *= 0x85EBCA6Bu; k ^= k >> 13; k *= 0xC2B2AE35u; k ^= k >> 16;
    return k;
}
__device__ __forceinline__ u32 slot_hash(u64 k) {
    k ^= k >> 33; k *= 0xFF51AFD7ED558CCDull; k ^= k >> 33; k *= 0xC4CEB9FE1A85EC53ull; k ^= k >> 33;
    return (u32)k;
}
