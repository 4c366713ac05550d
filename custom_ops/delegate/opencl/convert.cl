// Boundary conversions between the interpreter's float32 tensors and half
// storage (used only when the backend stores activations as half).
#include "dl_storage.cl"
__kernel void f32_to_storage(__global const float* src, __global DL_T* dst, int n) {
  const int i = get_global_id(0);
  if (i < n) DL_STORE(dst, i, src[i]);
}

__kernel void storage_to_f32(__global const DL_T* src, __global float* dst, int n) {
  const int i = get_global_id(0);
  if (i < n) dst[i] = DL_LOAD(src, i);
}
