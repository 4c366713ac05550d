// difflite.LoRA on the GPU (host code: lora_opencl.cc): out = y + (x D^T) U^T over the rows m of
// x [M, K] and y, out [M, N] (channels-last tensors flattened over their leading dims), with the
// slot's factors as the op stored them: float, D [R, K] (as given: a rank's row along k, so the 32
// lanes of lora_down read it coalesced, as they read x) and UT = U^T [R, N] (row-major).
// Two kernels per pass of at most kRanksPerPass ranks r0 .. r0 + rc - 1 (the host launches both
// again for the next ranks, with out as y):
//   1. lora_down: t [M, ld] = x . D[r0 .. r0 + rc)^T into a float scratch (ld = rc rounded up
//      to 4; the columns rc .. ld - 1 are written 0), K split over the items of a work-group;
//   2. lora_up: out = y + t . UT[r0 .. r0 + rc), an item per (rows, 4 consecutive columns).
// y and out may be one buffer (the op then adds in place: each element is read and written by
// the same work-item). Storage DL_T (float or half, dl_storage.cl); arithmetic in float.
// M * K, M * N, M * ld, K * R and R * N below 2^31.
#include "dl_storage.cl"

#ifndef LORA_DR
#define LORA_DR 1  // lora_down: rows per item
#endif
#ifndef LORA_DS
#define LORA_DS 2  // lora_down: row slots of a work-group
#endif
#ifndef LORA_UR
#define LORA_UR 1  // lora_up: rows per item
#endif
#ifndef LORA_US
#define LORA_US 8  // lora_up: row slots of a work-group
#endif
#define LORA_KL 32  // lora_down: items along k (one warp's lanes: x read coalesced)
#define LORA_RB 32  // lora_down: ranks of a work-group (4 rank groups of 8)
#define LORA_UC 32  // lora_up: items along N (4 columns each)
#define LORA_DOWN_ITEMS (LORA_KL * 4 * LORA_DS)
#define LORA_UP_ITEMS (LORA_UC * LORA_US)

// 1. Work-group: LORA_DOWN_ITEMS items in one dimension, item (s, q, l) = (id / 128, id / 32 % 4,
// id % 32) takes k = l, l + 32, ... for the rows m0 + LORA_DR s + i (i < LORA_DR) and the 8
// ranks 32 b + 8 q .. + 7 of the pass (b = group id 1), summing in float; then the 32 lanes' sums
// are added in local memory, a row of each slot at a time, by the first 32 LORA_DS items.
// Global size: (ceil(M / (LORA_DR LORA_DS)) LORA_DOWN_ITEMS, ceil(rc / 32)).
__kernel __attribute__((reqd_work_group_size(LORA_DOWN_ITEMS, 1, 1)))
void lora_down(__global const DL_T* x, __global const float* dk, __global float* t, int M, int K,
               int R, int r0, int rc, int ld) {
  __local float red[LORA_KL * (LORA_DS * LORA_RB + 1)];  // [lane][slot, rank], padded: no conflicts
  const int lid = get_local_id(0);
  const int l = lid % LORA_KL;
  const int q = (lid / LORA_KL) % 4;
  const int s = lid / (4 * LORA_KL);
  const int m0 = get_group_id(0) * (LORA_DR * LORA_DS) + LORA_DR * s;
  const int jb = get_group_id(1) * LORA_RB;  // the group's first rank in the pass
  const int j0 = jb + 8 * q;                 // the item's
  const int nj = clamp(rc - j0, 0, 8);       // its ranks that exist
  __global const float* d = dk + (size_t)(r0 + j0) * K;  // the item's first rank's row of D
  float4 a0[LORA_DR], a1[LORA_DR];
#pragma unroll
  for (int i = 0; i < LORA_DR; ++i) a0[i] = a1[i] = (float4)(0.0f);
  int rows[LORA_DR];  // clamped: a tail slot computes a real row's sums and writes none
#pragma unroll
  for (int i = 0; i < LORA_DR; ++i) rows[i] = min(m0 + i, M - 1) * K;
  if (nj == 8) {
#pragma unroll 4
    for (int k = l; k < K; k += LORA_KL) {
      // D[j][k] for the item's 8 ranks: each read is 32 consecutive floats across the lanes
      const float4 d0 = (float4)(d[k], d[K + k], d[2 * K + k], d[3 * K + k]);
      const float4 d1 = (float4)(d[4 * K + k], d[5 * K + k], d[6 * K + k], d[7 * K + k]);
#pragma unroll
      for (int i = 0; i < LORA_DR; ++i) {
        const float xv = DL_LOAD(x, rows[i] + k);
        a0[i] += xv * d0;
        a1[i] += xv * d1;
      }
    }
  } else if (nj > 0) {
    for (int k = l; k < K; k += LORA_KL) {
      __global const float* dj = d + k;
      const float4 d0 = (float4)(dj[0], nj > 1 ? dj[K] : 0.0f, nj > 2 ? dj[2 * K] : 0.0f,
                                 nj > 3 ? dj[3 * K] : 0.0f);
      const float4 d1 = (float4)(nj > 4 ? dj[4 * K] : 0.0f, nj > 5 ? dj[5 * K] : 0.0f,
                                 nj > 6 ? dj[6 * K] : 0.0f, nj > 7 ? dj[7 * K] : 0.0f);
#pragma unroll
      for (int i = 0; i < LORA_DR; ++i) {
        const float xv = DL_LOAD(x, rows[i] + k);
        a0[i] += xv * d0;
        a1[i] += xv * d1;
      }
    }
  }
  // Sums over the lanes: row i of every slot at a time. Item o < 32 LORA_DS adds the 32 lanes'
  // values of (slot o / 32, rank o % 32).
  const int w = LORA_DS * LORA_RB + 1;
  const int o = lid;
  const int os = o / LORA_RB, oj = jb + o % LORA_RB;
#pragma unroll
  for (int i = 0; i < LORA_DR; ++i) {
    __local float* mine = red + l * w + s * LORA_RB + 8 * q;
    vstore4(a0[i], 0, mine);
    vstore4(a1[i], 0, mine + 4);
    barrier(CLK_LOCAL_MEM_FENCE);
    if (o < LORA_DS * LORA_RB) {
      float sum = 0.0f;
#pragma unroll 8
      for (int e = 0; e < LORA_KL; ++e) sum += red[e * w + o];
      const int m = get_group_id(0) * (LORA_DR * LORA_DS) + LORA_DR * os + i;
      if (m < M && oj < ld) t[m * ld + oj] = sum;  // ranks rc .. ld - 1: 0
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
}

// UT[j][n .. n + cols - 1] (cols <= 4 columns in the matrix), 0 past them.
inline float4 lora_ut4(__global const float* u, int cols) {
  if (cols >= 4) return vload4(0, u);
  return (float4)(u[0], cols > 1 ? u[1] : 0.0f, cols > 2 ? u[2] : 0.0f, 0.0f);
}

// 2. Work-group: LORA_UC x LORA_US items (2 dimensions); item (c, s) takes the columns
// n = 4 (LORA_UC group_id(0) + c) .. n + 3 of the rows LORA_UR (LORA_US group_id(1) + s) + i
// (i < LORA_UR): t's rows are read through the cache (one address per row for the whole
// group), UT as float4 along N, y read and out written once.
// Global size: (ceil(N / (4 LORA_UC)) LORA_UC, ceil(M / (LORA_UR LORA_US)) LORA_US).
__kernel __attribute__((reqd_work_group_size(LORA_UC, LORA_US, 1)))
void lora_up(__global const DL_T* y, __global DL_T* out, __global const float* t,
             __global const float* ut, int M, int N, int R, int r0, int rc, int ld) {
  const int n = 4 * get_global_id(0);
  const int m0 = LORA_UR * get_global_id(1);
  if (n >= N || m0 >= M) return;
  const int cols = min(4, N - n);
  int rows[LORA_UR];
#pragma unroll
  for (int i = 0; i < LORA_UR; ++i) rows[i] = min(m0 + i, M - 1) * ld;
  float4 acc[LORA_UR];
#pragma unroll
  for (int i = 0; i < LORA_UR; ++i) acc[i] = (float4)(0.0f);
  __global const float* u = ut + r0 * N + n;
  const int full = rc & ~3;
  for (int j = 0; j < full; j += 4) {
    const float4 u0 = lora_ut4(u + j * N, cols), u1 = lora_ut4(u + (j + 1) * N, cols);
    const float4 u2 = lora_ut4(u + (j + 2) * N, cols), u3 = lora_ut4(u + (j + 3) * N, cols);
#pragma unroll
    for (int i = 0; i < LORA_UR; ++i) {
      const float4 tv = vload4(0, t + rows[i] + j);
      acc[i] += tv.x * u0 + tv.y * u1 + tv.z * u2 + tv.w * u3;
    }
  }
  for (int j = full; j < rc; ++j) {
    const float4 u0 = lora_ut4(u + j * N, cols);
#pragma unroll
    for (int i = 0; i < LORA_UR; ++i) acc[i] += t[rows[i] + j] * u0;
  }
#pragma unroll
  for (int i = 0; i < LORA_UR; ++i) {
    const int m = m0 + i;
    if (m >= M) break;
    const int e = m * N + n;
    if (cols == 4) {
      DL_STORE4(out, e, DL_LOAD4(y, e) + acc[i]);
    } else {
      const float a[4] = {acc[i].x, acc[i].y, acc[i].z, acc[i].w};
      for (int c = 0; c < cols; ++c) DL_STORE(out, e + c, DL_LOAD(y, e + c) + a[c]);
    }
  }
}
