// difflite.Attention: the parsed attributes, shared by the CPU kernel
// (attention.cc) and the GPU side (attention_opencl.cc).
#ifndef DIFFLITE_OPS_ATTENTION_H_
#define DIFFLITE_OPS_ATTENTION_H_

#include <string>

#include "difflite/op_api.h"

namespace difflite {
namespace attention {

constexpr const char* kOpName = "difflite.Attention";

struct Options {
  int heads = 1;
  float scale = 1.f;
  bool causal = false;
  std::string variant;  // "auto" | "partial_softmax" | "flash"
};

// The OpInstance the op's Create returns; the GPU side reads options().
using Parsed = ParsedOp<Options>;

}  // namespace attention
}  // namespace difflite

#endif  // DIFFLITE_OPS_ATTENTION_H_
