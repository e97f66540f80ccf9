// views.cu — a build side's string and binary values gathered on the device.
//
// The device carries a build view column as its 16-byte Arrow views, each out-of-line view's
// buffer index naming one of the build side's data buffers, which lie one after another in one
// device buffer (`data`; buffer b begins at `starts[b]`, `buffers` of them). For an output
// window of n rows (its views gathered like any 16-byte column, `validity` its packed bitmap or
// null):
//   view_lengths: lengths[i] = the bytes of row i's value the device copies: its length where it
//                 is longer than 12 bytes (out of line), at most `max_copied`, and the row is
//                 valid, else 0
//   (exclusive scan of the lengths, scan.cu u64: where each value goes in the window's buffer)
//   view_copy:    copies each such value into `out` at its place and points its view there
//                 (buffer 0, offset = its place); a null row's view becomes 0 (an empty value);
//                 a valid row's value longer than `max_copied` is left to the host: not copied,
//                 its view still naming its bytes in the build side's buffers, with its buffer
//                 index raised by one (buffer 0 is the window's), or 0 where it names no buffer
// A valid row's view that names bytes outside `data` (never made by staging, which checks each
// view's buffer) is left out: its length counts 0 and its view becomes 0; so is a value whose
// place lies past `out_len` or past what a view's 32-bit offset holds (the host, which sizes
// `out` by a bound, finds such a window by its total and refuses it).
// Example: views {"short", 20-byte value in buffer 1 at 4}, starts {0, 100}: lengths {0, 20},
// offsets {0, 0, 20}; out = data[104..124], the second view (20, prefix, buffer 0, offset 0).
#include "common.cuh"

__device__ __forceinline__ bool valid_row(const u8* validity, u64 i) {
    return validity == nullptr || ((validity[i >> 3] >> (i & 7)) & 1) != 0;
}

// The bytes of view `v` held out of line, and where they start in `data`; 0 for an inline value,
// a null row, or a view past the data.
__device__ __forceinline__ u32 out_of_line(uint4 v, const u64* starts, u32 buffers, u64 data_len,
                                           u64* from) {
    u32 len = v.x;
    if (len <= 12 || v.z >= buffers) return 0;
    u64 at = starts[v.z] + (u64)v.w;
    if (at + len > data_len) return 0;
    *from = at;
    return len;
}

extern "C" __global__ void view_lengths(const uint4* views, const u8* validity, u64 n,
                                        const u64* starts, u32 buffers, u64 data_len,
                                        u32 max_copied, u64* lengths) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    u64 from = 0;
    uint4 v = views[i];
    bool copied = valid_row(validity, i) && v.x <= max_copied;
    lengths[i] = copied ? out_of_line(v, starts, buffers, data_len, &from) : 0;
}

// One thread a row decides its row's copy and rewrites its view; then each warp copies its 32
// rows' values one after another, its 32 lanes over each value's bytes, so that a value's
// loads and stores are contiguous (a thread copying its own value byte by byte touched 32
// rows' lines at each step). Every thread of a warp takes part in the copies, so none returns
// early; launched in whole warps.
extern "C" __global__ void view_copy(uint4* views, const u8* validity, u64 n, const u64* offsets,
                                     const u8* data, const u64* starts, u32 buffers, u64 data_len,
                                     u32 max_copied, u8* out, u64 out_len) {
    u64 i = (u64)blockIdx.x * blockDim.x + threadIdx.x;
    u64 from = 0, to = 0;
    u32 len = 0;
    if (i < n) {
        if (!valid_row(validity, i)) {
            views[i] = make_uint4(0, 0, 0, 0);
        } else {
            uint4 v = views[i];
            if (v.x > max_copied && v.x > 12) {
                views[i] = v.z < buffers ? make_uint4(v.x, v.y, v.z + 1, v.w) : make_uint4(0, 0, 0, 0);
            } else if (v.x > 12) {
                len = out_of_line(v, starts, buffers, data_len, &from);
                to = offsets[i];
                if (len == 0 || to + len > out_len || to + len > 0xffffffffull) {
                    views[i] = make_uint4(0, 0, 0, 0);
                    len = 0;
                } else {
                    views[i] = make_uint4(v.x, v.y, 0, (u32)to);
                }
            }
        }
    }
    u32 lane = threadIdx.x & 31;
    for (u32 r = 0; r < 32; ++r) {
        u32 l = __shfl_sync(kFullMask, len, r);
        if (l == 0) continue;
        u64 f = __shfl_sync(kFullMask, from, r);
        u64 t = __shfl_sync(kFullMask, to, r);
        for (u32 k = lane; k < l; k += 32) out[t + k] = data[f + k];
    }
}
