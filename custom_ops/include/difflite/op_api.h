// The interface between the delegate and the op folders (custom_ops/ops/*).
//
// The delegate knows no op by name: it asks the registry (registry.h) for the
// OpDef whose name equals the node's custom_code, lets the op parse its
// attributes (OpDef::create), asks for output shapes (OpInstance::Infer) and
// runs it (OpInstance::Run). Ops return errors as strings; they never throw
// across this boundary and never crash on bad input.
#ifndef DIFFLITE_OP_API_H_
#define DIFFLITE_OP_API_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "difflite/attrs.h"
#include "difflite/registry.h"

namespace difflite {

// kInt8 / kInt4 (two a byte, low nibble first) only name quantized weights held on the
// OpenCL device (GpuTensor); ops never see them as TensorInfo::dtype.
enum class DType { kFloat32, kFloat16, kInt32, kOther, kInt8, kInt4 };

const char* DTypeName(DType t);
size_t DTypeSize(DType t);  // 0 for kOther and kInt4 (half a byte)

using Shape = std::vector<int>;

// "[2,3,4]": a shape, or any list of ints (node and tensor indices in logs).
std::string ShapeToString(const Shape& s);
// The product of the dims; -1 when a dim is negative or the product overflows int64.
int64_t NumElements(const Shape& s);

// What Infer sees of one tensor.
struct TensorInfo {
  DType dtype = DType::kOther;
  Shape shape;
  // Non-null when the tensor is a constant of the model (weights); lets an op
  // inspect it at Prepare time. Ops must not rely on it being set.
  const void* const_data = nullptr;
  // Added by the OpenCL backend: true for a model constant even where
  // const_data is not set (a float16 weight the backend does not widen on the host).
  bool is_constant = false;
  // Added by the OpenCL backend: a float32 constant the model stores quantized (the folded
  // DEQUANTIZE of an int8 / int4 tensor, zero points 0) whose every scale covers
  // `quant_group` consecutive elements in row-major order: quant_bits 8 or 4, else 0. An op
  // that reads it quantized says so (GpuOp::ReadsQuantized); otherwise it is dequantized.
  int quant_bits = 0;
  int quant_group = 0;
  // Added by the OpenCL backend: its scales are float16 (int4 blocks at --precision fp16), else
  // float32.
  bool quant_half_scales = false;
};

// What Run sees of one tensor (shape already checked by Infer).
struct InTensor {
  DType dtype;
  Shape shape;
  const void* data;
};
struct OutTensor {
  DType dtype;
  Shape shape;
  void* data;
};

struct ExecOptions {
  int num_threads = 1;
};

class LoraSlots;  // lora_slots.h

// What an op may keep of the delegate that runs it, beyond its tensors (added for run-time LoRA
// factors): the delegate's LoRA slots (lora_slots.h; owned by a shared_ptr, never null here).
struct DelegateServices {
  LoraSlots* lora = nullptr;
};

class OpInstance {
 public:
  virtual ~OpInstance() = default;
  // Checks input count, types and shapes; fills the outputs' types and
  // shapes. Returns "" when valid, else a one-line reason.
  virtual std::string Infer(const std::vector<TensorInfo>& inputs,
                            std::vector<TensorInfo>* outputs) const = 0;
  // Computes the outputs. Returns "" or a one-line reason.
  virtual std::string Run(const std::vector<InTensor>& inputs,
                          const std::vector<OutTensor>& outputs,
                          const ExecOptions& exec) const = 0;
  // The parsed attributes as "k=v, ..." for logs.
  virtual std::string Describe() const = 0;
  // Added for ops that keep state on their delegate (difflite.LoRA: its slot's layer, in the
  // delegate's LoraSlots): called by the CPU backend at every Prepare of the op's partition,
  // after Infer accepted `inputs`. "" or a one-line reason (the partition does not prepare).
  // Run must still work where it was never called (the fuzz harness runs ops without a delegate).
  virtual std::string BindDelegate(const std::vector<TensorInfo>& /*inputs*/,
                                   const DelegateServices& /*services*/) {
    return "";
  }
};

// The OpInstance of an op whose GPU side reads its parsed attributes, `Options`.
template <typename Options>
class ParsedOp : public OpInstance {
 public:
  explicit ParsedOp(const Options& o) : o_(o) {}
  const Options& options() const { return o_; }

 protected:
  Options o_;
};

struct OpDef {
  const char* name;  // the custom_code, e.g. as emitted by the Python passes
  // Parses and validates the attributes. Returns nullptr and sets *error on
  // a missing attribute, a wrong type or an out-of-range value.
  std::unique_ptr<OpInstance> (*create)(const AttrMap& attrs,
                                        std::string* error);
};

// Every op folder registers its OpDef with DIFFLITE_REGISTER_OPS (registry.h).

// Shared helpers for the op folders.
std::string ExpectInputCount(const std::vector<TensorInfo>& inputs, size_t n);
// "" if the tensor is float32; a reason naming `what` otherwise (float16 is
// refused with a message that says so: the CPU kernels are fp32 only).
std::string ExpectFloat32(const TensorInfo& t, const char* what);
// "" if every dimension is >= 1 (empty and unknown dims are refused).
std::string ExpectPositiveDims(const TensorInfo& t, const char* what);

}  // namespace difflite

#endif  // DIFFLITE_OP_API_H_
