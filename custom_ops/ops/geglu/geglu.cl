// difflite.GeGLU on the GPU: x [rows, 2D] -> y [rows, D] = x[:, :D] * gelu(x[:, D:]).
// One kernel: reads both halves once, writes y once. One work-item per 4
// consecutive outputs of one row (vload4/vstore4; the row's last work-item
// takes the tail element by element, so D need not be a multiple of 4).
// mode: 0 erf, 1 tanh, 2 sigmoid, as difflite.Gelu (gelu.cl; OpenCL programs
// cannot include each other here, so the three forms are repeated).
// Storage type DL_T (float or half), DL_T4 its 4-vector; math in float.
#if defined(cl_khr_fp16)
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
#endif
#ifndef DL_T
#define DL_T float
#endif
#ifndef DL_T4
#define DL_T4 float4
#endif
#define DL_CAT_(a, b) a##b
#define DL_CAT(a, b) DL_CAT_(a, b)
#define DL_LOAD4(p, i) convert_float4(vload4(0, (p) + (i)))
#define DL_STORE4(p, i, v) vstore4(DL_CAT(convert_, DL_T4)(v), 0, (p) + (i))

inline float dl_gelu(float x, int mode) {
  if (mode == 0) return 0.5f * x * (1.0f + erf(x * 0.70710678118654752f));
  if (mode == 1) {
    const float u = 0.79788456080286536f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanh(u));
  }
  return x / (1.0f + exp(-1.702f * x));
}

inline float4 dl_gelu4(float4 x, int mode) {
  if (mode == 0) return 0.5f * x * (1.0f + erf(x * 0.70710678118654752f));
  if (mode == 1) {
    const float4 u = 0.79788456080286536f * (x + 0.044715f * x * x * x);
    return 0.5f * x * (1.0f + tanh(u));
  }
  return x / (1.0f + exp(-1.702f * x));
}

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
      out[j] = (DL_T)((float)hidden[j] * dl_gelu((float)gate[j], mode));
    }
  }
}
