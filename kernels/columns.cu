// columns.cu — moves fixed-width column values and validity between row positions.
//
//   gather_wN:  out[i] = src[idx[i]]   materializes join output from the partitioned columns
//                                      (idx: the matching positions); 0 where idx[i] is kNoRow
//   gather_planes: gather_wN of up to kMaxPlanes columns by one idx, read once
//   present:    out[i] = idx[i] != kNoRow  the validity of a side that may be missing
//   unpack_bits: bytes[i] = bit i of an Arrow bitmap (LSB first)
//   pack_bits:   bit i of the output = bytes[i] != 0, one 32-bit word per warp
//   unframe_wN_pM: out[i] = base + packed[i], N-byte values from M-byte offsets (frame-of-reference
//                packing over PCIe), wrapping at N bytes; base given as its low and high words
// N is the value width in bytes: 1, 2, 4, 8 or 16. gather_wN: kGatherItems rows per thread;
// the others: one thread per row.
// Example: gather_w4(src {7, 8, 9}, idx {2, 2, 0}) -> {9, 9, 7}.
#include "common.cuh"

struct alignas(16) w16 { u64 lo, hi; };


template <typename T>
__device__ void gather(const T* src, const u32* idx, u64 n, T* out) {
    u64 base = (u64)blockIdx.x * blockDim.x * kGatherItems + threadIdx.x;
    u32 at[kGatherItems];
    T v[kGatherItems];
#pragma unroll
    for (u32 k = 0; k < kGatherItems; ++k) {
        u64 i = base + (u64)k * blockDim.x;
        at[k] = i < n ? idx[i] : 0u;
    }
#pragma unroll
    for (u32 k = 0; k < kGatherItems; ++k) {
        u64 i = base + (u64)k * blockDim.x;
        if (i < n) v[k] = at[k] == kNoRow ? T{} : src[at[k]];
    }
#pragma unroll
    for (u32 k = 0; k < kGatherItems; ++k) {
        u64 i = base + (u64)k * blockDim.x;
        if (i < n) out[i] = v[k];
    }
}

// One plane of gather_planes: the values at the thread's positions `at` (rows base, base +
// blockDim.x, ...), every load before any store.
template <typename T>
__device__ __forceinline__ void gather_plane(const void* src, void* out, const u32 (&at)[kGatherItems],
                                             u64 base, u64 n) {
    T v[kGatherItems];
#pragma unroll
    for (u32 k = 0; k < kGatherItems; ++k) {
        u64 i = base + (u64)k * blockDim.x;
        if (i < n) v[k] = at[k] == kNoRow ? T{} : ((const T*)src)[at[k]];
    }
#pragma unroll
    for (u32 k = 0; k < kGatherItems; ++k) {
        u64 i = base + (u64)k * blockDim.x;
        if (i < n) ((T*)out)[i] = v[k];
    }
}

#define MOVE(N, T) \
    extern "C" __global__ void gather_w##N(const T* src, const u32* idx, u64 n, T* out) { gather<T>(src, idx, n, out); }

MOVE(1, u8)
MOVE(2, u16)
MOVE(4, u32)
MOVE(8, u64)
MOVE(16, w16)

// gather_wN of every plane at once: the positions are read once for all of them.
extern "C" __global__ void gather_planes(Planes planes, const u32* idx, u64 n) {
    u64 base = (u64)blockIdx.x * blockDim.x * kGatherItems + threadIdx.x;
    u32 at[kGatherItems];
#pragma unroll
    for (u32 k = 0; k < kGatherItems; ++k) {
        u64 i = base + (u64)k * blockDim.x;
        at[k] = i < n ? idx[i] : 0u;
    }
    for (u32 p = 0; p < planes.count; ++p) {
        switch (planes.width[p]) {
            case 1: gather_plane<u8>(planes.in[p], planes.out[p], at, base, n); break;
            case 2: gather_plane<u16>(planes.in[p], planes.out[p], at, base, n); break;
            case 4: gather_plane<u32>(planes.in[p], planes.out[p], at, base, n); break;
            case 8: gather_plane<u64>(planes.in[p], planes.out[p], at, base, n); break;
            default: gather_plane<w16>(planes.in[p], planes.out[p], at, base, n); break;
        }
    }
}

// out[i] = i: every row's position (n < 2^32: the last is below kNoRow).
extern "C" __global__ void row_positions(u64 n, u32* out) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (u32)i;
}

extern "C" __global__ void present(const u32* idx, u64 n, u8* out) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = idx[i] != kNoRow;
}

extern "C" __global__ void unpack_bits(const u8* bits, u64 n, u8* out) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (bits[i >> 3] >> (i & 7)) & 1;
}

// Grid covers ceil(n / 32) * 32 threads so that every warp is complete.
extern "C" __global__ void pack_bits(const u8* bytes, u64 n, u32* out) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    bool set = i < n && bytes[i] != 0;
    u32 word = __ballot_sync(kFullMask, set);
    if ((threadIdx.x & 31) == 0 && i < n) out[i >> 5] = word;
}

// A 16-byte value is its two words, the carry of the low one added to the high one.
template <typename T, typename P>
__device__ void unframe(const P* packed, u64 n, u64 base_lo, u64 base_hi, T* out) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = (T)(base_lo + (u64)packed[i]);
}

template <typename P>
__device__ void unframe16(const P* packed, u64 n, u64 base_lo, u64 base_hi, w16* out) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    u64 lo = base_lo + (u64)packed[i];
    out[i] = w16{lo, base_hi + (lo < base_lo ? 1ull : 0ull)};
}

#define UNFRAME(N, T, M, P) \
    extern "C" __global__ void unframe_w##N##_p##M(const P* packed, u64 n, u64 lo, u64 hi, T* out) { \
        unframe<T, P>(packed, n, lo, hi, out); }
#define UNFRAME16(M, P) \
    extern "C" __global__ void unframe_w16_p##M(const P* packed, u64 n, u64 lo, u64 hi, w16* out) { \
        unframe16<P>(packed, n, lo, hi, out); }

UNFRAME(2, u16, 1, u8)
UNFRAME(4, u32, 1, u8)
UNFRAME(4, u32, 2, u16)
UNFRAME(8, u64, 1, u8)
UNFRAME(8, u64, 2, u16)
UNFRAME(8, u64, 4, u32)
UNFRAME16(1, u8)
UNFRAME16(2, u16)
UNFRAME16(4, u32)
UNFRAME16(8, u64)
