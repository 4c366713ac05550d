// TFLite builtins the CPU backend runs itself: FULLY_CONNECTED and CONV_2D whose weight is a
// quantized constant (qgemm.h), and GATHER of a quantized table's rows, read as the model stores
// them; the CONV_2D also runs difflite.WinogradConv3x3 nodes whose filter (the op's form [Cout, 3,
// 3, Cin]) is a quantized constant. The delegate's claim
// (delegate/cpu/quantized_claim.cc) finds the weight, folds its chain (DEQUANTIZE, int4's block-scale MUL,
// RESHAPE) into a QuantWeight and creates the op here from the node's builtin parameters.
//
// The ops are OpInstances like the difflite custom ops: Infer sees the inputs (x, the weight as
// the float32 tensor of its model shape, the bias or an omitted one: dtype kOther), Run gets the
// same; the weight's InTensor has no data (the op reads its QuantWeight).
#ifndef DIFFLITE_CPU_BUILTINS_CPU_BUILTINS_H_
#define DIFFLITE_CPU_BUILTINS_CPU_BUILTINS_H_

#include <memory>
#include <string>
#include <vector>

#include "difflite/op_api.h"
#include "difflite/registry.h"
#include "qgemm.h"

namespace difflite {
namespace cpu {

// How the CPU backend runs a node that reads a quantized weight: `name` is the TFLite builtin
// ("FULLY_CONNECTED") or the difflite op ("difflite.WinogradConv3x3", run as a quantized 3x3
// CONV_2D) the op stands for; it reads input `weight_input` from the model's integers, and takes
// min_inputs..max_inputs inputs. `create` makes the op from the node's builtin_data (`params`:
// null is refused where the op needs parameters) and the weight `w` of model shape
// `weight_shape` (w's n and k unset: create sets them), or returns nullptr with *why where it
// does not run the node exactly. Each op's file registers its definition (registry.h).
struct QuantizedOpDef {
  const char* name;
  int weight_input;
  size_t min_inputs;
  size_t max_inputs;
  std::unique_ptr<OpInstance> (*create)(const void* params, QuantWeight w,
                                        const Shape& weight_shape, std::string* why);
};

// What a quantized reader's Infer checks first: 2 or 3 inputs; a float32 input of positive dims;
// the float32 weight (named `weight`); a bias omitted (dtype kOther) or float32 of `outputs`
// values. "" or why not.
std::string CheckReaderInputs(const std::vector<TensorInfo>& in, const char* weight, int64_t outputs);

// The activations both fuse, as a clamp; false for any other.
bool ActivationClamp(int activation, Clamp* clamp, std::string* why);
// The fused activation's name, for descriptions.
const char* ActivationName(int activation);

}  // namespace cpu
}  // namespace difflite

#endif  // DIFFLITE_CPU_BUILTINS_CPU_BUILTINS_H_
