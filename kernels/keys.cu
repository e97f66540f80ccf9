// keys.cu — encodes join-key columns into one fixed-width unsigned key per row, and hashes
// checked keys (strings and binary of up to 64 bytes) from their check bytes.
//
// Each key column c is mapped onto [0, span_c) by subtracting the build side's minimum;
// a composite key is the mixed-radix number sum((v_c - min_c) * stride_c). The kernel runs once
// per key column; the first column initializes `out`, the later ones accumulate into it.
// Values outside [min_c, max_c] become the sentinel (all ones), which never matches; so do
// nulls, unless nulls equal nulls (IS NOT DISTINCT FROM): then a null is the digit null_code
// (one past the range's; all ones: nulls never match).
// Example (one Int32 column, min 10, max 12): {10, 12, null, 99} -> {0, 2, ~0, ~0}; with
// null_code 3: {0, 2, 3, ~0}.
#include "common.cuh"

// kMode: 0 reads plain values; 1 (kFloat) reads a float's bits as unsigned, with -0.0 (the
// sign bit alone) read as +0.0: SQL equality as DataFusion's hash join decides it; 2 (kWide)
// reads a 16-byte integer as two i64 words, the value the low word where the high word is its
// sign extension, and out of every range (the sentinel) where it is not.
enum : int { kPlain = 0, kFloat = 1, kWide = 2 };

// Rows of one thread: kEncodeItems, blockDim.x apart; every read is issued before any write.
template <typename S, typename W, typename K, int kMode>
__device__ void encode_keys(const S* src, const u8* valid, u64 n, W min_v, W max_v, u64 stride,
                            u64 null_code, int first, K* out) {
    const u64 base = (u64)blockIdx.x * blockDim.x * kEncodeItems + threadIdx.x;
    const int top = (int)sizeof(S) * 8 - 1;
    S raw[kEncodeItems];
    bool fits[kEncodeItems], is_null[kEncodeItems];
    K prev[kEncodeItems];
#pragma unroll
    for (u32 j = 0; j < kEncodeItems; ++j) {
        u64 i = base + (u64)j * blockDim.x;
        if (i >= n) break;
        raw[j] = src[kMode == kWide ? 2 * i : i];
        fits[j] = kMode != kWide || src[2 * i + 1] == (S)(raw[j] >> top);
        is_null[j] = valid != nullptr && valid[i] == 0;
        prev[j] = first ? (K)0 : out[i];
    }
#pragma unroll
    for (u32 j = 0; j < kEncodeItems; ++j) {
        u64 i = base + (u64)j * blockDim.x;
        if (i >= n) break;
        S r = raw[j];
        if (kMode == kFloat && r == (S)((S)1 << top)) r = 0;
        W v = (W)r;
        bool ok = is_null[j] ? null_code != ~(u64)0 : (fits[j] && v >= min_v && v <= max_v);
        if (!ok || prev[j] == key_sentinel<K>()) {
            out[i] = key_sentinel<K>();
        } else {
            u64 d = is_null[j] ? null_code : (u64)v - (u64)min_v;
            out[i] = prev[j] + (K)(d * stride);
        }
    }
}

#define ENCODE(NAME, S, W, K, MODE) \
    extern "C" __global__ void encode_keys_##NAME(const S* src, const u8* valid, u64 n, W min_v, W max_v, \
                                                  u64 stride, u64 null_code, int first, K* out) { \
        encode_keys<S, W, K, MODE>(src, valid, n, min_v, max_v, stride, null_code, first, out); \
    }
#define ENCODE_BOTH(NAME, S, W, MODE) ENCODE(NAME##_u32, S, W, u32, MODE) ENCODE(NAME##_u64, S, W, u64, MODE)

ENCODE_BOTH(i8, i8, i64, kPlain)
ENCODE_BOTH(i16, i16, i64, kPlain)
ENCODE_BOTH(i32, i32, i64, kPlain)
ENCODE_BOTH(i64, i64, i64, kPlain)
ENCODE_BOTH(u8, u8, u64, kPlain)
ENCODE_BOTH(u16, u16, u64, kPlain)
ENCODE_BOTH(u32, u32, u64, kPlain)
ENCODE_BOTH(u64, u64, u64, kPlain)
ENCODE_BOTH(f16, unsigned short, u64, kFloat)
ENCODE_BOTH(f32, u32, u64, kFloat)
ENCODE_BOTH(f64, u64, u64, kFloat)
ENCODE_BOTH(i128, i64, i64, kWide)

// hash_checked: the hash of a checked key from its check bytes (`check.words` words of 16 bytes,
// each read as two little-endian u64) and its length class (a byte, below 2^kClassBits): the
// class and the words mixed, a murmur3 finalizer between words and after the last, masked, the
// class in the low kClassBits bits. Equal keys of up to 16 bytes a word hash equal. Twin of
// `checked_hash` in src/backend/keys.rs.
// The murmur3 64-bit finalizer.
__device__ __forceinline__ u64 fmix64(u64 h) {
    h ^= h >> 33;
    h *= 0xFF51AFD7ED558CCDull;
    h ^= h >> 33;
    h *= 0xC4CEB9FE1A85EC53ull;
    h ^= h >> 33;
    return h;
}

extern "C" __global__ void hash_checked(const CheckWords check, const u8* classes, u64 n, u64 mask,
                                        u64* out) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const u64 class_mask = (1ull << kClassBits) - 1;
    u64 cls = (u64)classes[i] & class_mask;
    u64 h = cls * 0x165667B19E3779F9ull;
    // Unrolled, so that the words' addresses are read from the parameters at constant places.
#pragma unroll
    for (u32 j = 0; j < kCheckWords; ++j) {
        if (j >= check.words) break;
        ulonglong2 c = ((const ulonglong2*)check.w[j])[i];
        if (j > 0) h = fmix64(h);
        u64 hi = (c.y << 29) | (c.y >> 35);
        h ^= (c.x * 0x9E3779B97F4A7C15ull) ^ (hi * 0xC2B2AE3D27D4EB4Full);
    }
    h = fmix64(h);
    out[i] = (h & mask & ~class_mask) | cls;
}
