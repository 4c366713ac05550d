// difflite.LoRA: its name, its attribute, the parsed op and its shape rules, shared by the CPU
// kernel (lora.cc) and the GPU side (lora_opencl.cc).
#ifndef DIFFLITE_OPS_LORA_H_
#define DIFFLITE_OPS_LORA_H_

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "difflite/lora_slots.h"
#include "difflite/op_api.h"

namespace difflite {
namespace lora {

constexpr const char* kOpName = "difflite.LoRA";

constexpr const char* kSlot = "slot";

// The layer one op runs: `rows` rows (the flattened leading dims) of K inputs and N outputs.
struct Layer {
  int64_t rows = 0;
  int k = 0;
  int n = 0;
};

// y [..., N] and x [..., K] (inputs 0 and 1) as Infer accepted them.
inline Layer LayerOf(const std::vector<TensorInfo>& in) {
  Layer l;
  l.n = in[0].shape.back();
  l.k = in[1].shape.back();
  l.rows = NumElements(in[0].shape) / l.n;
  return l;
}

// The OpInstance the op's Create returns: its slot, and the shape rules (Infer) both backends
// check; the GPU side reads slot().
class Parsed : public OpInstance {
 public:
  explicit Parsed(int slot) : slot_(slot) {}
  int slot() const { return slot_; }
  std::string Describe() const override { return std::string(kSlot) + "=" + std::to_string(slot_); }

  // y [..., N], x [..., K]: float32 (the GPU side sees float16 tensors as float32), the same rank
  // >= 2 and the same leading dims, every dim positive; the output is y's shape.
  std::string Infer(const std::vector<TensorInfo>& in, std::vector<TensorInfo>* out) const override {
    std::string e = ExpectInputCount(in, 2);
    if (e.empty()) e = ExpectFloat32(in[0], "y");
    if (e.empty()) e = ExpectFloat32(in[1], "x");
    if (e.empty()) e = ExpectPositiveDims(in[0], "y");
    if (e.empty()) e = ExpectPositiveDims(in[1], "x");
    if (!e.empty()) return e;
    const Shape& y = in[0].shape;
    const Shape& x = in[1].shape;
    if (y.size() < 2 || x.size() != y.size() || !std::equal(y.begin(), y.end() - 1, x.begin())) {
      return "y and x must be [..., N] and [..., K] over the same rows, got " + ShapeToString(y) +
             " and " + ShapeToString(x);
    }
    out->assign(1, TensorInfo{DType::kFloat32, y, nullptr});
    return "";
  }

 protected:
  int slot_;
};

}  // namespace lora
}  // namespace difflite

#endif  // DIFFLITE_OPS_LORA_H_
