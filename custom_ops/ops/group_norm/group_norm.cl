// difflite.GroupNorm (+ SiLU) on the GPU: x [N, S, C] (S = H*W or L), NHWC.
//
// Two passes over x, nothing of the unfused form materialised. The "split"
// plan, two kernels (three at most):
//   gn_stats    one read of x: per (sample, group) mean and variance. A
//               work-group of GN_WG work-items reduces the rows [s0, s1) of
//               one group; each work-item keeps shifted sums of the elements
//               it reads, turns them into (count, mean, M2) and the work-group
//               merges those pairwise (Chan et al.) in local memory.
//               splits == 1: writes (mean, rstd) directly; splits > 1 (groups
//               too big for one work-group to fill the device): one
//               (count, mean, M2) partial per work-group.
//   gn_apply /  one read of x, one write of y: normalise, affine, SiLU,
//   gn_apply4   coalesced over C (float4 when C % 4 == 0). With split
//               statistics each work-group first merges the partials of the
//               (sample, group) pairs it touches in local memory.
//   gn_combine  merges the partials into (mean, rstd) as a separate tiny
//               kernel, only where a work-group of gn_apply would touch more
//               than GN_APPLY_WG pairs (many small samples or > 256 groups).
// The "one" plan (GPUs), one kernel:
//   gn_one      one work-group per (sample, group): reduces the group as
//               gn_stats does, then reads it again (from cache on a GPU) and
//               writes y. GN_VW-wide loads, GN_UNROLL of them in flight.
//
// Storage type DL_T (float or half), DL_T4 its 4-vector; math in float.
#include "dl_storage.cl"
#ifndef GN_WG
#define GN_WG 256  // work-group size of gn_stats / gn_one (a power of two)
#endif
#ifndef GN_APPLY_WG
#define GN_APPLY_WG 256  // work-group size of gn_apply / gn_apply4
#endif
#define DL_CAT_(a, b) a##b
#define DL_CAT(a, b) DL_CAT_(a, b)
#define DL_LOAD4(p, i) convert_float4(vload4(0, (p) + (i)))
#define DL_STORE4(p, i, v) vstore4(DL_CAT(convert_, DL_T4)(v), 0, (p) + (i))

// Merges (nb, mb, qb) into (na, ma, qa): count, mean, sum of squared
// deviations.
inline void gn_merge(float* na, float* ma, float* qa, float nb, float mb, float qb) {
  if (nb == 0.0f) return;
  if (*na == 0.0f) {
    *na = nb;
    *ma = mb;
    *qa = qb;
    return;
  }
  const float n = *na + nb;
  const float delta = mb - *ma;
  const float fb = nb / n;
  *ma += delta * fb;
  *qa += qb + delta * delta * (*na) * fb;
  *na = n;
}

// Merges every work-item's (count, mean, M2) in a tree in local memory
// (GN_WG work-items, a power of two; a uniform call). The work-group's totals
// end in l_n[0], l_m[0], l_q[0], visible to every work-item.
inline void gn_reduce(__local float* l_n, __local float* l_m, __local float* l_q,
                      float cnt, float mean, float m2) {
  const int lid = get_local_id(0);
  l_n[lid] = cnt;
  l_m[lid] = mean;
  l_q[lid] = m2;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int half_size = GN_WG / 2; half_size > 0; half_size >>= 1) {
    if (lid < half_size) {
      float na = l_n[lid], ma = l_m[lid], qa = l_q[lid];
      gn_merge(&na, &ma, &qa, l_n[lid + half_size], l_m[lid + half_size],
               l_q[lid + half_size]);
      l_n[lid] = na;
      l_m[lid] = ma;
      l_q[lid] = qa;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
}

// Reading a group: loads are GN_VW (1, 2 or 4, a divisor of cg) elements
// wide; each work-item keeps GN_UNROLL of them in flight (gn_stats, gn_one).
#ifndef GN_VW
#define GN_VW 1
#endif
#ifndef GN_UNROLL
#define GN_UNROLL 4
#endif
#if GN_VW == 4
#define GN_VEC float4
#define GN_LOAD(p, i) convert_float4(vload4(0, (p) + (i)))
#define GN_STORE(p, i, v) vstore4(DL_CAT(convert_, DL_T4)(v), 0, (p) + (i))
#define GN_HSUM(v) ((v).x + (v).y + (v).z + (v).w)
#elif GN_VW == 2
#define GN_VEC float2
#define GN_LOAD(p, i) convert_float2(vload2(0, (p) + (i)))
#define GN_STORE(p, i, v) vstore2(DL_CAT(convert_, DL_CAT(DL_T, 2))(v), 0, (p) + (i))
#define GN_HSUM(v) ((v).x + (v).y)
#else
#define GN_VEC float
#define GN_LOAD(p, i) ((float)(p)[i])
#define GN_STORE(p, i, v) ((p)[i] = (DL_T)(v))
#define GN_HSUM(v) (v)
#endif

// A work-item's walk over its group's vectors: vector e sits at row e / cgv,
// channel GN_VW * (e % cgv) of the group (cgv = cg / GN_VW); stepping e by
// GN_WG moves (row, col) = (*s, *k) by (ds, dk), without a division. Returns
// the current element offset, then steps.
inline int gn_step(int* s, int* k, int ds, int dk, int cgv, int C) {
  const int off = *s * C + *k * GN_VW;
  *k += dk;
  *s += ds;
  if (*k >= cgv) {
    *k -= cgv;
    *s += 1;
  }
  return off;
}


// One work-item's share of the statistics of `total` vectors of a group that
// start at xg (rows C elements apart, cgv = cg / GN_VW vectors per row): every
// GN_WG-th vector from its own, as shifted sums turned into (count, mean, M2).
inline void gn_item_stats(__global const DL_T* xg, int total, int cgv, int C, float* cnt,
                          float* mean, float* m2) {
  const int lid = get_local_id(0);
  const int ds = GN_WG / cgv;
  const int dk = GN_WG - ds * cgv;
  int s = lid / cgv;
  int k = lid - s * cgv;
  // Lanes past the end load the shift (they add nothing).
  const float shift = lid < total ? (float)xg[s * C + k * GN_VW] : 0.0f;
  GN_VEC s1 = 0.0f, s2 = 0.0f;
  for (int e = lid; e < total; e += GN_UNROLL * GN_WG) {
    GN_VEC v[GN_UNROLL];
#pragma unroll
    for (int u = 0; u < GN_UNROLL; ++u) {
      const int off = gn_step(&s, &k, ds, dk, cgv, C);
      v[u] = e + u * GN_WG < total ? GN_LOAD(xg, off) : (GN_VEC)shift;
    }
#pragma unroll
    for (int u = 0; u < GN_UNROLL; ++u) {
      const GN_VEC d = v[u] - shift;
      s1 += d;
      s2 += d * d;
    }
  }
  *cnt = lid < total ? (float)(((total - 1 - lid) / GN_WG + 1) * GN_VW) : 0.0f;
  *mean = 0.0f;
  *m2 = 0.0f;
  if (*cnt > 0.0f) {
    const float t1 = GN_HSUM(s1);
    const float dm = t1 / *cnt;
    *mean = shift + dm;
    *m2 = fmax(GN_HSUM(s2) - t1 * dm, 0.0f);
  }
}

// Global size (GN_WG * groups, splits, N), local size (GN_WG, 1, 1).
// partial: [N][groups][splits] float4 (count, mean, M2, 0) when splits > 1.
// stats:   [N][groups] float2 (mean, rstd) when splits == 1.
__kernel void gn_stats(__global const DL_T* x, __global float4* partial,
                       __global float2* stats, int S, int C, int cg,
                       int splits, float eps) {
  __local float l_n[GN_WG];
  __local float l_m[GN_WG];
  __local float l_q[GN_WG];
  const int lid = get_local_id(0);
  const int g = get_group_id(0);
  const int groups = get_num_groups(0);
  const int sp = get_global_id(1);
  const int n = get_global_id(2);

  const int rows_per = (S + splits - 1) / splits;
  const int s0 = min(S, sp * rows_per);
  const int s1 = min(S, s0 + rows_per);
  const int cgv = cg / GN_VW;
  float cnt, mean, m2;
  gn_item_stats(x + ((long)n * S + s0) * C + g * cg, (s1 - s0) * cgv, cgv, C, &cnt, &mean, &m2);
  gn_reduce(l_n, l_m, l_q, cnt, mean, m2);
  if (lid == 0) {
    const int ng = n * groups + g;
    if (splits == 1) {
      const float var = l_n[0] > 0.0f ? l_q[0] / l_n[0] : 0.0f;
      stats[ng] = (float2)(l_m[0], rsqrt(var + eps));
    } else {
      partial[(long)ng * splits + sp] = (float4)(l_n[0], l_m[0], l_q[0], 0.0f);
    }
  }
}

// One work-item per (sample, group): merges `splits` partials.
// Global size >= count (= N * groups), any local size.
__kernel void gn_combine(__global const float4* partial, __global float2* stats,
                         int count, int splits, float eps) {
  const int ng = get_global_id(0);
  if (ng >= count) return;
  float na = 0.0f, ma = 0.0f, qa = 0.0f;
  for (int p = 0; p < splits; ++p) {
    const float4 v = partial[(long)ng * splits + p];
    gn_merge(&na, &ma, &qa, v.x, v.y, v.z);
  }
  const float var = na > 0.0f ? qa / na : 0.0f;
  stats[ng] = (float2)(ma, rsqrt(var + eps));
}

inline float gn_act(float v, int silu) {
  return silu ? v / (1.0f + exp(-v)) : v;
}

// With `combine` (the statistics were split over several work-groups), the
// work-group first merges the partials of every (sample, group) its elements
// touch into l_st, so normalising needs no third kernel; the host guarantees
// at most GN_APPLY_WG such pairs. Returns the first sample touched. Elements
// [first_elem, last_elem] are the work-group's; the call is uniform.
inline int gn_stage_stats(__local float2* l_st, __global const float4* partial,
                          long first_elem, long last_elem, int S, int C, int groups,
                          int splits, float eps) {
  const long per_sample = (long)S * C;
  const int n0 = (int)(first_elem / per_sample);
  const int pairs = ((int)(last_elem / per_sample) - n0 + 1) * groups;
  for (int p = get_local_id(0); p < pairs; p += get_local_size(0)) {
    __global const float4* src = partial + ((long)n0 * groups + p) * splits;
    float na = 0.0f, ma = 0.0f, qa = 0.0f;
    for (int k = 0; k < splits; ++k) {
      const float4 v = src[k];
      gn_merge(&na, &ma, &qa, v.x, v.y, v.z);
    }
    const float var = na > 0.0f ? qa / na : 0.0f;
    l_st[p] = (float2)(ma, rsqrt(var + eps));
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  return n0;
}

// Scalar form: one work-item per element; global size >= N*S*C, local size
// GN_APPLY_WG. stats: final (mean, rstd) when !combine; partial: the split
// statistics when combine.
__kernel void gn_apply(__global const DL_T* x, __global const float2* stats,
                       __global const float4* partial, __global const DL_T* gamma,
                       __global const DL_T* beta, __global DL_T* y, int rows, int S,
                       int C, int cg, int groups, int silu, int combine, int splits,
                       float eps) {
  __local float2 l_st[GN_APPLY_WG];
  const int total = rows * C;
  const int first = get_group_id(0) * GN_APPLY_WG;
  int n0 = 0;
  if (combine) {
    n0 = gn_stage_stats(l_st, partial, first, min(total - 1, first + GN_APPLY_WG - 1), S, C,
                        groups, splits, eps);
  }
  const int i = get_global_id(0);
  if (i >= total) return;
  const int row = i / C;
  const int c = i - row * C;
  const int n = row / S;
  const float2 st = combine ? l_st[(n - n0) * groups + c / cg] : stats[n * groups + c / cg];
  const float v = ((float)x[i] - st.x) * (st.y * (float)gamma[c]) + (float)beta[c];
  y[i] = (DL_T)gn_act(v, silu);
}

// Vector form (C % 4 == 0): one work-item per 4 channels of one row; global
// size >= N*S*C/4, local size GN_APPLY_WG. The 4 lanes may straddle two groups.
__kernel void gn_apply4(__global const DL_T* x, __global const float2* stats,
                        __global const float4* partial, __global const DL_T* gamma,
                        __global const DL_T* beta, __global DL_T* y, int rows, int S,
                        int C, int cg, int groups, int silu, int combine, int splits,
                        float eps) {
  __local float2 l_st[GN_APPLY_WG];
  const int c4 = C >> 2;
  const int items = rows * c4;
  const int first = get_group_id(0) * GN_APPLY_WG;
  int n0 = 0;
  if (combine) {
    const int last = min(items - 1, first + GN_APPLY_WG - 1);
    n0 = gn_stage_stats(l_st, partial, 4L * first, 4L * last + 3, S, C, groups, splits, eps);
  }
  const int i = get_global_id(0);
  if (i >= items) return;
  const int row = i / c4;
  const int c = (i - row * c4) << 2;
  const int n = row / S;
  float2 a, b, d, e;
  if (combine) {
    __local const float2* st = l_st + (n - n0) * groups;
    a = st[c / cg];
    b = st[(c + 1) / cg];
    d = st[(c + 2) / cg];
    e = st[(c + 3) / cg];
  } else {
    __global const float2* st = stats + n * groups;
    a = st[c / cg];
    b = st[(c + 1) / cg];
    d = st[(c + 2) / cg];
    e = st[(c + 3) / cg];
  }
  const float4 mean = (float4)(a.x, b.x, d.x, e.x);
  const float4 rstd = (float4)(a.y, b.y, d.y, e.y);
  const long off = (long)row * C + c;
  const float4 v = (DL_LOAD4(x, off) - mean) * (rstd * DL_LOAD4(gamma, c)) +
                   DL_LOAD4(beta, c);
  DL_STORE4(y, off, silu ? v / (1.0f + exp(-v)) : v);
}

// ---------------------------------------------------------------------------
// The one-kernel plan.
// Global size (GN_WG * groups, N), local size (GN_WG, 1): work-group (g, n)
// normalises group g of sample n. Pass 1 reduces it as gn_stats does (shifted
// sums per work-item, Chan merges in local memory); pass 2 reads it again and
// writes act(gamma * (x - mean) * rstd + beta).
__kernel void gn_one(__global const DL_T* x, __global const DL_T* gamma,
                     __global const DL_T* beta, __global DL_T* y, int S, int C,
                     int cg, int silu, float eps) {
  __local float l_n[GN_WG];
  __local float l_m[GN_WG];
  __local float l_q[GN_WG];
  const int lid = get_local_id(0);
  const int g = get_group_id(0);
  const long first = (long)get_global_id(1) * S * C + g * cg;
  __global const DL_T* xg = x + first;
  const int cgv = cg / GN_VW;
  const int total = S * cgv;  // vectors of the group
  float cnt, mean, m2;
  gn_item_stats(xg, total, cgv, C, &cnt, &mean, &m2);
  gn_reduce(l_n, l_m, l_q, cnt, mean, m2);
  const float mu = l_m[0];
  const float rstd = rsqrt((l_n[0] > 0.0f ? l_q[0] / l_n[0] : 0.0f) + eps);

  // Pass 2.
  const int ds = GN_WG / cgv;
  const int dk = GN_WG - ds * cgv;
  __global const DL_T* gg = gamma + g * cg;
  __global const DL_T* bg = beta + g * cg;
  __global DL_T* yg = y + first;
  int s = lid / cgv;
  int k = lid - s * cgv;
  for (int e = lid; e < total; e += GN_UNROLL * GN_WG) {
    GN_VEC v[GN_UNROLL];
    int off[GN_UNROLL], ch[GN_UNROLL];
#pragma unroll
    for (int u = 0; u < GN_UNROLL; ++u) {
      ch[u] = k * GN_VW;
      off[u] = gn_step(&s, &k, ds, dk, cgv, C);
      v[u] = e + u * GN_WG < total ? GN_LOAD(xg, off[u]) : (GN_VEC)0.0f;
    }
#pragma unroll
    for (int u = 0; u < GN_UNROLL; ++u) {
      if (e + u * GN_WG < total) {
        const GN_VEC r = (v[u] - mu) * (rstd * GN_LOAD(gg, ch[u])) + GN_LOAD(bg, ch[u]);
        GN_STORE(yg, off[u], silu ? r / (1.0f + exp(-r)) : r);
      }
    }
  }
}
