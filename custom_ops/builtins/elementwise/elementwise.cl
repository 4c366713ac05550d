// Elementwise builtins. Values are loaded from DL_T storage, computed in
// float and stored back as DL_T. The op is a run-time argument (one program
// for all of them; the switch is uniform across a launch).
//
// Unary op codes (keep in sync with elementwise.cc).
#include "dl_storage.cl"
#include "nd_index.cl"
#define U_LOGISTIC 0
#define U_TANH 1
#define U_EXP 2
#define U_LOG 3
#define U_SQRT 4
#define U_RSQRT 5
#define U_NEG 6
#define U_ABS 7
#define U_SIN 8
#define U_COS 9
#define U_SIGN 10
#define U_GELU_ERF 11
#define U_GELU_TANH 12
#define U_RELU 13
#define U_RELU6 14
#define U_SQUARE 15
#define U_FLOOR 16
#define U_CEIL 17
// Binary op codes.
#define B_ADD 0
#define B_SUB 1
#define B_MUL 2
#define B_DIV 3
#define B_MAX 4
#define B_MIN 5
#define B_SQDIFF 6
#define B_POW 7

// The ops on T (float, or float16 for the row variants below); SIGN(x) is the sign in T.
#define UNARY_OP(NAME, T, SIGN)                                       \
  inline T NAME(T x, int op) {                                        \
    switch (op) {                                                     \
      case U_LOGISTIC: return 1.0f / (1.0f + exp(-x));                \
      case U_TANH: return tanh(x);                                    \
      case U_EXP: return exp(x);                                      \
      case U_LOG: return log(x);                                      \
      case U_SQRT: return sqrt(x);                                    \
      case U_RSQRT: return rsqrt(x);                                  \
      case U_NEG: return -x;                                          \
      case U_ABS: return fabs(x);                                     \
      case U_SIN: return sin(x);                                      \
      case U_COS: return cos(x);                                      \
      case U_SIGN: return SIGN(x);                                    \
      case U_GELU_ERF: return 0.5f * x * (1.0f + erf(x * 0.70710678118654752f)); \
      case U_GELU_TANH: {                                             \
        const T inner = 0.79788456080286536f * (x + 0.044715f * x * x * x); \
        return 0.5f * x * (1.0f + tanh(inner));                       \
      }                                                               \
      case U_RELU: return fmax(x, 0.0f);                              \
      case U_RELU6: return fmin(fmax(x, 0.0f), 6.0f);                 \
      case U_SQUARE: return x * x;                                    \
      case U_FLOOR: return floor(x);                                  \
      case U_CEIL: return ceil(x);                                    \
      default: return x;                                              \
    }                                                                 \
  }

#define BINARY_OP(NAME, T)                                            \
  inline T NAME(T a, T b, int op) {                                   \
    switch (op) {                                                     \
      case B_ADD: return a + b;                                       \
      case B_SUB: return a - b;                                       \
      case B_MUL: return a * b;                                       \
      case B_DIV: return a / b;                                       \
      case B_MAX: return fmax(a, b);                                  \
      case B_MIN: return fmin(a, b);                                  \
      case B_SQDIFF: { const T d = a - b; return d * d; }             \
      case B_POW: return pow(a, b);                                   \
      default: return a;                                              \
    }                                                                 \
  }

// The scalar sign: 0 for both zeros and NaN.
#define SCALAR_SIGN(x) ((x) > 0.0f ? 1.0f : ((x) < 0.0f ? -1.0f : 0.0f))
UNARY_OP(unary_op, float, SCALAR_SIGN)
BINARY_OP(binary_op, float)

__kernel void unary(__global const DL_T* x, __global DL_T* y, int n, int op) {
  const int i = get_global_id(0);
  if (i < n) DL_STORE(y, i, unary_op(DL_LOAD(x, i), op));
}

// Same-shape operands (sa, sb in {0, 1}: 0 broadcasts a single element).
__kernel void binary_flat(__global const DL_T* a, __global const DL_T* b, __global DL_T* y,
                          int n, int op, int sa, int sb) {
  const int i = get_global_id(0);
  if (i < n) DL_STORE(y, i, binary_op(DL_LOAD(a, i * sa), DL_LOAD(b, i * sb), op));
}

// binary_op on each of 4 lanes.
inline float4 binary_op4(float4 a, float4 b, int op) {
  return (float4)(binary_op(a.x, b.x, op), binary_op(a.y, b.y, op), binary_op(a.z, b.z, op),
                  binary_op(a.w, b.w, op));
}

// binary_flat, 4 consecutive elements an item (n4 = elements / 4).
__kernel void binary_flat4(__global const DL_T* a, __global const DL_T* b, __global DL_T* y,
                           int n4, int op, int sa, int sb) {
  const int i = get_global_id(0);
  if (i >= n4) return;
  const float4 va = sa ? DL_LOAD4A(a, 4 * i) : (float4)(DL_LOAD(a, 0));
  const float4 vb = sb ? DL_LOAD4A(b, 4 * i) : (float4)(DL_LOAD(b, 0));
  DL_STORE4A(y, 4 * i, binary_op4(va, vb, op));
}

// Broadcasting over up to 8 collapsed dims (outermost first).
__kernel void binary_nd(__global const DL_T* a, __global const DL_T* b, __global DL_T* y,
                        int n, int op, int rank, int8 dims_v, int8 sa_v, int8 sb_v) {
  const int i = get_global_id(0);
  if (i >= n) return;
  const int2 o = nd_offsets(i, rank, dims_v, sa_v, sb_v);
  DL_STORE(y, i, binary_op(DL_LOAD(a, o.x), DL_LOAD(b, o.y), op));
}

// binary_nd, 4 consecutive innermost elements an item (n4 = elements / 4): the
// host divides the innermost dim by 4 and multiplies its strides by 4, so
// offsets stay in elements. An operand whose innermost stride is nonzero (va,
// vb) is read as one aligned 4-vector, else its one element is broadcast.
__kernel void binary_nd4(__global const DL_T* a, __global const DL_T* b, __global DL_T* y,
                         int n4, int op, int rank, int8 dims_v, int8 sa_v, int8 sb_v, int va,
                         int vb) {
  const int i = get_global_id(0);
  if (i >= n4) return;
  const int2 o = nd_offsets(i, rank, dims_v, sa_v, sb_v);
  const float4 x = va ? DL_LOAD4A(a, o.x) : (float4)(DL_LOAD(a, o.x));
  const float4 z = vb ? DL_LOAD4A(b, o.y) : (float4)(DL_LOAD(b, o.y));
  DL_STORE4A(y, 4 * i, binary_op4(x, z, op));
}

// SELECT / SELECT_V2: y = cond ? a : b, broadcasting; the condition is an
// int32 (bool constants become 0/1) or a float tensor; IS_SET(c, ic) tests it.
#define SELECT_KERNEL(NAME, COND_T, IS_SET)                                            \
  __kernel void NAME(__global const COND_T* c, __global const DL_T* a,                \
                     __global const DL_T* b, __global DL_T* y, int n, int rank,        \
                     int8 dims_v, int8 sc_v, int8 sa_v, int8 sb_v) {                   \
    const int i = get_global_id(0);                                                    \
    if (i >= n) return;                                                                \
    const int dims[8] = {dims_v.s0, dims_v.s1, dims_v.s2, dims_v.s3,                   \
                         dims_v.s4, dims_v.s5, dims_v.s6, dims_v.s7};                  \
    const int sc[8] = {sc_v.s0, sc_v.s1, sc_v.s2, sc_v.s3, sc_v.s4, sc_v.s5, sc_v.s6, sc_v.s7}; \
    const int sa[8] = {sa_v.s0, sa_v.s1, sa_v.s2, sa_v.s3, sa_v.s4, sa_v.s5, sa_v.s6, sa_v.s7}; \
    const int sb[8] = {sb_v.s0, sb_v.s1, sb_v.s2, sb_v.s3, sb_v.s4, sb_v.s5, sb_v.s6, sb_v.s7}; \
    int r = i, ic = 0, ia = 0, ib = 0;                                                 \
    for (int k = 7; k >= 0; --k) {                                                     \
      if (k < rank) {                                                                  \
        const int q = r / dims[k];                                                     \
        const int cc = r - q * dims[k];                                                \
        r = q;                                                                         \
        ic += cc * sc[k];                                                              \
        ia += cc * sa[k];                                                              \
        ib += cc * sb[k];                                                              \
      }                                                                                \
    }                                                                                  \
    DL_STORE(y, i, IS_SET(c, ic) ? DL_LOAD(a, ia) : DL_LOAD(b, ib));                   \
  }

#define INT_IS_SET(c, i) ((c)[i] != 0)
#define FLOAT_IS_SET(c, i) (DL_LOAD(c, i) != 0.0f)
SELECT_KERNEL(select_i, int, INT_IS_SET)
SELECT_KERNEL(select_f, DL_T, FLOAT_IS_SET)

__kernel void cast_i2f(__global const int* x, __global DL_T* y, int n) {
  const int i = get_global_id(0);
  if (i < n) DL_STORE(y, i, (float)x[i]);
}

// float -> int32 truncates toward zero (C static_cast, as TFLite's CAST).
__kernel void cast_f2i(__global const DL_T* x, __global int* y, int n) {
  const int i = get_global_id(0);
  if (i < n) y[i] = convert_int_rtz(DL_LOAD(x, i));
}

// ---------------------------------------------------------------------------
// Row variants for CPU-like devices: an item handles 16 consecutive elements
// of the innermost dim with explicit float16 vectors (a scalar tail in the
// last chunk of a row). Binary operands walk that dim with stride 1 or 0.
#define LOAD16(p) DL_LOAD16((p), 0)
#define STORE16(v, p) DL_STORE16((p), 0, (v))

UNARY_OP(unary_op16, float16, sign)
BINARY_OP(binary_op16, float16)

__kernel void unary_vec(__global const DL_T* x, __global DL_T* y, int n, int op) {
  const int i = get_global_id(0) * 16;
  if (i + 16 <= n) {
    STORE16(unary_op16(LOAD16(x + i), op), y + i);
  } else {
    for (int j = i; j < n; ++j) DL_STORE(y, j, unary_op(DL_LOAD(x, j), op));
  }
}

// Outer index space (rank up to 7, collapsed) times an innermost dim of
// `inner` elements; ia/ib in {0, 1} are the operands' innermost strides.
__kernel void binary_rows(__global const DL_T* a, __global const DL_T* b, __global DL_T* y,
                          int inner, int chunks, int n_items, int op, int rank, int8 dims_v,
                          int8 sa_v, int8 sb_v, int ia, int ib) {
  const int item = get_global_id(0);
  if (item >= n_items) return;
  const int row = item / chunks;
  const int c0 = (item - row * chunks) * 16;
  const int2 o = nd_offsets(row, rank, dims_v, sa_v, sb_v);
  const int oy = row * inner + c0;
  const int oa = o.x + c0 * ia;
  const int ob = o.y + c0 * ib;
  if (c0 + 16 <= inner) {
    const float16 va = ia ? LOAD16(a + oa) : (float16)(DL_LOAD(a, oa));
    const float16 vb = ib ? LOAD16(b + ob) : (float16)(DL_LOAD(b, ob));
    STORE16(binary_op16(va, vb, op), y + oy);
  } else {
    for (int j = 0; j < inner - c0; ++j) {
      DL_STORE(y, oy + j, binary_op(DL_LOAD(a, oa + j * ia), DL_LOAD(b, ob + j * ib), op));
    }
  }
}
