// Boundary conversions between the interpreter's float32 / float16 tensors and the storage type
// (where the two differ: float32 tensors in half storage, float16 ones in float storage).
#include "dl_storage.cl"
__kernel void f32_to_storage(__global const float* src, __global DL_T* dst, int n) {
  const int i = get_global_id(0);
  if (i < n) DL_STORE(dst, i, src[i]);
}

__kernel void storage_to_f32(__global const DL_T* src, __global float* dst, int n) {
  const int i = get_global_id(0);
  if (i < n) dst[i] = DL_LOAD(src, i);
}

__kernel void f16_to_storage(__global const half* src, __global DL_T* dst, int n) {
  const int i = get_global_id(0);
  if (i < n) DL_STORE(dst, i, vload_half(i, src));
}

__kernel void storage_to_f16(__global const DL_T* src, __global half* dst, int n) {
  const int i = get_global_id(0);
  if (i < n) vstore_half(DL_LOAD(src, i), i, dst);
}
