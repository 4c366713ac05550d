// The GPU sides of the five difflite custom ops, for the OpenCL backend's
// registry: AllGpuOps() (delegate/opencl/) appends DiffliteCustomGpuOps() to
// its builtins, so FindGpuOp("difflite.GroupNorm") etc. find them.
// Each op folder defines its `kGpu<Op>` in <op>_opencl.cc.
#include <vector>

#include "difflite/gpu_api.h"

namespace difflite {
namespace gpu {

extern const GpuOpDef kGpuGroupNorm;
extern const GpuOpDef kGpuGelu;
extern const GpuOpDef kGpuGeGlu;
extern const GpuOpDef kGpuAttention;
extern const GpuOpDef kGpuWinogradConv3x3;

std::vector<const GpuOpDef*> DiffliteCustomGpuOps() {
  return {&kGpuGroupNorm, &kGpuGelu, &kGpuGeGlu, &kGpuAttention, &kGpuWinogradConv3x3};
}

// The same list under the spelling first proposed for it (with "Diffllite").
std::vector<const GpuOpDef*> DifflliteCustomGpuOps() { return DiffliteCustomGpuOps(); }

}  // namespace gpu
}  // namespace difflite
