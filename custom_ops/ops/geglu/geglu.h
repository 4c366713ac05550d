// difflite.GeGLU: its name. Its attribute is GELU's (approximate), parsed into the same
// gelu::Parsed, which the CPU kernel (geglu.cc) and the GPU side (geglu_opencl.cc) read.
#ifndef DIFFLITE_OPS_GEGLU_H_
#define DIFFLITE_OPS_GEGLU_H_

#include "../gelu/gelu.h"

namespace difflite {
namespace geglu {

constexpr const char* kOpName = "difflite.GeGLU";
constexpr const char* kApproximate = gelu::kApproximate;
using Parsed = gelu::Parsed;

}  // namespace geglu
}  // namespace difflite

#endif  // DIFFLITE_OPS_GEGLU_H_
