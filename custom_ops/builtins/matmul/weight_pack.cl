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

// A quantized [N][K] weight (dl_qweights.cl, -DDL_WQ=8|4) for the flat kernels: its integers
// widened to int8 and packed [K][NP] (columns i >= N zero), and its scales packed [KB][NP]:
// out[b][i] = s[i * kg + b], the scale of column i for k >> shift == b (float16 scales widened).
#include "dl_qweights.cl"
#if DL_WQ
__kernel void pack_transposed_q(DL_WQ_PTR w, __global char* out, int n, int k, int np) {
  const int i = get_global_id(0);
  const int j = get_global_id(1);
  if (i >= np || j >= k) return;
  const int e = i * k + j;
  out[(size_t)j * np + i] = i < n ? (char)DL_WQ_FROM_RAW(DL_WQ_LOAD_RAW(w, e), e) : (char)0;
}

__kernel void pack_scales(DL_WQ_SCALE_PTR wq_scale, __global float* out, int n, int kg, int np,
                          int blocks) {
  const int i = get_global_id(0);
  const int b = get_global_id(1);
  if (i >= np || b >= blocks) return;
  out[(size_t)b * np + i] = i < n ? DL_WQ_SCALE_AT(i * kg + b) : 0.0f;
}
#endif
