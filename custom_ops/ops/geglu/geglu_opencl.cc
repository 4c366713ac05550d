// difflite.GeGLU on the OpenCL backend (kernel: geglu.cl): one kernel that
// reads both halves of x once and writes y (half the width) once, 4 outputs
// per work-item.
// The launch plan is mirrored by benchmarks/gpu_kernels_harness/launch.py.
#include <memory>
#include <string>
#include <vector>

#include "common/kernel_util.h"
#include "difflite/gpu_api.h"
#include "difflite/registry.h"
#include "geglu.h"

namespace difflite::gpu {
namespace {

using builtin::Arg;
using builtin::CeilDiv;

constexpr size_t kGroup = 256;

class GeGluGpu final : public GpuOp {
 public:
  GeGluGpu(cl_kernel k, int64_t rows, int d, gelu::Mode m)
      : kernel_(k), rows_(static_cast<cl_int>(rows)), d_(d), mode_(gelu::KernelMode(m)) {}

  std::string Run(GpuContext& ctx, const std::vector<GpuTensor>& in,
                  const std::vector<GpuTensor>& out) override {
    std::string e = builtin::CheckRunTensors(ctx, in, out, 1, 1);
    if (e.empty()) {
      e = gpu::SetArgs(
          ctx.cl(), kernel_,
          {Arg(in[0].mem), Arg(out[0].mem), Arg(rows_), Arg(d_), Arg(mode_)});
    }
    if (!e.empty()) return e;
    const size_t items = static_cast<size_t>(rows_) * CeilDiv(d_, 4);
    const size_t global = gpu::RoundUp(items, kGroup);
    return ctx.Enqueue(kernel_, 1, &global, &kGroup, "geglu");
  }

 private:
  cl_kernel kernel_;
  cl_int rows_, d_, mode_;
};

std::unique_ptr<GpuOp> Create(const NodeView& node, GpuContext& ctx, std::string* error) {
  const auto* parsed = builtin::CheckedCustomNode<geglu::Parsed>(node, error);
  if (parsed == nullptr) return nullptr;
  const int d = node.inputs[0].shape.back() / 2;
  const int64_t rows = NumElements(node.inputs[0].shape) / (2 * static_cast<int64_t>(d));
  if (NumElements(node.inputs[0].shape) > builtin::kMaxIndex) {
    return builtin::Refuse(error, "x has more than 2^31-1 elements");
  }
  cl_kernel k = nullptr;
  *error = builtin::GetKernel(ctx, "geglu", "geglu", "", &k);
  if (!error->empty()) return nullptr;
  return std::unique_ptr<GpuOp>(new GeGluGpu(k, rows, d, parsed->mode()));
}

}  // namespace

const GpuOpDef kGpuGeGluOps[] = {{geglu::kOpName, &Create}};
DIFFLITE_REGISTER_OPS(kGpuGeGluOps);

}  // namespace difflite::gpu
