// difflite.LoRA on the GPU (host code: lora_opencl.cc): out = y + (x D^T) U^T over the rows m of
// x [M, K] and y, out [M, N] (channels-last tensors flattened over their leading dims), with the
// slot's factors as the op stored them: float, DT = D^T [K, R] and UT = U^T [R, N] (row-major).
// One launch adds ranks r0 .. r0 + rc - 1 (rc <= LORA_RMAX; the host launches again for more
// ranks, with out as y). A work-group takes LORA_TM rows:
//   1. t [LORA_TM, rc] = x[rows] . DT[:, r0 ..], K in slices of LORA_KC staged in local memory;
//      t is kept in local memory, in float;
//   2. out[rows, n] = y[rows, n] + t . UT[r0 .., n], N in slices of LORA_NC columns whose ranks
//      are staged LORA_JC at a time.
// x and y are read once and out written once; y and out may be one buffer (the op then adds in
// place: each element is read and written by the same work-item). Storage DL_T (float or half,
// dl_storage.cl); arithmetic in float.
// Work-group: LORA_ITEMS = 32 x LORA_WY items in one dimension, item (ty, tx) = (id / 32, id % 32)
// takes rows ty + LORA_WY i (i < 4): in step 1 ranks tx + 32 j (j < LORA_RMAX / 32), in step 2
// columns tx + 32 c (c < 4), so the 32 items of a row read 32 consecutive columns.
#include "dl_storage.cl"

#ifndef LORA_WY
#define LORA_WY 8
#endif
#ifndef LORA_RMAX
#define LORA_RMAX 64  // a multiple of 32
#endif
#define LORA_ITEMS (32 * LORA_WY)
#define LORA_TM (4 * LORA_WY)
#define LORA_KC 32
#define LORA_NC 128
#define LORA_JC 16
#define LORA_RJ (LORA_RMAX / 32)
#define LORA_STEP1 (LORA_TM * LORA_KC + LORA_KC * LORA_RMAX)
#define LORA_STEP2 (LORA_JC * LORA_NC)
#define LORA_SHARED (LORA_STEP1 > LORA_STEP2 ? LORA_STEP1 : LORA_STEP2)

// Global size: ceil(M / LORA_TM) * LORA_ITEMS. M * K, M * N, K * R and R * N below 2^31.
__kernel __attribute__((reqd_work_group_size(LORA_ITEMS, 1, 1)))
void lora(__global const DL_T* x, __global const DL_T* y, __global DL_T* out,
          __global const float* dt, __global const float* ut, int M, int K, int N, int R, int r0,
          int rc) {
  __local float ts[LORA_TM * LORA_RMAX];  // t [row][rank]
  __local float shared[LORA_SHARED];      // step 1: xs [LORA_TM][LORA_KC], ds [LORA_KC][LORA_RMAX]
  __local float* xs = shared;              //         (x and DT slices);
  __local float* ds = shared + LORA_TM * LORA_KC;
  __local float* us = shared;              // step 2: us [LORA_JC][LORA_NC] (a UT slice)
  const int lid = get_local_id(0);
  const int tx = lid & 31;
  const int ty = lid >> 5;
  const int m0 = get_group_id(0) * LORA_TM;

  // 1. t = x[rows] . DT[:, r0 .. r0 + rc); the rank groups past rc (j >= rj) are left out, and
  // ranks in [rc, 32 rj) come out 0 (their DT columns are staged as 0).
  const int rj = (rc + 31) >> 5;
  float acc1[4][LORA_RJ];
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int j = 0; j < LORA_RJ; ++j) acc1[i][j] = 0.0f;
  }
  for (int k0 = 0; k0 < K; k0 += LORA_KC) {
    for (int e = lid; e < LORA_TM * LORA_KC; e += LORA_ITEMS) {
      const int m = m0 + e / LORA_KC, k = k0 + e % LORA_KC;
      xs[e] = m < M && k < K ? DL_LOAD(x, m * K + k) : 0.0f;
    }
    for (int e = lid; e < LORA_KC * LORA_RMAX; e += LORA_ITEMS) {
      const int k = k0 + e / LORA_RMAX, j = e % LORA_RMAX;
      if (j < 32 * rj) ds[e] = j < rc && k < K ? dt[k * R + r0 + j] : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int kk = 0; kk < LORA_KC; kk += 4) {
      float4 xv[4];  // x[row i][kk .. kk + 3]: one read the 32 items of a row share
#pragma unroll
      for (int i = 0; i < 4; ++i) xv[i] = vload4(0, xs + (ty + LORA_WY * i) * LORA_KC + kk);
#pragma unroll
      for (int j = 0; j < LORA_RJ; ++j) {
        if (j >= rj) break;
        const int c = tx + 32 * j;
        const float4 dv = (float4)(ds[kk * LORA_RMAX + c], ds[(kk + 1) * LORA_RMAX + c],
                                   ds[(kk + 2) * LORA_RMAX + c], ds[(kk + 3) * LORA_RMAX + c]);
#pragma unroll
        for (int i = 0; i < 4; ++i) acc1[i][j] += dot(xv[i], dv);
      }
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
#pragma unroll
    for (int j = 0; j < LORA_RJ; ++j) ts[(ty + LORA_WY * i) * LORA_RMAX + tx + 32 * j] = acc1[i][j];
  }
  barrier(CLK_LOCAL_MEM_FENCE);

  // 2. out[rows] = y[rows] + t . UT[r0 .. r0 + rc), ranks 4 at a time (those past rc are 0 in t
  // and in the stage)
  for (int n0 = 0; n0 < N; n0 += LORA_NC) {
    float acc[4][4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[i][c] = 0.0f;
    }
    for (int j0 = 0; j0 < rc; j0 += LORA_JC) {
      for (int e = lid; e < LORA_JC * LORA_NC; e += LORA_ITEMS) {
        const int j = j0 + e / LORA_NC, n = n0 + e % LORA_NC;
        us[e] = j < rc && n < N ? ut[(r0 + j) * N + n] : 0.0f;
      }
      barrier(CLK_LOCAL_MEM_FENCE);
      const int jn = min(LORA_JC, (rc - j0 + 3) & ~3);
      for (int jj = 0; jj < jn; jj += 4) {
        float4 tv[4];  // t[row i][j0 + jj .. + 3]: one read the 32 items of a row share
#pragma unroll
        for (int i = 0; i < 4; ++i) tv[i] = vload4(0, ts + (ty + LORA_WY * i) * LORA_RMAX + j0 + jj);
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          const int col = tx + 32 * c;
          const float4 uv = (float4)(us[jj * LORA_NC + col], us[(jj + 1) * LORA_NC + col],
                                     us[(jj + 2) * LORA_NC + col], us[(jj + 3) * LORA_NC + col]);
#pragma unroll
          for (int i = 0; i < 4; ++i) acc[i][c] += dot(tv[i], uv);
        }
      }
      barrier(CLK_LOCAL_MEM_FENCE);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int m = m0 + ty + LORA_WY * i;
      if (m >= M) continue;
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        const int n = n0 + tx + 32 * c;
        if (n < N) DL_STORE(out, m * N + n, DL_LOAD(y, m * N + n) + acc[i][c]);
      }
    }
  }
}
