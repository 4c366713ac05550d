// A constant [N][K] weight copied to [K][NP] for the flat kernels (see
// PackedWeight in gemm.h): out[j][i] = w[i][j], columns i >= N are zero.
// Made once on the device, in the storage type, bit-exact.
#include "dl_storage.cl"
__kernel void pack_transposed(__global const DL_T* w, __global DL_T* out, int n, int k, int np) {
  const int i = get_global_id(0);
  const int j = get_global_id(1);
  if (i >= np || j >= k) return;
  const float v = i < n ? DL_LOAD(w, (size_t)i * k + j) : 0.0f;
  DL_STORE(out, (size_t)j * np + i, v);
}
