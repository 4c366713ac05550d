// difflite.GroupNorm: the parsed attributes, shared by the CPU kernel
// (group_norm.cc) and the GPU side (group_norm_opencl.cc).
#ifndef DIFFLITE_OPS_GROUP_NORM_H_
#define DIFFLITE_OPS_GROUP_NORM_H_

#include "difflite/op_api.h"

namespace difflite {
namespace group_norm {

constexpr const char* kOpName = "difflite.GroupNorm";

struct Options {
  int groups = 0;
  float epsilon = 0.f;
  bool silu = false;
};

// The OpInstance the op's Create returns; the GPU side reads options().
using Parsed = ParsedOp<Options>;

}  // namespace group_norm
}  // namespace difflite

#endif  // DIFFLITE_OPS_GROUP_NORM_H_
