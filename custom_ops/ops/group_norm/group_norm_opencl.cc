// difflite.GroupNorm on the OpenCL backend (kernels: group_norm.cl).
//
// Two plans (UseOneKernel below picks one):
// "one": gn_one, one work-group per (sample, group) that reduces the group and
// then normalises it: one kernel, no scratch (GPUs).
// "split": gn_stats_cols reads x once into per-(work-group, group) partial
// statistics; gn_apply_cols merges the partials of its own groups in local
// memory and reads x once more, writing y once. Both over column blocks
// (ColsPlan): a work-item owns one vector of channels and walks rows.
// Scratch: [N * groups * P] float4 partials in slot 0.
// The launch plans are mirrored by benchmarks/gpu_kernels_harness/launch.py.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "../opencl_common.h"
#include "difflite/gpu_api.h"
#include "group_norm.h"

namespace difflite {
namespace {

using gpu::GpuContext;
using gpu::GpuOp;
using gpu::GpuTensor;
using gpu::NodeView;
using gpu::opsupport::Arg;
using gpu::opsupport::CeilDiv;
using gpu::opsupport::SetKernelArgs;

constexpr const char* kProgram = "group_norm";
constexpr int kColsGroup = 256;  // the split plan's largest work-group
constexpr int kColsMinWidth = 32;  // columns a work-group should span (a warp's row stretch)
constexpr int kStatsRows = 8;  // fewest rows per gn_stats_cols work-item
constexpr int kApplyRows = 16;  // rows per gn_apply_cols work-item
constexpr int kMaxPartials = 64;  // partials per group (gn_apply_cols merges them per work-group)
constexpr size_t kOneGroup = 1024;        // largest gn_one work-group
constexpr size_t kOneMinGroup = 64;       // smallest, for small groups
constexpr int kOneUnroll = 4;             // GN_UNROLL: loads in flight per work-item
constexpr int64_t kOneMaxGroupElems = 65536;  // "one" for groups this small (UseOneKernel)

// The plan. "one" moves fewer bytes (x once from memory and once more from
// cache, no partials) and launches one kernel instead of two, so GPUs (tiled
// kernels) take it when its work-groups, one per (sample, group), fill the
// device, or when each group is small enough that a second kernel costs more
// than the idle compute units: on the H100 (132 compute units) a kernel costs
// ~7 us even when tiny and two dependent ones another 3-10 us between them,
// so at N = 2, 32 groups "one" took 31 us against 37 split at [4096, 320]
// (41K elements a group), 17 against 32 at [1024, 640], 10 against 31 at
// [64, 1280]; split won from [4096, 640] (82K: 40 against 44) and at N = 1
// [4096, 1280] (164K: 38 against 79) (benchmarks/gpu_gn_sweep.py, NOTES.md
// §14). Phones (a few to a dozen compute units) take "one". CPU-like devices
// (flat kernels) keep "split": on PoCL (2 cores) "one" took 0.6x to 1.7x its
// time at SD shapes, no clear win. DIFFLITE_GN_PLAN=one|split overrides, for
// benchmarking.
bool UseOneKernel(int64_t n, int groups, int64_t group_elems, uint32_t cus, bool flat) {
  const char* env = std::getenv("DIFFLITE_GN_PLAN");
  if (env != nullptr && std::strcmp(env, "one") == 0) return true;
  if (env != nullptr && std::strcmp(env, "split") == 0) return false;
  if (flat) return false;
  return n * groups >= static_cast<int64_t>(cus) || group_elems <= kOneMaxGroupElems;
}

// gn_one's load width: 4 or 2 elements where they divide channels per group.
int OneVectorWidth(int cg) { return cg % 4 == 0 ? 4 : cg % 2 == 0 ? 2 : 1; }

// The split plan's shape. Columns are vectors of vw channels (vw divides cg),
// cv per row. A work-group spans lx columns x ly rows; lx is gpw whole groups
// (the fewest that reach kColsMinWidth columns) or, for a group wider than
// the work-group limit, a 1/xb share of one. gn_stats_cols runs ys
// work-groups down the rows (fill the device 4 times over, at least
// kStatsRows rows per work-item, at most kMaxPartials partials per group);
// gn_apply_cols runs ya (kApplyRows rows per work-item).
struct ColsPlan {
  int vw = 1, cv = 1, lx = 1, ly = 1, gpw = 1, xb = 1, ys = 1, ya = 1;

  int Partials() const { return ys * xb; }
  std::string Options() const {
    return "-DGN_VW=" + std::to_string(vw) + " -DGN_LX=" + std::to_string(lx) +
           " -DGN_LY=" + std::to_string(ly) + " -DGN_GPW=" + std::to_string(gpw);
  }
};

ColsPlan PlanCols(int64_t n, int groups, int64_t spatial, int c, uint32_t cus, int limit) {
  ColsPlan p;
  const int cg = c / groups;
  p.vw = OneVectorWidth(cg);
  p.cv = c / p.vw;
  const int cgv = cg / p.vw;
  if (cgv <= limit) {
    for (int d = 1; d <= groups && cgv * d <= limit; ++d) {
      if (groups % d != 0) continue;
      p.gpw = d;
      if (cgv * d >= kColsMinWidth) break;
    }
    p.lx = cgv * p.gpw;
  } else {
    p.xb = 2;
    while (cgv % p.xb != 0 || cgv / p.xb > limit) ++p.xb;
    p.lx = cgv / p.xb;
  }
  p.ly = static_cast<int>(std::min<int64_t>(std::max(1, std::min(kColsGroup, limit) / p.lx), spatial));
  const int64_t blocks = static_cast<int64_t>(p.cv / p.lx) * n;
  const int64_t want = CeilDiv(4 * std::max<int64_t>(1, cus), blocks);
  const int64_t by_rows = std::max<int64_t>(1, spatial / (p.ly * kStatsRows));
  p.ys = static_cast<int>(std::max<int64_t>(1, std::min({want, by_rows, int64_t{kMaxPartials / p.xb}})));
  p.ya = static_cast<int>(std::max<int64_t>(1, CeilDiv(spatial, int64_t{p.ly} * kApplyRows)));
  return p;
}

class GroupNormGpu final : public GpuOp {
 public:
  std::string Init(const group_norm::Options& o, const Shape& x, GpuContext& ctx) {
    o_ = o;
    n_ = x[0];
    c_ = x.back();
    spatial_ = NumElements(x) / (static_cast<int64_t>(n_) * c_);
    cg_ = c_ / o.groups;
    if (NumElements(x) > gpu::opsupport::kMaxIndex) {
      return "x has more than 2^31-1 elements";
    }
    one_ = UseOneKernel(n_, o.groups, spatial_ * cg_, ctx.device().compute_units,
                        ctx.PreferFlatKernels());
    if (one_) return InitOne(ctx);
    return InitCols(ctx);
  }

  size_t ScratchBytes() const override { return one_ ? 0 : PartialBytes(); }

  std::string Run(GpuContext& ctx, const std::vector<GpuTensor>& in,
                  const std::vector<GpuTensor>& out) override {
    std::string e = gpu::opsupport::CheckRunTensors(ctx, in, out, 3, 1);
    if (!e.empty()) return e;
    if (one_) return RunOne(ctx, in, out);
    const gpu::ClApi& cl = ctx.cl();
    cl_mem partial = ctx.Scratch(PartialBytes(), 0, &e);
    if (partial == nullptr) return "group norm partial statistics: " + e;
    const cl_int s = static_cast<cl_int>(spatial_), c = c_, cg = cg_, groups = o_.groups,
                 xb = plan_.xb, parts = plan_.Partials(), silu = o_.silu ? 1 : 0;
    const cl_float eps = o_.epsilon;
    const size_t local[3] = {static_cast<size_t>(plan_.lx), static_cast<size_t>(plan_.ly), 1};
    e = SetKernelArgs(cl, stats_k_, {Arg(in[0].mem), Arg(partial), Arg(s), Arg(c), Arg(cg),
                                     Arg(groups), Arg(xb)});
    if (!e.empty()) return e;
    const size_t g1[3] = {static_cast<size_t>(plan_.cv), local[1] * plan_.ys,
                          static_cast<size_t>(n_)};
    e = ctx.Enqueue(stats_k_, 3, g1, local, "group_norm.stats");
    if (!e.empty()) return e;
    e = SetKernelArgs(cl, apply_k_,
                      {Arg(in[0].mem), Arg(partial), Arg(in[1].mem), Arg(in[2].mem),
                       Arg(out[0].mem), Arg(s), Arg(c), Arg(cg), Arg(groups), Arg(xb),
                       Arg(parts), Arg(silu), Arg(eps)});
    if (!e.empty()) return e;
    const size_t g2[3] = {static_cast<size_t>(plan_.cv), local[1] * plan_.ya,
                          static_cast<size_t>(n_)};
    return ctx.Enqueue(apply_k_, 3, g2, local, "group_norm.apply");
  }

 private:
  // The split plan with the largest work-group limit (kColsGroup, the
  // device's) whose work-group both kernels accept.
  std::string InitCols(GpuContext& ctx) {
    const size_t device_max = ctx.device().max_work_group_size;
    int limit = kColsGroup;
    if (device_max != 0 && device_max < static_cast<size_t>(limit)) limit = static_cast<int>(device_max);
    for (;;) {
      plan_ = PlanCols(n_, o_.groups, spatial_, c_, ctx.device().compute_units, limit);
      const std::string opts = plan_.Options();
      std::string e = gpu::opsupport::GetKernel(ctx, kProgram, "gn_stats_cols", opts, &stats_k_);
      if (e.empty()) e = gpu::opsupport::GetKernel(ctx, kProgram, "gn_apply_cols", opts, &apply_k_);
      if (!e.empty()) return e;
      size_t accepted = static_cast<size_t>(plan_.lx) * plan_.ly;
      for (cl_kernel k : {stats_k_, apply_k_}) {
        const size_t kmax = gpu::opsupport::KernelMaxWorkGroup(ctx, k);
        if (kmax != 0) accepted = std::min(accepted, kmax);
      }
      if (accepted >= static_cast<size_t>(plan_.lx) * plan_.ly) return "";
      if (limit == 1) return "group norm kernels fit no work-group size";
      limit = std::max(1, std::min(limit / 2, static_cast<int>(accepted)));
    }
  }

  // The largest power-of-two work-group <= kOneGroup that the device and
  // gn_one accept, smaller (down to kOneMinGroup) for groups too small to give
  // each work-item kOneUnroll loads.
  std::string InitOne(GpuContext& ctx) {
    vw_ = OneVectorWidth(cg_);
    wg_ = 1;
    const size_t device_max = ctx.device().max_work_group_size;
    while (wg_ * 2 <= kOneGroup && (device_max == 0 || wg_ * 2 <= device_max)) wg_ *= 2;
    const int64_t group_elems = spatial_ * cg_;
    while (wg_ > kOneMinGroup && static_cast<int64_t>(wg_) * kOneUnroll * vw_ > group_elems) {
      wg_ /= 2;
    }
    for (;; wg_ /= 2) {
      const std::string opts = "-DGN_WG=" + std::to_string(wg_) + " -DGN_VW=" +
                               std::to_string(vw_) + " -DGN_UNROLL=" + std::to_string(kOneUnroll);
      std::string e = gpu::opsupport::GetKernel(ctx, kProgram, "gn_one", opts, &one_k_);
      if (!e.empty()) return e;
      const size_t kmax = gpu::opsupport::KernelMaxWorkGroup(ctx, one_k_);
      if (kmax == 0 || kmax >= wg_) return "";
      if (wg_ == 1) return "gn_one fits no work-group size";
    }
  }

  std::string RunOne(GpuContext& ctx, const std::vector<GpuTensor>& in,
                     const std::vector<GpuTensor>& out) {
    const cl_int s = static_cast<cl_int>(spatial_), c = c_, cg = cg_, silu = o_.silu ? 1 : 0;
    const cl_float eps = o_.epsilon;
    std::string e = SetKernelArgs(ctx.cl(), one_k_,
                                  {Arg(in[0].mem), Arg(in[1].mem), Arg(in[2].mem),
                                   Arg(out[0].mem), Arg(s), Arg(c), Arg(cg), Arg(silu), Arg(eps)});
    if (!e.empty()) return e;
    const size_t global[2] = {wg_ * o_.groups, static_cast<size_t>(n_)};
    const size_t local[2] = {wg_, 1};
    return ctx.Enqueue(one_k_, 2, global, local, "group_norm.one");
  }

  size_t PartialBytes() const {
    return sizeof(cl_float4) * static_cast<size_t>(n_) * o_.groups * plan_.Partials();
  }

  group_norm::Options o_;
  int n_ = 0, c_ = 0, cg_ = 0, vw_ = 1;
  bool one_ = false;
  int64_t spatial_ = 0;
  size_t wg_ = kOneGroup;  // gn_one's work-group
  ColsPlan plan_;
  cl_kernel stats_k_ = nullptr, apply_k_ = nullptr, one_k_ = nullptr;
};

std::unique_ptr<GpuOp> Create(const NodeView& node, GpuContext& ctx, std::string* error) {
  const auto* parsed = dynamic_cast<const group_norm::Parsed*>(node.custom);
  if (parsed == nullptr) {
    *error = "not a parsed difflite.GroupNorm node";
    return nullptr;
  }
  std::vector<TensorInfo> outs;
  std::string e = gpu::opsupport::InferAsFloat(*parsed, node.inputs, &outs);
  std::unique_ptr<GroupNormGpu> op(new GroupNormGpu());
  if (e.empty()) e = op->Init(parsed->options(), node.inputs[0].shape, ctx);
  if (!e.empty()) {
    *error = e;
    return nullptr;
  }
  return op;
}

}  // namespace

namespace gpu {
extern const GpuOpDef kGpuGroupNorm;
const GpuOpDef kGpuGroupNorm = {group_norm::kOpName, &Create};
}  // namespace gpu

}  // namespace difflite
