// The GELU forms shared by difflite.Gelu (gelu.cl) and difflite.GeGLU (geglu.cl), included by
// both (the runtime resolves `#include "NAME.cl"` from the embedded sources).
// mode: 0 erf, 1 tanh, 2 sigmoid (x * sigmoid(1.702 x), CLIP's quick GELU).
// Storage type DL_T (float or half), DL_T4 its 4-vector; math in float.
#include "dl_storage.cl"

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
