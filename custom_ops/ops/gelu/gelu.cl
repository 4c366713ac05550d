// difflite.Gelu on the GPU: y = gelu(x), elementwise over any shape; one read
// of x and one write of y. Each work-item handles 4 consecutive elements, a
// vector at an aligned offset (the last one takes the tail element by element).
// mode and storage: gelu_math.cl.
#include "gelu_math.cl"

// Global size >= ceil(count / 4).
__kernel void gelu(__global const DL_T* x, __global DL_T* y, int count, int mode) {
  const int i = get_global_id(0) << 2;
  if (i + 4 <= count) {
    DL_STORE4A(y, i, dl_gelu4(DL_LOAD4A(x, i), mode));
  } else {
    for (int j = i; j < count; ++j) DL_STORE(y, j, dl_gelu(DL_LOAD(x, j), mode));
  }
}
