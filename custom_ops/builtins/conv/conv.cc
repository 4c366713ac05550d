// CONV_2D and DEPTHWISE_CONV_2D on the GPU (conv.cl): strides, dilations,
// SAME/VALID padding, optional bias, no fused activation. On GPUs a CONV_2D of
// few output channels with a float filter runs conv2d_narrow (PlanNarrow); otherwise a 1x1, stride-1, unpadded CONV_2D is a
// plain GEMM (gemm.cl) and every other CONV_2D runs as an implicit GEMM over the
// filter taps. A CONV_2D reads an int8 / int4 filter quantized (dl_qweights.cl)
// where its kernel can.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "common/kernel_util.h"
#include "matmul/gemm.h"

namespace difflite::gpu::builtin {
namespace {

// Output size and leading pad of one spatial dim (TFLite's rules).
bool Geometry(int padding, int in, int k, int stride, int dilation, int* out, int* pad) {
  const int eff = (k - 1) * dilation + 1;
  if (padding == tfl::kPaddingSame) {
    *out = (in + stride - 1) / stride;
    const int total = std::max((*out - 1) * stride + eff - in, 0);
    *pad = total / 2;
    return true;
  }
  if (padding == tfl::kPaddingValid) {
    *out = (in - eff + stride) / stride;
    *pad = 0;
    return *out > 0;
  }
  return false;
}

struct ConvGeometry {
  int n = 0, ih = 0, iw = 0, cin = 0, oh = 0, ow = 0, kh = 0, kw = 0, cout = 0;
  int sh = 1, sw = 1, dh = 1, dw = 1, pt = 0, pl = 0;
  std::vector<int> G0() const { return {ih, iw, cin, oh}; }
  std::vector<int> G1() const { return {ow, kw, sh, sw}; }
  std::vector<int> G2() const { return {dh, dw, pt, pl}; }
};

// Shapes and parameters common to both convolutions; "" or a reason.
std::string CheckConv(const NodeView& node, int padding, int stride_w, int stride_h,
                      int dil_w, int dil_h, int activation, bool depthwise, ConvGeometry* g,
                      bool* has_bias) {
  std::string e = ExpectCounts(node, 2, 3, 1);
  if (e.empty()) e = ActivationNone(activation, node.op_name);
  if (!e.empty()) return e;
  const TensorInfo& x = node.inputs[0];
  const TensorInfo& w = node.inputs[1];
  *has_bias = node.inputs.size() == 3 && Present(node.inputs[2]);
  e = ExpectFloat(node, x, "input");
  if (e.empty()) e = ExpectFloat(node, w, "filter");
  if (e.empty()) e = ExpectFloat(node, node.outputs[0], "output");
  if (e.empty() && *has_bias) e = ExpectFloat(node, node.inputs[2], "bias");
  if (e.empty() && (x.shape.size() != 4 || w.shape.size() != 4)) e = "input and filter must be 4-D";
  if (!e.empty()) return e;
  if (stride_w < 1 || stride_h < 1 || dil_w < 1 || dil_h < 1) return "strides and dilations must be >= 1";
  g->n = x.shape[0];
  g->ih = x.shape[1];
  g->iw = x.shape[2];
  g->cin = x.shape[3];
  g->kh = w.shape[1];
  g->kw = w.shape[2];
  g->sh = stride_h;
  g->sw = stride_w;
  g->dh = dil_h;
  g->dw = dil_w;
  if (depthwise) {
    if (w.shape[0] != 1) return "depthwise filter must be [1, KH, KW, C*multiplier]";
    g->cout = w.shape[3];
    if (g->cout % g->cin != 0) return "depthwise output channels are not a multiple of the input's";
  } else {
    g->cout = w.shape[0];
    if (w.shape[3] != g->cin) {
      return "filter " + ShapeToString(w.shape) + " does not match input channels " +
             std::to_string(g->cin) + " (grouped convolution is not supported)";
    }
  }
  if (*has_bias && NumElements(node.inputs[2].shape) != g->cout) return "bias must have one value per output channel";
  if (!Geometry(padding, g->ih, g->kh, g->sh, g->dh, &g->oh, &g->pt) ||
      !Geometry(padding, g->iw, g->kw, g->sw, g->dw, &g->ow, &g->pl)) {
    return "unsupported padding or an empty output";
  }
  return ExpectShape(node.outputs[0], {g->n, g->oh, g->ow, g->cout}, "output");
}

class Conv2dOp final : public GpuOp {
 public:
  // `wt`: the filter packed [K][N] for the flat kernel (conv2d_rows); not
  // planned for the tiled one, which reads the OHWI filter in place.
  // `wq`: how the kernel reads a quantized filter (off: float).
  Conv2dOp(cl_kernel k, TileConfig t, ConvGeometry g, bool has_bias, PackedWeight wt,
           size_t flat_local, WeightQuant wq)
      : k_(k), tile_(t), g_(g), has_bias_(has_bias), wt_(std::move(wt)),
        flat_local_(flat_local), wq_(wq) {}
  // Split-K (gemm.h); `k` must be the kernel the plan built.
  void SetSplitK(const SplitK& split) { split_ = split; }
  bool UsesInput(size_t input) const override { return !(input == 1 && wt_.planned()); }
  bool PacksInput(size_t input) const override { return input == 1 && wt_.planned(); }
  bool ReadsQuantized(size_t input) const override { return input == 1 && wq_.on(); }
  bool ReadsAtOffset(size_t input) const override { return input == 1 && !wt_.planned(); }
  std::string PackWeights(GpuContext& ctx, const std::vector<GpuTensor>& in) override {
    return wt_.Pack(ctx, in[1].mem, in[1].scales);
  }
  size_t WeightBytes() const override { return wt_.bytes(); }
  size_t ScratchSlotBytes(int slot) const override { return slot == kSplitKSlot ? split_.bytes() : 0; }
  std::string Run(GpuContext& ctx, const std::vector<GpuTensor>& in,
                  const std::vector<GpuTensor>& out) override {
    const int m = g_.n * g_.oh * g_.ow;
    const int kk = g_.kh * g_.kw * g_.cin;
    cl_mem bias = has_bias_ ? in[2].mem : nullptr;
    const WeightOffsets at = wt_.planned() ? WeightOffsets() : WeightOffsets::Of(in[1]);
    int w_base = 0, wq_base = 0;
    std::string e = WeightBases(at, wq_, ctx.storage(), &w_base, &wq_base);
    if (!e.empty()) return e;
    cl_mem y = split_.Target(ctx, out[0].mem, &e);
    if (y == nullptr) return e;
    Args args;
    args.Mem(in[0].mem).Mem(wt_.planned() ? wt_.mem() : in[1].mem).Mem(bias).Mem(y).Int(m)
        .Int(g_.cout).Int(kk).Int4(g_.G0()).Int4(g_.G1()).Int4(g_.G2())
        .Int(has_bias_ && split_.splits() == 1 ? 1 : 0).Int(w_base);
    e = wq_.AppendArgs(args, wt_.planned() ? wt_.scales() : in[1].scales, wq_base).Set(ctx.cl(), k_);
    if (!e.empty()) return e;
    if (wt_.planned()) {
      const size_t local[2] = {flat_local_, 1};
      const size_t global[2] = {RoundUp(static_cast<size_t>((g_.cout + 15) / 16), flat_local_),
                                static_cast<size_t>((m + kFlatRows - 1) / kFlatRows)};
      return ctx.Enqueue(k_, 2, global, local, "conv2d");
    }
    const size_t local[3] = {static_cast<size_t>(tile_.tn / tile_.wn),
                             static_cast<size_t>(tile_.tm / tile_.wm), 1};
    const size_t global[3] = {static_cast<size_t>((g_.cout + tile_.tn - 1) / tile_.tn) * local[0],
                              static_cast<size_t>((m + tile_.tm - 1) / tile_.tm) * local[1],
                              static_cast<size_t>(split_.splits())};
    e = ctx.Enqueue(k_, 3, global, local, "conv2d");
    if (!e.empty()) return e;
    return split_.Sum(ctx, y, bias, out[0].mem, m, g_.cout, g_.cout, m * g_.cout, 1,
                      "conv2d.splitk_sum");
  }

 private:
  cl_kernel k_;
  TileConfig tile_;
  ConvGeometry g_;
  bool has_bias_;
  PackedWeight wt_;
  size_t flat_local_;
  WeightQuant wq_;
  SplitK split_;
};

// conv2d_narrow (conv.cl): NW_L lanes share NW_PX consecutive output pixels of a row (a pixel
// group) and all its N <= kNarrowMaxCout output channels; work-groups of kNarrowGroup items.
constexpr int kNarrowMaxCout = 8;
constexpr int kNarrowGroup = 64;
constexpr int kNarrowMaxLanes = 32;
struct NarrowPlan {
  int px = 4;     // pixels a group
  int lanes = 1;  // lanes a group, along Cin
  int64_t groups(const ConvGeometry& g) const { return int64_t{g.n} * g.oh * per_row(g); }
  int per_row(const ConvGeometry& g) const { return (g.ow + px - 1) / px; }
};

// Whether a CONV_2D takes conv2d_narrow, and how: on GPUs (tiled kernels), at most
// kNarrowMaxCout output channels, a float filter. The implicit GEMM's output tiles are 16 to 64
// channels wide, so with N = 3 (the VAE decoder's conv_out) over 80% of a tile's multiply-adds
// and local-memory staging is padding; that holds on any GPU, phones included. Quantized filters
// stay with the GEMM, which reads them so. The plan: 4 pixels a group (2 for N > 4: at most 16
// float4 accumulators), about 8 input channels a lane and tap (a lane per 8 channels, 1 to 16);
// then, while the launch has fewer than 1024 items per compute unit (few pixels, a long K: a
// float UNet's conv_out, 64x64 pixels and Cin = 320), twice the lanes (up to 32, 4 channels
// each), else half the pixels. On the H200 (NVIDIA's OpenCL, half storage, the kernels timed
// alone) this ran the VAE's conv_out (512x512x128 -> 3) in 140 us against the GEMM's 941 us,
// 64x64x320 -> 4 in 21 us against 86 us. DIFFLITE_CONV_NARROW=0 keeps the GEMM (A/B);
// DIFFLITE_CONV_NARROW=PxL (e.g. 4x8) forces P pixels and L lanes a group (tests). "" or a reason.
std::string PlanNarrow(GpuContext& ctx, const ConvGeometry& g, const TensorInfo& w,
                       NarrowPlan* plan, bool* narrow) {
  *narrow = false;
  if (ctx.PreferFlatKernels() || g.cout > kNarrowMaxCout || w.quant_bits != 0) return "";
  const char* env = std::getenv("DIFFLITE_CONV_NARROW");
  if (env != nullptr && *env != '\0') {
    if (std::string(env) == "0") return "";
    int px = 0, lanes = 0;
    char end = 0;
    if (std::sscanf(env, "%dx%d%c", &px, &lanes, &end) != 2 || (px != 1 && px != 2 && px != 4) ||
        lanes < 1 || lanes > kNarrowMaxLanes || (lanes & (lanes - 1)) != 0) {
      return std::string("DIFFLITE_CONV_NARROW=") + env +
             ": expected 0 or PxL (P pixels 1, 2 or 4; L lanes a power of two <= 32)";
    }
    plan->px = px;
    plan->lanes = lanes;
  } else {
    plan->px = g.cout <= 4 ? 4 : 2;
    plan->lanes = 1;
    while (plan->lanes < 16 && plan->lanes * 2 * 8 <= g.cin) plan->lanes *= 2;
    const int64_t want = 1024 * static_cast<int64_t>(std::max<uint32_t>(ctx.device().compute_units, 1));
    while (plan->groups(g) * plan->lanes < want) {
      if (plan->lanes < kNarrowMaxLanes && plan->lanes * 2 * 4 <= g.cin) {
        plan->lanes *= 2;
      } else if (plan->px > 1) {
        plan->px /= 2;
      } else {
        break;
      }
    }
  }
  *narrow = plan->groups(g) <= kMaxIndex;
  return "";
}

class NarrowConvOp final : public GpuOp {
 public:
  NarrowConvOp(cl_kernel k, NarrowPlan plan, ConvGeometry g, bool has_bias)
      : k_(k), plan_(plan), g_(g), has_bias_(has_bias) {}
  std::string Run(GpuContext& ctx, const std::vector<GpuTensor>& in,
                  const std::vector<GpuTensor>& out) override {
    const int groups = static_cast<int>(plan_.groups(g_));
    std::string e = Args()
                        .Mem(in[0].mem)
                        .Mem(in[1].mem)
                        .Mem(has_bias_ ? in[2].mem : nullptr)
                        .Mem(out[0].mem)
                        .Int4(g_.G0())
                        .Int4(g_.G1())
                        .Int4(g_.G2())
                        .Int4({g_.kh, plan_.per_row(g_), groups, 0})
                        .Int(has_bias_ ? 1 : 0)
                        .Set(ctx.cl(), k_);
    if (!e.empty()) return e;
    const size_t per_wg = static_cast<size_t>(kNarrowGroup / plan_.lanes);  // groups a work-group
    const size_t local[2] = {static_cast<size_t>(plan_.lanes), per_wg};
    const size_t global[2] = {local[0], RoundUp(static_cast<size_t>(groups), per_wg)};
    return ctx.Enqueue(k_, 2, global, local, "conv2d_narrow");
  }

 private:
  cl_kernel k_;
  NarrowPlan plan_;
  ConvGeometry g_;
  bool has_bias_;
};

std::unique_ptr<GpuOp> CreateConv2d(const NodeView& node, GpuContext& ctx, std::string* error) {
  const auto* p = Params<tfl::ConvParams>(node);
  if (p == nullptr) return Refuse(error, "CONV_2D without parameters");
  ConvGeometry g;
  bool has_bias = false;
  std::string e = CheckConv(node, p->padding, p->stride_width, p->stride_height,
                            p->dilation_width_factor, p->dilation_height_factor, p->activation,
                            false, &g, &has_bias);
  if (!e.empty()) return Refuse(error, e);
  const int m = g.n * g.oh * g.ow;
  const int k = g.kh * g.kw * g.cin;
  const TensorInfo& w = node.inputs[1];
  NarrowPlan narrow_plan;
  bool narrow = false;
  e = PlanNarrow(ctx, g, w, &narrow_plan, &narrow);
  if (!e.empty()) return Refuse(error, e);
  if (narrow) {
    cl_kernel kn = nullptr;
    e = GetKernel(ctx, "conv", "conv2d_narrow",
                  TileConfig().Options() + " -DNW_N=" + std::to_string(g.cout) +
                      " -DNW_PX=" + std::to_string(narrow_plan.px) +
                      " -DNW_L=" + std::to_string(narrow_plan.lanes) +
                      " -DNW_G=" + std::to_string(kNarrowGroup / narrow_plan.lanes) +
                      (g.cin % 4 == 0 ? " -DNW_ALIGNED=1" : ""),
                  &kn);
    if (!e.empty()) return Refuse(error, e);
    // a device whose limit is below the fixed work-group keeps the GEMM
    if (ctx.KernelWorkGroupSize(kn) >= static_cast<size_t>(kNarrowGroup)) {
      return std::make_unique<NarrowConvOp>(kn, narrow_plan, g, has_bias);
    }
  }
  if (g.kh == 1 && g.kw == 1 && g.sh == 1 && g.sw == 1 && g.pt == 0 && g.pl == 0) {
    GemmShape s;  // a plain GEMM: B is the [N][K] filter, k-major
    s.m = m;
    s.n = g.cout;
    s.k = k;
    s.a_sm = k;
    s.a_sk = 1;
    s.b_sk = 1;
    s.b_sn = k;
    s.ldc = g.cout;
    s.has_bias = has_bias;
    s.wq = WeightQuant::Of(w, g.cout, k, true);
    return MakeWeightGemm(ctx, w, s, has_bias ? 2 : -1, "conv2d_1x1", error);
  }
  WeightQuant wq = WeightQuant::Of(w, g.cout, k, false);
  // CPU-like devices: the filter packed [K][NP] (NP = N rounded up to 16) for conv2d_rows,
  // an int8 copy where it is quantized.
  PackedWeight wt;
  wt.Plan(ctx, w, g.cout, k, 16, wq);
  if (wt.planned()) {
    wq = wq.PackedCopy(wt.np());
    cl_kernel k_rows = nullptr;
    e = GetKernel(ctx, "conv", "conv2d_rows", "-DRM=" + std::to_string(kFlatRows) + wq.Options(),
                  &k_rows);
    if (!e.empty()) return Refuse(error, e);
    const size_t items = static_cast<size_t>((g.cout + 15) / 16);
    size_t l = 1;
    while (l < items && l < 16) l *= 2;
    l = std::min(l, std::max<size_t>(ctx.KernelWorkGroupSize(k_rows), 1));
    return std::make_unique<Conv2dOp>(k_rows, TileConfig(), g, has_bias, std::move(wt), l, wq);
  }
  TileConfig tile;
  cl_kernel kernel = nullptr;
  auto kernel_of = [&](const TileConfig& c, cl_kernel* out) {
    if (c.threads() % c.tk != 0) return std::string("tile threads not a multiple of TK");
    // Each item stages TM * TK / NT patch elements a slice, with their rows' coordinates in
    // registers: 8 on the 128x128x16 tensor-core tile (256 items), 32 on the 64x64x32 one (64
    // items), which took 255 registers and spilled in PoCL's PTX for sm_90 (2026-11-30): the
    // convolutions take the 256-item tensor-core tiles only.
    if (c.mma && c.threads() < 256) return std::string("tensor-core tile of too few items for a convolution");
    // quantized filters in aligned quads of k where K allows (a scale already covers >= 4 k)
    const bool quads = wq.on() && k % 4 == 0;
    return GetKernel(ctx, "conv", "conv2d", c.Options() + wq.Options() + (quads ? " -DWQ_QUADS=1" : ""), out);
  };
  const int64_t macs = static_cast<int64_t>(m) * g.cout * k;
  // The implicit GEMM takes the tensor-core tiles as gemm.cl's GEMMs do (PickTile, where the
  // context allows them): the generic profile's direct 3x3 convolutions (the UNet's 16x16 and
  // 8x8 levels, below its Winograd minimum) are most of its convolution time.
  e = PickTile(ctx, m, g.cout, macs, kernel_of, &tile, &kernel, wq.on());
  if (!e.empty() && wq.on()) {  // no vectorised tile fits: the filter dequantized at upload
    wq = WeightQuant();
    e = PickTile(ctx, m, g.cout, macs, kernel_of, &tile, &kernel);
  }
  if (!e.empty()) return Refuse(error, e);
  SplitK split;
  if (tile.vec) {
    const int64_t tiles = static_cast<int64_t>((m + tile.tm - 1) / tile.tm) *
                          ((g.cout + tile.tn - 1) / tile.tn);
    e = split.Plan(ctx, tiles, k, static_cast<int64_t>(m) * g.cout);
    if (!e.empty()) return Refuse(error, e);
  }
  auto op = std::make_unique<Conv2dOp>(kernel, tile, g, has_bias, PackedWeight(), 0, wq);
  op->SetSplitK(split);
  return op;
}

class DepthwiseOp final : public GpuOp {
 public:
  DepthwiseOp(cl_kernel k, size_t local, ConvGeometry g, bool has_bias)
      : k_(k), local_(local), g_(g), has_bias_(has_bias) {}
  std::string Run(GpuContext& ctx, const std::vector<GpuTensor>& in,
                  const std::vector<GpuTensor>& out) override {
    const int n = g_.n * g_.oh * g_.ow * g_.cout;
    std::string e = Args()
                        .Mem(in[0].mem)
                        .Mem(in[1].mem)
                        .Mem(has_bias_ ? in[2].mem : nullptr)
                        .Mem(out[0].mem)
                        .Int(n)
                        .Int4(g_.G0())
                        .Int4(g_.G1())
                        .Int4(g_.G2())
                        .Int4({g_.kh, g_.cout / g_.cin, g_.cout, 0})
                        .Int(has_bias_ ? 1 : 0)
                        .Set(ctx.cl(), k_);
    if (!e.empty()) return e;
    return Launch1D(ctx, k_, static_cast<size_t>(n), local_, "depthwise_conv2d");
  }

 private:
  cl_kernel k_;
  size_t local_;
  ConvGeometry g_;
  bool has_bias_;
};

std::unique_ptr<GpuOp> CreateDepthwise(const NodeView& node, GpuContext& ctx,
                                       std::string* error) {
  const auto* p = Params<tfl::DepthwiseConvParams>(node);
  if (p == nullptr) return Refuse(error, "DEPTHWISE_CONV_2D without parameters");
  ConvGeometry g;
  bool has_bias = false;
  std::string e = CheckConv(node, p->padding, p->stride_width, p->stride_height,
                            p->dilation_width_factor, p->dilation_height_factor, p->activation,
                            true, &g, &has_bias);
  if (!e.empty()) return Refuse(error, e);
  cl_kernel k = nullptr;
  e = GetKernel(ctx, "conv", "depthwise_conv2d", TileConfig().Options(), &k);
  if (!e.empty()) return Refuse(error, e);
  return std::make_unique<DepthwiseOp>(k, Local1D(ctx, k, 64), g, has_bias);
}

const GpuOpDef kConvOps[] = {
    {"CONV_2D", &CreateConv2d},
    {"DEPTHWISE_CONV_2D", &CreateDepthwise},
};
DIFFLITE_REGISTER_OPS(kConvOps);

}  // namespace

}  // namespace difflite::gpu::builtin
