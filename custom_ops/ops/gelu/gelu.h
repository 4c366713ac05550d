// difflite.Gelu: the parsed attributes, shared by the CPU kernel (gelu.cc)
// and the GPU side (gelu_opencl.cc).
#ifndef DIFFLITE_OPS_GELU_H_
#define DIFFLITE_OPS_GELU_H_

#include "difflite/op_api.h"
#include "gelu_math.h"

namespace difflite {
namespace gelu {

constexpr const char* kOpName = "difflite.Gelu";

constexpr const char* kApproximate = "approximate";

// The OpInstance the op's Create returns; the GPU side reads mode().
class Parsed : public ModeOp {
 public:
  explicit Parsed(Mode m) : ModeOp(m, kApproximate) {}
};

}  // namespace gelu
}  // namespace difflite

#endif  // DIFFLITE_OPS_GELU_H_
