// filter.cuh — what a join's compiled residual filter is made of (src/filter/cuda.rs writes the
// filter itself): values that may be null, and DataFusion's operations on them.
//
// A filter reads up to GJ_FILTER_COLUMNS columns of each side; FilterArgs holds, per column,
// its values and its validity (a byte per row, 1 = valid; null when no row is null). Build
// columns are read at the build row's bucket position r, probe columns at the probe row s.
// Semantics (the host twin, src/filter/eval.rs, is kept equal): integer arithmetic wraps;
// floats compare with -0.0 read as 0.0 and then in IEEE 754's total order (as DataFusion's
// comparisons do) and are rounded per operation (the
// _rn intrinsics are never contracted into an FMA); a null operand gives null; AND, OR and NOT
// are three-valued (Kleene). Operations that can fail in DataFusion are never compiled.
#pragma once

struct FilterArgs {
    const void* build[2 * GJ_FILTER_COLUMNS];
    const void* probe[2 * GJ_FILTER_COLUMNS];
};

// A value and whether it is valid (not null).
template <typename T>
struct V {
    T v;
    bool ok;
};

template <typename T>
__device__ __forceinline__ V<T> col(const void* values, const void* validity, u64 i) {
    return V<T>{((const T*)values)[i], !validity || ((const u8*)validity)[i] != 0};
}
template <>
__device__ __forceinline__ V<bool> col<bool>(const void* values, const void* validity, u64 i) {
    return V<bool>{((const u8*)values)[i] != 0, !validity || ((const u8*)validity)[i] != 0};
}
template <typename T>
__device__ __forceinline__ V<T> lit(T v) { return V<T>{v, true}; }
template <typename T>
__device__ __forceinline__ V<T> null_of() { return V<T>{T(), false}; }

// Keys that order floats as DataFusion compares them: -0.0 read as 0.0, then IEEE 754's total
// order (f32::total_cmp: a NaN equals a NaN of the same bits, positive NaNs are the greatest and
// negative ones the least); integers as themselves.
__device__ __forceinline__ i32 ord(float x) {
    i32 b = x == 0.0f ? 0 : __float_as_int(x);
    return b ^ (i32)(((u32)(b >> 31)) >> 1);
}
__device__ __forceinline__ i64 ord(double x) {
    i64 b = x == 0.0 ? 0 : __double_as_longlong(x);
    return b ^ (i64)(((u64)(b >> 63)) >> 1);
}
template <typename T>
__device__ __forceinline__ T ord(T x) { return x; }

#define GJ_CMP(name, op)                                                  \
    template <typename T>                                                 \
    __device__ __forceinline__ V<bool> name(V<T> a, V<T> b) {             \
        return V<bool>{ord(a.v) op ord(b.v), a.ok && b.ok};               \
    }
GJ_CMP(eq, ==)
GJ_CMP(ne, !=)
GJ_CMP(lt, <)
GJ_CMP(le, <=)
GJ_CMP(gt, >)
GJ_CMP(ge, >=)
#undef GJ_CMP

// IS DISTINCT FROM: never null; two nulls are not distinct, a null and a value are.
template <typename T>
__device__ __forceinline__ V<bool> distinct(V<T> a, V<T> b) {
    return V<bool>{a.ok != b.ok || (a.ok && ord(a.v) != ord(b.v)), true};
}

// Integer arithmetic modulo 2^64, truncated to T: wrapping, with no signed overflow (integers of
// at most 8 bytes: decimals take no arithmetic, src/filter/compile.rs).
template <typename T>
__device__ __forceinline__ V<T> add(V<T> a, V<T> b) {
    static_assert(sizeof(T) <= 8, "wrapping arithmetic of at most 64 bits");
    return V<T>{(T)((u64)a.v + (u64)b.v), a.ok && b.ok};
}
template <typename T>
__device__ __forceinline__ V<T> sub(V<T> a, V<T> b) { return V<T>{(T)((u64)a.v - (u64)b.v), a.ok && b.ok}; }
template <typename T>
__device__ __forceinline__ V<T> mul(V<T> a, V<T> b) { return V<T>{(T)((u64)a.v * (u64)b.v), a.ok && b.ok}; }
template <typename T>
__device__ __forceinline__ V<T> neg(V<T> a) { return V<T>{(T)(0ull - (u64)a.v), a.ok}; }
// Only by a literal divisor other than 0 and -1 (src/filter/compile.rs).
template <typename T>
__device__ __forceinline__ V<T> div(V<T> a, V<T> b) { return V<T>{b.ok && a.ok ? (T)(a.v / b.v) : T(), a.ok && b.ok}; }
template <typename T>
__device__ __forceinline__ V<T> rem(V<T> a, V<T> b) { return V<T>{b.ok && a.ok ? (T)(a.v % b.v) : T(), a.ok && b.ok}; }

// A float operation's NaN as the host CPU makes it (its default NaN for an operation on
// numbers, GJ_NAN_F32/GJ_NAN_F64, measured on the host; else the NaN operand, quieted), not the
// GPU's canonical NaN: comparisons order NaNs by sign and payload.
__device__ __forceinline__ float host_nan(float r, float a, float b) {
    if (r == r) return r;
    if (a != a) return __int_as_float(__float_as_int(a) | 0x00400000);
    if (b != b) return __int_as_float(__float_as_int(b) | 0x00400000);
    return __int_as_float((int)GJ_NAN_F32);
}
__device__ __forceinline__ double host_nan(double r, double a, double b) {
    if (r == r) return r;
    if (a != a) return __longlong_as_double(__double_as_longlong(a) | 0x0008000000000000ll);
    if (b != b) return __longlong_as_double(__double_as_longlong(b) | 0x0008000000000000ll);
    return __longlong_as_double((long long)GJ_NAN_F64);
}
#define GJ_FLOAT_OP(T, name, expr)                                               \
    __device__ __forceinline__ V<T> name(V<T> a, V<T> b) {                       \
        T x = a.v, y = b.v;                                                      \
        return V<T>{host_nan((T)(expr), x, y), a.ok && b.ok};                    \
    }
GJ_FLOAT_OP(float, add, __fadd_rn(x, y))
GJ_FLOAT_OP(float, sub, __fsub_rn(x, y))
GJ_FLOAT_OP(float, mul, __fmul_rn(x, y))
GJ_FLOAT_OP(float, div, __fdiv_rn(x, y))
GJ_FLOAT_OP(float, rem, fmodf(x, y))
GJ_FLOAT_OP(double, add, __dadd_rn(x, y))
GJ_FLOAT_OP(double, sub, __dsub_rn(x, y))
GJ_FLOAT_OP(double, mul, __dmul_rn(x, y))
GJ_FLOAT_OP(double, div, __ddiv_rn(x, y))
GJ_FLOAT_OP(double, rem, fmod(x, y))
#undef GJ_FLOAT_OP
// The sign bit flipped, as the host negates: `-x` compiles to an add of negated operands,
// which gives the GPU's canonical NaN for a NaN (a NaN's sign orders it in comparisons).
__device__ __forceinline__ V<float> neg(V<float> a) {
    return V<float>{__int_as_float(__float_as_int(a.v) ^ (int)0x80000000), a.ok};
}
__device__ __forceinline__ V<double> neg(V<double> a) {
    return V<double>{__longlong_as_double(__double_as_longlong(a.v) ^ (long long)0x8000000000000000ull), a.ok};
}

// Widening casts only: exact, or integer to float (rounded to nearest).
template <typename To, typename From>
__device__ __forceinline__ V<To> cast(V<From> a) { return V<To>{(To)a.v, a.ok}; }

// Three-valued logic.
__device__ __forceinline__ V<bool> and3(V<bool> a, V<bool> b) {
    if ((a.ok && !a.v) || (b.ok && !b.v)) return V<bool>{false, true};
    return V<bool>{true, a.ok && b.ok};
}
__device__ __forceinline__ V<bool> or3(V<bool> a, V<bool> b) {
    if ((a.ok && a.v) || (b.ok && b.v)) return V<bool>{true, true};
    return V<bool>{false, a.ok && b.ok};
}
__device__ __forceinline__ V<bool> not3(V<bool> a) { return V<bool>{!a.v, a.ok}; }
template <typename T>
__device__ __forceinline__ V<bool> is_null(V<T> a) { return V<bool>{!a.ok, true}; }
