// difflite.GeGLU on the GPU: x [rows, 2D] -> y [rows, D] = x[:, :D] * gelu(x[:, D:]).
// One kernel: reads both halves once, writes y once. One work-item per 4
// consecutive outputs of one row (vload4/vstore4; the row's last work-item
// takes the tail element by element, so D need not be a multiple of 4).
// mode: 0 erf, 1 tanh, 2 sigmoid, as difflite.Gelu (gelu_math.cl).
// Storage type DL_T (float or half), DL_T4 its 4-vector; math in float.
#include "gelu_math.cl"

// Global size >= rows * ceil(D / 4).
__kernel void geglu(__global const DL_T* x, __global DL_T* y, int rows, int D, int mode) {
  const int d4 = (D + 3) >> 2;
  const int i = get_global_id(0);
  if (i >= rows * d4) return;
  const int r = i / d4;
  const int c = (i - r * d4) << 2;
  __global const DL_T* hidden = x + (long)r * 2 * D;
  __global const DL_T* gate = hidden + D;
  __global DL_T* out = y + (long)r * D;
  if (c + 4 <= D) {
    DL_STORE4(out, c, DL_LOAD4(hidden, c) * dl_gelu4(DL_LOAD4(gate, c), mode));
  } else {
    for (int j = c; j < D; ++j) {
      DL_STORE(out, j, DL_LOAD(hidden, j) * dl_gelu(DL_LOAD(gate, j), mode));
    }
  }
}
