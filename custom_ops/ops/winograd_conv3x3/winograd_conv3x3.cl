// difflite.WinogradConv3x3 on the GPU: F(4x4, 3x3), 3x3 / stride 1 / pad 1
// convolution of x [N, H, W, Cin] with transformed weights u [36, Cin, Cout]
// (U = G g G^T, position 6*i + j; tests/winograd_ref.py) plus bias [Cout].
// In the filter form the op's weight is the 3x3 filter itself (OHWI, as stored:
// quantized with -DDL_WQ, dl_qweights.cl), and wino_filter writes U into
// scratch first, at every call.
//
// N * ceil(H/4) * ceil(W/4) output tiles (border tiles read zeros and are
// cropped, so H and W need not be multiples of 4), taken in bands of T tiles
// from tile t0 (winograd_conv3x3_opencl.cc: whole tile rows, V and M within a
// bound): tile t of a band is the image's tile t0 + t, and V and M hold the
// band's tiles only, from its first. The kernels here with the GEMM between
// them, two scratch tensors:
//   wino_input   V[p][t][ci] = (B^T d B)[p] of the 6x6 input tile d of tile t0 + t
//                (one work-item per (tile, ci); coalesced over ci)
//   GEMM         M[p] = V[p] (T x Cin) * U[p] (Cin x Cout) for the 36 p: not
//                here, but builtins/matmul's gemm.cl (builtin::Gemm, batched
//                over p; winograd_conv3x3_opencl.cc)
//   wino_output  y = A^T M A + bias, cropped to H x W, NHWC
//                (one work-item per (tile, co); coalesced over co)
// Storage type DL_T (float or half) for x, y, u, V and M; math in float.
#include "dl_storage.cl"
#include "dl_qweights.cl"
#if DL_WQ
#define DL_W_PTR DL_WQ_PTR
#else
#define DL_W_PTR __global const DL_T*
#define DL_WQ_PARAMS
#endif

// Row r of a 6x6 transformed tile into positions 6r .. 6r+5, `plane` elements apart.
inline void wino_store_row(__global DL_T* out, int r, long plane, float x0, float x1, float x2,
                           float x3, float x4, float x5) {
  DL_STORE(out, (6 * r + 0) * plane, x0);
  DL_STORE(out, (6 * r + 1) * plane, x1);
  DL_STORE(out, (6 * r + 2) * plane, x2);
  DL_STORE(out, (6 * r + 3) * plane, x3);
  DL_STORE(out, (6 * r + 4) * plane, x4);
  DL_STORE(out, (6 * r + 5) * plane, x5);
}

// G of F(4x4, 3x3) applied to 3 values (a column or row of the filter).
#define WINO_G(g0, g1, g2, r0, r1, r2, r3, r4, r5)              \
  do {                                                          \
    r0 = 0.25f * (g0);                                          \
    r1 = -((g0) + (g1) + (g2)) / 6.0f;                          \
    r2 = -((g0) - (g1) + (g2)) / 6.0f;                          \
    r3 = (g0) / 24.0f + (g1) / 12.0f + (g2) / 6.0f;             \
    r4 = (g0) / 24.0f - (g1) / 12.0f + (g2) / 6.0f;             \
    r5 = (g2);                                                  \
  } while (0)

// Global >= Cin * Cout (1-D), one work-item per (ci, co), co fastest so that the
// stores coalesce. w: the filter [Cout][3][3][Cin] (as [Cout][9*Cin]);
// U: [36][Cin][Cout] = G g G^T per (ci, co).
__kernel void wino_filter(DL_W_PTR w, __global DL_T* U, int Cin, int Cout, int w_base DL_WQ_PARAMS) {
  w += w_base;
  DL_WQ_AT_BASE;
  const int idx = get_global_id(0);
  if (idx >= Cin * Cout) return;
  const int ci = idx / Cout;
  const int co = idx - ci * Cout;
  const int K = 9 * Cin;
  float g[3][3];
  #pragma unroll
  for (int t = 0; t < 9; ++t) {
    const int k = t * Cin + ci;
#if DL_WQ
    const int e = co * K + k;
    g[t / 3][t % 3] = DL_WQ_FROM_RAW(DL_WQ_LOAD_RAW(w, e), e) * DL_WQ_SCALE(co, k);
#else
    g[t / 3][t % 3] = DL_LOAD(w, co * K + k);
#endif
  }
  float tmp[6][3];  // tmp = G g (columns)
  #pragma unroll
  for (int c = 0; c < 3; ++c) {
    WINO_G(g[0][c], g[1][c], g[2][c], tmp[0][c], tmp[1][c], tmp[2][c], tmp[3][c], tmp[4][c],
           tmp[5][c]);
  }
  const long plane = (long)Cin * Cout;
  __global DL_T* out = U + (long)ci * Cout + co;
  #pragma unroll
  for (int r = 0; r < 6; ++r) {  // (G g) G^T: rows
    float u0, u1, u2, u3, u4, u5;
    WINO_G(tmp[r][0], tmp[r][1], tmp[r][2], u0, u1, u2, u3, u4, u5);
    wino_store_row(out, r, plane, u0, u1, u2, u3, u4, u5);
  }
}

// B^T applied to 6 values (B^T of F(4x4, 3x3), points 0, +-1, +-2, inf).
#define WINO_BT(d0, d1, d2, d3, d4, d5, r0, r1, r2, r3, r4, r5) \
  do {                                                          \
    r0 = 4.0f * (d0) - 5.0f * (d2) + (d4);                      \
    r1 = -4.0f * ((d1) + (d2)) + (d3) + (d4);                   \
    r2 = 4.0f * ((d1) - (d2)) - (d3) + (d4);                    \
    r3 = -2.0f * ((d1) - (d3)) - (d2) + (d4);                   \
    r4 = 2.0f * ((d1) - (d3)) - (d2) + (d4);                    \
    r5 = 4.0f * (d1) - 5.0f * (d3) + (d5);                      \
  } while (0)

// A^T applied to 6 values.
#define WINO_AT(m0, m1, m2, m3, m4, m5, r0, r1, r2, r3) \
  do {                                                  \
    r0 = (m0) + (m1) + (m2) + (m3) + (m4);              \
    r1 = (m1) - (m2) + 2.0f * ((m3) - (m4));            \
    r2 = (m1) + (m2) + 4.0f * ((m3) + (m4));            \
    r3 = (m1) - (m2) + 8.0f * ((m3) - (m4)) + (m5);     \
  } while (0)

// Global >= T * Cin (1-D). V: [36][T][Cin], tiles t0 .. t0 + T - 1 of the image.
__kernel void wino_input(__global const DL_T* x, __global DL_T* V, int H, int W,
                         int Cin, int tiles_h, int tiles_w, int T, int t0) {
  const int idx = get_global_id(0);
  if (idx >= T * Cin) return;
  const int t = idx / Cin;
  const int ci = idx - t * Cin;
  const int tg = t0 + t;  // the tile in the image
  const int tx = tg % tiles_w;
  const int ty = (tg / tiles_w) % tiles_h;
  const int n = tg / (tiles_w * tiles_h);
  const int y0 = ty * 4 - 1;
  const int x0 = tx * 4 - 1;
  __global const DL_T* xn = x + (long)n * H * W * Cin + ci;
  float d[6][6];
  #pragma unroll
  for (int r = 0; r < 6; ++r) {
    const int iy = y0 + r;
    #pragma unroll
    for (int c = 0; c < 6; ++c) {
      const int ix = x0 + c;
      d[r][c] = (iy >= 0 && iy < H && ix >= 0 && ix < W)
                    ? DL_LOAD(xn, ((long)iy * W + ix) * Cin)
                    : 0.0f;
    }
  }
  float tmp[6][6];  // tmp = B^T d (columns)
  #pragma unroll
  for (int c = 0; c < 6; ++c) {
    WINO_BT(d[0][c], d[1][c], d[2][c], d[3][c], d[4][c], d[5][c], tmp[0][c],
            tmp[1][c], tmp[2][c], tmp[3][c], tmp[4][c], tmp[5][c]);
  }
  const long plane = (long)T * Cin;
  __global DL_T* out = V + (long)t * Cin + ci;
  #pragma unroll
  for (int r = 0; r < 6; ++r) {  // (B^T d) B: rows
    float v0, v1, v2, v3, v4, v5;
    WINO_BT(tmp[r][0], tmp[r][1], tmp[r][2], tmp[r][3], tmp[r][4], tmp[r][5], v0,
            v1, v2, v3, v4, v5);
    wino_store_row(out, r, plane, v0, v1, v2, v3, v4, v5);
  }
}

// Global >= T * Cout (1-D). M: [36][T][Cout], tiles t0 .. t0 + T - 1 of the
// image; y: [N, H, W, Cout].
__kernel void wino_output(__global const DL_T* M, __global const DL_T* bias,
                          __global DL_T* y, int H, int W, int Cout, int tiles_h,
                          int tiles_w, int T, int t0) {
  const int idx = get_global_id(0);
  if (idx >= T * Cout) return;
  const int t = idx / Cout;
  const int co = idx - t * Cout;
  const int tg = t0 + t;  // the tile in the image
  const int tx = tg % tiles_w;
  const int ty = (tg / tiles_w) % tiles_h;
  const int n = tg / (tiles_w * tiles_h);
  const long plane = (long)T * Cout;
  __global const DL_T* src = M + (long)t * Cout + co;
  float tmp[4][6];  // tmp = A^T m (columns)
  #pragma unroll
  for (int c = 0; c < 6; ++c) {
    const float m0 = DL_LOAD(src, (0 * 6 + c) * plane);
    const float m1 = DL_LOAD(src, (1 * 6 + c) * plane);
    const float m2 = DL_LOAD(src, (2 * 6 + c) * plane);
    const float m3 = DL_LOAD(src, (3 * 6 + c) * plane);
    const float m4 = DL_LOAD(src, (4 * 6 + c) * plane);
    const float m5 = DL_LOAD(src, (5 * 6 + c) * plane);
    WINO_AT(m0, m1, m2, m3, m4, m5, tmp[0][c], tmp[1][c], tmp[2][c], tmp[3][c]);
  }
  const float b = DL_LOAD(bias, co);
  __global DL_T* yn = y + (long)n * H * W * Cout + co;
  #pragma unroll
  for (int r = 0; r < 4; ++r) {
    const int oy = ty * 4 + r;
    if (oy >= H) break;
    float o[4];
    WINO_AT(tmp[r][0], tmp[r][1], tmp[r][2], tmp[r][3], tmp[r][4], tmp[r][5], o[0],
            o[1], o[2], o[3]);
    #pragma unroll
    for (int c = 0; c < 4; ++c) {
      const int ox = tx * 4 + c;
      if (ox < W) DL_STORE(yn, ((long)oy * W + ox) * Cout, (o[c] + b));
    }
  }
}
