// The three GELU forms of difflite.Gelu / difflite.GeGLU, the parser of
// their `approximate` values, and what else the two ops share. Shared by ops/gelu and ops/geglu.
#ifndef DIFFLITE_OPS_GELU_MATH_H_
#define DIFFLITE_OPS_GELU_MATH_H_

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "difflite/attrs.h"
#include "difflite/op_api.h"

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

// The OpInstance of a GELU-family op: its mode, read from its one attribute (`attribute`, as
// the op folder spells it); the GPU sides read mode().
class ModeOp : public OpInstance {
 public:
  ModeOp(Mode m, const char* attribute) : mode_(m), attribute_(attribute) {}
  Mode mode() const { return mode_; }
  std::string Describe() const override {
    return std::string(attribute_) + "=" + ModeName(mode_);
  }

 protected:
  // The one input both take: x, float32, of positive dims ("" or why not).
  static std::string ExpectX(const std::vector<TensorInfo>& in) {
    std::string e = ExpectInputCount(in, 1);
    if (e.empty()) e = ExpectFloat32(in[0], "x");
    if (e.empty()) e = ExpectPositiveDims(in[0], "x");
    return e;
  }

  Mode mode_;
  const char* attribute_;
};

// The OpDef::create of a GELU-family op `Op` (constructed from a Mode), whose attribute is `key`.
template <typename Op>
std::unique_ptr<OpInstance> CreateModeOp(const AttrMap& attrs, const char* key,
                                         std::string* error) {
  Mode mode = Mode::kErf;
  *error = ReadModeAttribute(attrs, key, &mode);
  if (!error->empty()) return nullptr;
  return std::unique_ptr<OpInstance>(new Op(mode));
}

}  // namespace gelu
}  // namespace difflite

#endif  // DIFFLITE_OPS_GELU_MATH_H_
