// GATHER along one axis (batch_dims 0): out[o, j, k] = params[o, idx[j], k]
// with o over the dims before the axis, j over the indices, k over the dims
// after it. Out-of-range indices give 0. COPY_T: the element's bit type.
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
