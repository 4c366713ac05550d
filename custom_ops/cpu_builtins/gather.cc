// GATHER of the rows of a quantized table on the CPU backend (the int4 mix's token embedding: an
// int8 [V, D] table of per-tensor scale 1, its rows then multiplied by their gathered scales, a
// MUL left to TFLite). TFLite's semantics for axis 0 and batch_dims 0: params [V, ...] (read as
// the model stores it), int32 indices of any shape, output indices.shape + params.shape[1:]; an
// index outside [0, V) fails the call, as TFLite's GATHER does.
#include <string>

#include "cpu_builtins.h"
#include "difflite/tflite_abi.h"

namespace difflite {
namespace cpu {
namespace {

class QuantizedGather final : public OpInstance {
 public:
  QuantizedGather(const QuantWeight& w, const Shape& table) : w_(w), table_(table) {}

  std::string Infer(const std::vector<TensorInfo>& in, std::vector<TensorInfo>* out) const override {
    std::string e = ExpectInputCount(in, 2);
    if (e.empty()) e = ExpectFloat32(in[0], "params");
    if (!e.empty()) return e;
    if (in[0].shape != table_) {
      return "params " + ShapeToString(in[0].shape) + " are not the quantized " + ShapeToString(table_);
    }
    if (in[1].dtype != DType::kInt32) return std::string("indices must be int32, got ") + DTypeName(in[1].dtype);
    if (NumElements(in[1].shape) < 0) return "indices have a negative dimension";
    Shape shape = in[1].shape;
    shape.insert(shape.end(), table_.begin() + 1, table_.end());
    out->assign(1, TensorInfo{DType::kFloat32, shape, nullptr});
    return "";
  }

  std::string Run(const std::vector<InTensor>& in, const std::vector<OutTensor>& out,
                  const ExecOptions& exec) const override {
    const int64_t count = NumElements(in[1].shape);
    if (count > 0 && (in[1].data == nullptr || out[0].data == nullptr)) return "a tensor has no data";
    int64_t bad = 0;
    const auto* rows = static_cast<const int32_t*>(in[1].data);
    if (!DequantizeRows(w_, rows, count, static_cast<float*>(out[0].data), exec.num_threads, &bad)) {
      return "index " + std::to_string(rows[bad]) + " (position " + std::to_string(bad) +
             ") is outside [0, " + std::to_string(w_.n) + ")";
    }
    return "";
  }

  std::string Describe() const override { return "params=" + w_.Describe() + ", axis=0"; }

 private:
  QuantWeight w_;
  Shape table_;
};

std::unique_ptr<OpInstance> CreateQuantizedGather(const void* params, QuantWeight w,
                                                  const Shape& table, std::string* why) {
  if (table.size() < 2) {
    *why = "params " + ShapeToString(table) + " are not a table of rows";
    return nullptr;
  }
  w.n = table[0];
  w.k = NumElements(table) / table[0];
  if (params != nullptr) {
    const auto* p = static_cast<const tfl::GatherParams*>(params);
    if (p->axis != 0 || p->batch_dims != 0) {
      *why = "axis " + std::to_string(p->axis) + ", batch_dims " + std::to_string(p->batch_dims) +
             " (axis 0, batch_dims 0 are run)";
      return nullptr;
    }
  }
  if (table.size() < 2 || table[0] != w.n || NumElements(table) != w.n * w.k) {
    *why = "params " + ShapeToString(table) + " are not the quantized table " + w.Describe();
    return nullptr;
  }
  *why = w.Check();
  if (!why->empty()) return nullptr;
  return std::unique_ptr<OpInstance>(new QuantizedGather(w, table));
}

const QuantizedOpDef kGatherOps[] = {
    {"GATHER", 0, 2, 2, &CreateQuantizedGather},
};
DIFFLITE_REGISTER_OPS(kGatherOps);

}  // namespace

}  // namespace cpu
}  // namespace difflite
