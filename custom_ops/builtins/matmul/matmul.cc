// FULLY_CONNECTED and BATCH_MATMUL on the GPU, both through the tiled GEMM
// (gemm.cl). FULLY_CONNECTED: input [..., K] as [M, K], weights [N, K]
// (read k-major in place, no repacking), optional bias [N], output [M, N]
// or [..., N] (keep_num_dims). BATCH_MATMUL: adj_x / adj_y and numpy
// broadcasting of the batch dims.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "common/kernel_util.h"
#include "matmul/gemm.h"

namespace difflite::gpu::builtin {
namespace {

class GemmOp final : public GpuOp {
 public:
  GemmOp(Gemm g, int bias_input, const char* label, PackedWeight b = PackedWeight())
      : gemm_(std::move(g)), bias_input_(bias_input), label_(label), own_b_(std::move(b)) {}
  bool UsesInput(size_t input) const override { return !(input == 1 && own_b_.planned()); }
  bool PacksInput(size_t input) const override { return input == 1 && own_b_.planned(); }
  bool ReadsQuantized(size_t input) const override {
    return input == 1 && gemm_.reads_quantized();
  }
  bool ReadsAtOffset(size_t input) const override {
    return input == 1 && !own_b_.planned() && gemm_.ReadsBAtOffset();
  }
  std::string PackWeights(GpuContext& ctx, const std::vector<GpuTensor>& in) override {
    return own_b_.Pack(ctx, in[1].mem, in[1].scales);
  }
  size_t WeightBytes() const override { return own_b_.bytes(); }
  size_t ScratchSlotBytes(int slot) const override { return gemm_.ScratchSlotBytes(slot); }
  std::string Run(GpuContext& ctx, const std::vector<GpuTensor>& in,
                  const std::vector<GpuTensor>& out) override {
    cl_mem bias = bias_input_ >= 0 ? in[bias_input_].mem : nullptr;
    if (own_b_.planned()) {
      return gemm_.Run(ctx, in[0].mem, own_b_.mem(), bias, out[0].mem, label_, own_b_.scales());
    }
    return gemm_.Run(ctx, in[0].mem, in[1].mem, bias, out[0].mem, label_, in[1].scales, {},
                     WeightOffsets::Of(in[1]));
  }

 private:
  Gemm gemm_;
  int bias_input_;
  const char* label_;
  PackedWeight own_b_;
};

std::unique_ptr<GpuOp> CreateFullyConnected(const NodeView& node, GpuContext& ctx,
                                            std::string* error) {
  std::string e = ExpectCounts(node, 2, 3, 1);
  if (!e.empty()) return Refuse(error, e);
  const auto* p = Params<tfl::FullyConnectedParams>(node);
  if (p == nullptr) return Refuse(error, "FULLY_CONNECTED without parameters");
  e = ActivationNone(p->activation, "FULLY_CONNECTED");
  if (e.empty() && p->weights_format != 0) e = "packed weights formats are not supported";
  const TensorInfo& x = node.inputs[0];
  const TensorInfo& w = node.inputs[1];
  const bool has_bias = node.inputs.size() == 3 && Present(node.inputs[2]);
  if (e.empty()) e = ExpectFloat(node, x, "input");
  if (e.empty()) e = ExpectFloat(node, w, "weights");
  if (e.empty()) e = ExpectFloat(node, node.outputs[0], "output");
  if (e.empty() && has_bias) e = ExpectFloat(node, node.inputs[2], "bias");
  if (e.empty() && w.shape.size() != 2) e = "weights must be 2-D [N, K]";
  if (!e.empty()) return Refuse(error, e);
  const int n = w.shape[0], k = w.shape[1];
  const int64_t total = NumElements(x.shape);
  if (k <= 0 || total % k != 0) return Refuse(error, "input size is not a multiple of K");
  const int m = static_cast<int>(total / k);
  if (has_bias && NumElements(node.inputs[2].shape) != n) return Refuse(error, "bias must have N elements");
  Shape want;
  if (p->keep_num_dims) {
    want = x.shape;
    want.back() = n;
    if (x.shape.empty() || x.shape.back() != k) return Refuse(error, "keep_num_dims needs input [..., K]");
  } else {
    want = {m, n};
  }
  e = ExpectShape(node.outputs[0], want, "output");
  if (!e.empty()) return Refuse(error, e);
  GemmShape s;
  s.m = m;
  s.n = n;
  s.k = k;
  s.a_sm = k;
  s.a_sk = 1;
  s.b_sk = 1;
  s.b_sn = k;
  s.ldc = n;
  s.has_bias = has_bias;
  s.wq = WeightQuant::Of(w, n, k, true);
  return MakeWeightGemm(ctx, w, s, has_bias ? 2 : -1, "fully_connected", error);
}

std::unique_ptr<GpuOp> CreateBatchMatMul(const NodeView& node, GpuContext& ctx,
                                         std::string* error) {
  std::string e = ExpectCounts(node, 2, 2, 1);
  if (!e.empty()) return Refuse(error, e);
  const auto* p = Params<tfl::BatchMatMulParams>(node);
  const bool adj_x = p != nullptr && p->adj_x;
  const bool adj_y = p != nullptr && p->adj_y;
  const TensorInfo& x = node.inputs[0];
  const TensorInfo& y = node.inputs[1];
  e = ExpectFloat(node, x, "lhs");
  if (e.empty()) e = ExpectFloat(node, y, "rhs");
  if (e.empty()) e = ExpectFloat(node, node.outputs[0], "output");
  if (e.empty() && (x.shape.size() < 2 || y.shape.size() < 2)) e = "operands must be at least 2-D";
  if (!e.empty()) return Refuse(error, e);
  const int xr = static_cast<int>(x.shape.size()), yr = static_cast<int>(y.shape.size());
  const int m = adj_x ? x.shape[xr - 1] : x.shape[xr - 2];
  const int kx = adj_x ? x.shape[xr - 2] : x.shape[xr - 1];
  const int ky = adj_y ? y.shape[yr - 1] : y.shape[yr - 2];
  const int n = adj_y ? y.shape[yr - 2] : y.shape[yr - 1];
  if (kx != ky) {
    return Refuse(error, "inner dimensions differ: " + ShapeToString(x.shape) + " x " +
                             ShapeToString(y.shape));
  }
  // Broadcast batch dims.
  const Shape xb(x.shape.begin(), x.shape.end() - 2), yb(y.shape.begin(), y.shape.end() - 2);
  const int br = static_cast<int>(std::max(xb.size(), yb.size()));
  Shape ob(br, 1);
  IndexSpace space;
  space.strides.assign(3, std::vector<int>(br, 0));
  const int x_mat = m * kx, y_mat = kx * n;
  const std::vector<int> xs = Strides(xb), ys = Strides(yb);
  for (int d = 0; d < br; ++d) {
    const int dx = d - (br - static_cast<int>(xb.size()));
    const int dy = d - (br - static_cast<int>(yb.size()));
    const int vx = dx >= 0 ? xb[dx] : 1;
    const int vy = dy >= 0 ? yb[dy] : 1;
    if (vx != vy && vx != 1 && vy != 1) {
      return Refuse(error, "batch dims do not broadcast: " + ShapeToString(x.shape) + " x " +
                               ShapeToString(y.shape));
    }
    ob[d] = std::max(vx, vy);
    if (vx != 1) space.strides[0][d] = xs[dx] * x_mat;
    if (vy != 1) space.strides[1][d] = ys[dy] * y_mat;
  }
  Shape want = ob;
  want.push_back(m);
  want.push_back(n);
  e = ExpectShape(node.outputs[0], want, "output");
  if (!e.empty()) return Refuse(error, e);
  space.dims = ob;
  {
    const std::vector<int> os = Strides(ob);
    for (int d = 0; d < br; ++d) space.strides[2][d] = os[d] * m * n;
  }
  space.Collapse();
  GemmShape s;
  s.m = m;
  s.n = n;
  s.k = kx;
  s.a_sm = adj_x ? 1 : kx;
  s.a_sk = adj_x ? m : 1;
  s.b_sk = adj_y ? 1 : n;
  s.b_sn = adj_y ? kx : 1;
  s.ldc = n;
  const bool trivial = space.rank() == 1 && space.dims[0] == 1;
  if (!trivial) {
    s.bdims = space.dims;
    s.a_bs = space.strides[0];
    s.b_bs = space.strides[1];
    // The output is dense over the batch: its collapsed stride is m * n.
    for (size_t d = 0; d + 1 < space.dims.size(); ++d) {
      if (space.strides[2][d] != space.strides[2][d + 1] * space.dims[d + 1]) {
        return Refuse(error, "internal: output batch not dense");
      }
    }
  }
  s.c_bs = m * n;
  Gemm g;
  e = g.Init(ctx, s);
  if (!e.empty()) return Refuse(error, e);
  return std::make_unique<GemmOp>(std::move(g), -1, "batch_matmul");
}

const GpuOpDef kMatmulOps[] = {
    {"FULLY_CONNECTED", &CreateFullyConnected},
    {"BATCH_MATMUL", &CreateBatchMatMul},
};
DIFFLITE_REGISTER_OPS(kMatmulOps);

}  // namespace

std::unique_ptr<GpuOp> MakeWeightGemm(GpuContext& ctx, const TensorInfo& w, GemmShape s,
                                      int bias_input, const char* label, std::string* error) {
  PackedWeight wt;
  wt.Plan(ctx, w, s.n, s.k, 1, s.wq);
  if (wt.planned()) {
    s.b_sk = wt.np();
    s.b_sn = 1;
  }
  Gemm g;
  std::string e = g.Init(ctx, s);
  if (!e.empty()) {
    *error = e;
    return nullptr;
  }
  if (s.wq.on() && !g.reads_quantized()) {  // the kernel reads floats: so must the packing
    s.wq = WeightQuant();
    return MakeWeightGemm(ctx, w, s, bias_input, label, error);
  }
  return std::make_unique<GemmOp>(std::move(g), bias_input, label, std::move(wt));
}

}  // namespace difflite::gpu::builtin
