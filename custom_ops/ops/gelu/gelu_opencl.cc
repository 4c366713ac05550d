// difflite.Gelu on the OpenCL backend (kernel: gelu.cl): one kernel, one read
// of x and one write of y, 4 elements per work-item.
// The launch plan is mirrored by benchmarks/gpu_kernels_harness/launch.py.
#include <memory>
#include <string>
#include <vector>

#include "common/kernel_util.h"
#include "difflite/gpu_api.h"
#include "difflite/registry.h"
#include "gelu.h"

namespace difflite::gpu {
namespace {

using builtin::Arg;

constexpr size_t kGroup = 256;

class GeluGpu final : public GpuOp {
 public:
  GeluGpu(cl_kernel k, int64_t count, gelu::Mode m)
      : kernel_(k), count_(static_cast<cl_int>(count)), mode_(gelu::KernelMode(m)) {}

  std::string Run(GpuContext& ctx, const std::vector<GpuTensor>& in,
                  const std::vector<GpuTensor>& out) override {
    std::string e = builtin::CheckRunTensors(ctx, in, out, 1, 1);
    if (e.empty()) {
      e = gpu::SetArgs(
          ctx.cl(), kernel_, {Arg(in[0].mem), Arg(out[0].mem), Arg(count_), Arg(mode_)});
    }
    if (!e.empty()) return e;
    const size_t global =
        gpu::RoundUp(static_cast<size_t>(builtin::CeilDiv(count_, 4)), kGroup);
    return ctx.Enqueue(kernel_, 1, &global, &kGroup, "gelu");
  }

 private:
  cl_kernel kernel_;
  cl_int count_;
  cl_int mode_;
};

std::unique_ptr<GpuOp> Create(const NodeView& node, GpuContext& ctx, std::string* error) {
  const auto* parsed = builtin::CheckedCustomNode<gelu::Parsed>(node, error);
  if (parsed == nullptr) return nullptr;
  const int64_t count = NumElements(node.inputs[0].shape);
  if (count > builtin::kMaxIndex - 4) return builtin::Refuse(error, "x has more than 2^31-5 elements");
  cl_kernel k = nullptr;
  *error = builtin::GetKernel(ctx, "gelu", "gelu", "", &k);
  if (!error->empty()) return nullptr;
  return std::unique_ptr<GpuOp>(new GeluGpu(k, count, parsed->mode()));
}

}  // namespace

const GpuOpDef kGpuGeluOps[] = {{gelu::kOpName, &Create}};
DIFFLITE_REGISTER_OPS(kGpuGeluOps);

}  // namespace difflite::gpu
