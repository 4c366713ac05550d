// GATHER along one axis (batch_dims 0): out[o, j, k] = params[o, idx[j], k]
// with o over the dims before the axis, j over the indices, k over the dims
// after it. Out-of-range indices give 0. COPY_T: the element's bit type.
// gather_q8: params is a quantized int8 constant (a folded DEQUANTIZE: an embedding table kept
// int8 on the device), element e worth params[e] * scale[e / group].
#include "dl_storage.cl"
#ifndef COPY_T
#define COPY_T uint
#endif

// The params element that output element i copies, or -1 where its index is out of range.
inline int gather_source(int i, __global const int* idx, int n_idx, int axis_dim, int inner) {
  const int t = i / inner;
  const int k = i - t * inner;
  const int o = t / n_idx;
  const int j = t - o * n_idx;
  const int ix = idx[j];
  return (ix >= 0 && ix < axis_dim) ? (o * axis_dim + ix) * inner + k : -1;
}

__kernel void gather(__global const COPY_T* params, __global const int* idx,
                     __global COPY_T* out, int n, int n_idx, int axis_dim, int inner) {
  const int i = get_global_id(0);
  if (i >= n) return;
  const int e = gather_source(i, idx, n_idx, axis_dim, inner);
  out[i] = e >= 0 ? params[e] : (COPY_T)0;
}

__kernel void gather_q8(__global const char* params, __global const float* scale, int group,
                        __global const int* idx, __global DL_T* out, int n, int n_idx,
                        int axis_dim, int inner) {
  const int i = get_global_id(0);
  if (i >= n) return;
  const int e = gather_source(i, idx, n_idx, axis_dim, inner);
  DL_STORE(out, i, e >= 0 ? (float)params[e] * scale[e / group] : 0.0f);
}
