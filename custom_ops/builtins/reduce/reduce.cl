// Reductions (MEAN, SUM, REDUCE_MAX/MIN/PROD) over any set of axes. The
// host collapses the kept dims (`od`, input strides `os`; the output is
// dense in that order) and the reduced dims (`rd`, input strides `rs`).
// reduce_serial: one work-item per output; reduce_wg: one work-group of
// RD_WG items per output with a tree in local memory. Accumulates in float;
// the result is multiplied by `scale` (1/count for MEAN).
#include "dl_storage.cl"
#ifndef RD_WG
#define RD_WG 64
#endif
#define R_SUM 0
#define R_MAX 1
#define R_MIN 2
#define R_PROD 3

inline float r_init(int op) {
  return op == R_MAX ? -INFINITY : (op == R_MIN ? INFINITY : (op == R_PROD ? 1.0f : 0.0f));
}

inline float r_combine(float a, float b, int op) {
  return op == R_MAX ? fmax(a, b) : (op == R_MIN ? fmin(a, b) : (op == R_PROD ? a * b : a + b));
}

inline int offset_of(int i, int rank, const int* dims, const int* str) {
  int off = 0;
  for (int k = 7; k >= 0; --k) {
    if (k < rank) {
      const int q = i / dims[k];
      off += (i - q * dims[k]) * str[k];
      i = q;
    }
  }
  return off;
}

#define UNPACK(v, a) const int a[8] = {v.s0, v.s1, v.s2, v.s3, v.s4, v.s5, v.s6, v.s7}
// The output's and the reduced axes' dims and strides as arrays, and output o's first input
// element: both kernels start so.
#define REDUCE_INDEXING(o)   \
  UNPACK(od_v, od);          \
  UNPACK(os_v, os);          \
  UNPACK(rd_v, rd);          \
  UNPACK(rs_v, rs);          \
  const int base = offset_of(o, orank, od, os)

// Sums a contiguous run of n values with float16 vectors (a scalar tail).
inline float sum_run(__global const DL_T* p, int n) {
  float16 v = (float16)(0.0f);
  const int nv = n & ~15;
  for (int i = 0; i < nv; i += 16) v += DL_LOAD16(p, i);
  const float8 a = v.lo + v.hi;
  const float4 b = a.lo + a.hi;
  const float2 c = b.lo + b.hi;
  float s = c.x + c.y;
  for (int i = nv; i < n; ++i) s += DL_LOAD(p, i);
  return s;
}

__kernel void reduce_serial(__global const DL_T* x, __global DL_T* y, int n_out, int count,
                            int orank, int8 od_v, int8 os_v, int rrank, int8 rd_v, int8 rs_v,
                            int op, float scale) {
  const int o = get_global_id(0);
  if (o >= n_out) return;
  REDUCE_INDEXING(o);
  float acc = r_init(op);
  if (op == R_SUM && rrank <= 2 && rs[rrank - 1] == 1) {
    // The common case (last-axis or GroupNorm-style sums): contiguous runs.
    const int inner = rd[rrank - 1];
    const int outer = rrank == 2 ? rd[0] : 1;
    const int step = rrank == 2 ? rs[0] : 0;
    for (int r = 0; r < outer; ++r) acc += sum_run(x + base + r * step, inner);
  } else if (rrank == 1) {
    const int s = rs[0];
    for (int r = 0; r < count; ++r) acc = r_combine(acc, DL_LOAD(x, base + r * s), op);
  } else if (rrank == 2) {
    for (int r0 = 0; r0 < rd[0]; ++r0) {
      for (int r1 = 0; r1 < rd[1]; ++r1) {
        acc = r_combine(acc, DL_LOAD(x, base + r0 * rs[0] + r1 * rs[1]), op);
      }
    }
  } else {
    for (int r = 0; r < count; ++r) {
      acc = r_combine(acc, DL_LOAD(x, base + offset_of(r, rrank, rd, rs)), op);
    }
  }
  DL_STORE(y, o, (acc * scale));
}

__kernel __attribute__((reqd_work_group_size(RD_WG, 1, 1)))
void reduce_wg(__global const DL_T* x, __global DL_T* y, int n_out, int count, int orank,
               int8 od_v, int8 os_v, int rrank, int8 rd_v, int8 rs_v, int op, float scale) {
  __local float red[RD_WG];
  const int o = get_group_id(0);
  const int lid = get_local_id(0);
  REDUCE_INDEXING(o);
  float acc = r_init(op);
  if (rrank == 1) {
    const int s = rs[0];
    for (int r = lid; r < count; r += RD_WG) acc = r_combine(acc, DL_LOAD(x, base + r * s), op);
  } else {
    for (int r = lid; r < count; r += RD_WG) {
      acc = r_combine(acc, DL_LOAD(x, base + offset_of(r, rrank, rd, rs)), op);
    }
  }
  red[lid] = acc;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = RD_WG / 2; s > 0; s >>= 1) {
    if (lid < s) red[lid] = r_combine(red[lid], red[lid + s], op);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (lid == 0 && o < n_out) DL_STORE(y, o, (red[0] * scale));
}
