// GATHER along one axis (batch_dims 0): out[o, j, k] = params[o, idx[j], k]
// with o over the dims before the axis, j over the indices, k over the dims
// after it. Out-of-range indices give 0. COPY_T: the element's bit type.
// gather_q8: params is a quantized int8 constant (a folded DEQUANTIZE: an embedding table kept
// int8 on the device), element e worth params[e] * scale[e / group].
#include "dl_storage.cl"
#ifndef COPY_T
#define COPY_T uint
#endif

__kernel void gather(__global const COPY_T* params, __global const int* idx,
                     __global COPY_T* out, int n, int n_idx, int axis_dim, int inner) {
  const int i = get_global_id(0);
  if (i >= n) return;
  const int t = i / inner;
  const int k = i - t * inner;
  const int o = t / n_idx;
  const int j = t - o * n_idx;
  const int ix = idx[j];
  out[i] = (ix >= 0 && ix < axis_dim) ? params[(o * axis_dim + ix) * inner + k] : (COPY_T)0;
}

__kernel void gather_q8(__global const char* params, __global const float* scale, int group,
                        __global const int* idx, __global DL_T* out, int n, int n_idx,
                        int axis_dim, int inner) {
  const int i = get_global_id(0);
  if (i >= n) return;
  const int t = i / inner;
  const int k = i - t * inner;
  const int o = t / n_idx;
  const int j = t - o * n_idx;
  const int ix = idx[j];
  float v = 0.0f;
  if (ix >= 0 && ix < axis_dim) {
    const int e = (o * axis_dim + ix) * inner + k;
    v = (float)params[e] * scale[e / group];
  }
  DL_STORE(out, i, v);
}
