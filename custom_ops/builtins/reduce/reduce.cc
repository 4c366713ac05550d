// MEAN, SUM, REDUCE_MAX, REDUCE_MIN, REDUCE_PROD over constant axes (any
// subset, negative allowed, keep_dims either way) on the GPU (reduce.cl).
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "common/kernel_util.h"

namespace difflite::gpu::builtin {
namespace {

constexpr int kGroup = 64;  // RD_WG

class ReduceOp final : public GpuOp {
 public:
  ReduceOp(cl_kernel k, bool per_group, size_t local, int n_out, int count, IndexSpace out,
           IndexSpace red, int op, float scale)
      : k_(k), per_group_(per_group), local_(local), n_out_(n_out), count_(count),
        out_(std::move(out)), red_(std::move(red)), op_(op), scale_(scale) {}
  bool UsesInput(size_t input) const override { return input == 0; }
  std::string Run(GpuContext& ctx, const std::vector<GpuTensor>& in,
                  const std::vector<GpuTensor>& out) override {
    std::string e = Args()
                        .Mem(in[0].mem)
                        .Mem(out[0].mem)
                        .Int(n_out_)
                        .Int(count_)
                        .Int(out_.rank())
                        .Int8(out_.dims, 1)
                        .Int8(out_.strides[0])
                        .Int(red_.rank())
                        .Int8(red_.dims, 1)
                        .Int8(red_.strides[0])
                        .Int(op_)
                        .Float(scale_)
                        .Set(ctx.cl(), k_);
    if (!e.empty()) return e;
    if (!per_group_) return Launch1D(ctx, k_, static_cast<size_t>(n_out_), local_, "reduce");
    return LaunchGroups(ctx, k_, static_cast<size_t>(n_out_), kGroup, "reduce");
  }

 private:
  cl_kernel k_;
  bool per_group_;
  size_t local_;
  int n_out_, count_;
  IndexSpace out_, red_;
  int op_;
  float scale_;
};

std::unique_ptr<GpuOp> CreateReduce(const NodeView& node, GpuContext& ctx, std::string* error) {
  auto refuse = [error](const std::string& why) -> std::unique_ptr<GpuOp> {
    *error = why;
    return nullptr;
  };
  std::string e = ExpectCounts(node, 2, 2, 1);
  if (e.empty()) e = ExpectFloat(node, node.inputs[0], "input");
  if (e.empty()) e = ExpectFloat(node, node.outputs[0], "output");
  if (!e.empty()) return refuse(e);
  std::vector<int> axes;
  if (!ConstInts(node.inputs[1], &axes)) return refuse("axes must be a constant int32 tensor");
  const std::string name = node.op_name;
  int op = 0;
  if (name == "MEAN" || name == "SUM") op = 0;
  else if (name == "REDUCE_MAX") op = 1;
  else if (name == "REDUCE_MIN") op = 2;
  else if (name == "REDUCE_PROD") op = 3;
  const auto* p = Params<tfl::ReducerParams>(node);
  const bool keep = p != nullptr && p->keep_dims;
  const Shape& x = node.inputs[0].shape;
  const int rank = static_cast<int>(x.size());
  std::vector<bool> reduced(rank, false);
  for (int a : axes) {
    const int ax = a < 0 ? a + rank : a;
    if (ax < 0 || ax >= rank) return refuse("axis " + std::to_string(a) + " out of range");
    reduced[ax] = true;
  }
  const std::vector<int> xs = Strides(x);
  IndexSpace out, red;
  out.strides.assign(2, {});
  red.strides.assign(1, {});
  Shape out_shape;
  int64_t count = 1;
  for (int d = 0; d < rank; ++d) {
    if (reduced[d]) {
      red.dims.push_back(x[d]);
      red.strides[0].push_back(xs[d]);
      count *= x[d];
      if (keep) out_shape.push_back(1);
    } else {
      out.dims.push_back(x[d]);
      out.strides[0].push_back(xs[d]);
      out_shape.push_back(x[d]);
    }
  }
  e = ExpectShape(node.outputs[0], out_shape, "output");
  if (!e.empty()) return refuse(e);
  if (count == 0) return refuse("reduction over an empty axis");
  // Output elements are dense in kept-dim order: its strides only decide merges.
  {
    Shape kept;
    for (int d = 0; d < rank; ++d) {
      if (!reduced[d]) kept.push_back(x[d]);
    }
    out.strides[1] = Strides(kept);
  }
  out.Collapse();
  red.Collapse();
  if (out.rank() > kMaxRank || red.rank() > kMaxRank) return refuse("too many dims");
  const int n_out = static_cast<int>(NumElements(out.dims));
  const bool per_group = count >= 64 && n_out < 65536 && !ctx.PreferFlatKernels();
  cl_kernel k = nullptr;
  e = GetKernel(ctx, "reduce", per_group ? "reduce_wg" : "reduce_serial",
                "-DRD_WG=" + std::to_string(kGroup), &k);
  if (e.empty() && per_group && ctx.KernelWorkGroupSize(k) < kGroup) {
    e = "the device cannot run " + std::to_string(kGroup) + "-item work-groups";
  }
  if (!e.empty()) return refuse(e);
  const float scale = name == "MEAN" ? static_cast<float>(1.0 / static_cast<double>(count)) : 1.0f;
  return std::make_unique<ReduceOp>(k, per_group, Local1D(ctx, k, 64), n_out,
                                    static_cast<int>(count), std::move(out), std::move(red), op,
                                    scale);
}

const GpuOpDef kReduceOps[] = {
    {"MEAN", &CreateReduce},
    {"SUM", &CreateReduce},
    {"REDUCE_MAX", &CreateReduce},
    {"REDUCE_MIN", &CreateReduce},
    {"REDUCE_PROD", &CreateReduce},
};
DIFFLITE_REGISTER_OPS(kReduceOps);

}  // namespace

}  // namespace difflite::gpu::builtin
