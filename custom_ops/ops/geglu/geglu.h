// difflite.GeGLU: the parsed attributes, shared by the CPU kernel (geglu.cc)
// and the GPU side (geglu_opencl.cc).
#ifndef DIFFLITE_OPS_GEGLU_H_
#define DIFFLITE_OPS_GEGLU_H_

#include "../gelu/gelu_math.h"
#include "difflite/op_api.h"

namespace difflite {
namespace geglu {

constexpr const char* kOpName = "difflite.GeGLU";

constexpr const char* kApproximate = "approximate";

// The OpInstance the op's Create returns; the GPU side reads mode().
class Parsed : public gelu::ModeOp {
 public:
  explicit Parsed(gelu::Mode m) : ModeOp(m, kApproximate) {}
};

}  // namespace geglu
}  // namespace difflite

#endif  // DIFFLITE_OPS_GEGLU_H_
