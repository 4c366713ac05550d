// TFLite builtins the CPU backend runs itself: FULLY_CONNECTED and CONV_2D whose weight is a
// quantized constant (qgemm.h), and GATHER of a quantized table's rows, read as the model stores
// them; the CONV_2D also runs difflite.WinogradConv3x3 nodes whose filter (the op's form [Cout, 3,
// 3, Cin]) is a quantized constant. The delegate's claim
// (delegate/cpu_claim.cc) finds the weight, folds its chain (DEQUANTIZE, int4's block-scale MUL,
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
#include "qgemm.h"

namespace difflite {
namespace cpu {

// `params`: the node's builtin_data (tfl::FullyConnectedParams / tfl::ConvParams; null is
// refused). nullptr and *why where the parameters are ones the op does not run exactly.
std::unique_ptr<OpInstance> CreateQuantizedFullyConnected(const void* params, const QuantWeight& w,
                                                           std::string* why);
// `filter`: the weight's model shape, OHWI; w is that filter as [O, H*W*I].
std::unique_ptr<OpInstance> CreateQuantizedConv2d(const void* params, const QuantWeight& w,
                                                  const Shape& filter, std::string* why);

// A 3x3 CONV_2D of stride 1, dilation 1, SAME padding (one pixel each side) and no fused
// activation: difflite.WinogradConv3x3's function, run on its quantized filter (`filter`
// [Cout, 3, 3, Cin], OHWI; w that filter as [Cout, 9*Cin]). Infer takes (x, filter, bias).
std::unique_ptr<OpInstance> CreateQuantizedConv3x3(const QuantWeight& w, const Shape& filter,
                                                   std::string* why);

// GATHER of the rows of a quantized table (`table`: its model shape, w that table as [rows,
// the rest]); axis 0 and batch_dims 0 only (`params`: tfl::GatherParams, null meaning those).
std::unique_ptr<OpInstance> CreateQuantizedGather(const void* params, const QuantWeight& w,
                                                  const Shape& table, std::string* why);

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
