// SOFTMAX over the last axis: y = exp(beta * (x - max)) / sum(...), computed
// in float. softmax_wg: one work-group of SM_WG items per row (long rows);
// softmax_rows: one work-item per row (short rows, many of them).
#include "dl_storage.cl"
#ifndef SM_WG
#define SM_WG 128
#endif

__kernel __attribute__((reqd_work_group_size(SM_WG, 1, 1)))
void softmax_wg(__global const DL_T* x, __global DL_T* y, int len, float beta) {
  __local float red[SM_WG];
  const int lid = get_local_id(0);
  const size_t base = (size_t)get_group_id(0) * (size_t)len;
  __global const DL_T* xr = x + base;
  __global DL_T* yr = y + base;
  float m = -INFINITY;
  for (int i = lid; i < len; i += SM_WG) m = fmax(m, DL_LOAD(xr, i));
  red[lid] = m;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = SM_WG / 2; s > 0; s >>= 1) {
    if (lid < s) red[lid] = fmax(red[lid], red[lid + s]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  m = red[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  float sum = 0.0f;
  for (int i = lid; i < len; i += SM_WG) sum += exp((DL_LOAD(xr, i) - m) * beta);
  red[lid] = sum;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = SM_WG / 2; s > 0; s >>= 1) {
    if (lid < s) red[lid] += red[lid + s];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float inv = 1.0f / red[0];
  for (int i = lid; i < len; i += SM_WG) DL_STORE(yr, i, (exp((DL_LOAD(xr, i) - m) * beta) * inv));
}

// One work-item per row, explicit float16 vectors along the row (a scalar
// tail): the form CPU-like devices vectorise.
inline float hmax16(float16 v) {
  const float8 a = fmax(v.lo, v.hi);
  const float4 b = fmax(a.lo, a.hi);
  const float2 c = fmax(b.lo, b.hi);
  return fmax(c.x, c.y);
}
inline float hsum16(float16 v) {
  const float8 a = v.lo + v.hi;
  const float4 b = a.lo + a.hi;
  const float2 c = b.lo + b.hi;
  return c.x + c.y;
}

__kernel void softmax_rows(__global const DL_T* x, __global DL_T* y, int rows, int len,
                           float beta) {
  const int r = get_global_id(0);
  if (r >= rows) return;
  __global const DL_T* xr = x + (size_t)r * (size_t)len;
  __global DL_T* yr = y + (size_t)r * (size_t)len;
#ifdef DL_HALF_IO
  // PoCL 3.1 compiles vload_half16 to an aligned vector load (a crash where a row of odd length
  // starts mid-vector): vectors only where every row starts on a 16-element boundary.
  const int lv = (len & 15) == 0 ? len : 0;
#else
  const int lv = len & ~15;
#endif
  float16 mv = (float16)(-INFINITY);
  for (int i = 0; i < lv; i += 16) mv = fmax(mv, DL_LOAD16(xr, i));
  float m = hmax16(mv);
  for (int i = lv; i < len; ++i) m = fmax(m, DL_LOAD(xr, i));
  float16 sv = (float16)(0.0f);
  for (int i = 0; i < lv; i += 16) sv += exp((DL_LOAD16(xr, i) - m) * beta);
  float sum = hsum16(sv);
  for (int i = lv; i < len; ++i) sum += exp((DL_LOAD(xr, i) - m) * beta);
  const float inv = 1.0f / sum;
  for (int i = 0; i < lv; i += 16) {
    DL_STORE16(yr, i, exp((DL_LOAD16(xr, i) - m) * beta) * inv);
  }
  for (int i = lv; i < len; ++i) DL_STORE(yr, i, (exp((DL_LOAD(xr, i) - m) * beta) * inv));
}
