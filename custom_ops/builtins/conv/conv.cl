// CONV_2D as an implicit GEMM, and DEPTHWISE_CONV_2D directly, on NHWC
// tensors with TFLite's OHWI filters.
//
// conv2d: C[m][n] = sum_k A(m,k) * W[n][k] (+ bias[n]) where m = (b, oy, ox)
// walks the output pixels, n the output channels and k = (ky, kx, ci) the
// filter taps; A(m,k) = x[b, oy*sh - pt + ky*dh, ox*sw - pl + kx*dw, ci] or 0
// outside the image (im2col without materialising it). Same tiling as
// gemm.cl: a TM x TN tile per work-group, TK-deep K slices in local memory,
// WM x WN outputs per item. Each item loads the A tile at a fixed k column
// (NT is a multiple of TK), so its rows' pixel coordinates are computed once.
// With -DDL_WQ=8|4 (dl_qweights.cl) the filter is quantized and dequantized where it is
// staged (the tiled conv2d), or read from its packed int8 copy (conv2d_rows); the scales
// follow as the last arguments.
#include "dl_storage.cl"
#include "dl_qweights.cl"
#include "gemm_tile.cl"
#if DL_WQ
#define DL_W_PTR DL_WQ_PTR
#define DL_ROWS_W_PTR __global const char*
#else
#define DL_W_PTR __global const DL_T*
#define DL_ROWS_W_PTR __global const DL_T*
#define DL_WQ_PARAMS
#endif
#define RA ((TM * TK + NT - 1) / NT)
// -DMMA=1 (with -DVEC=1): the vectorised kernel's walk with each slice multiplied on NVIDIA's
// tensor cores (common/mma_tile.cl).
#ifndef MMA
#define MMA 0
#endif

// The output pixels of the A rows this item stages (fixed over K since NT % TK == 0): the
// batch's base offset (-1: outside M) and the top-left input coordinates of the window.
inline void conv_rows(int m0, int M, int tid, int4 g0, int4 g1, int4 g2, int* a_base, int* a_y,
                      int* a_x) {
  const int ih = g0.x, iw = g0.y, cin = g0.z, oh = g0.w;
  const int ow = g1.x, sh = g1.z, sw = g1.w;
  const int pt = g2.z, pl = g2.w;
#pragma unroll
  for (int r = 0; r < RA; ++r) {
    const int mm = tid / TK + r * (NT / TK);
    const int m = m0 + mm;
    if (mm < TM && m < M) {
      const int ox = m % ow;
      const int t = m / ow;
      const int oy = t % oh;
      const int b = t / oh;
      a_base[r] = b * ih * iw * cin;
      a_y[r] = oy * sh - pt;
      a_x[r] = ox * sw - pl;
    } else {
      a_base[r] = -1;
      a_y[r] = 0;
      a_x[r] = 0;
    }
  }
}

// Column k = (ky, kx, ci) of the implicit im2col matrix, for a kw-wide filter over cin
// channels: (the tap's row offset ky * dh, its column offset kx * dw, ci).
inline int3 conv_tap(int k, int cin, int kw, int dh, int dw) {
  const int tap = k / cin;
  const int ky = tap / kw;
  return (int3)(ky * dh, (tap - ky * kw) * dw, k % cin);
}

// The offset in x of a row's patch element at `tap` (conv_rows: the row's batch base, -1
// outside M, and window corner y, x), or -1 where the tap falls outside the image.
inline int patch_offset(int base, int y, int x, int3 tap, int ih, int iw, int cin) {
  const int iy = y + tap.x;
  const int ix = x + tap.y;
  if (base < 0 || iy < 0 || iy >= ih || ix < 0 || ix >= iw) return -1;
  return base + (iy * iw + ix) * cin + tap.z;
}

// geometry: ih, iw, cin, oh, ow, kw, sh, sw, dh, dw, pt, pl (int4 x 3), unpacked by name.
#define CONV_GEOMETRY(g0, g1, g2)                                  \
  const int ih = (g0).x, iw = (g0).y, cin = (g0).z, oh = (g0).w;   \
  const int ow = (g1).x, kw = (g1).y, sh = (g1).z, sw = (g1).w;    \
  const int dh = (g2).x, dw = (g2).y, pt = (g2).z, pl = (g2).w

#if !VEC
__kernel __attribute__((reqd_work_group_size(TX, TY, 1)))
void conv2d(__global const DL_T* x, __global const DL_T* w, __global const DL_T* bias,
            __global DL_T* y, int M, int N, int K, int4 g0, int4 g1, int4 g2, int has_bias,
            int w_base) {
  w += w_base;
  __local float As[TK][TM + 1];
  __local float Bs[TK][TN + 1];
  CONV_GEOMETRY(g0, g1, g2);
  TILE_ITEM(tx, ty, tid, n0, m0);

  // The A rows this item loads: fixed over K (NT % TK == 0).
  const int a_kk = tid % TK;
  int a_base[RA], a_y[RA], a_x[RA];
  conv_rows(m0, M, tid, g0, g1, g2, a_base, a_y, a_x);

  float acc[WM][WN];
  ST_ZERO(acc);

  for (int k0 = 0; k0 < K; k0 += TK) {
    const int k = k0 + a_kk;
    const int3 tap = conv_tap(k, cin, kw, dh, dw);
#pragma unroll
    for (int r = 0; r < RA; ++r) {
      const int mm = tid / TK + r * (NT / TK);
      if (mm < TM) {
        const int o = patch_offset(a_base[r], a_y[r], a_x[r], tap, ih, iw, cin);
        As[a_kk][mm] = (o >= 0 && k < K) ? DL_LOAD(x, o) : 0.0f;
      }
    }
    for (int e = tid; e < TN * TK; e += NT) {
      const int kk = e % TK;
      const int nn = e / TK;
      const int n = n0 + nn;
      const int kb = k0 + kk;
      Bs[kk][nn] = (n < N && kb < K) ? DL_LOAD(w, n * K + kb) : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    ST_FMA_SLICE(As, Bs, tx, ty, acc);
    barrier(CLK_LOCAL_MEM_FENCE);
  }

  ST_STORE(y, N, bias, has_bias, tx, ty, m0, n0, M, N, acc);
}

#else  // VEC
// Vectorised variant (-DVEC=1), the design of gemm.cl's: an item owns the
// contiguous block rows ty*WM.., cols tx*WN.. (WM, WN multiples of 4) and
// reads its operands per k as DL_C4s from k-major tiles padded by 4 elements
// (aligned); double-buffered tiles, slice k+1 fetched into registers
// while slice k is computed, one barrier per slice.
#define LDA (TM + 4)
#define LDB (TN + 4)
#define LB ((TN * TK + NT - 1) / NT)  // filter elements staged per item
#include "vec_tile.cl"

#if DL_WQ
#define W_RAW DL_WQ_RAW
#else
#define W_RAW DL_RAW
#endif
// -DWQ_QUADS=1 (K % 4 == 0, a scale covering 4 aligned k at least): the quantized filter is
// fetched as aligned runs of 4 k, one load and one scale each, as gemm.cl stages its quantized
// B; element by element, the scale loads and int4 unpacking made the convolutions slower than
// float16 (SD 1.5 UNet on the H100, 2026-11: int8 convolutions +17%, int4 +26%).
#ifndef WQ_QUADS
#define WQ_QUADS 0
#endif
#define LB4 ((TN * TK / 4 + NT - 1) / NT)  // filter quads staged per item (WQ_QUADS)

// The fetch of slice k0 into registers, as both vectorised kernels do it: ra[RA] (the item's
// patch elements at column a_kk, raw: see dl_storage.cl's DL_RAW), and the filter's rb (raw
// integers and their scales rbs where quantized; quads along k with WQ_QUADS).
#if DL_WQ && WQ_QUADS
#define CONV_B_REGS DL_WQ_RAW4 rb[LB4]; float rbs[LB4]
#elif DL_WQ
#define CONV_B_REGS W_RAW rb[LB]; float rbs[LB]
#else
#define CONV_B_REGS W_RAW rb[LB]
#endif
#define CONV_FETCH_A                                                           \
  do {                                                                         \
    const int k = k0 + a_kk;                                                   \
    const int3 tap = conv_tap(k, cin, kw, dh, dw);                             \
    _Pragma("unroll") for (int r = 0; r < RA; ++r) {                           \
      const int o = patch_offset(a_base[r], a_y[r], a_x[r], tap, ih, iw, cin); \
      ra[r] = (o >= 0 && k < kend) ? DL_LOAD_RAW(x, o) : (DL_RAW)0;            \
    }                                                                          \
  } while (0)
#if DL_WQ && WQ_QUADS
#define CONV_FETCH_B                                                           \
  _Pragma("unroll") for (int l = 0; l < LB4; ++l) {                            \
    const int e = tid + l * NT;                                                \
    const int kk = 4 * (e % (TK / 4)), nn = e / (TK / 4);                      \
    const int n = n0 + nn, kb = k0 + kk;                                       \
    const bool in = n < N && kb < kend && e < TN * TK / 4;                     \
    rb[l] = in ? DL_WQ_LOAD4_RAW(w, n * K + kb) : (DL_WQ_RAW4)(0);             \
    rbs[l] = in ? DL_WQ_SCALE(n, kb) : 0.0f;                                   \
  }
#elif DL_WQ
#define CONV_FETCH_B                                                           \
  _Pragma("unroll") for (int l = 0; l < LB; ++l) {                             \
    const int e = tid + l * NT;                                                \
    const int kk = e % TK, nn = e / TK;                                        \
    const int n = n0 + nn, kb = k0 + kk;                                       \
    const bool in = n < N && kb < kend && nn < TN;                             \
    rb[l] = in ? DL_WQ_LOAD_RAW(w, n * K + kb) : (DL_WQ_RAW)0;                 \
    rbs[l] = in ? DL_WQ_SCALE(n, kb) : 0.0f;                                   \
  }
#else
#define CONV_FETCH_B                                                           \
  _Pragma("unroll") for (int l = 0; l < LB; ++l) {                             \
    const int e = tid + l * NT;                                                \
    const int kk = e % TK, nn = e / TK;                                        \
    const int n = n0 + nn, kb = k0 + kk;                                       \
    rb[l] = (n < N && kb < kend && nn < TN) ? DL_LOAD_RAW(w, n * K + kb) : (DL_RAW)0; \
  }
#endif

// Split-K (as in gemm.cl): work-group dimension 2 is the split (1 when the NDRange has two
// dimensions); it sums K range [kbeg, kend) into partial plane `split` of y ([M][N] each). The A
// rows this item loads are fixed over K (NT % TK == 0): conv_rows.
#define CONV_SPLIT_AND_ROWS                                           \
  const int split = get_group_id(2);                                  \
  VT_SPLIT_RANGE(K, split, (int)get_num_groups(2), kbeg, kend);       \
  const int a_kk = tid % TK;                                          \
  int a_base[RA], a_y[RA], a_x[RA];                                   \
  conv_rows(m0, M, tid, g0, g1, g2, a_base, a_y, a_x)

// Where a staged element goes, per kernel: A's patch element of row mm (at column a_kk), the
// filter's element (nn, kk) as stored (raw) or dequantized (a float), and a dequantized quad of
// 4 k; and the multiply of a staged slice.
#if MMA
// The filter is a k-major B ([N][K] rows), staged [n][k] as mma_tile.cl reads it.
#define B_KMAJOR 1
#include "mma_tile.cl"
#define CONV_PUT_A(mm, r) (*MMA_A_AT(buf, mm, a_kk) = MMA_BITS(r))
#define CONV_PUT_B_RAW(nn, kk, r) (*MMA_B_AT(buf, nn, kk) = MMA_BITS(r))
#define CONV_PUT_B(nn, kk, f) (*MMA_B_AT(buf, nn, kk) = mma_half_bits(f))
#define CONV_PUT_B4(nn, kk, q) (*(__local ushort4*)MMA_B_AT(buf, nn, kk) = mma_half_bits4(q))
#define CONV_MULTIPLY(cb) MMA_SLICE(cb)
#else
// A quad of 4 k goes down 4 rows of the k-major tile.
inline void conv_put_quad_down(__local DL_C* p, float4 q) {
  p[0] = DL_TO_C(q.x);
  p[LDB] = DL_TO_C(q.y);
  p[2 * LDB] = DL_TO_C(q.z);
  p[3 * LDB] = DL_TO_C(q.w);
}
#define CONV_PUT_A(mm, r) (as[(buf * TK + a_kk) * LDA + (mm)] = DL_TO_C(DL_FROM_RAW(r)))
#define CONV_PUT_B_RAW(nn, kk, r) (bs[(buf * TK + (kk)) * LDB + (nn)] = DL_TO_C(DL_FROM_RAW(r)))
#define CONV_PUT_B(nn, kk, f) (bs[(buf * TK + (kk)) * LDB + (nn)] = DL_TO_C(f))
#define CONV_PUT_B4(nn, kk, q) conv_put_quad_down(bs + (buf * TK + (kk)) * LDB + (nn), q)
#define CONV_MULTIPLY(cb) VT_FMA_SLICE(As, Bs, cb, acc)
#endif

#define CONV_STAGE_A                                                           \
  _Pragma("unroll") for (int r = 0; r < RA; ++r) {                             \
    const int mm = tid / TK + r * (NT / TK);                                   \
    if (mm < TM) CONV_PUT_A(mm, ra[r]);                                        \
  }
#if DL_WQ && WQ_QUADS
#define CONV_STAGE_B                                                           \
  _Pragma("unroll") for (int l = 0; l < LB4; ++l) {                            \
    const int e = tid + l * NT;                                                \
    const int kk = 4 * (e % (TK / 4)), nn = e / (TK / 4);                      \
    if (e < TN * TK / 4) CONV_PUT_B4(nn, kk, DL_WQ_FROM_RAW4(rb[l]) * rbs[l]); \
  }
#elif DL_WQ
#define CONV_STAGE_B                                                           \
  _Pragma("unroll") for (int l = 0; l < LB; ++l) {                             \
    const int e = tid + l * NT;                                                \
    const int kk = e % TK, nn = e / TK;                                        \
    const int wi = (n0 + nn) * K + k0 + kk; /* its element index: the int4 nibble */ \
    if (nn < TN) CONV_PUT_B(nn, kk, DL_WQ_FROM_RAW(rb[l], wi) * rbs[l]);       \
  }
#else
#define CONV_STAGE_B                                                           \
  _Pragma("unroll") for (int l = 0; l < LB; ++l) {                             \
    const int e = tid + l * NT;                                                \
    const int kk = e % TK, nn = e / TK;                                        \
    if (nn < TN) CONV_PUT_B_RAW(nn, kk, rb[l]);                                \
  }
#endif

// As in gemm.cl: iteration k0 fetches slice k0 into registers, multiplies slice k0 - TK from
// buffer buf ^ 1 and stages slice k0 into buffer buf; one barrier a slice.
#define CONV_SLICE_WALK                                                        \
  DL_RAW ra[RA];                                                               \
  CONV_B_REGS;                                                                 \
  int buf = 0;                                                                 \
  for (int k0 = kbeg; k0 < kend + TK; k0 += TK) {                              \
    if (k0 < kend) {                                                           \
      CONV_FETCH_A;                                                            \
      CONV_FETCH_B;                                                            \
    }                                                                          \
    if (k0 > kbeg) {                                                           \
      CONV_MULTIPLY(buf ^ 1);                                                  \
    }                                                                          \
    if (k0 < kend) {                                                           \
      CONV_STAGE_A;                                                            \
      CONV_STAGE_B;                                                            \
      barrier(CLK_LOCAL_MEM_FENCE);                                            \
      buf ^= 1;                                                                \
    }                                                                          \
  }

#if MMA
__kernel __attribute__((reqd_work_group_size(TX, TY, 1)))
void conv2d(__global const DL_T* x, DL_W_PTR w, __global const DL_T* bias,
            __global DL_T* y, int M, int N, int K, int4 g0, int4 g1, int4 g2,
            int has_bias, int w_base DL_WQ_PARAMS) {
  w += w_base;
  DL_WQ_AT_BASE;
  MMA_TILE_LOCALS;
  CONV_GEOMETRY(g0, g1, g2);
  TILE_ITEM(tx, ty, tid, n0, m0);
  MMA_ITEM_AND_ACC(tid);
  CONV_SPLIT_AND_ROWS;
  CONV_SLICE_WALK
  const int vec_c = (N & 1) == 0;  // rows of N elements: 2-vector stores where N is even
  MMA_STORE_TILE(y + split * M * N, N, vec_c);
}
#else  // MMA
__kernel __attribute__((reqd_work_group_size(TX, TY, 1)))
void conv2d(__global const DL_T* x, DL_W_PTR w, __global const DL_T* bias,
            __global DL_T* y, int M, int N, int K, int4 g0, int4 g1, int4 g2,
            int has_bias, int w_base DL_WQ_PARAMS) {
  w += w_base;
  DL_WQ_AT_BASE;
  __local DL_C4 As[2][TK][LDA / 4];
  __local DL_C4 Bs[2][TK][LDB / 4];
  __local DL_C* as = (__local DL_C*)As;
  __local DL_C* bs = (__local DL_C*)Bs;
  CONV_GEOMETRY(g0, g1, g2);
  TILE_ITEM(tx, ty, tid, n0, m0);
  CONV_SPLIT_AND_ROWS;
  float4 acc[WM][WN / 4];
  VT_ZERO(acc);
  CONV_SLICE_WALK
  const bool vec_c = (N & 3) == 0;  // with n % 4 == 0: 16-byte aligned rows
  VT_STORE(acc, bias, has_bias, M, N, vec_c, y + (split * M + m) * N);
}
#endif  // MMA
#endif  // VEC

// DEPTHWISE_CONV_2D: one item per output element; filter [1, KH, KW, C*mult],
// output channel oc reads input channel oc / mult.
// geometry as conv2d plus g3 = (kh, mult, oc, 0).
__kernel void depthwise_conv2d(__global const DL_T* x, __global const DL_T* w,
                               __global const DL_T* bias, __global DL_T* y, int n, int4 g0,
                               int4 g1, int4 g2, int4 g3, int has_bias) {
  const int i = get_global_id(0);
  if (i >= n) return;
  CONV_GEOMETRY(g0, g1, g2);
  const int kh = g3.x, mult = g3.y, oc_count = g3.z;
  const int oc = i % oc_count;
  int t = i / oc_count;
  const int ox = t % ow;
  t /= ow;
  const int oy = t % oh;
  const int b = t / oh;
  const int ci = oc / mult;
  float acc = has_bias ? DL_LOAD(bias, oc) : 0.0f;
  for (int ky = 0; ky < kh; ++ky) {
    const int iy = oy * sh - pt + ky * dh;
    if (iy < 0 || iy >= ih) continue;
    for (int kx = 0; kx < kw; ++kx) {
      const int ix = ox * sw - pl + kx * dw;
      if (ix < 0 || ix >= iw) continue;
      acc = fma(DL_LOAD(x, ((b * ih + iy) * iw + ix) * cin + ci),
                DL_LOAD(w, (ky * kw + kx) * oc_count + oc), acc);
    }
  }
  DL_STORE(y, i, acc);
}

// conv2d for CPU-like devices (no local memory, no barriers, explicit
// vectors): an item owns 16 consecutive output channels (one float16
// lane each) and RM consecutive output pixels. `wt` is the filter repacked as
// [K][NP] with NP = N rounded up to 16 (zero lanes past N), so each tap is one
// vload16; each input value is loaded once and broadcast.
#ifndef RM
#define RM 8
#endif
__kernel void conv2d_rows(__global const DL_T* x, DL_ROWS_W_PTR wt,
                          __global const DL_T* bias, __global DL_T* y, int M, int N, int K,
                          int4 g0, int4 g1, int4 g2, int has_bias, int w_base DL_WQ_PARAMS) {
  wt += w_base;
  DL_WQ_AT_BASE;
  const int n0 = get_global_id(0) * 16;
  const int m0 = get_global_id(1) * RM;
  if (n0 >= N) return;
  const int np = (N + 15) & ~15;
  CONV_GEOMETRY(g0, g1, g2);
  const int kh = K / (kw * cin);
  int base[RM], y0[RM], x0[RM];
  float16 acc[RM];
  float16 b0 = (float16)(0.0f);
  if (has_bias) {
    float bv[16];
    for (int j = 0; j < 16; ++j) bv[j] = n0 + j < N ? DL_LOAD(bias, n0 + j) : 0.0f;
    b0 = vload16(0, bv);
  }
  for (int r = 0; r < RM; ++r) {
    const int m = min(m0 + r, M - 1);  // clamped rows are computed, not stored
    acc[r] = b0;
    const int ox = m % ow;
    const int t = m / ow;
    const int oy = t % oh;
    base[r] = (t / oh) * ih * iw * cin;
    y0[r] = oy * sh - pt;
    x0[r] = ox * sw - pl;
  }
#if DL_WQ
  int block = -1;
  float16 wscale = (float16)(0.0f);
#endif
  for (int ky = 0; ky < kh; ++ky) {
    for (int kx = 0; kx < kw; ++kx) {
      const int k0 = (ky * kw + kx) * cin;
      DL_ROWS_W_PTR wk = wt + (size_t)k0 * np + n0;
      // Rows outside the image read a valid pixel and multiply it by 0.
      int off[RM];
      float keep[RM];
      for (int r = 0; r < RM; ++r) {
        const int iy = y0[r] + ky * dh;
        const int ix = x0[r] + kx * dw;
        const bool in = iy >= 0 && iy < ih && ix >= 0 && ix < iw;
        off[r] = in ? base[r] + (iy * iw + ix) * cin : 0;
        keep[r] = in ? 1.0f : 0.0f;
      }
      for (int ci = 0; ci < cin; ++ci) {
#if DL_WQ
        if (((k0 + ci) >> wq_shift) != block) {
          block = (k0 + ci) >> wq_shift;
          wscale = vload16(0, wq_scale + (size_t)block * wq_kg + n0);
        }
        const float16 w = convert_float16(vload16(0, wk + (size_t)ci * np)) * wscale;
#else
        const float16 w = DL_LOAD16(wk, (size_t)ci * np);
#endif
#pragma unroll
        for (int r = 0; r < RM; ++r) {
          acc[r] = fma((float16)(DL_LOAD(x, off[r] + ci) * keep[r]), w, acc[r]);
        }
      }
    }
  }
  for (int r = 0; r < RM; ++r) {
    const int m = m0 + r;
    if (m >= M) break;
    __global DL_T* yp = y + (size_t)m * N + n0;
    if (n0 + 16 <= N) {
      DL_STORE16(yp, 0, acc[r]);
    } else {
      float av[16];
      vstore16(acc[r], 0, av);
      for (int j = 0; j < N - n0; ++j) DL_STORE(yp, j, av[j]);
    }
  }
}

// conv2d for GPUs when the output has few channels (N = NW_N <= 8, e.g. the VAE's last
// convolution, N = 3): the implicit GEMM's tiles are 16-64 channels wide, so most of their
// multiply-adds and staging would be padding. Here NW_L lanes (local dimension 0, neighbours in
// a warp / wave) share NW_PX consecutive output pixels of one row and all NW_N channels: lane l
// takes the runs of 4 input channels l, l + NW_L, ... of each filter tap, so the lanes' loads of
// one pixel's channels (NHWC) are contiguous; a lane per pixel instead reads 8-16 bytes of a
// different cache line each, which bounded it at 4 TFLOP/s on the H200. For each run a lane
// loads one float4 of x per pixel and one float4 of each output channel's filter row (OHWI: the
// filter is contiguous along Cin, read in place through the cache; every pixel group reads the
// same filter elements) and keeps a float4 of partial sums per (pixel, channel); at the end the
// lanes' sums are added through local memory. Arithmetic in float (also with DL_FP16_MATH:
// K = KH*KW*Cin can be long). NW_ALIGNED=1 (Cin % 4 == 0): every run starts on a multiple of
// 4, one aligned load each. Taps outside the image add nothing.
// geometry as conv2d; g3 = (kh, pixel groups per output row, pixel groups); local size
// (NW_L, NW_G).
#ifndef NW_N
#define NW_N 4
#endif
#ifndef NW_PX
#define NW_PX 4
#endif
#ifndef NW_L
#define NW_L 8
#endif
#ifndef NW_G
#define NW_G 8
#endif
#ifndef NW_ALIGNED
#define NW_ALIGNED 0
#endif
#if NW_ALIGNED
#define NW_LOAD4(p, i) DL_LOAD4A(p, i)
#else
#define NW_LOAD4(p, i) DL_LOAD4(p, i)
#endif
#define NW_OUT (NW_PX * NW_N)  // a pixel group's outputs
__kernel __attribute__((reqd_work_group_size(NW_L, NW_G, 1)))
void conv2d_narrow(__global const DL_T* x, __global const DL_T* w, __global const DL_T* bias,
                   __global DL_T* y, int4 g0, int4 g1, int4 g2, int4 g3, int has_bias) {
  __local float sums[NW_G][NW_L][NW_OUT + 1];
  const int lane = get_local_id(0), lg = get_local_id(1);
  const int i = get_global_id(1);  // the pixel group; past the last one: computes nothing
  CONV_GEOMETRY(g0, g1, g2);
  const int kh = g3.x, row_items = g3.y;
  const bool live = i < g3.z;
  const int K = kh * kw * cin;
  const int ox0 = (i % row_items) * NW_PX;
  const int t = i / row_items;
  const int oy = t % oh;
  const int b = t / oh;
  float4 acc[NW_PX][NW_N];
#pragma unroll
  for (int p = 0; p < NW_PX; ++p) {
#pragma unroll
    for (int c = 0; c < NW_N; ++c) acc[p][c] = (float4)(0.0f);
  }
  for (int ky = 0; ky < kh; ++ky) {
    const int iy = oy * sh - pt + ky * dh;
    if (!live || iy < 0 || iy >= ih) continue;
    const int row = (b * ih + iy) * iw;
    for (int kx = 0; kx < kw; ++kx) {
      // each pixel's input offset at this tap; -1 outside the image or past the row's end
      int off[NW_PX];
#pragma unroll
      for (int p = 0; p < NW_PX; ++p) {
        const int ix = (ox0 + p) * sw - pl + kx * dw;
        off[p] = (ox0 + p < ow && ix >= 0 && ix < iw) ? (row + ix) * cin : -1;
      }
      const int wk = (ky * kw + kx) * cin;  // the tap's start in a filter row
      for (int ci = 4 * lane; ci + 4 <= cin; ci += 4 * NW_L) {
        float4 xv[NW_PX];
#pragma unroll
        for (int p = 0; p < NW_PX; ++p) {
          xv[p] = off[p] >= 0 ? NW_LOAD4(x, off[p] + ci) : (float4)(0.0f);
        }
#pragma unroll
        for (int c = 0; c < NW_N; ++c) {
          const float4 wv = NW_LOAD4(w, c * K + wk + ci);
#pragma unroll
          for (int p = 0; p < NW_PX; ++p) acc[p][c] = fma(xv[p], wv, acc[p][c]);
        }
      }
      for (int ci = (cin & ~3) + lane; ci < cin; ci += NW_L) {  // Cin % 4 trailing channels
        float xs[NW_PX];
#pragma unroll
        for (int p = 0; p < NW_PX; ++p) xs[p] = off[p] >= 0 ? DL_LOAD(x, off[p] + ci) : 0.0f;
#pragma unroll
        for (int c = 0; c < NW_N; ++c) {
          const float ws = DL_LOAD(w, c * K + wk + ci);
#pragma unroll
          for (int p = 0; p < NW_PX; ++p) acc[p][c].x = fma(xs[p], ws, acc[p][c].x);
        }
      }
    }
  }
#pragma unroll
  for (int p = 0; p < NW_PX; ++p) {
#pragma unroll
    for (int c = 0; c < NW_N; ++c) {
      const float4 a = acc[p][c];
      sums[lg][lane][p * NW_N + c] = (a.x + a.y) + (a.z + a.w);
    }
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  if (!live) return;
  // output j = p * NW_N + c of the group: y's element m0 * NW_N + j (consecutive lanes store
  // consecutive elements)
  const int m0 = (b * oh + oy) * ow + ox0;
  const int outs = min(NW_PX, ow - ox0) * NW_N;
  for (int j = lane; j < outs; j += NW_L) {
    float v = has_bias ? DL_LOAD(bias, j % NW_N) : 0.0f;
    for (int l = 0; l < NW_L; ++l) v += sums[lg][l][j];
    DL_STORE(y, m0 * NW_N + j, v);
  }
}
