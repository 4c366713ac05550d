// SOFTMAX (last axis, beta) on the GPU (softmax.cl).
#include <memory>
#include <string>
#include <vector>

#include "common/kernel_util.h"

namespace difflite::gpu::builtin {
namespace {

constexpr int kGroup = 128;  // SM_WG of softmax_wg

class SoftmaxOp final : public GpuOp {
 public:
  SoftmaxOp(cl_kernel k, bool per_row, size_t local, int rows, int len, float beta)
      : k_(k), per_row_(per_row), local_(local), rows_(rows), len_(len), beta_(beta) {}
  std::string Run(GpuContext& ctx, const std::vector<GpuTensor>& in,
                  const std::vector<GpuTensor>& out) override {
    Args a;
    a.Mem(in[0].mem).Mem(out[0].mem);
    if (per_row_) a.Int(rows_);
    std::string e = a.Int(len_).Float(beta_).Set(ctx.cl(), k_);
    if (!e.empty()) return e;
    if (per_row_) return Launch1D(ctx, k_, static_cast<size_t>(rows_), local_, "softmax");
    return LaunchGroups(ctx, k_, static_cast<size_t>(rows_), kGroup, "softmax");
  }

 private:
  cl_kernel k_;
  bool per_row_;
  size_t local_;
  int rows_, len_;
  float beta_;
};

std::unique_ptr<GpuOp> CreateSoftmax(const NodeView& node, GpuContext& ctx, std::string* error) {
  std::string e = ExpectCounts(node, 1, 1, 1);
  if (e.empty()) e = ExpectFloat(node, node.inputs[0], "input");
  if (e.empty()) e = ExpectFloat(node, node.outputs[0], "output");
  if (e.empty()) e = ExpectShape(node.outputs[0], node.inputs[0].shape, "output");
  if (e.empty() && node.inputs[0].shape.empty()) e = "SOFTMAX of a scalar";
  if (!e.empty()) {
    *error = e;
    return nullptr;
  }
  const auto* p = Params<tfl::SoftmaxParams>(node);
  const float beta = p != nullptr ? p->beta : 1.0f;
  const int len = node.inputs[0].shape.back();
  const int rows = static_cast<int>(NumElements(node.inputs[0].shape) / len);
  // Short rows, or a CPU-like device: a work-item per row; else a
  // work-group per row.
  const bool per_row = len <= 32 || ctx.PreferFlatKernels();
  cl_kernel k = nullptr;
  e = GetKernel(ctx, "softmax", per_row ? "softmax_rows" : "softmax_wg",
                "-DSM_WG=" + std::to_string(kGroup), &k);
  if (e.empty() && !per_row && ctx.KernelWorkGroupSize(k) < kGroup) {
    e = "the device cannot run " + std::to_string(kGroup) + "-item work-groups";
  }
  if (!e.empty()) {
    *error = e;
    return nullptr;
  }
  return std::make_unique<SoftmaxOp>(k, per_row, Local1D(ctx, k, 64), rows, len, beta);
}

const GpuOpDef kSoftmaxOps[] = {
    {"SOFTMAX", &CreateSoftmax},
};
DIFFLITE_REGISTER_OPS(kSoftmaxOps);

}  // namespace

}  // namespace difflite::gpu::builtin
