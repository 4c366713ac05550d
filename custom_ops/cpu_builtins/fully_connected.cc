// FULLY_CONNECTED with a quantized weight on the CPU backend, TFLite's semantics: x [..., K]
// flattened to [M, K] (M = elements / K), y = act(x W^T + bias); y [M, N], or x's shape with its
// last dim N where keep_num_dims. Bias optional ([N] floats); activations none, RELU, RELU_N1_TO_1,
// RELU6; the default weights format only.
#include <limits>
#include <string>

#include "cpu_builtins.h"
#include "difflite/tflite_abi.h"

namespace difflite {
namespace cpu {

bool ActivationClamp(int activation, Clamp* clamp, std::string* why) {
  const float inf = std::numeric_limits<float>::infinity();
  switch (activation) {
    case tfl::kActNone: *clamp = {-inf, inf}; return true;
    case tfl::kActRelu: *clamp = {0.0f, inf}; return true;
    case tfl::kActReluN1To1: *clamp = {-1.0f, 1.0f}; return true;
    case tfl::kActRelu6: *clamp = {0.0f, 6.0f}; return true;
    default:
      *why = "fused activation " + std::to_string(activation) +
             " (none, RELU, RELU_N1_TO_1 and RELU6 are run)";
      return false;
  }
}

std::string CheckReaderInputs(const std::vector<TensorInfo>& in, const char* weight, int64_t outputs) {
  if (in.size() != 2 && in.size() != 3) {
    return "expects 2 or 3 inputs, got " + std::to_string(in.size());
  }
  std::string e = ExpectFloat32(in[0], "input");
  if (e.empty()) e = ExpectPositiveDims(in[0], "input");
  if (e.empty()) e = ExpectFloat32(in[1], weight);
  if (!e.empty() || in.size() != 3 || in[2].dtype == DType::kOther) return e;
  e = ExpectFloat32(in[2], "bias");
  if (e.empty() && NumElements(in[2].shape) != outputs) {
    e = "bias " + ShapeToString(in[2].shape) + " does not hold one value per output (" +
        std::to_string(outputs) + ")";
  }
  return e;
}

const char* ActivationName(int activation) {
  switch (activation) {
    case tfl::kActRelu: return "relu";
    case tfl::kActReluN1To1: return "relu_n1_to_1";
    case tfl::kActRelu6: return "relu6";
    default: return "none";
  }
}

namespace {

class QuantizedFullyConnected final : public OpInstance {
 public:
  QuantizedFullyConnected(const QuantWeight& w, int activation, Clamp clamp, bool keep_num_dims)
      : w_(w), activation_(activation), clamp_(clamp), keep_num_dims_(keep_num_dims) {}

  std::string Infer(const std::vector<TensorInfo>& in, std::vector<TensorInfo>* out) const override {
    std::string e = CheckReaderInputs(in, "weights", w_.n);
    if (!e.empty()) return e;
    if (in[1].shape != Shape{static_cast<int>(w_.n), static_cast<int>(w_.k)}) {
      return "weights " + ShapeToString(in[1].shape) + " are not the quantized [" +
             std::to_string(w_.n) + "," + std::to_string(w_.k) + "]";
    }
    const int64_t elements = NumElements(in[0].shape);
    Shape shape;
    if (keep_num_dims_) {
      if (in[0].shape.back() != w_.k) {
        return "input " + ShapeToString(in[0].shape) + " does not end in the weights' " +
               std::to_string(w_.k) + " (keep_num_dims)";
      }
      shape = in[0].shape;
      shape.back() = static_cast<int>(w_.n);
    } else {
      if (elements % w_.k != 0) {
        return "input " + ShapeToString(in[0].shape) + " is not a whole number of rows of " +
               std::to_string(w_.k);
      }
      shape = {static_cast<int>(elements / w_.k), static_cast<int>(w_.n)};
    }
    out->assign(1, TensorInfo{DType::kFloat32, shape, nullptr});
    return "";
  }

  std::string Run(const std::vector<InTensor>& in, const std::vector<OutTensor>& out,
                  const ExecOptions& exec) const override {
    GemmA a;
    a.x = static_cast<const float*>(in[0].data);
    a.m = NumElements(in[0].shape) / w_.k;
    const float* bias = in.size() == 3 && in[2].dtype == DType::kFloat32
                            ? static_cast<const float*>(in[2].data) : nullptr;
    if (a.x == nullptr || out[0].data == nullptr || (in.size() == 3 && in[2].dtype == DType::kFloat32 && bias == nullptr)) {
      return "a tensor has no data";
    }
    QuantizedGemm(w_, a, bias, clamp_, static_cast<float*>(out[0].data), exec.num_threads);
    return "";
  }

  std::string Describe() const override {
    return "weights=" + w_.Describe() + ", activation=" + ActivationName(activation_) +
           ", keep_num_dims=" + (keep_num_dims_ ? "true" : "false");
  }

 private:
  QuantWeight w_;
  int activation_;
  Clamp clamp_;
  bool keep_num_dims_;
};

std::unique_ptr<OpInstance> CreateQuantizedFullyConnected(const void* params, QuantWeight w,
                                                           const Shape& weights, std::string* why) {
  if (weights.size() != 2) {
    *why = "weights " + ShapeToString(weights) + " are not 2-D";
    return nullptr;
  }
  w.n = weights[0];
  w.k = weights[1];
  if (params == nullptr) {
    *why = "no parameters";
    return nullptr;
  }
  const auto* p = static_cast<const tfl::FullyConnectedParams*>(params);
  if (p->weights_format != 0) {
    *why = "weights format " + std::to_string(p->weights_format) + " (the default is run)";
    return nullptr;
  }
  Clamp clamp{};
  if (!ActivationClamp(p->activation, &clamp, why)) return nullptr;
  *why = w.Check();
  if (!why->empty()) return nullptr;
  return std::unique_ptr<OpInstance>(new QuantizedFullyConnected(w, p->activation, clamp, p->keep_num_dims));
}

const QuantizedOpDef kFullyConnectedOps[] = {
    {"FULLY_CONNECTED", 1, 2, 3, &CreateQuantizedFullyConnected},
};
DIFFLITE_REGISTER_OPS(kFullyConnectedOps);

}  // namespace

}  // namespace cpu
}  // namespace difflite
