// The builtins the CPU backend claims besides the difflite custom ops (quantized_claim.cc): every
// FULLY_CONNECTED and CONV_2D whose weight is a quantized constant, every GATHER of a quantized
// table's rows, and that weight's chain; and every difflite.WinogradConv3x3 whose w is a
// quantized 3x3 filter [Cout, 3, 3, Cin], run as that quantized CONV_2D (not by the op registry).
#ifndef DIFFLITE_DELEGATE_CPU_QUANTIZED_CLAIM_H_
#define DIFFLITE_DELEGATE_CPU_QUANTIZED_CLAIM_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "delegate_util.h"
#include "difflite/op_api.h"
#include "difflite/tflite_abi.h"

namespace difflite {

// One claimed builtin node. Either a FULLY_CONNECTED / CONV_2D / GATHER, or a
// difflite.WinogradConv3x3 as a CONV_2D (`op`: reads its weight,
// input `weight_input`, from the model's integers; Infer sees it as `weight_info`), or a node of a
// quantized weight's chain (DEQUANTIZE of the int8 / int4 constant or of float16 block scales,
// int4's block-scale MUL, RESHAPE), `folded`: it runs nothing and its output is never
// allocated, by TFLite or by the delegate (a partition output of that kind is given 0 bytes and
// no data at Prepare; only the claimed readers of quantized weights read it, and they read
// the constant it stands for).
struct CpuBuiltinNode {
  std::string name;  // "FULLY_CONNECTED", "DEQUANTIZE", "difflite.WinogradConv3x3", ...
  bool folded = false;
  std::unique_ptr<OpInstance> op;
  int weight_input = 1;
  TensorInfo weight_info;
};

// The nodes of `plan` the CPU backend runs as builtins, by node index. A chain is folded only
// where every reader of each of its outputs is a claimed node (a folded one, or a claimed
// reader of it as its weight) and no output is a graph output; anything else is left to TFLite.
// A reader of a quantized weight that cannot be run exactly is refused with a one-line reason on
// stderr and stays with TFLite.
std::map<int, std::unique_ptr<CpuBuiltinNode>> ClaimQuantizedBuiltins(tfl::Context* ctx,
                                                                      const std::vector<int>& plan,
                                                                      const PlanOrder& order,
                                                                      bool verbose);

}  // namespace difflite

#endif  // DIFFLITE_DELEGATE_CPU_QUANTIZED_CLAIM_H_
