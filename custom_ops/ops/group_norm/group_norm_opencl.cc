// difflite.GroupNorm on the OpenCL backend (kernels: group_norm.cl).
//
// Two plans (UseOneKernel below picks one):
// "one": gn_one, one work-group per (sample, group) that reduces the group
// and then normalises it: one kernel, no scratch (GPUs).
// "split": gn_stats reads x once for the per-(sample, group) mean and rstd
// (split over several work-groups per group when there are too few groups to
// fill the device: partials); gn_apply (float4 form when C % 4 == 0) reads x
// once more and writes y once, merging split partials itself in local memory.
// A separate tiny gn_combine runs first only where an apply work-group would
// touch more than GN_APPLY_WG (sample, group) pairs. Scratch: [N*groups]
// float2 (mean, rstd) in slot 0 and, when split, [N*groups*splits] float4
// partials in slot 1.
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
constexpr size_t kStatsGroup = 256;  // preferred work-groups of gn_stats / gn_apply
constexpr size_t kCombineGroup = 64;
constexpr size_t kOneGroup = 1024;        // largest gn_one work-group
constexpr size_t kOneMinGroup = 64;       // smallest, for small groups
constexpr int kOneUnroll = 4;             // GN_UNROLL: loads in flight per work-item

// The plan. "one" moves fewer bytes (x once from memory and once more from
// cache, no partials) and launches one kernel instead of two or three, so GPUs
// (tiled kernels) take it when its work-groups, one per (sample, group), can
// fill the device. With fewer (sample, group) pairs than compute units the
// split statistics spread the reading over the whole device instead: on the
// H100 (132 compute units) the SD 1.5 UNet's GroupNorms (N = 2, 32 groups)
// took 1.46 ms per step with "one" against 1.27 ms split, and at N = 1
// [4096, 1280] 0.099 ms against 0.058 (benchmarks/NOTES.md §10). Phones (a
// few to a dozen compute units) take "one". CPU-like devices (flat kernels)
// keep "split": on PoCL (2 cores) "one" took 0.6x to 1.7x its time at SD
// shapes, no clear win. DIFFLITE_GN_PLAN=one|split overrides, for benchmarking.
bool UseOneKernel(int64_t n, int groups, uint32_t cus, bool flat) {
  const char* env = std::getenv("DIFFLITE_GN_PLAN");
  if (env != nullptr && std::strcmp(env, "one") == 0) return true;
  if (env != nullptr && std::strcmp(env, "split") == 0) return false;
  if (flat) return false;
  return n * groups >= static_cast<int64_t>(cus);
}

// gn_one's load width: 4 or 2 elements where they divide channels per group.
int OneVectorWidth(int cg) { return cg % 4 == 0 ? 4 : cg % 2 == 0 ? 2 : 1; }

// Work-groups per (sample, group) for the statistics pass: enough
// work-groups to fill the device, at least ~16 elements per work-item.
int PlanSplits(int64_t n, int groups, int64_t spatial, int cg, uint32_t cus,
               size_t wg) {
  const int64_t want = CeilDiv(4 * std::max<int64_t>(1, cus), n * groups);
  const int64_t by_size =
      std::max<int64_t>(1, spatial * cg / static_cast<int64_t>(wg * 16));
  return static_cast<int>(std::max<int64_t>(
      1, std::min({want, by_size, int64_t{64}, spatial})));
}

// Whether gn_apply merges split statistics itself: one of its work-groups
// (wg work-items, 4 elements each in the float4 form) touches at most wg
// (sample, group) pairs.
bool CombineInApply(int64_t n, int groups, int64_t spatial, int c, int splits, size_t wg) {
  if (splits == 1) return false;
  const int64_t elems = static_cast<int64_t>(wg) * (c % 4 == 0 ? 4 : 1);
  const int64_t samples = std::min<int64_t>(n, (elems - 1) / (spatial * c) + 2);
  return samples * groups <= static_cast<int64_t>(wg);
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
    one_ = UseOneKernel(n_, o.groups, ctx.device().compute_units, ctx.PreferFlatKernels());
    if (one_) return InitOne(ctx);
    // One program for the three kernels; the largest power-of-two work-group
    // <= 256 that the device and every kernel accept.
    wg_ = 1;
    const size_t device_max = ctx.device().max_work_group_size;
    while (wg_ * 2 <= kStatsGroup && (device_max == 0 || wg_ * 2 <= device_max)) wg_ *= 2;
    const char* apply_name = c_ % 4 == 0 ? "gn_apply4" : "gn_apply";
    for (;; wg_ /= 2) {
      const std::string opts = "-DGN_WG=" + std::to_string(wg_) +
                               " -DGN_APPLY_WG=" + std::to_string(wg_) +
                               " -DGN_VW=" + std::to_string(OneVectorWidth(cg_)) +
                               " -DGN_UNROLL=" + std::to_string(kOneUnroll);
      std::string e = gpu::opsupport::GetKernel(ctx, kProgram, "gn_stats", opts, &stats_k_);
      if (e.empty()) e = gpu::opsupport::GetKernel(ctx, kProgram, "gn_combine", opts, &combine_k_);
      if (e.empty()) e = gpu::opsupport::GetKernel(ctx, kProgram, apply_name, opts, &apply_k_);
      if (!e.empty()) return e;
      bool fits = true;
      for (cl_kernel k : {stats_k_, apply_k_}) {
        const size_t kmax = gpu::opsupport::KernelMaxWorkGroup(ctx, k);
        if (kmax != 0 && kmax < wg_) fits = false;
      }
      if (fits) break;
      if (wg_ == 1) return "group norm kernels fit no work-group size";
    }
    splits_ = PlanSplits(n_, o.groups, spatial_, cg_, ctx.device().compute_units, wg_);
    combine_in_apply_ = CombineInApply(n_, o.groups, spatial_, c_, splits_, wg_);
    return "";
  }

  size_t ScratchBytes() const override {
    if (one_) return 0;
    return StatsBytes() + (splits_ > 1 ? PartialBytes() : 0);
  }

  std::string Run(GpuContext& ctx, const std::vector<GpuTensor>& in,
                  const std::vector<GpuTensor>& out) override {
    std::string e = gpu::opsupport::CheckRunTensors(ctx, in, out, 3, 1);
    if (!e.empty()) return e;
    if (one_) return RunOne(ctx, in, out);
    const gpu::ClApi& cl = ctx.cl();
    cl_mem stats = ctx.Scratch(StatsBytes(), 0, &e);
    if (stats == nullptr) return "group norm statistics: " + e;
    cl_mem partial = stats;  // unused by gn_stats when splits == 1
    if (splits_ > 1) {
      partial = ctx.Scratch(PartialBytes(), 1, &e);
      if (partial == nullptr) return "group norm partial sums: " + e;
    }
    const cl_int s = static_cast<cl_int>(spatial_), c = c_, cg = cg_,
                 splits = splits_, groups = o_.groups;
    const cl_float eps = o_.epsilon;
    e = SetKernelArgs(cl, stats_k_, {Arg(in[0].mem), Arg(partial), Arg(stats), Arg(s),
                                     Arg(c), Arg(cg), Arg(splits), Arg(eps)});
    if (!e.empty()) return e;
    const size_t g1[3] = {wg_ * groups, static_cast<size_t>(splits_),
                          static_cast<size_t>(n_)};
    const size_t l1[3] = {wg_, 1, 1};
    e = ctx.Enqueue(stats_k_, 3, g1, l1, "group_norm.stats");
    if (!e.empty()) return e;
    if (splits_ > 1 && !combine_in_apply_) {
      const cl_int count = n_ * groups;
      e = SetKernelArgs(cl, combine_k_,
                        {Arg(partial), Arg(stats), Arg(count), Arg(splits), Arg(eps)});
      if (!e.empty()) return e;
      const size_t g2 = gpu::RoundUp(static_cast<size_t>(count), kCombineGroup);
      e = ctx.Enqueue(combine_k_, 1, &g2, &kCombineGroup, "group_norm.combine");
      if (!e.empty()) return e;
    }
    const cl_int rows = static_cast<cl_int>(n_ * spatial_);
    const cl_int silu = o_.silu ? 1 : 0;
    const cl_int combine = combine_in_apply_ ? 1 : 0;
    e = SetKernelArgs(cl, apply_k_,
                      {Arg(in[0].mem), Arg(stats), Arg(partial), Arg(in[1].mem),
                       Arg(in[2].mem), Arg(out[0].mem), Arg(rows), Arg(s), Arg(c),
                       Arg(cg), Arg(groups), Arg(silu), Arg(combine), Arg(splits),
                       Arg(eps)});
    if (!e.empty()) return e;
    const size_t items = static_cast<size_t>(rows) * (c_ % 4 == 0 ? c_ / 4 : c_);
    const size_t g3 = gpu::RoundUp(items, wg_);
    return ctx.Enqueue(apply_k_, 1, &g3, &wg_, "group_norm.apply");
  }

 private:
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

  size_t StatsBytes() const { return sizeof(cl_float2) * n_ * o_.groups; }
  size_t PartialBytes() const {
    return sizeof(cl_float4) * static_cast<size_t>(n_) * o_.groups * splits_;
  }

  group_norm::Options o_;
  int n_ = 0, c_ = 0, cg_ = 0, splits_ = 1, vw_ = 1;
  bool one_ = false, combine_in_apply_ = false;
  int64_t spatial_ = 0;
  size_t wg_ = kStatsGroup;
  cl_kernel stats_k_ = nullptr, combine_k_ = nullptr, apply_k_ = nullptr, one_k_ = nullptr;
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
