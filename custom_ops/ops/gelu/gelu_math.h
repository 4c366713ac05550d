// The three GELU forms of difflite.Gelu / difflite.GeGLU, and the parser of
// their `approximate` values. Shared by ops/gelu and ops/geglu.
#ifndef DIFFLITE_OPS_GELU_MATH_H_
#define DIFFLITE_OPS_GELU_MATH_H_

#include <cmath>
#include <string>

#include "difflite/attrs.h"

namespace difflite {
namespace gelu {

enum class Mode { kErf, kTanh, kSigmoid };

// Parses an `approximate` value; returns false for anything else.
inline bool ParseMode(const std::string& s, Mode* mode) {
  if (s == "erf") {
    *mode = Mode::kErf;
  } else if (s == "tanh") {
    *mode = Mode::kTanh;
  } else if (s == "sigmoid") {
    *mode = Mode::kSigmoid;
  } else {
    return false;
  }
  return true;
}

inline const char* ModeName(Mode m) {
  switch (m) {
    case Mode::kErf: return "erf";
    case Mode::kTanh: return "tanh";
    default: return "sigmoid";
  }
}

// The `mode` argument of the OpenCL kernels (gelu.cl, geglu.cl).
inline int KernelMode(Mode m) {
  switch (m) {
    case Mode::kErf: return 0;
    case Mode::kTanh: return 1;
    default: return 2;
  }
}

// erf:     x * Phi(x) = 0.5 x (1 + erf(x / sqrt 2))
// tanh:    0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
// sigmoid: x * sigmoid(1.702 x)   (CLIP's quick GELU)
inline float Apply(Mode m, float x) {
  switch (m) {
    case Mode::kErf:
      return 0.5f * x * (1.0f + std::erf(x * 0.70710678118654752f));
    case Mode::kTanh: {
      const float inner = 0.79788456080286536f * (x + 0.044715f * x * x * x);
      return 0.5f * x * (1.0f + std::tanh(inner));
    }
    default:
      return x / (1.0f + std::exp(-1.702f * x));
  }
}

// Reads the single attribute of a GELU-family op (`key` names it; each op folder spells its own)
// into *mode. Returns "" or a one-line reason.
inline std::string ReadModeAttribute(const AttrMap& attrs, const char* key, Mode* mode) {
  std::string s;
  std::string e = attrs.CheckKnown({key});
  if (e.empty()) e = attrs.GetString(key, &s);
  if (e.empty() && !ParseMode(s, mode)) {
    e = std::string(key) + " must be \"erf\", \"tanh\" or \"sigmoid\", got \"" + s + "\"";
  }
  return e;
}

}  // namespace gelu
}  // namespace difflite

#endif  // DIFFLITE_OPS_GELU_MATH_H_
