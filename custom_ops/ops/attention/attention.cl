// difflite.Attention on the GPU:
//   q [N, Lq, H*Dk], k [N, Lk, H*Dk], v [N, Lk, H*Dv] -> o [N, Lq, H*Dv]
//   o = per head softmax(scale * q k^T [+ causal mask: key j > query i]) v.
// The Lq x Lk score matrix is never written to memory. Two variants:
//
// (1) Partially fused softmax (any head size):
//   attn_rowstats  per query row the max m and the sum l of exp(s - m),
//                  streaming the keys in tiles (online max/sum); writes only
//                  (m, l) per row: [N, H, Lq] float2.
//   attn_output    recomputes the scores tile by tile, p = exp(s - m) / l
//                  (the softmax normalisation fused into the second matmul),
//                  and accumulates p v. Grid dimension 1 also splits Dv into
//                  chunks of AT_DVC (the scores are recomputed per chunk).
//   Work-group: AT_BQ work-items, one query row each. Local memory: a Q
//   chunk [AT_BQ][AT_DC+1] (padded: no bank conflicts), a K chunk
//   [AT_BK][AT_DC], a V chunk [AT_BK][AT_DVC] and (attn_output) the tile's
//   probabilities [AT_BQ][AT_BK+1]; Dk is streamed in chunks of AT_DC, so no
//   private array depends on the head size (scores: AT_BK registers, output
//   accumulator: AT_DVC registers).
//
// (2) FlashAttention (head sizes AT_DK, AT_DV known at build time):
//   attn_flash     one kernel: a work-group of AT_BQ work-items owns AT_BQ
//                  query rows (q row and output accumulator in registers);
//                  K/V tiles of AT_BK keys go through local memory; online
//                  softmax per chunk of AT_KC keys (running max, running sum,
//                  accumulator rescaled when the max grows); o written once.
//
// Scores are kept in base 2 (q pre-scaled by scale*log2(e), exp2), which is
// the same softmax. Storage type DL_T (float or half); math in float.
#if defined(cl_khr_fp16)
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
#endif
#ifndef DL_T
#define DL_T float
#endif
#ifndef DL_T4
#define DL_T4 float4
#endif
#ifndef AT_BQ
#define AT_BQ 64  // query rows (= work-items) per work-group
#endif
#ifndef AT_BK
#define AT_BK 32  // keys per tile
#endif
#ifndef AT_KC
#define AT_KC 8  // keys per online-softmax step (flash; divides AT_BK)
#endif
#ifndef AT_DC
#define AT_DC 32  // Dk chunk (partial softmax)
#endif
#ifndef AT_DVC
#define AT_DVC 64  // Dv chunk (partial softmax)
#endif
#define AT_LOG2E 1.4426950408889634f

// ---------------------------------------------------------------------------
// Partially fused softmax.

// Loads rows [row0, row0 + AT_BQ) x dims [d0, d0 + AT_DC) of q (pre-scaled)
// into Qs (zero outside Lq x Dk).
inline void at_load_q(__local float* Qs, __global const DL_T* qh, int qstride,
                      int rows_left, int d0, int Dk, float qscale, int lid) {
  for (int e = lid; e < AT_BQ * AT_DC; e += AT_BQ) {
    const int r = e / AT_DC;
    const int d = e - r * AT_DC;
    Qs[r * (AT_DC + 1) + d] = (r < rows_left && d0 + d < Dk)
                                  ? (float)qh[(long)r * qstride + d0 + d] * qscale
                                  : 0.0f;
  }
}

// s[u] = q_row . k_{j0+u} (scaled, base 2) for u < AT_BK, Dk streamed in
// chunks through local memory. Keys u >= jn read zeros. When q_resident, Qs
// already holds the whole (single-chunk) Q block.
inline void at_tile_scores(float* s, __local float* Qs, __local float* Ks,
                           __global const DL_T* qh, __global const DL_T* kh,
                           int qstride, int rows_left, int j0, int jn, int Dk,
                           float qscale, int q_resident, int lid) {
#pragma unroll
  for (int u = 0; u < AT_BK; ++u) s[u] = 0.0f;
  for (int d0 = 0; d0 < Dk; d0 += AT_DC) {
    barrier(CLK_LOCAL_MEM_FENCE);  // the previous users of Qs / Ks are done
    if (!q_resident) at_load_q(Qs, qh, qstride, rows_left, d0, Dk, qscale, lid);
    for (int e = lid; e < AT_BK * AT_DC; e += AT_BQ) {
      const int jj = e / AT_DC;
      const int d = e - jj * AT_DC;
      Ks[e] = (jj < jn && d0 + d < Dk) ? (float)kh[(long)(j0 + jj) * qstride + d0 + d]
                                       : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    __local const float* qrow = Qs + lid * (AT_DC + 1);
    for (int d = 0; d < AT_DC; ++d) {
      const float qd = qrow[d];
#pragma unroll
      for (int u = 0; u < AT_BK; ++u) s[u] = mad(qd, Ks[u * AT_DC + d], s[u]);
    }
  }
}

// Global (ceil(Lq / AT_BQ) * AT_BQ, H, N), local (AT_BQ, 1, 1).
// stats: [N, H, Lq] float2 (row max, row sum of exp2(s - max)).
__kernel void attn_rowstats(__global const DL_T* q, __global const DL_T* k,
                            __global float2* stats, int Lq, int Lk, int H, int Dk,
                            float scale, int causal) {
  __local float Qs[AT_BQ * (AT_DC + 1)];
  __local float Ks[AT_BK * AT_DC];
  const int lid = get_local_id(0);
  const int row0 = get_group_id(0) * AT_BQ;
  const int h = get_group_id(1);
  const int n = get_group_id(2);
  const int i = row0 + lid;
  const int qstride = H * Dk;
  const float qscale = scale * AT_LOG2E;
  __global const DL_T* qh = q + ((long)n * Lq + row0) * qstride + h * Dk;
  __global const DL_T* kh = k + (long)n * Lk * qstride + h * Dk;
  const int rows_left = Lq - row0;
  const int q_resident = Dk <= AT_DC;
  if (q_resident) at_load_q(Qs, qh, qstride, rows_left, 0, Dk, qscale, lid);
  // Causal: no row of this block sees a key past its last row.
  const int kend = causal ? min(Lk, min(Lq, row0 + AT_BQ)) : Lk;
  float m = -INFINITY, l = 0.0f;
  float s[AT_BK];
  for (int j0 = 0; j0 < kend; j0 += AT_BK) {
    const int jn = min(AT_BK, kend - j0);
    at_tile_scores(s, Qs, Ks, qh, kh, qstride, rows_left, j0, jn, Dk, qscale,
                   q_resident, lid);
    float tmax = -INFINITY;
#pragma unroll
    for (int u = 0; u < AT_BK; ++u) {
      const int ok = u < jn && (!causal || j0 + u <= i);
      s[u] = ok ? s[u] : -INFINITY;
      tmax = fmax(tmax, s[u]);
    }
    if (tmax > -INFINITY) {
      const float mnew = fmax(m, tmax);
      float sum = l * exp2(m - mnew);
#pragma unroll
      for (int u = 0; u < AT_BK; ++u) sum += exp2(s[u] - mnew);
      l = sum;
      m = mnew;
    }
  }
  if (i < Lq) stats[((long)n * H + h) * Lq + i] = (float2)(m, l);
}

// Global (ceil(Lq / AT_BQ) * AT_BQ, H * ceil(Dv / AT_DVC), N), local (AT_BQ, 1, 1).
__kernel void attn_output(__global const DL_T* q, __global const DL_T* k,
                          __global const DL_T* v, __global const float2* stats,
                          __global DL_T* o, int Lq, int Lk, int H, int Dk, int Dv,
                          float scale, int causal) {
  __local float Qs[AT_BQ * (AT_DC + 1)];
  __local float Ks[AT_BK * AT_DC];
  __local float Vs[AT_BK * AT_DVC];
  __local float Ps[AT_BQ * (AT_BK + 1)];  // each work-item's probabilities (own row)
  const int lid = get_local_id(0);
  const int row0 = get_group_id(0) * AT_BQ;
  const int chunks = (Dv + AT_DVC - 1) / AT_DVC;
  const int h = get_group_id(1) / chunks;
  const int dv0 = (get_group_id(1) - h * chunks) * AT_DVC;
  const int n = get_group_id(2);
  const int i = row0 + lid;
  const int qstride = H * Dk;
  const int vstride = H * Dv;
  const float qscale = scale * AT_LOG2E;
  __global const DL_T* qh = q + ((long)n * Lq + row0) * qstride + h * Dk;
  __global const DL_T* kh = k + (long)n * Lk * qstride + h * Dk;
  __global const DL_T* vh = v + (long)n * Lk * vstride + h * Dv + dv0;
  const int rows_left = Lq - row0;
  const int q_resident = Dk <= AT_DC;
  if (q_resident) at_load_q(Qs, qh, qstride, rows_left, 0, Dk, qscale, lid);
  const float2 st = stats[((long)n * H + h) * Lq + min(i, Lq - 1)];
  const float m = st.x;
  const float inv = st.y > 0.0f ? 1.0f / st.y : 0.0f;
  const int kend = causal ? min(Lk, min(Lq, row0 + AT_BQ)) : Lk;
  float acc[AT_DVC];
#pragma unroll
  for (int dd = 0; dd < AT_DVC; ++dd) acc[dd] = 0.0f;
  float s[AT_BK];
  for (int j0 = 0; j0 < kend; j0 += AT_BK) {
    const int jn = min(AT_BK, kend - j0);
    at_tile_scores(s, Qs, Ks, qh, kh, qstride, rows_left, j0, jn, Dk, qscale,
                   q_resident, lid);
    __local float* prow = Ps + lid * (AT_BK + 1);
#pragma unroll
    for (int u = 0; u < AT_BK; ++u) {
      const int ok = u < jn && (!causal || j0 + u <= i);
      prow[u] = ok ? exp2(s[u] - m) * inv : 0.0f;  // normalised probability
    }
    barrier(CLK_LOCAL_MEM_FENCE);  // the previous tile's readers of Vs are done
    for (int e = lid; e < AT_BK * AT_DVC; e += AT_BQ) {
      const int jj = e / AT_DVC;
      const int dd = e - jj * AT_DVC;
      Vs[e] = (jj < jn && dv0 + dd < Dv) ? (float)vh[(long)(j0 + jj) * vstride + dd]
                                         : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int u = 0; u < AT_BK; ++u) {  // not unrolled: p comes from local memory
      const float p = prow[u];
#pragma unroll
      for (int dd = 0; dd < AT_DVC; ++dd) acc[dd] = mad(p, Vs[u * AT_DVC + dd], acc[dd]);
    }
  }
  if (i < Lq) {
    __global DL_T* orow = o + ((long)n * Lq + i) * vstride + h * Dv + dv0;
#pragma unroll
    for (int dd = 0; dd < AT_DVC; ++dd) {
      if (dv0 + dd < Dv) orow[dd] = (DL_T)acc[dd];
    }
  }
}

// ---------------------------------------------------------------------------
// FlashAttention (built only when the head sizes are given).
#if defined(AT_DK) && defined(AT_DV)

// Global (ceil(Lq / AT_BQ) * AT_BQ, H, N), local (AT_BQ, 1, 1).
__kernel void attn_flash(__global const DL_T* q, __global const DL_T* k,
                         __global const DL_T* v, __global DL_T* o, int Lq, int Lk,
                         int H, float scale, int causal) {
  __local float Ks[AT_BK * AT_DK];
  __local float Vs[AT_BK * AT_DV];
  const int lid = get_local_id(0);
  const int row0 = get_group_id(0) * AT_BQ;
  const int h = get_group_id(1);
  const int n = get_group_id(2);
  const int i = row0 + lid;
  const int qstride = H * AT_DK;
  const int vstride = H * AT_DV;
  const float qscale = scale * AT_LOG2E;
  float qr[AT_DK];
  __global const DL_T* qrow = q + ((long)n * Lq + min(i, Lq - 1)) * qstride + h * AT_DK;
#pragma unroll
  for (int d = 0; d < AT_DK; ++d) qr[d] = (float)qrow[d] * qscale;
  float acc[AT_DV];
#pragma unroll
  for (int d = 0; d < AT_DV; ++d) acc[d] = 0.0f;
  float m = -INFINITY, l = 0.0f;
  __global const DL_T* kh = k + (long)n * Lk * qstride + h * AT_DK;
  __global const DL_T* vh = v + (long)n * Lk * vstride + h * AT_DV;
  const int kend = causal ? min(Lk, min(Lq, row0 + AT_BQ)) : Lk;
  for (int j0 = 0; j0 < kend; j0 += AT_BK) {
    const int jn = min(AT_BK, kend - j0);
    barrier(CLK_LOCAL_MEM_FENCE);  // the previous tile's readers are done
    for (int e = lid; e < AT_BK * AT_DK; e += AT_BQ) {
      const int jj = e / AT_DK;
      const int d = e - jj * AT_DK;
      Ks[e] = jj < jn ? (float)kh[(long)(j0 + jj) * qstride + d] : 0.0f;
    }
    for (int e = lid; e < AT_BK * AT_DV; e += AT_BQ) {
      const int jj = e / AT_DV;
      const int d = e - jj * AT_DV;
      Vs[e] = jj < jn ? (float)vh[(long)(j0 + jj) * vstride + d] : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int c0 = 0; c0 < jn; c0 += AT_KC) {
      float s[AT_KC];
      float cmax = -INFINITY;
#pragma unroll
      for (int u = 0; u < AT_KC; ++u) {
        const int jj = c0 + u;
        float dot = 0.0f;
#pragma unroll
        for (int d = 0; d < AT_DK; ++d) dot = mad(qr[d], Ks[jj * AT_DK + d], dot);
        const int ok = jj < jn && (!causal || j0 + jj <= i);
        s[u] = ok ? dot : -INFINITY;
        cmax = fmax(cmax, s[u]);
      }
      if (cmax == -INFINITY) continue;  // all masked for this row (no barrier inside)
      const float mnew = fmax(m, cmax);
      const float corr = exp2(m - mnew);  // 0 on the first visible chunk
      l *= corr;
#pragma unroll
      for (int d = 0; d < AT_DV; ++d) acc[d] *= corr;
#pragma unroll
      for (int u = 0; u < AT_KC; ++u) {
        const float p = exp2(s[u] - mnew);
        l += p;
#pragma unroll
        for (int d = 0; d < AT_DV; ++d) acc[d] = mad(p, Vs[(c0 + u) * AT_DV + d], acc[d]);
      }
      m = mnew;
    }
  }
  if (i < Lq) {
    const float inv = l > 0.0f ? 1.0f / l : 0.0f;
    __global DL_T* orow = o + ((long)n * Lq + i) * vstride + h * AT_DV;
#pragma unroll
    for (int d = 0; d < AT_DV; ++d) orow[d] = (DL_T)(acc[d] * inv);
  }
}

#endif  // AT_DK && AT_DV
