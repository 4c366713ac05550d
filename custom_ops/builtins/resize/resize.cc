// RESIZE_NEAREST_NEIGHBOR and RESIZE_BILINEAR (4-D NHWC, constant size
// input) on the GPU (resize.cl).
#include <memory>
#include <string>
#include <vector>

#include "common/kernel_util.h"

namespace difflite::gpu::builtin {
namespace {

class ResizeOp final : public GpuOp {
 public:
  ResizeOp(cl_kernel k, size_t local, bool bilinear, std::vector<int> ints, float sh, float sw,
           int align, int half_px)
      : k_(k), local_(local), bilinear_(bilinear), ints_(std::move(ints)), sh_(sh), sw_(sw),
        align_(align), half_(half_px) {}
  bool UsesInput(size_t input) const override { return input == 0; }
  std::string Run(GpuContext& ctx, const std::vector<GpuTensor>& in,
                  const std::vector<GpuTensor>& out) override {
    Args a;
    a.Mem(in[0].mem).Mem(out[0].mem);
    for (int v : ints_) a.Int(v);
    a.Float(sh_).Float(sw_);
    if (!bilinear_) a.Int(align_);
    a.Int(half_);
    std::string e = a.Set(ctx.cl(), k_);
    if (!e.empty()) return e;
    return Launch1D(ctx, k_, static_cast<size_t>(ints_[0]), local_, "resize");
  }

 private:
  cl_kernel k_;
  size_t local_;
  bool bilinear_;
  std::vector<int> ints_;  // n, ih, iw, c, oh, ow
  float sh_, sw_;
  int align_, half_;
};

float Scale(int in, int out, bool align) {
  return (align && out > 1) ? static_cast<float>(in - 1) / static_cast<float>(out - 1)
                            : static_cast<float>(in) / static_cast<float>(out);
}

std::unique_ptr<GpuOp> CreateResize(const NodeView& node, GpuContext& ctx, std::string* error) {
  const bool bilinear = std::string(node.op_name) == "RESIZE_BILINEAR";
  std::string e = ExpectCounts(node, 2, 2, 1);
  if (e.empty()) e = ExpectFloat(node, node.inputs[0], "input");
  if (e.empty()) e = ExpectFloat(node, node.outputs[0], "output");
  const Shape& x = node.inputs[0].shape;
  const Shape& y = node.outputs[0].shape;
  if (e.empty() && (x.size() != 4 || y.size() != 4)) e = "input and output must be 4-D (NHWC)";
  std::vector<int> size;
  if (e.empty() && (!ConstInts(node.inputs[1], &size) || size.size() != 2)) {
    e = "size must be a constant int32 [2]";
  }
  if (e.empty()) e = ExpectShape(node.outputs[0], {x[0], size[0], size[1], x[3]}, "output");
  const auto* p = Params<tfl::ResizeParams>(node);
  const bool align = p != nullptr && p->align_corners;
  const bool half_px = p != nullptr && p->half_pixel_centers;
  if (e.empty() && align && half_px) e = "align_corners with half_pixel_centers";
  cl_kernel k = nullptr;
  if (e.empty()) e = GetKernel(ctx, "resize", bilinear ? "resize_bilinear" : "resize_nearest", "", &k);
  if (!e.empty()) {
    *error = e;
    return nullptr;
  }
  const int n = static_cast<int>(NumElements(y));
  return std::make_unique<ResizeOp>(k, Local1D(ctx, k, 128), bilinear,
                                    std::vector<int>{n, x[1], x[2], x[3], y[1], y[2]},
                                    Scale(x[1], y[1], align), Scale(x[2], y[2], align), align,
                                    half_px);
}

const GpuOpDef kResizeOps[] = {
    {"RESIZE_NEAREST_NEIGHBOR", &CreateResize},
    {"RESIZE_BILINEAR", &CreateResize},
};
DIFFLITE_REGISTER_OPS(kResizeOps);

}  // namespace

}  // namespace difflite::gpu::builtin
