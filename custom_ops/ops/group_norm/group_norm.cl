// difflite.GroupNorm (+ SiLU) on the GPU: x [N, S, C] (S = H*W or L), NHWC.
//
// Nothing of the unfused form materialised. Four plans (PickPlan in
// group_norm_opencl.cc):
// "rows" (GPUs, LayerNorms: one group, S = 1, C % 4 == 0), one kernel:
//   gn_rows        several samples (rows) a work-group, a row's float4s in
//                  the registers of its work-items; one read, one write.
// "coop" (GPUs, tensors up to about the L2 cache), one kernel, one pass:
//   gn_coop        column blocks of whole groups; the K work-groups of a
//                  block each hold a slice of rows in registers and exchange
//                  per-group partial sums through tagged 64-bit words, then
//                  write y from registers (see "The cooperative plan").
// The "split" plan (CPU-like devices, large tensors), two kernels over
// column blocks (a work-item owns one vector of channels and walks rows):
//   gn_stats_cols  one read of x: per work-group and group a partial
//                  (count, mean, M2) from shifted sums, merged pairwise
//                  (Chan et al.) in local memory. GN_COLS_UNROLL rows in
//                  flight per work-item, in both kernels.
//   gn_apply_cols  merges the partials of its own groups in local memory,
//                  folds mean, rstd, gamma and beta into one scale and shift
//                  per channel (registers), then reads x once more and writes
//                  y = act(x * scale + shift).
// The "one" plan (large tensors with enough (sample, group) pairs), one
// kernel:
//   gn_one         one work-group per (sample, group): reduces the group as
//                  a walk over its elements, then reads it again (from cache
//                  on a GPU) and writes y. GN_VW-wide loads, GN_UNROLL of
//                  them in flight.
//
// Storage type DL_T (float or half), DL_T4 its 4-vector; math in float.
#include "dl_storage.cl"
#ifndef GN_WG
#define GN_WG 256  // work-group size of gn_one (a power of two)
#endif
#ifndef GN_LX  // the split plan's work-group: GN_LX columns x GN_LY rows,
#define GN_LX 64  // GN_GPW groups (or one group's share) across the columns
#endif
#ifndef GN_LY
#define GN_LY 4
#endif
#ifndef GN_GPW
#define GN_GPW 1
#endif
#ifndef GN_COLS_UNROLL
#define GN_COLS_UNROLL 8  // rows in flight per work-item of the split plan
#endif

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

// Tree-merges each of `segs` runs of `len` consecutive entries of l_n/l_m/l_q
// into the run's first entry, in ceil(log2(len)) rounds (a chain of merges,
// each with a division, would serialise). A uniform call.
inline void gn_tree_merge(__local float* l_n, __local float* l_m, __local float* l_q, int segs,
                          int len) {
  const int lid = get_local_id(1) * get_local_size(0) + get_local_id(0);
  const int nt = get_local_size(0) * get_local_size(1);
  for (int h = len; h > 1;) {
    const int upper = (h + 1) / 2, pairs = h - upper;  // entries [upper, h) merge down
    for (int t = lid; t < segs * pairs; t += nt) {
      const int seg = t / pairs;
      const int a = seg * len + (t - seg * pairs), b = a + upper;
      float na = l_n[a], ma = l_m[a], qa = l_q[a];
      gn_merge(&na, &ma, &qa, l_n[b], l_m[b], l_q[b]);
      l_n[a] = na;
      l_m[a] = ma;
      l_q[a] = qa;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    h = upper;
  }
}

// Stores (cnt, mean, m2) as entry i of l_n / l_m / l_q.
inline void gn_put(__local float* l_n, __local float* l_m, __local float* l_q, int i, float cnt,
                   float mean, float m2) {
  l_n[i] = cnt;
  l_m[i] = mean;
  l_q[i] = m2;
}

// Merges every work-item's (count, mean, M2) in a tree in local memory
// (GN_WG work-items; a uniform call). The work-group's totals end in l_n[0],
// l_m[0], l_q[0], visible to every work-item.
inline void gn_reduce(__local float* l_n, __local float* l_m, __local float* l_q,
                      float cnt, float mean, float m2) {
  gn_put(l_n, l_m, l_q, get_local_id(0), cnt, mean, m2);
  barrier(CLK_LOCAL_MEM_FENCE);
  gn_tree_merge(l_n, l_m, l_q, 1, GN_WG);
}

// Reading a group: loads are GN_VW (1, 2 or 4, a divisor of cg) elements
// wide; each work-item keeps GN_UNROLL of them in flight (gn_one, and the
// split plan's column walks).
#ifndef GN_VW
#define GN_VW 1
#endif
#ifndef GN_UNROLL
#define GN_UNROLL 4
#endif
// Vector loads and stores, dl_storage.cl's aligned forms: every offset is a
// multiple of GN_VW elements (GN_VW divides cg and C) and buffers start
// aligned.
#if GN_VW == 4
#define GN_VEC float4
#define GN_LOAD(p, i) DL_LOAD4A(p, i)
#define GN_STORE(p, i, v) DL_STORE4A(p, i, v)
#define GN_HSUM(v) ((v).x + (v).y + (v).z + (v).w)
#elif GN_VW == 2
#define GN_VEC float2
#define GN_LOAD(p, i) DL_LOAD2A(p, i)
#define GN_STORE(p, i, v) DL_STORE2A(p, i, v)
#define GN_HSUM(v) ((v).x + (v).y)
#else
#define GN_VEC float
#define GN_LOAD(p, i) DL_LOAD(p, i)
#define GN_STORE(p, i, v) DL_STORE(p, i, v)
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
  const float shift = lid < total ? DL_LOAD(xg, s * C + k * GN_VW) : 0.0f;
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

// ---------------------------------------------------------------------------
// The split plan: column blocks. (Not built with gn_coop's options, GN_COOP:
// its blocks need not be whole multiples of GN_GPW columns.)
#ifndef GN_COOP
// Per sample, x is S rows of cv = C / GN_VW vectors (GN_VW divides cg, so a
// vector never straddles two groups). Both kernels run on global size
// (cv, R, N) and local size (GN_LX, GN_LY, 1): a work-item owns one vector
// column and walks the rows r, r + R, r + 2R, ..., so its channels, gamma,
// beta and statistics stay in registers, and the GN_LX work-items of a row
// read one contiguous stretch of it. A work-group's GN_LX columns are
// GN_GPW whole groups (xb == 1), or a 1/xb share of one group (xb > 1:
// groups wider than a work-group; GN_GPW is then 1).
// partial[(n * groups + g) * P + p]: (count, mean, M2, 0) of one work-group's
// share of group g, P = (work-groups along dimension 1) * xb.

// The (count, mean, M2) of a work-item's shifted vector sums over `rows` rows.
inline void gn_lanes_stats(GN_VEC shift, GN_VEC s1, GN_VEC s2, int rows, float* cnt,
                           float* mean, float* m2) {
  *cnt = (float)(rows * GN_VW);
  *mean = 0.0f;
  *m2 = 0.0f;
  if (rows == 0) return;
  const GN_VEC d_mean = s1 / (float)rows;  // per lane, relative to the shift
  const float mu = GN_HSUM(shift + d_mean) / (float)GN_VW;
  const GN_VEC spread = shift + d_mean - mu;
  *mean = mu;
  *m2 = fmax(GN_HSUM(s2 - s1 * d_mean) + (float)rows * GN_HSUM(spread * spread), 0.0f);
}

__kernel void gn_stats_cols(__global const DL_T* x, __global float4* partial, int S, int C,
                            int cg, int groups, int xb) {
  __local float l_n[GN_LX * GN_LY];
  __local float l_m[GN_LX * GN_LY];
  __local float l_q[GN_LX * GN_LY];
  const int lx = get_local_id(0), ly = get_local_id(1);
  const int r0 = get_global_id(1), R = get_global_size(1), n = get_global_id(2);
  __global const DL_T* xc = x + (long)n * S * C + get_global_id(0) * GN_VW;
  const GN_VEC shift = r0 < S ? GN_LOAD(xc, (long)r0 * C) : (GN_VEC)0.0f;
  GN_VEC s1 = 0.0f, s2 = 0.0f;
  // Batches of GN_COLS_UNROLL rows, all loads issued before any is used (a
  // remainder loop would wait on its loads one by one); rows past S read as
  // the shift, which adds nothing.
  for (int s = r0; s < S; s += GN_COLS_UNROLL * R) {
    GN_VEC v[GN_COLS_UNROLL];
#pragma unroll
    for (int u = 0; u < GN_COLS_UNROLL; ++u) {
      v[u] = s + u * R < S ? GN_LOAD(xc, (long)(s + u * R) * C) : shift;
    }
#pragma unroll
    for (int u = 0; u < GN_COLS_UNROLL; ++u) {
      const GN_VEC d = v[u] - shift;
      s1 += d;
      s2 += d * d;
    }
  }
  float cnt, mean, m2;
  gn_lanes_stats(shift, s1, s2, r0 < S ? (S - 1 - r0) / R + 1 : 0, &cnt, &mean, &m2);
  // Entries grouped by group (share): its GN_LY rows x cols columns in one run.
  const int cols = GN_LX / GN_GPW, j = lx / cols;
  const int slot = (j * GN_LY + ly) * cols + (lx - j * cols);
  gn_put(l_n, l_m, l_q, slot, cnt, mean, m2);
  barrier(CLK_LOCAL_MEM_FENCE);
  gn_tree_merge(l_n, l_m, l_q, GN_GPW, GN_LY * cols);
  const int lid = ly * GN_LX + lx;
  if (lid < GN_GPW) {
    const int first = lid * GN_LY * cols;
    const float na = l_n[first], ma = l_m[first], qa = l_q[first];
    const int wx = get_group_id(0);
    const int g = xb > 1 ? wx / xb : wx * GN_GPW + lid;
    const int P = get_num_groups(1) * xb;
    const int p = get_group_id(1) * xb + (xb > 1 ? wx % xb : 0);
    partial[((long)n * groups + g) * P + p] = (float4)(na, ma, qa, 0.0f);
  }
}

// Merges the P partials of each of the work-group's GN_GPW groups into
// l_st (mean, rstd): GN_LX * GN_LY / GN_GPW work-items per group each merge
// every such-th partial, then a tree merges theirs. A uniform call.
inline void gn_stage_groups(__local float2* l_st, __local float* l_n, __local float* l_m,
                            __local float* l_q, __global const float4* partial, int first_group,
                            int P, float eps) {
  const int lid = get_local_id(1) * GN_LX + get_local_id(0);
  const int per = GN_LX * GN_LY / GN_GPW;
  const int j = lid / per, k = lid - j * per;
  float na = 0.0f, ma = 0.0f, qa = 0.0f;
  if (j < GN_GPW) {
    __global const float4* src = partial + (long)(first_group + j) * P;
    for (int p = k; p < P; p += per) {
      const float4 v = src[p];
      gn_merge(&na, &ma, &qa, v.x, v.y, v.z);
    }
  }
  gn_put(l_n, l_m, l_q, lid, na, ma, qa);
  barrier(CLK_LOCAL_MEM_FENCE);
  gn_tree_merge(l_n, l_m, l_q, GN_GPW, per);
  if (lid < GN_GPW) {
    const int first = lid * per;
    const float nn = l_n[first], q = l_q[first];
    l_st[lid] = (float2)(l_m[first], rsqrt((nn > 0.0f ? q / nn : 0.0f) + eps));
  }
  barrier(CLK_LOCAL_MEM_FENCE);
}

__kernel void gn_apply_cols(__global const DL_T* x, __global const float4* partial,
                            __global const DL_T* gamma, __global const DL_T* beta,
                            __global DL_T* y, int S, int C, int cg, int groups, int xb,
                            int P, int silu, float eps) {
  __local float l_n[GN_LX * GN_LY];
  __local float l_m[GN_LX * GN_LY];
  __local float l_q[GN_LX * GN_LY];
  __local float2 l_st[GN_GPW];
  const int wx = get_group_id(0), n = get_global_id(2);
  const int first_group = n * groups + (xb > 1 ? wx / xb : wx * GN_GPW);
  gn_stage_groups(l_st, l_n, l_m, l_q, partial, first_group, P, eps);
  const int c = get_global_id(0) * GN_VW;
  const float2 st = l_st[get_local_id(0) / (GN_LX / GN_GPW)];
  const GN_VEC scale = st.y * GN_LOAD(gamma, c);
  const GN_VEC shift = GN_LOAD(beta, c) - st.x * scale;
  const int R = get_global_size(1);
  const long base = (long)n * S * C + c;
  __global const DL_T* xc = x + base;
  __global DL_T* yc = y + base;
  for (int s = get_global_id(1); s < S; s += GN_COLS_UNROLL * R) {
    GN_VEC v[GN_COLS_UNROLL];
#pragma unroll
    for (int u = 0; u < GN_COLS_UNROLL; ++u) {
      v[u] = s + u * R < S ? GN_LOAD(xc, (long)(s + u * R) * C) : (GN_VEC)0.0f;
    }
#pragma unroll
    for (int u = 0; u < GN_COLS_UNROLL; ++u) {
      const GN_VEC r = v[u] * scale + shift;
      if (s + u * R < S) GN_STORE(yc, (long)(s + u * R) * C, silu ? r / (1.0f + exp(-r)) : r);
    }
  }
}

#endif  // GN_COOP

// ---------------------------------------------------------------------------
// The one-kernel plan.
// Global size (GN_WG * groups, N), local size (GN_WG, 1): work-group (g, n)
// normalises group g of sample n. Pass 1 reduces it (gn_item_stats: shifted
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

// ---------------------------------------------------------------------------
// The rows plan: a LayerNorm as GroupNorm (S = 1, one group: a sample is one
// row of C channels, C % 4 == 0). A work-group of GN_LX x GN_LY items
// normalises GN_LY rows; item (lx, ly) of row n = group * GN_LY + ly holds its
// float4 columns lx, lx + GN_LX, ... (at most GN_RV) in registers, the row's
// items add their shifted sums in a tree in local memory (GN_LX a power of
// two), then write. Rows past N (the last work-group) load row N - 1 and
// store nothing. One row a work-group (the cooperative plan's shape here)
// left [8192, 320] at ~40% of a copy: 8192 work-groups of 80 items.
// Global size (GN_LX, GN_LY * ceil(N / GN_LY)), local size (GN_LX, GN_LY);
// built with GN_VW = 4.
#ifndef GN_RV
#define GN_RV 1
#endif
__kernel void gn_rows(__global const DL_T* x, __global const DL_T* gamma,
                      __global const DL_T* beta, __global DL_T* y, int N, int C, int silu,
                      float eps) {
  __local float2 l_sum[GN_LX * GN_LY];
  const int lx = get_local_id(0), ly = get_local_id(1), n = get_global_id(1);
  const int cv = C / 4, at = ly * GN_LX;
  const long row = (long)min(n, N - 1) * C;
  const float shift = DL_LOAD(x, row);
  GN_VEC v[GN_RV], s1 = 0.0f, s2 = 0.0f;
#pragma unroll
  for (int i = 0; i < GN_RV; ++i) {
    const int c = lx + i * GN_LX;
    v[i] = c < cv ? GN_LOAD(x, row + 4 * c) : (GN_VEC)shift;
    const GN_VEC d = v[i] - shift;
    s1 += d;
    s2 += d * d;
  }
  l_sum[at + lx] = (float2)(GN_HSUM(s1), GN_HSUM(s2));
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int h = GN_LX / 2; h > 0; h >>= 1) {
    if (lx < h) l_sum[at + lx] += l_sum[at + lx + h];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float inv = 1.0f / (float)C;
  const float dm = l_sum[at].x * inv;
  const float rstd = rsqrt(fmax(l_sum[at].y * inv - dm * dm, 0.0f) + eps);
  const float mean = shift + dm;
  if (n >= N) return;
#pragma unroll
  for (int i = 0; i < GN_RV; ++i) {
    const int c = lx + i * GN_LX;
    if (c >= cv) break;
    const GN_VEC scale = rstd * GN_LOAD(gamma, 4 * c);
    const GN_VEC o = v[i] * scale + (GN_LOAD(beta, 4 * c) - mean * scale);
    GN_STORE(y, row + 4 * c, silu ? o / (1.0f + exp(-o)) : o);
  }
}

// ---------------------------------------------------------------------------
// The cooperative plan: one kernel, one read of x from memory, one write of y.
// Column blocks: a block is GN_GPW whole groups (a row's stretch of whole
// 32-byte sectors where it can), GN_LX vector columns of GN_VW channels
// (GN_VW divides the block's GN_GPW * cg channels, not necessarily cg: the
// lanes of a vector may belong to two groups, so sums are kept per lane and
// gathered per group by channel). A work-item owns one column (its gamma and
// beta) and walks rows. The K work-groups of (sample n, block b) each take
// `rows` consecutive rows (a slice) in chunks of GN_ITEMS rows per work-item
// (GN_ITEMS * GN_LY rows a chunk), sum it per group (shifted sums: of x - shift
// and of its square; the shift is the group's first element, the same in
// every slice, so partials add), publish the sums, wait for the K - 1
// others', add the K partials (a tree, the same in every work-group) and
// write the slice: the last
// chunk from registers, any earlier ones read again (from cache; the host
// keeps a slice to a few chunks).
// Global size (GN_LX * K * blocks, GN_LY, N), local size (GN_LX, GN_LY, 1).
// partial[((n * groups + g) * K + k) * 2 + {0, 1}]: the two sums of group g
// over slice k, each a 64-bit word with the launch's tag in its upper half.
// One aligned 64-bit store carries a value and its tag together, so a reader
// needs no ordering between separate stores (NVIDIA compiles
// mem_fence(CLK_GLOBAL_MEM_FENCE) to a work-group-scope membar.cta), and a tag
// never seen before (the host counts launches, never 0, the buffer starts
// zeroed) cannot match a stale word.
// Waiting needs the siblings to run alongside; GPUs dispatch work-groups in
// index order, so siblings (adjacent indices) are resident together. Nothing
// in OpenCL promises that, hence a bound: after spin_limit polls a work-group
// computes the missing slices' sums itself from x (same sums, same order).

#ifndef GN_ITEMS
#define GN_ITEMS 4
#endif
#ifndef GN_PARTS
#define GN_PARTS (2 * GN_LX * GN_LY)  // GN_GPW * K: the slice sums a work-group gathers
#endif
#define GN_GATHER ((GN_PARTS + GN_LX * GN_LY - 1) / (GN_LX * GN_LY))  // per work-item
#if GN_VW == 4
#define GN_FROM_LANES(a) vload4(0, a)
#elif GN_VW == 2
#define GN_FROM_LANES(a) vload2(0, a)
#else
#define GN_FROM_LANES(a) ((a)[0])
#endif

// Rows of slice k: [k * rows, min(S, (k + 1) * rows)).
inline int gn_slice_rows(int k, int rows, int S) { return clamp(S - k * rows, 0, rows); }

// Loads this work-item's rows of chunk `chunk` of a slice (xs: its column at
// the slice's first row; rows (chunk * GN_ITEMS + i) * GN_LY + ly, those past
// nrows as the shift) into v and adds their shifted sums to *s1, *s2.
inline void gn_chunk_load(__global const DL_T* xs, int chunk, int nrows, int C, GN_VEC shift,
                          GN_VEC* v, GN_VEC* s1, GN_VEC* s2) {
  const int ly = get_local_id(1);
#pragma unroll
  for (int i = 0; i < GN_ITEMS; ++i) {
    const int r = (chunk * GN_ITEMS + i) * GN_LY + ly;
    v[i] = r < nrows ? GN_LOAD(xs, (long)r * C) : shift;
  }
#pragma unroll
  for (int i = 0; i < GN_ITEMS; ++i) {
    const GN_VEC d = v[i] - shift;
    *s1 += d;
    *s2 += d * d;
  }
}

// Writes act(v * scale + offset) for the rows of gn_chunk_load's chunk.
inline void gn_chunk_store(__global DL_T* ys, int chunk, int nrows, int C, const GN_VEC* v,
                           GN_VEC scale, GN_VEC offset, int silu) {
  const int ly = get_local_id(1);
#pragma unroll
  for (int i = 0; i < GN_ITEMS; ++i) {
    const int r = (chunk * GN_ITEMS + i) * GN_LY + ly;
    const GN_VEC o = v[i] * scale + offset;
    if (r < nrows) GN_STORE(ys, (long)r * C, silu ? o / (1.0f + exp(-o)) : o);
  }
}

// This work-item's shifted sums over a whole slice, in gn_chunk_load's order
// (so the same sums), one row in registers at a time (the fallback:
// registers stay free for the work-group's own last chunk).
inline void gn_slice_sums(__global const DL_T* xs, int nrows, int C, GN_VEC shift, GN_VEC* s1,
                          GN_VEC* s2) {
  *s1 = 0.0f;
  *s2 = 0.0f;
  for (int r = get_local_id(1); r < nrows; r += GN_LY) {
    const GN_VEC d = GN_LOAD(xs, (long)r * C) - shift;
    *s1 += d;
    *s2 += d * d;
  }
}

// The block's sums per group of every work-item's lane sums, into
// l_grp[0 .. GN_GPW). One group a block: a tree over all work-items. Else a
// tree down the rows of each column, then each group's cg channels in order
// (a vector's lanes may belong to two groups). A uniform call.
inline void gn_block_sums(__local GN_VEC* l_s1, __local GN_VEC* l_s2, __local float2* l_grp,
                          GN_VEC s1, GN_VEC s2, int cg) {
  const int lx = get_local_id(0), ly = get_local_id(1), lid = ly * GN_LX + lx;
  barrier(CLK_LOCAL_MEM_FENCE);  // earlier readers of l_s1 / l_s2 / l_grp are done
  l_s1[lid] = s1;
  l_s2[lid] = s2;
  barrier(CLK_LOCAL_MEM_FENCE);
#if GN_GPW == 1
  const int n = GN_LX * GN_LY, at = lid;
  const int step = 1;
#else
  const int n = GN_LY, at = ly;
  const int step = GN_LX;
#endif
  int h = 1;
  while (h < n) h <<= 1;
  for (h >>= 1; h > 0; h >>= 1) {
    if (at < h && at + h < n) {
      l_s1[lid] += l_s1[lid + h * step];
      l_s2[lid] += l_s2[lid + h * step];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
#if GN_GPW == 1
  if (lid == 0) l_grp[0] = (float2)(GN_HSUM(l_s1[0]), GN_HSUM(l_s2[0]));
#else
  // Row 0 as channels: lane l of column c is channel c * GN_VW + l.
  __local const float* c1 = (__local const float*)l_s1;
  __local const float* c2 = (__local const float*)l_s2;
  for (int j = lid; j < GN_GPW; j += GN_LX * GN_LY) {
    float2 t = 0.0f;
    for (int ch = j * cg; ch < (j + 1) * cg; ++ch) t += (float2)(c1[ch], c2[ch]);
    l_grp[j] = t;
  }
#endif
  barrier(CLK_LOCAL_MEM_FENCE);
}

inline ulong gn_tagged(float v, uint tag) { return ((ulong)tag << 32) | as_uint(v); }

inline int gn_has_tag(ulong word, uint tag) { return (uint)(word >> 32) == tag; }

// Entry i (< GN_GATHER) of a work-item's gather: entry lid + i * (work-group
// size), when it is another slice's ((group j, slice kk) = (e / K, e % K)).
inline int gn_gathers(int i, int k, int K, int* e) {
  *e = get_local_id(1) * GN_LX + get_local_id(0) + i * GN_LX * GN_LY;
  return *e < GN_GPW * K && *e % K != k;
}

// Gathers the siblings' sums into l_part[(group j) * K + slice kk]: a
// work-item's GN_GATHER entries are read together (one wait for all, not
// one per entry), then re-read until all carry `tag` or spin_limit polls
// pass; sets *l_ok to 0 when one did not arrive (its entry is left unset).
// Its own slice's entries come from l_grp.
inline void gn_gather(__local float2* l_grp, __local float2* l_part, __local int* l_ok,
                      volatile __global const ulong* partial, int k, int K, uint tag,
                      int spin_limit) {
  ulong w[2 * GN_GATHER];
  int e[GN_GATHER], want[GN_GATHER];
#pragma unroll
  for (int i = 0; i < GN_GATHER; ++i) {
    want[i] = gn_gathers(i, k, K, &e[i]);
    const int at = 2 * e[i];  // entry e's two words
    w[2 * i] = want[i] ? partial[at] : 0;
    w[2 * i + 1] = want[i] ? partial[at + 1] : 0;
    if (e[i] < GN_GPW * K && !want[i]) l_part[e[i]] = l_grp[e[i] / K];
  }
  int missing = 0;
  for (int spin = 0;; ++spin) {
    missing = 0;
#pragma unroll
    for (int i = 0; i < GN_GATHER; ++i) {
      if (!want[i] || (gn_has_tag(w[2 * i], tag) && gn_has_tag(w[2 * i + 1], tag))) continue;
      missing = 1;
      if (spin < spin_limit) {
        const int at = 2 * e[i];
        w[2 * i] = partial[at];
        w[2 * i + 1] = partial[at + 1];
      }
    }
    if (!missing || spin >= spin_limit) break;
  }
  if (missing) *l_ok = 0;
#pragma unroll
  for (int i = 0; i < GN_GATHER; ++i) {
    if (want[i]) l_part[e[i]] = (float2)(as_float((uint)w[2 * i]), as_float((uint)w[2 * i + 1]));
  }
}

// Adds each group's K slice sums l_part[j * K ..] into its first entry, in a
// tree (the same order in every work-group of the block, so all get the
// same totals; a chain of K local-memory adds would serialise). A uniform
// call.
inline void gn_add_slices(__local float2* l_part, int K) {
  const int lid = get_local_id(1) * GN_LX + get_local_id(0);
  for (int h = K; h > 1;) {
    const int upper = (h + 1) / 2, pairs = h - upper;  // entries [upper, h) add down
    for (int t = lid; t < GN_GPW * pairs; t += GN_LX * GN_LY) {
      const int j = t / pairs, a = j * K + (t - j * pairs);
      l_part[a] += l_part[a + upper];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    h = upper;
  }
}

// Turns l_grp's sums of this slice into each group's sums over its K slices,
// in l_grp: publishes them (partial: the block's words), gathers the
// siblings' or, where one did not arrive within spin_limit polls, computes
// every slice's from x (xc: this work-item's column at row 0): the same sums
// in the same order, so the same totals. Every work-group reads all K
// partials of its groups (K^2 word pairs a group in all); one work-group a
// block gathering them and publishing the totals reads 2K, but its extra
// round trip cost ~1 us more at every SD 1.5 shape (H100, 2026-11).
// *l_ok is 1 on entry. A uniform call.
inline void gn_exchange(__local GN_VEC* l_s1, __local GN_VEC* l_s2, __local float2* l_grp,
                        __local float2* l_part, __local int* l_ok, __global ulong* partial,
                        __global const DL_T* xc, GN_VEC shift, int k, int K, int rows, int S,
                        int C, int cg, uint tag, int spin_limit) {
  const int lid = get_local_id(1) * GN_LX + get_local_id(0);
  for (int j = lid; j < GN_GPW; j += GN_LX * GN_LY) {
    partial[(j * K + k) * 2] = gn_tagged(l_grp[j].x, tag);
    partial[(j * K + k) * 2 + 1] = gn_tagged(l_grp[j].y, tag);
  }
  gn_gather(l_grp, l_part, l_ok, partial, k, K, tag, spin_limit);
  barrier(CLK_LOCAL_MEM_FENCE);
  if (!*l_ok) {  // every slice's sums (its own again: one loop, no skipped barriers)
    for (int kk = 0; kk < K; ++kk) {
      GN_VEC s1, s2;
      gn_slice_sums(xc + (long)kk * rows * C, gn_slice_rows(kk, rows, S), C, shift, &s1, &s2);
      gn_block_sums(l_s1, l_s2, l_grp, s1, s2, cg);
      for (int j = lid; j < GN_GPW; j += GN_LX * GN_LY) l_part[j * K + kk] = l_grp[j];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  gn_add_slices(l_part, K);
  for (int j = lid; j < GN_GPW; j += GN_LX * GN_LY) l_grp[j] = l_part[j * K];
  barrier(CLK_LOCAL_MEM_FENCE);
}

__kernel void gn_coop(__global const DL_T* x, __global const DL_T* gamma,
                      __global const DL_T* beta, __global DL_T* y, __global ulong* partial,
                      int S, int C, int cg, int groups, int K, int rows, int silu, float eps,
                      uint tag, int spin_limit) {
  __local GN_VEC l_s1[GN_LX * GN_LY];
  __local GN_VEC l_s2[GN_LX * GN_LY];
  __local float2 l_part[GN_PARTS];  // [j * K + kk]
  __local float2 l_grp[GN_GPW];
  __local int l_ok;
  const int lid = get_local_id(1) * GN_LX + get_local_id(0);
  const int b = get_group_id(0) / K, k = get_group_id(0) - b * K, n = get_global_id(2);
  const int first = b * GN_GPW;  // the block's first group
  const int cb = get_local_id(0) * GN_VW;  // this work-item's first channel in the block
  const long sample = (long)n * S * C;
  if (lid == 0) l_ok = 1;  // (gn_block_sums' barriers publish it)
  // Everything but the slice is read up front, so that no load waits on the
  // exchange: the shift per lane (its group's first element) and the lane's
  // gamma and beta.
  float lanes[GN_VW];
  for (int l = 0; l < GN_VW; ++l) lanes[l] = DL_LOAD(x, sample + (first + (cb + l) / cg) * cg);
  const GN_VEC shift = GN_FROM_LANES(lanes);
  const GN_VEC gam = GN_LOAD(gamma, first * cg + cb), bet = GN_LOAD(beta, first * cg + cb);
  __global const DL_T* xc = x + sample + first * cg + cb;
  const long slice = (long)k * rows * C;
  const int nrows = gn_slice_rows(k, rows, S);
  const int last = (nrows - 1) / (GN_ITEMS * GN_LY);  // the last chunk

  GN_VEC v[GN_ITEMS], s1 = 0.0f, s2 = 0.0f;
  for (int chunk = 0; chunk <= last; ++chunk) {
    gn_chunk_load(xc + slice, chunk, nrows, C, shift, v, &s1, &s2);
  }
  gn_block_sums(l_s1, l_s2, l_grp, s1, s2, cg);
  if (K > 1) {
    gn_exchange(l_s1, l_s2, l_grp, l_part, &l_ok, partial + ((long)n * groups + first) * K * 2,
                xc, shift, k, K, rows, S, C, cg, tag, spin_limit);
  }
  float dmean[GN_VW], rstd[GN_VW];  // per lane: its group's mean - shift, 1 / std
  const float inv = 1.0f / (float)(S * cg);
  for (int l = 0; l < GN_VW; ++l) {
    const float2 t = l_grp[(cb + l) / cg];
    dmean[l] = t.x * inv;
    rstd[l] = rsqrt(fmax(t.y * inv - dmean[l] * dmean[l], 0.0f) + eps);
  }
  const GN_VEC scale = GN_FROM_LANES(rstd) * gam;
  const GN_VEC offset = bet - (shift + GN_FROM_LANES(dmean)) * scale;
  __global DL_T* ys = y + sample + first * cg + cb + slice;
  gn_chunk_store(ys, last, nrows, C, v, scale, offset, silu);  // from registers
  for (int chunk = 0; chunk < last; ++chunk) {  // read again
    gn_chunk_load(xc + slice, chunk, nrows, C, shift, v, &s1, &s2);  // (sums unused)
    gn_chunk_store(ys, chunk, nrows, C, v, scale, offset, silu);
  }
}
