// difflite.Attention on the GPU:
//   q [N, Lq, H*Dk], k [N, Lk, H*Dk], v [N, Lk, H*Dv] -> o [N, Lq, H*Dv]
//   o = per head softmax(scale * q k^T [+ causal mask: key j > query i]) v.
// The Lq x Lk score matrix is never written to memory. Three variants:
//
// (1) Partially fused softmax (any head size):
//   attn_rowstats  per query row the max m and the sum l of exp(s - m),
//                  streaming the keys in tiles (online max/sum); writes only
//                  (m, l) per row: [N, H, Lq] float2.
//   attn_output    recomputes the scores tile by tile, p = exp(s - m) / l
//                  (the softmax normalisation fused into the second matmul),
//                  and accumulates p v. Grid dimension 1 also splits Dv into
//                  chunks of AT_DVC (the scores are recomputed per chunk).
//   Work-group: AT_BQ / AT_RQ work-items owning AT_BQ query rows, AT_RQ each
//   (rows lid, lid + AT_WG, ...: each K/V value read from local memory feeds
//   AT_RQ rows). Local memory holds float4s along the head dimension (a chunk
//   of AT_DC dims is AT_DC4 float4s, zero padded past AT_DC): a Q chunk
//   [AT_BQ][AT_DC4 + 1] (padded row: no bank conflicts), a K chunk
//   [AT_BK][AT_DC4], a V chunk [AT_BK][AT_DVC4] and (attn_output) the tile's
//   probabilities [AT_BQ][AT_BK + 1] floats; one float4 read feeds 4 * AT_RQ
//   multiply-adds. Dk is streamed in chunks of AT_DC, so no private array
//   depends on the head size (scores: AT_RQ * AT_BK registers, output
//   accumulator: AT_RQ * AT_DVC4 float4s).
//
// (2) FlashAttention (head sizes AT_DK, AT_DV known at build time):
//   attn_flash     one kernel: a work-group of AT_BQ / AT_RQ work-items owns
//                  AT_BQ query rows, AT_RQ per work-item (q rows and output
//                  accumulators in registers as float4s); K/V tiles of AT_BK
//                  keys go through local memory as float4s along the head
//                  dimension (AT_DK4 / AT_DV4 per key, zero padded); online
//                  softmax per chunk of AT_KC keys (running max, running sum,
//                  accumulator rescaled when the max grows); o written once.
//   Split keys (AT_SPLIT = 2 or 4, flash-decoding style): grid dimension 1 is
//                  H * AT_SPLIT (h * AT_SPLIT + split); a work-group sees only
//                  keys [split * Lk / AT_SPLIT, (split + 1) * Lk / AT_SPLIT),
//                  so a launch with too few work-groups to fill the GPU gets
//                  AT_SPLIT times as many. `o` is then a scratch buffer: each
//                  row's (m, l) as float [AT_SPLIT][N*Lq*H][2] (base-2 max,
//                  sum of exp2(s - m); l = 0 for a split that saw no key),
//                  then the self-normalised partial rows in the storage type
//                  [AT_SPLIT][N*Lq*H][AT_DV].
//   attn_merge     (built with AT_SPLIT) combines them per (n, row, head):
//                  w_s = exp2(m_s - M) * l_s, o = sum_s w_s o_s / sum_s w_s.
//
// (3) FlashAttention-2 tiled per work-group, for wide heads (AT_DK, AT_DV and
//     the work-group size AT_NT given at build time):
//   attn_wide      a work-group of AT_NT work-items owns AT_BQ query rows and
//                  loops over blocks of AT_BK keys: the AT_BQ x AT_BK score
//                  tile is computed cooperatively (Q and K staged through
//                  local memory in chunks of AT_DC dims, each work-item an
//                  AT_SR x AT_SC sub-tile) into local memory; one work-item
//                  per row does the online softmax update (running max and
//                  sum in local memory); then O += P V with V staged in chunks
//                  of AT_VK keys, each work-item owning AT_OR rows x AT_OC
//                  float4 columns of the AT_BQ x AT_DV accumulator in
//                  registers (rescaled when a row's max grows). Each staged
//                  chunk is fetched into registers while the previous one
//                  is in use (a work-group per compute unit cannot hide the
//                  loads' latency otherwise). No private array grows with
//                  Dk, and Dv only through AT_OC.
//
// Launch: global (ceil(Lq / AT_BQ) * AT_WG, ...), local (AT_WG, 1, 1) with
// AT_WG = AT_BQ / AT_RQ (AT_RQ defaults to 1: one row per work-item);
// attn_wide: global (ceil(Lq / AT_BQ) * AT_NT, H, N), local (AT_NT, 1, 1).
// Split attn_flash: global (ceil(Lq / AT_BQ) * AT_WG, H * AT_SPLIT, N), then
// attn_merge: global (N * Lq * H * ceil(AT_DV / 4), rounded up), any local.
// Scores are kept in base 2 (q pre-scaled by scale*log2(e), exp2), which is
// the same softmax. Storage type DL_T (float or half); math in float, except
// the products of attn_flash, attn_rowstats and attn_output with DL_FP16_MATH:
// q, K and V tiles in half, dot products and p.v summed in half over a chunk
// (AT_KC keys, AT_DC dims, AT_BK keys), then carried in float.
#include "dl_storage.cl"
#ifndef AT_BQ
#define AT_BQ 64  // query rows per work-group
#endif
#ifndef AT_RQ
#define AT_RQ 1  // query rows per work-item (divides AT_BQ)
#endif
#ifndef AT_BK
#define AT_BK 32  // keys per tile
#endif
#ifndef AT_KC
#define AT_KC 8  // keys per online-softmax step (flash; divides AT_BK)
#endif
#ifndef AT_DC
#define AT_DC 32  // Dk chunk (partial softmax, wide)
#endif
#ifndef AT_DVC
#define AT_DVC 64  // Dv chunk (partial softmax)
#endif
#if AT_BQ % AT_RQ != 0
#error "AT_RQ must divide AT_BQ"
#endif
#define AT_WG (AT_BQ / AT_RQ)  // work-items per work-group
#define AT_DC4 ((AT_DC + 3) / 4)
#define AT_DVC4 ((AT_DVC + 3) / 4)
#define AT_LOG2E 1.4426950408889634f

// p[d .. d + 3] as float4, zero at and past n (never read there).
inline float4 at_ld4(__global const DL_T* p, int d, int n) {
  if (d + 4 <= n) return DL_LOAD4(p, d);
  return (float4)(d < n ? DL_LOAD(p, d) : 0.0f, d + 1 < n ? DL_LOAD(p, d + 1) : 0.0f,
                  d + 2 < n ? DL_LOAD(p, d + 2) : 0.0f, 0.0f);
}

// s + a . b, as 4 multiply-adds.
inline float at_dot4(float4 a, float4 b, float s) {
  return mad(a.w, b.w, mad(a.z, b.z, mad(a.y, b.y, mad(a.x, b.x, s))));
}
#ifdef DL_FP16_MATH
// dot(a, b) of half4, spelled out: PoCL's CUDA kernel library (6.0) has no half dot.
inline half at_hdot4(half4 a, half4 b) { return a.x * b.x + a.y * b.y + a.z * b.z + a.w * b.w; }
#endif

// ---------------------------------------------------------------------------
// Partially fused softmax.

// Offset of the first element of head h (head size d) at row `row` of sample
// n in a [N, L, H * d] tensor.
inline long at_head_offset(int n, int L, int row, int H, int d, int h) {
  return ((long)n * L + row) * H * d + (long)h * d;
}

// Loads rows [row0, row0 + AT_BQ) x dims [d0, d0 + AT_DC) of q (pre-scaled)
// into Qs as float4s (zero outside Lq x Dk and past the chunk).
inline void at_load_q(__local DL_C4* Qs, __global const DL_T* qh, int qstride,
                      int rows_left, int d0, int Dk, float qscale, int lid) {
  const int dend = min(AT_DC, Dk - d0);  // dims of this chunk
  for (int e = lid; e < AT_BQ * AT_DC4; e += AT_WG) {
    const int r = e / AT_DC4;
    const int d4 = e - r * AT_DC4;
    Qs[r * (AT_DC4 + 1) + d4] = DL_TO_C4(
        r < rows_left ? at_ld4(qh + (long)r * qstride + d0, 4 * d4, dend) * qscale
                      : (float4)(0.0f));
  }
}

// s[r][u] = q_row(r) . k_{j0+u} (scaled, base 2) for u < AT_BK and the
// work-item's rows r < AT_RQ (local rows lid + r * AT_WG), Dk streamed in
// chunks through local memory. Keys u >= jn read zeros. When q_resident, Qs
// already holds the whole (single-chunk) Q block.
inline void at_tile_scores(float s[AT_RQ][AT_BK], __local DL_C4* Qs, __local DL_C4* Ks,
                           __global const DL_T* qh, __global const DL_T* kh,
                           int qstride, int rows_left, int j0, int jn, int Dk,
                           float qscale, int q_resident, int lid) {
#pragma unroll
  for (int r = 0; r < AT_RQ; ++r) {
#pragma unroll
    for (int u = 0; u < AT_BK; ++u) s[r][u] = 0.0f;
  }
  for (int d0 = 0; d0 < Dk; d0 += AT_DC) {
    barrier(CLK_LOCAL_MEM_FENCE);  // the previous users of Qs / Ks are done
    if (!q_resident) at_load_q(Qs, qh, qstride, rows_left, d0, Dk, qscale, lid);
    const int dend = min(AT_DC, Dk - d0);
    for (int e = lid; e < AT_BK * AT_DC4; e += AT_WG) {
      const int jj = e / AT_DC4;
      const int d4 = e - jj * AT_DC4;
      Ks[e] = DL_TO_C4(jj < jn ? at_ld4(kh + (long)(j0 + jj) * qstride + d0, 4 * d4, dend)
                               : (float4)(0.0f));
    }
    barrier(CLK_LOCAL_MEM_FENCE);
#ifdef DL_FP16_MATH
    // The chunk's AT_DC products of each score are summed in half, then
    // added to the float score.
    half sc[AT_RQ][AT_BK];
#pragma unroll
    for (int r = 0; r < AT_RQ; ++r) {
#pragma unroll
      for (int u = 0; u < AT_BK; ++u) sc[r][u] = 0.0h;
    }
#endif
    for (int d4 = 0; d4 < AT_DC4; ++d4) {
      DL_C4 qd[AT_RQ];
#pragma unroll
      for (int r = 0; r < AT_RQ; ++r) qd[r] = Qs[(lid + r * AT_WG) * (AT_DC4 + 1) + d4];
#pragma unroll
      for (int u = 0; u < AT_BK; ++u) {
        const DL_C4 kd = Ks[u * AT_DC4 + d4];
#pragma unroll
        for (int r = 0; r < AT_RQ; ++r) {
#ifdef DL_FP16_MATH
          sc[r][u] = at_hdot4(qd[r], kd) + sc[r][u];
#else
          s[r][u] = at_dot4(qd[r], kd, s[r][u]);
#endif
        }
      }
    }
#ifdef DL_FP16_MATH
#pragma unroll
    for (int r = 0; r < AT_RQ; ++r) {
#pragma unroll
      for (int u = 0; u < AT_BK; ++u) s[r][u] += (float)sc[r][u];
    }
#endif
  }
}

// Global (ceil(Lq / AT_BQ) * AT_WG, H, N), local (AT_WG, 1, 1).
// stats: [N, H, Lq] float2 (row max, row sum of exp2(s - max)).
__kernel void attn_rowstats(__global const DL_T* q, __global const DL_T* k,
                            __global float2* stats, int Lq, int Lk, int H, int Dk,
                            float scale, int causal) {
  __local DL_C4 Qs[AT_BQ * (AT_DC4 + 1)];
  __local DL_C4 Ks[AT_BK * AT_DC4];
  const int lid = get_local_id(0);
  const int row0 = get_group_id(0) * AT_BQ;
  const int h = get_group_id(1);
  const int n = get_group_id(2);
  const int qstride = H * Dk;
  const float qscale = scale * AT_LOG2E;
  __global const DL_T* qh = q + at_head_offset(n, Lq, row0, H, Dk, h);
  __global const DL_T* kh = k + at_head_offset(n, Lk, 0, H, Dk, h);
  const int rows_left = Lq - row0;
  const int q_resident = Dk <= AT_DC;
  if (q_resident) at_load_q(Qs, qh, qstride, rows_left, 0, Dk, qscale, lid);
  // Causal: no row of this block sees a key past its last row.
  const int kend = causal ? min(Lk, min(Lq, row0 + AT_BQ)) : Lk;
  float m[AT_RQ], l[AT_RQ];
#pragma unroll
  for (int r = 0; r < AT_RQ; ++r) {
    m[r] = -INFINITY;
    l[r] = 0.0f;
  }
  float s[AT_RQ][AT_BK];
  for (int j0 = 0; j0 < kend; j0 += AT_BK) {
    const int jn = min(AT_BK, kend - j0);
    at_tile_scores(s, Qs, Ks, qh, kh, qstride, rows_left, j0, jn, Dk, qscale,
                   q_resident, lid);
#pragma unroll
    for (int r = 0; r < AT_RQ; ++r) {
      const int i = row0 + lid + r * AT_WG;
      float tmax = -INFINITY;
#pragma unroll
      for (int u = 0; u < AT_BK; ++u) {
        const int ok = u < jn && (!causal || j0 + u <= i);
        s[r][u] = ok ? s[r][u] : -INFINITY;
        tmax = fmax(tmax, s[r][u]);
      }
      if (tmax > -INFINITY) {
        const float mnew = fmax(m[r], tmax);
        float sum = l[r] * exp2(m[r] - mnew);
#pragma unroll
        for (int u = 0; u < AT_BK; ++u) sum += exp2(s[r][u] - mnew);
        l[r] = sum;
        m[r] = mnew;
      }
    }
  }
#pragma unroll
  for (int r = 0; r < AT_RQ; ++r) {
    const int i = row0 + lid + r * AT_WG;
    if (i < Lq) stats[((long)n * H + h) * Lq + i] = (float2)(m[r], l[r]);
  }
}

// sum[r] += the tile's probabilities (own rows of Ps) times its V rows, in
// DL_C4; the key loop is not unrolled: p comes from local memory.
#define AT_TILE_PV(Ps, Vs, lid, sum)                                                         \
  for (int u_ = 0; u_ < AT_BK; ++u_) {                                                   \
    DL_C p_[AT_RQ];                                                                      \
    _Pragma("unroll") for (int r_ = 0; r_ < AT_RQ; ++r_) {                               \
      p_[r_] = DL_TO_C(Ps[((lid) + r_ * AT_WG) * (AT_BK + 1) + u_]);                     \
    }                                                                                    \
    _Pragma("unroll") for (int d4_ = 0; d4_ < AT_DVC4; ++d4_) {                          \
      const DL_C4 vd_ = Vs[u_ * AT_DVC4 + d4_];                                          \
      _Pragma("unroll") for (int r_ = 0; r_ < AT_RQ; ++r_) {                             \
        sum[r_][d4_] = mad((DL_C4)(p_[r_]), vd_, sum[r_][d4_]);                          \
      }                                                                                  \
    }                                                                                    \
  }

// Global (ceil(Lq / AT_BQ) * AT_WG, H * ceil(Dv / AT_DVC), N), local (AT_WG, 1, 1).
__kernel void attn_output(__global const DL_T* q, __global const DL_T* k,
                          __global const DL_T* v, __global const float2* stats,
                          __global DL_T* o, int Lq, int Lk, int H, int Dk, int Dv,
                          float scale, int causal) {
  __local DL_C4 Qs[AT_BQ * (AT_DC4 + 1)];
  __local DL_C4 Ks[AT_BK * AT_DC4];
  __local DL_C4 Vs[AT_BK * AT_DVC4];
  __local float Ps[AT_BQ * (AT_BK + 1)];  // each row's probabilities (own rows)
  const int lid = get_local_id(0);
  const int row0 = get_group_id(0) * AT_BQ;
  const int chunks = (Dv + AT_DVC - 1) / AT_DVC;
  const int h = get_group_id(1) / chunks;
  const int dv0 = (get_group_id(1) - h * chunks) * AT_DVC;
  const int dvend = min(AT_DVC, Dv - dv0);  // columns of this chunk
  const int n = get_group_id(2);
  const int qstride = H * Dk;
  const int vstride = H * Dv;
  const float qscale = scale * AT_LOG2E;
  __global const DL_T* qh = q + at_head_offset(n, Lq, row0, H, Dk, h);
  __global const DL_T* kh = k + at_head_offset(n, Lk, 0, H, Dk, h);
  __global const DL_T* vh = v + at_head_offset(n, Lk, 0, H, Dv, h) + dv0;
  const int rows_left = Lq - row0;
  const int q_resident = Dk <= AT_DC;
  if (q_resident) at_load_q(Qs, qh, qstride, rows_left, 0, Dk, qscale, lid);
  float m[AT_RQ], inv[AT_RQ];
#pragma unroll
  for (int r = 0; r < AT_RQ; ++r) {
    const float2 st = stats[((long)n * H + h) * Lq + min(row0 + lid + r * AT_WG, Lq - 1)];
    m[r] = st.x;
    inv[r] = st.y > 0.0f ? 1.0f / st.y : 0.0f;
  }
  const int kend = causal ? min(Lk, min(Lq, row0 + AT_BQ)) : Lk;
  float4 acc[AT_RQ][AT_DVC4];
#pragma unroll
  for (int r = 0; r < AT_RQ; ++r) {
#pragma unroll
    for (int d4 = 0; d4 < AT_DVC4; ++d4) acc[r][d4] = (float4)(0.0f);
  }
  float s[AT_RQ][AT_BK];
  for (int j0 = 0; j0 < kend; j0 += AT_BK) {
    const int jn = min(AT_BK, kend - j0);
    at_tile_scores(s, Qs, Ks, qh, kh, qstride, rows_left, j0, jn, Dk, qscale,
                   q_resident, lid);
#pragma unroll
    for (int r = 0; r < AT_RQ; ++r) {
      const int i = row0 + lid + r * AT_WG;
      __local float* prow = Ps + (lid + r * AT_WG) * (AT_BK + 1);
#pragma unroll
      for (int u = 0; u < AT_BK; ++u) {
        const int ok = u < jn && (!causal || j0 + u <= i);
        prow[u] = ok ? exp2(s[r][u] - m[r]) * inv[r] : 0.0f;  // normalised probability
      }
    }
    barrier(CLK_LOCAL_MEM_FENCE);  // the previous tile's readers of Vs are done
    for (int e = lid; e < AT_BK * AT_DVC4; e += AT_WG) {
      const int jj = e / AT_DVC4;
      const int d4 = e - jj * AT_DVC4;
      Vs[e] = DL_TO_C4(jj < jn ? at_ld4(vh + (long)(j0 + jj) * vstride, 4 * d4, dvend)
                               : (float4)(0.0f));
    }
    barrier(CLK_LOCAL_MEM_FENCE);
#ifdef DL_FP16_MATH
    // The tile's AT_BK products p v summed in half, then added in float.
    DL_HALF_PARTS(part, AT_RQ, AT_DVC4);
    AT_TILE_PV(Ps, Vs, lid, part);
    DL_CARRY_PARTS(acc, part, AT_RQ, AT_DVC4);
#else
    AT_TILE_PV(Ps, Vs, lid, acc);
#endif
  }
#pragma unroll
  for (int r = 0; r < AT_RQ; ++r) {
    const int i = row0 + lid + r * AT_WG;
    if (i < Lq) {
      __global DL_T* orow = o + at_head_offset(n, Lq, i, H, Dv, h) + dv0;
#pragma unroll
      for (int d4 = 0; d4 < AT_DVC4; ++d4) {
        const float a[4] = {acc[r][d4].x, acc[r][d4].y, acc[r][d4].z, acc[r][d4].w};
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          if (4 * d4 + c < dvend) DL_STORE(orow, 4 * d4 + c, a[c]);
        }
      }
    }
  }
}

// ---------------------------------------------------------------------------
// Partial softmax through the backend's GEMM (devices with tiled kernels; the
// host, attention_opencl.cc, launches gemm.cl for S = q k^T and O = P v):
//   attn_softmax_rows  S [rows][Lk] in place: per row the max m and the sum l
//                      of exp2(c s - m) (c = scale * log2(e)) in float, then
//                      each score replaced by its probability exp2(c s - m) / l
//                      in the storage type (0 for keys the causal mask hides).
//   attn_scatter_rows  O' [N][H][R][Dv] (the second GEMM's output for R query
//                      rows) into o [N, Lq, H*Dv] at rows [m0, m0 + R).
#ifndef AT_SMW
#define AT_SMW 128  // work-items per row of attn_softmax_rows (a power of two)
#endif

// Global (AT_SMW, rows), local (AT_SMW, 1): rows = N * H * R of S (R query
// rows per (n, head), the chunk's first query row at m0: row r of S is query
// m0 + r % R). Each work-item keeps a running (max, sum) over keys lid,
// lid + AT_SMW, ...; the pairs are merged in local memory.
__kernel void attn_softmax_rows(__global DL_T* s, int R, int Lk, int m0, float scale,
                                int causal) {
  __local float ms[AT_SMW];
  __local float ls[AT_SMW];
  const int lid = get_local_id(0);
  const long row = get_group_id(1);
  const int i = m0 + (int)(row % R);  // the query position
  const int kend = causal ? min(Lk, i + 1) : Lk;  // keys past the query are masked
  __global DL_T* sr = s + row * Lk;
  const float c = scale * AT_LOG2E;
  float m = -INFINITY, l = 0.0f;
  for (int j = lid; j < kend; j += AT_SMW) {
    const float x = DL_LOAD(sr, j) * c;
    if (x > m) {
      l = l * exp2(m - x) + 1.0f;  // 0 * 0 + 1 on the first key
      m = x;
    } else {
      l += exp2(x - m);
    }
  }
  ms[lid] = m;
  ls[lid] = l;
  for (int half_ = AT_SMW / 2; half_ > 0; half_ /= 2) {
    barrier(CLK_LOCAL_MEM_FENCE);
    if (lid < half_) {
      const float m1 = ms[lid], m2 = ms[lid + half_];
      const float mm = fmax(m1, m2);
      if (mm > -INFINITY) {
        ls[lid] = ls[lid] * exp2(m1 - mm) + ls[lid + half_] * exp2(m2 - mm);
        ms[lid] = mm;
      }
    }
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  const float mrow = ms[0];
  const float inv = ls[0] > 0.0f ? 1.0f / ls[0] : 0.0f;
  for (int j = lid; j < Lk; j += AT_SMW) {
    const float p = j < kend ? exp2(DL_LOAD(sr, j) * c - mrow) * inv : 0.0f;
    DL_STORE(sr, j, p);
  }
}

// Global (R * H * Dv rounded up, N), any local: o[n][m0 + r][h * Dv + d] =
// src[n][h][r][d] for r < R.
__kernel void attn_scatter_rows(__global const DL_T* src, __global DL_T* o, int R, int Lq,
                                int m0, int H, int Dv) {
  const int e = get_global_id(0);
  const int width = H * Dv;
  if (e >= R * width) return;
  const int n = get_global_id(1);
  const int r = e / width;
  const int c = e - r * width;  // h * Dv + d
  const int h = c / Dv;
  const int d = c - h * Dv;
  const float x = DL_LOAD(src, (((long)n * H + h) * R + r) * Dv + d);
  DL_STORE(o, ((long)n * Lq + m0 + r) * width + c, x);
}

// ---------------------------------------------------------------------------
// FlashAttention (built only when the head sizes are given; attn_wide when
// AT_NT is given too, else attn_flash).
#if defined(AT_DK) && defined(AT_DV)
#define AT_DK4 ((AT_DK + 3) / 4)
#define AT_DV4 ((AT_DV + 3) / 4)
#ifndef AT_NT
#ifndef AT_SPLIT
#define AT_SPLIT 1  // key ranges per (row block, head): > 1 writes partials for attn_merge
#endif
#if AT_SPLIT > 1
#define AT_OUT_T float  // attn_flash's `o`: the partials' scratch (at_split_rows)
#else
#define AT_OUT_T DL_T
#endif
#if AT_SPLIT > 1
// The split partials' scratch: each row's (m, l) as float2, [AT_SPLIT][rows],
// then the self-normalised partial rows in the storage type (half with fp16:
// they are output-sized values), [AT_SPLIT][rows][AT_DV].
inline __global DL_T* at_split_rows(__global float* scratch, long rows) {
  return (__global DL_T*)(scratch + 2 * AT_SPLIT * rows);
}
#endif

// sum[r] += the chunk's probabilities p[r][u] times V rows c0 + u (u < AT_KC),
// in DL_C4; one V read feeds 4 * AT_RQ multiply-adds.
#define AT_CHUNK_PV(p, Vs, c0, sum)                                                     \
  _Pragma("unroll") for (int u_ = 0; u_ < AT_KC; ++u_) {                                \
    _Pragma("unroll") for (int d4_ = 0; d4_ < AT_DV4; ++d4_) {                          \
      const DL_C4 vd_ = Vs[((c0) + u_) * AT_DV4 + d4_];                                  \
      _Pragma("unroll") for (int r_ = 0; r_ < AT_RQ; ++r_) {                            \
        sum[r_][d4_] = mad((DL_C4)(DL_TO_C(p[r_][u_])), vd_, sum[r_][d4_]);             \
      }                                                                                 \
    }                                                                                   \
  }

// out[0 .. AT_DV) = acc * inv (an output row, or a split's partial row).
inline void at_store_row(__global DL_T* out, const float4* acc, float inv) {
#pragma unroll
  for (int d4 = 0; d4 < AT_DV4; ++d4) {
    const float4 a4 = acc[d4] * inv;
    const float a[4] = {a4.x, a4.y, a4.z, a4.w};
#pragma unroll
    for (int c = 0; c < 4; ++c) {
      if (4 * d4 + c < AT_DV) DL_STORE(out, 4 * d4 + c, a[c]);
    }
  }
}

// Global (ceil(Lq / AT_BQ) * AT_WG, H * AT_SPLIT, N), local (AT_WG, 1, 1).
__kernel void attn_flash(__global const DL_T* q, __global const DL_T* k,
                         __global const DL_T* v, __global AT_OUT_T* o, int Lq, int Lk,
                         int H, float scale, int causal) {
  // K, V and q in DL_C4: half with half arithmetic (the products; scores,
  // softmax and the accumulator stay float), float otherwise.
  __local DL_C4 Ks[AT_BK * AT_DK4];
  __local DL_C4 Vs[AT_BK * AT_DV4];
  const int lid = get_local_id(0);
  const int row0 = get_group_id(0) * AT_BQ;
#if AT_SPLIT > 1
  const int h = get_group_id(1) / AT_SPLIT;
  const int split = get_group_id(1) - h * AT_SPLIT;
  const int kbeg = (int)((long)split * Lk / AT_SPLIT);  // this split's keys [kbeg, klim)
  const int klim = (int)((long)(split + 1) * Lk / AT_SPLIT);
#else
  const int h = get_group_id(1);
  const int kbeg = 0, klim = Lk;
#endif
  const int n = get_group_id(2);
  const int qstride = H * AT_DK;
  const int vstride = H * AT_DV;
  const float qscale = scale * AT_LOG2E;
  DL_C4 qr[AT_RQ][AT_DK4];
  float4 acc[AT_RQ][AT_DV4];
  float m[AT_RQ], l[AT_RQ];
#pragma unroll
  for (int r = 0; r < AT_RQ; ++r) {
    const int i = row0 + lid + r * AT_WG;
    __global const DL_T* qrow = q + at_head_offset(n, Lq, min(i, Lq - 1), H, AT_DK, h);
#pragma unroll
    for (int d4 = 0; d4 < AT_DK4; ++d4) qr[r][d4] = DL_TO_C4(at_ld4(qrow, 4 * d4, AT_DK) * qscale);
#pragma unroll
    for (int d4 = 0; d4 < AT_DV4; ++d4) acc[r][d4] = (float4)(0.0f);
    m[r] = -INFINITY;
    l[r] = 0.0f;
  }
  __global const DL_T* kh = k + at_head_offset(n, Lk, 0, H, AT_DK, h);
  __global const DL_T* vh = v + at_head_offset(n, Lk, 0, H, AT_DV, h);
  const int kend = causal ? min(klim, min(Lq, row0 + AT_BQ)) : klim;
  for (int j0 = kbeg; j0 < kend; j0 += AT_BK) {
    const int jn = min(AT_BK, kend - j0);
    barrier(CLK_LOCAL_MEM_FENCE);  // the previous tile's readers are done
    for (int e = lid; e < AT_BK * AT_DK4; e += AT_WG) {
      const int jj = e / AT_DK4;
      const int d4 = e - jj * AT_DK4;
      Ks[e] = DL_TO_C4(jj < jn ? at_ld4(kh + (long)(j0 + jj) * qstride, 4 * d4, AT_DK) : (float4)(0.0f));
    }
    for (int e = lid; e < AT_BK * AT_DV4; e += AT_WG) {
      const int jj = e / AT_DV4;
      const int d4 = e - jj * AT_DV4;
      Vs[e] = DL_TO_C4(jj < jn ? at_ld4(vh + (long)(j0 + jj) * vstride, 4 * d4, AT_DV) : (float4)(0.0f));
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    for (int c0 = 0; c0 < jn; c0 += AT_KC) {
      float s[AT_RQ][AT_KC];
#pragma unroll
      for (int u = 0; u < AT_KC; ++u) {
        DL_C4 dot[AT_RQ];
#pragma unroll
        for (int r = 0; r < AT_RQ; ++r) dot[r] = (DL_C4)(0.0f);
#pragma unroll
        for (int d4 = 0; d4 < AT_DK4; ++d4) {
          const DL_C4 kd = Ks[(c0 + u) * AT_DK4 + d4];  // one read, 4 * AT_RQ mads
#pragma unroll
          for (int r = 0; r < AT_RQ; ++r) dot[r] = mad(qr[r][d4], kd, dot[r]);
        }
#pragma unroll
        for (int r = 0; r < AT_RQ; ++r) {
          const int ok = c0 + u < jn && (!causal || j0 + c0 + u <= row0 + lid + r * AT_WG);
          const float4 d = convert_float4(dot[r]);
          s[r][u] = ok ? (d.x + d.y) + (d.z + d.w) : -INFINITY;
        }
      }
      int any = 0;
#pragma unroll
      for (int r = 0; r < AT_RQ; ++r) {
        float cmax = -INFINITY;
#pragma unroll
        for (int u = 0; u < AT_KC; ++u) cmax = fmax(cmax, s[r][u]);
        if (cmax == -INFINITY) {  // all masked for this row: it takes no part
#pragma unroll
          for (int u = 0; u < AT_KC; ++u) s[r][u] = 0.0f;
          continue;
        }
        any = 1;
        const float mnew = fmax(m[r], cmax);
        const float corr = exp2(m[r] - mnew);  // 0 on the first visible chunk
        l[r] *= corr;
#pragma unroll
        for (int d4 = 0; d4 < AT_DV4; ++d4) acc[r][d4] *= corr;
#pragma unroll
        for (int u = 0; u < AT_KC; ++u) {
          s[r][u] = exp2(s[r][u] - mnew);  // now the probability
          l[r] += s[r][u];
        }
        m[r] = mnew;
      }
      if (!any) continue;  // no barrier inside this loop
#ifdef DL_FP16_MATH
      // The chunk's AT_KC products p v are summed in half, then added in
      // float: a half sum over all Lk keys would lose the small late terms.
      DL_HALF_PARTS(part, AT_RQ, AT_DV4);
      AT_CHUNK_PV(s, Vs, c0, part);
      DL_CARRY_PARTS(acc, part, AT_RQ, AT_DV4);
#else
      AT_CHUNK_PV(s, Vs, c0, acc);
#endif
    }
  }
#if AT_SPLIT > 1
  const long rows = (long)get_num_groups(2) * Lq * H;  // (n, i, h) rows of one split
  __global float* stats = o;
  __global DL_T* part = at_split_rows(o, rows);
#endif
#pragma unroll
  for (int r = 0; r < AT_RQ; ++r) {
    const int i = row0 + lid + r * AT_WG;
    if (i < Lq) {
      const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f;
      const long row = ((long)n * Lq + i) * H + h;  // o's row (n, i) at head h
#if AT_SPLIT > 1
      at_store_row(part + (split * rows + row) * AT_DV, acc[r], inv);
      vstore2((float2)(m[r], l[r]), split * rows + row, stats);
#else
      at_store_row(o + row * AT_DV, acc[r], inv);
#endif
    }
  }
}

#if AT_SPLIT > 1
// Global (rows * AT_DV4, rounded up), any local; rows = N * Lq * H. One
// work-item per float4 of an output row: the splits' partial rows weighted by
// w_s = exp2(m_s - M) * l_s (M: the largest m of the splits that saw a key),
// divided by sum_s w_s; a split with l = 0 (no key) takes no part.
__kernel void attn_merge(__global float* scratch, __global DL_T* o, int rows) {
  const int e = get_global_id(0);
  if (e >= rows * AT_DV4) return;
  const int row = e / AT_DV4;
  const int d = 4 * (e - row * AT_DV4);
  __global const float* stats = scratch;
  __global const DL_T* part = at_split_rows(scratch, rows);
  float mmax = -INFINITY;
#pragma unroll
  for (int s = 0; s < AT_SPLIT; ++s) {
    const float2 ml = vload2((long)s * rows + row, stats);
    if (ml.y > 0.0f) mmax = fmax(mmax, ml.x);
  }
  float4 acc = (float4)(0.0f);
  float wsum = 0.0f;
#pragma unroll
  for (int s = 0; s < AT_SPLIT; ++s) {
    const float2 ml = vload2((long)s * rows + row, stats);
    if (ml.y > 0.0f) {
      const float w = exp2(ml.x - mmax) * ml.y;
      wsum += w;
      acc = mad((float4)(w), at_ld4(part + ((long)s * rows + row) * AT_DV, d, AT_DV), acc);
    }
  }
  acc *= wsum > 0.0f ? 1.0f / wsum : 0.0f;
  __global DL_T* out = o + (long)row * AT_DV + d;
  const float a[4] = {acc.x, acc.y, acc.z, acc.w};
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    if (d + c < AT_DV) DL_STORE(out, c, a[c]);
  }
}
#endif  // AT_SPLIT > 1

#else  // AT_NT: wide heads
// Work-item layouts (AT_NT items): for the scores AT_SY x AT_SX (rows x keys),
// item (sy, sx) owning rows sy + AT_SY * i (i < AT_SR) and keys sx + AT_SX * j
// (j < AT_SC); for the output AT_OY x AT_OX, item (oy, ox) owning rows
// oy + AT_OY * i (i < AT_OR) and float4 columns ox + AT_OX * j (j < AT_OC).
// Strided ownership: neighbouring items read neighbouring float4s of K and V
// from local memory, and items of one row read the same Q / P value.
#ifndef AT_VK
#define AT_VK 8  // keys per staged V chunk (divides AT_BK)
#endif
#ifndef AT_SX
#define AT_SX 16  // work-items along the keys of the score tile
#endif
#ifndef AT_OX
#define AT_OX 32  // work-items along the float4 columns of the output
#endif
#define AT_SY (AT_NT / AT_SX)
#define AT_SR (AT_BQ / AT_SY)
#define AT_SC (AT_BK / AT_SX)
#define AT_OY (AT_NT / AT_OX)
#define AT_OR (AT_BQ / AT_OY)
#define AT_OC ((AT_DV4 + AT_OX - 1) / AT_OX)
#define AT_VS (AT_OC * AT_OX)  // float4s per staged V row (zero past AT_DV4)
#define AT_QS (AT_BQ * (AT_DC4 + 1))  // Q chunk, rows padded by a float4
#define AT_KS (AT_BK * (AT_DC4 + 1))  // K chunk
#define AT_QRES (AT_DK <= AT_DC)  // Q block loaded once, kept in local memory
// V chunks reuse the K (and, unless Q stays resident, the Q) area.
#define AT_VOFF (AT_QRES ? AT_QS : 0)
#define AT_SMEM4 (AT_QS + AT_KS > AT_VOFF + AT_VK * AT_VS ? AT_QS + AT_KS : AT_VOFF + AT_VK * AT_VS)
#define AT_QPF ((AT_BQ * AT_DC4 + AT_NT - 1) / AT_NT)  // prefetched float4s per work-item: Q chunk
#define AT_KPF ((AT_BK * AT_DC4 + AT_NT - 1) / AT_NT)  // K chunk
#define AT_VPF ((AT_VK * AT_VS + AT_NT - 1) / AT_NT)   // V chunk
#if AT_NT % AT_SX || AT_SY * AT_SR != AT_BQ || AT_SX * AT_SC != AT_BK || AT_NT % AT_OX || \
    AT_OY * AT_OR != AT_BQ || AT_BK % AT_VK
#error "attn_wide: AT_SX and AT_OX must tile AT_BQ x AT_BK and AT_BQ x AT_DV; AT_VK must divide AT_BK"
#endif

// Staging is software-pipelined: each chunk (Q and K dims, or V keys) is
// fetched into registers while the previous one is used, then stored to local
// memory. Work-item lid holds elements lid + AT_NT * t (t < count) of a
// rows x cols4 float4 block of a row-major matrix at g (row stride `stride`),
// zero at rows >= valid_rows and columns >= valid_cols, times mul. (count is
// a constant at every call: the loops unroll once inlined, so r stays in
// registers.)
inline void aw_fetch(float4* r, int count, __global const DL_T* g, int stride, int rows,
                     int cols4, int valid_rows, int valid_cols, float mul, int lid) {
  for (int t = 0; t < count; ++t) {
    const int e = lid + AT_NT * t;
    const int row = e / cols4;
    r[t] = e < rows * cols4 && row < valid_rows
               ? at_ld4(g + (long)row * stride, 4 * (e - row * cols4), valid_cols) * mul
               : (float4)(0.0f);
  }
}

// The fetched share into local memory (rows lstride float4s apart).
inline void aw_store(__local float4* s, int lstride, const float4* r, int count, int rows,
                     int cols4, int lid) {
  for (int t = 0; t < count; ++t) {
    const int e = lid + AT_NT * t;
    const int row = e / cols4;
    if (e < rows * cols4) s[row * lstride + e - row * cols4] = r[t];
  }
}

// Global (ceil(Lq / AT_BQ) * AT_NT, H, N), local (AT_NT, 1, 1).
__kernel void attn_wide(__global const DL_T* q, __global const DL_T* k,
                        __global const DL_T* v, __global DL_T* o, int Lq, int Lk,
                        int H, float scale, int causal) {
  __local float4 smem[AT_SMEM4];
  __local float Ss[AT_BQ * (AT_BK + 1)];  // the tile's scores, then probabilities
  __local float Ms[AT_BQ];  // running row max (base 2)
  __local float Ls[AT_BQ];  // running row sum of exp2(s - max)
  __local float Cs[AT_BQ];  // this tile's rescale factor of each row's accumulator
  __local float4* Qs = smem;
  __local float4* Ks = smem + AT_QS;
  __local float4* Vs = smem + AT_VOFF;
  const int lid = get_local_id(0);
  const int sx = lid % AT_SX, sy = lid / AT_SX;
  const int ox = lid % AT_OX, oy = lid / AT_OX;
  const int row0 = get_group_id(0) * AT_BQ;
  const int h = get_group_id(1);
  const int n = get_group_id(2);
  const int qstride = H * AT_DK;
  const int vstride = H * AT_DV;
  const float qscale = scale * AT_LOG2E;
  __global const DL_T* qh = q + at_head_offset(n, Lq, row0, H, AT_DK, h);
  __global const DL_T* kh = k + at_head_offset(n, Lk, 0, H, AT_DK, h);
  __global const DL_T* vh = v + at_head_offset(n, Lk, 0, H, AT_DV, h);
  const int rows_left = Lq - row0;
  for (int r = lid; r < AT_BQ; r += AT_NT) {
    Ms[r] = -INFINITY;
    Ls[r] = 0.0f;
  }
  float4 qpf[AT_QPF], kpf[AT_KPF], vpf[AT_VPF];  // the next chunk, in flight
#if AT_QRES
  aw_fetch(qpf, AT_QPF, qh, qstride, AT_BQ, AT_DC4, rows_left, AT_DK, qscale, lid);
  aw_store(Qs, AT_DC4 + 1, qpf, AT_QPF, AT_BQ, AT_DC4, lid);
#endif
  float4 acc[AT_OR][AT_OC];
#pragma unroll
  for (int i = 0; i < AT_OR; ++i) {
#pragma unroll
    for (int j = 0; j < AT_OC; ++j) acc[i][j] = (float4)(0.0f);
  }
  // Causal: no row of this block sees a key past its last row.
  const int kend = causal ? min(Lk, min(Lq, row0 + AT_BQ)) : Lk;
  // The first chunk: Q (unless resident) and K dims [0, AT_DC) of keys [0, AT_BK).
#if !AT_QRES
  aw_fetch(qpf, AT_QPF, qh, qstride, AT_BQ, AT_DC4, rows_left, AT_DC, qscale, lid);
#endif
  aw_fetch(kpf, AT_KPF, kh, qstride, AT_BK, AT_DC4, min(AT_BK, kend), AT_DC, 1.0f, lid);
  for (int j0 = 0; j0 < kend; j0 += AT_BK) {
    const int jn = min(AT_BK, kend - j0);
    // 1. Scores S = Q K^T (scaled, base 2), Dk streamed in chunks.
    float s[AT_SR][AT_SC];
#pragma unroll
    for (int i = 0; i < AT_SR; ++i) {
#pragma unroll
      for (int j = 0; j < AT_SC; ++j) s[i][j] = 0.0f;
    }
    for (int d0 = 0; d0 < AT_DK; d0 += AT_DC) {
      barrier(CLK_LOCAL_MEM_FENCE);  // the previous readers of Qs / Ks / Vs are done
#if !AT_QRES
      aw_store(Qs, AT_DC4 + 1, qpf, AT_QPF, AT_BQ, AT_DC4, lid);
#endif
      aw_store(Ks, AT_DC4 + 1, kpf, AT_KPF, AT_BK, AT_DC4, lid);
      barrier(CLK_LOCAL_MEM_FENCE);
      const int d1 = d0 + AT_DC;  // the next chunk: these keys' next dims, else the first V chunk
      if (d1 < AT_DK) {
#if !AT_QRES
        aw_fetch(qpf, AT_QPF, qh + d1, qstride, AT_BQ, AT_DC4, rows_left, AT_DK - d1, qscale, lid);
#endif
        aw_fetch(kpf, AT_KPF, kh + (long)j0 * qstride + d1, qstride, AT_BK, AT_DC4, jn, AT_DK - d1,
                 1.0f, lid);
      } else {
        aw_fetch(vpf, AT_VPF, vh + (long)j0 * vstride, vstride, AT_VK, AT_VS, jn, AT_DV, 1.0f, lid);
      }
#pragma unroll
      for (int d4 = 0; d4 < AT_DC4; ++d4) {
        float4 qd[AT_SR], kd[AT_SC];
#pragma unroll
        for (int i = 0; i < AT_SR; ++i) qd[i] = Qs[(sy + AT_SY * i) * (AT_DC4 + 1) + d4];
#pragma unroll
        for (int j = 0; j < AT_SC; ++j) kd[j] = Ks[(sx + AT_SX * j) * (AT_DC4 + 1) + d4];
#pragma unroll
        for (int i = 0; i < AT_SR; ++i) {
#pragma unroll
          for (int j = 0; j < AT_SC; ++j) s[i][j] = at_dot4(qd[i], kd[j], s[i][j]);
        }
      }
    }
#pragma unroll
    for (int i = 0; i < AT_SR; ++i) {
#pragma unroll
      for (int j = 0; j < AT_SC; ++j) Ss[(sy + AT_SY * i) * (AT_BK + 1) + sx + AT_SX * j] = s[i][j];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    // 2. Online softmax, one work-item per row: keys u < vis are visible;
    // the row's scores become probabilities exp2(s - m_new) (0 elsewhere).
    for (int r = lid; r < AT_BQ; r += AT_NT) {
      __local float* srow = Ss + r * (AT_BK + 1);
      const int vis = causal ? clamp(row0 + r - j0 + 1, 0, jn) : jn;
      float tmax = -INFINITY;
      for (int u = 0; u < vis; ++u) tmax = fmax(tmax, srow[u]);
      const float mold = Ms[r];
      const float mnew = fmax(mold, tmax);
      const float corr = mnew == -INFINITY ? 1.0f : exp2(mold - mnew);  // 0 on the first visible tile
      float sum = 0.0f;
      for (int u = 0; u < AT_BK; ++u) {
        const float p = u < vis ? exp2(srow[u] - mnew) : 0.0f;
        srow[u] = p;
        sum += p;
      }
      Ls[r] = Ls[r] * corr + sum;
      Ms[r] = mnew;
      Cs[r] = corr;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    // 3. O = O * corr + P V, V streamed in chunks of AT_VK keys.
#pragma unroll
    for (int i = 0; i < AT_OR; ++i) {
      const float c = Cs[oy + AT_OY * i];
#pragma unroll
      for (int j = 0; j < AT_OC; ++j) acc[i][j] *= c;
    }
    for (int c0 = 0; c0 < jn; c0 += AT_VK) {
      barrier(CLK_LOCAL_MEM_FENCE);  // the previous readers of Vs (or Ks) are done
      aw_store(Vs, AT_VS, vpf, AT_VPF, AT_VK, AT_VS, lid);
      barrier(CLK_LOCAL_MEM_FENCE);
      const int c1 = c0 + AT_VK;  // the next chunk: these keys' next V rows, else the next keys' Q, K
      const int j1 = j0 + AT_BK;
      if (c1 < jn) {
        aw_fetch(vpf, AT_VPF, vh + (long)(j0 + c1) * vstride, vstride, AT_VK, AT_VS, jn - c1, AT_DV,
                 1.0f, lid);
      } else if (j1 < kend) {
#if !AT_QRES
        aw_fetch(qpf, AT_QPF, qh, qstride, AT_BQ, AT_DC4, rows_left, AT_DC, qscale, lid);
#endif
        aw_fetch(kpf, AT_KPF, kh + (long)j1 * qstride, qstride, AT_BK, AT_DC4, min(AT_BK, kend - j1),
                 AT_DC, 1.0f, lid);
      }
#pragma unroll
      for (int u = 0; u < AT_VK; ++u) {
        float p[AT_OR];
#pragma unroll
        for (int i = 0; i < AT_OR; ++i) p[i] = Ss[(oy + AT_OY * i) * (AT_BK + 1) + c0 + u];
#pragma unroll
        for (int j = 0; j < AT_OC; ++j) {
          const float4 vd = Vs[u * AT_VS + ox + AT_OX * j];  // one read, 4 * AT_OR mads
#pragma unroll
          for (int i = 0; i < AT_OR; ++i) acc[i][j] = mad((float4)(p[i]), vd, acc[i][j]);
        }
      }
    }
  }
  barrier(CLK_LOCAL_MEM_FENCE);  // Ls complete (also when no key block ran)
  // 4. o = O / l.
#pragma unroll
  for (int i = 0; i < AT_OR; ++i) {
    const int r = oy + AT_OY * i;
    if (row0 + r < Lq) {
      const float l = Ls[r];
      const float inv = l > 0.0f ? 1.0f / l : 0.0f;
      __global DL_T* orow = o + at_head_offset(n, Lq, row0 + r, H, AT_DV, h);
#pragma unroll
      for (int j = 0; j < AT_OC; ++j) {
        const int c4 = ox + AT_OX * j;
        const float4 a4 = acc[i][j] * inv;
        const float a[4] = {a4.x, a4.y, a4.z, a4.w};
#pragma unroll
        for (int c = 0; c < 4; ++c) {
          if (4 * c4 + c < AT_DV) DL_STORE(orow, 4 * c4 + c, a[c]);
        }
      }
    }
  }
}
#endif  // AT_NT
#endif  // AT_DK && AT_DV
