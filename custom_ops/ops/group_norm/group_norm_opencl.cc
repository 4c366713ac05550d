// difflite.GroupNorm on the OpenCL backend (kernels: group_norm.cl).
//
// Four plans (PickPlan below picks one):
// "rows": gn_rows, for LayerNorms (one group, one position a sample): a
// work-group normalises several samples (rows), each read once into
// registers and written once (GPUs).
// "coop": gn_coop, column blocks of whole groups, K work-groups per (sample,
// block), each holding a slice of rows in registers; they exchange per-group
// partial sums through a buffer of the op's own, tagged with the launch, so x
// is read once from memory and y written once, in one kernel (GPUs).
// "one": gn_one, one work-group per (sample, group) that reduces the group and
// then normalises it: one kernel, no scratch.
// "split": gn_stats_cols reads x once into per-(work-group, group) partial
// statistics; gn_apply_cols merges the partials of its own groups in local
// memory and reads x once more, writing y once. Both over column blocks
// (ColsPlan): a work-item owns one vector of channels and walks rows
// (CPU-like devices).
// Scratch: the split plan's partials in slot 0 ([N * groups * P] float4).
// The launch plans are mirrored by benchmarks/gpu_kernels_harness/launch.py.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/kernel_util.h"
#include "difflite/gpu_api.h"
#include "difflite/registry.h"
#include "group_norm.h"

namespace difflite::gpu {
namespace {

using builtin::Arg;
using builtin::CeilDiv;

constexpr const char* kProgram = "group_norm";
constexpr int kColsGroup = 256;  // the split plan's largest work-group
constexpr int kColsMinWidth = 32;  // columns a work-group should span (a warp's row stretch)
constexpr int kStatsRows = 8;  // fewest rows per gn_stats_cols work-item
constexpr int kApplyRows = 16;  // rows per gn_apply_cols work-item
// Partials per group (gn_apply_cols merges them per work-group). 256: on the H200 the SD 1.5 VAE
// decoder's split GroupNorms took 1.38 ms a call against 1.78 at 64 (stats 0.87 -> 0.36 ms, the
// apply's merges 0.60 -> 0.72), 2026-11-29; a phone's 4 work-groups a compute unit stay below it.
constexpr int kMaxPartials = 256;
constexpr size_t kOneGroup = 1024;        // largest gn_one work-group
constexpr size_t kOneMinGroup = 64;       // smallest, for small groups
constexpr int kOneUnroll = 4;             // GN_UNROLL: loads in flight per work-item
constexpr int kCoopGroup = 128;  // gn_coop's work-group (largest)
constexpr int kCoopMaxFloats = 32;  // floats of x a gn_coop work-item holds in registers
constexpr int kCoopGroupsPerCu = 3;  // gn_coop work-groups a compute unit (PlanCoop)
constexpr int kCoopMaxChunks = 8;  // "coop" while a slice is at most this many chunks (PickPlan)
constexpr int64_t kOneMaxGroupElems = 65536;  // else "one" for groups this small (PickPlan)
constexpr int kCoopSpinLimit = 16384;  // polls before a work-group computes the sums itself
constexpr int kCoopMaxGather = 8;  // slice sums a gn_coop work-item gathers (registers)
constexpr int kRowsGroup = 128;  // gn_rows's work-group
constexpr int kRowsWidth = 32;  // gn_rows's work-items a row (at most)
constexpr int kRowsMaxVectors = 16;  // float4s of a row a gn_rows work-item holds

enum class Plan { kOne, kSplit, kCoop, kRows };

// gn_one's load width: 4 or 2 elements where they divide channels per group.
int OneVectorWidth(int cg) { return cg % 4 == 0 ? 4 : cg % 2 == 0 ? 2 : 1; }

// The fewest whole groups (a divisor of `groups`) whose cgv-vector columns
// reach kColsMinWidth (a warp's stretch of a row) within `limit` columns;
// fewer when that does not fit. cgv <= limit.
int GroupsPerBlock(int cgv, int groups, int limit) {
  int gpw = 1;
  for (int d = 1; d <= groups && cgv * d <= limit; ++d) {
    if (groups % d != 0) continue;
    gpw = d;
    if (cgv * d >= kColsMinWidth) break;
  }
  return gpw;
}

// gn_coop's shape: column blocks of gpw groups (lx vector columns of vw
// channels) by ly rows, k slices of `rows` rows a block, walked in `chunks`
// chunks of `items` rows a work-item. chunks kNoCoop: no plan (a group wider
// than the work-group).
constexpr int kNoCoop = 1 << 30;
struct CoopPlan {
  int vw = 1, lx = 1, ly = 1, gpw = 1, items = 1, k = 1, rows = 1, chunks = kNoCoop;

  std::string Options() const {
    return "-DGN_COOP=1 -DGN_VW=" + std::to_string(vw) + " -DGN_LX=" + std::to_string(lx) +
           " -DGN_LY=" + std::to_string(ly) + " -DGN_GPW=" + std::to_string(gpw) +
           " -DGN_ITEMS=" + std::to_string(items) + " -DGN_PARTS=" + std::to_string(gpw * k);
  }
};

// gn_coop's block: the fewest whole groups whose row stretch is whole 32-byte
// sectors (sector_elems elements), in float4 columns (a vector may span two
// groups), within `limit` columns: a stretch that is not whole sectors shares
// its end sectors with the next block, read twice (at 64x64x320, 10 channels
// a group, the UNet's commonest GroupNorm, 40 bytes of a row cost 64). Else
// GroupsPerBlock's groups in OneVectorWidth(cg) columns. Sets gpw, vw, lx.
void CoopBlock(int cg, int groups, int limit, int sector_elems, CoopPlan* p) {
  for (int d = 1; d <= groups && d * cg <= 4 * limit; ++d) {
    if (groups % d == 0 && (d * cg) % sector_elems == 0) {
      p->gpw = d;
      p->vw = 4;
      p->lx = d * cg / 4;
      return;
    }
  }
  p->vw = OneVectorWidth(cg);
  p->gpw = GroupsPerBlock(cg / p->vw, groups, limit);
  p->lx = p->gpw * cg / p->vw;
}

// Work-groups of at most `limit` work-items; slices enough for per_cu
// work-groups a compute unit (all resident at once: a sibling that waits for
// a later wave stalls its block), at most one a row and kCoopMaxGather *
// lx * ly / gpw a block (a work-item gathers at most kCoopMaxGather
// partials); then the fewest chunks a slice with at most max_floats floats a
// work-item, evened out.
CoopPlan PlanCoop(int64_t n, int groups, int64_t spatial, int cg, int limit, int max_floats,
                  uint32_t cus, int per_cu, int sector_elems) {
  CoopPlan p;
  if (cg / OneVectorWidth(cg) > limit) return p;
  CoopBlock(cg, groups, limit, sector_elems, &p);
  p.ly = static_cast<int>(std::min<int64_t>(std::max(1, limit / p.lx), spatial));
  const int64_t blocks = static_cast<int64_t>(groups / p.gpw) * n;
  const int64_t want = CeilDiv(static_cast<int64_t>(std::max<uint32_t>(cus, 1)) * per_cu, blocks);
  const int64_t k = std::max<int64_t>(
      1, std::min<int64_t>({want, spatial, std::max(1, kCoopMaxGather * p.lx * p.ly / p.gpw)}));
  const int64_t rows = CeilDiv(spatial, k);
  p.rows = static_cast<int>(rows);
  p.k = static_cast<int>(CeilDiv(spatial, rows));
  const int64_t per_item = CeilDiv(rows, p.ly);
  p.chunks = static_cast<int>(CeilDiv(per_item, std::max(1, max_floats / p.vw)));
  p.items = static_cast<int>(CeilDiv(per_item, p.chunks));
  return p;
}

// gn_rows's shape: lx work-items a row (the smallest power of two that
// covers the row's float4s, at most kRowsWidth and `limit`), rv float4s each,
// ly rows a work-group (limit / lx, at most n). rv 0: no rows plan (not a
// LayerNorm: more than one group or position a sample, C % 4 != 0, or a row
// of more than lx * kRowsMaxVectors float4s).
struct RowsPlan {
  int lx = 1, ly = 1, rv = 0;

  std::string Options() const {
    return "-DGN_VW=4 -DGN_LX=" + std::to_string(lx) + " -DGN_LY=" + std::to_string(ly) +
           " -DGN_RV=" + std::to_string(rv);
  }
};

RowsPlan PlanRows(int64_t n, int groups, int64_t spatial, int c, int limit) {
  RowsPlan p;
  if (groups != 1 || spatial != 1 || c % 4 != 0) return p;
  const int cv = c / 4;
  while (p.lx < cv && p.lx * 2 <= std::min(kRowsWidth, limit)) p.lx *= 2;
  if (CeilDiv(cv, p.lx) > kRowsMaxVectors) return p;
  p.rv = static_cast<int>(CeilDiv(cv, p.lx));
  p.ly = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(limit / p.lx, n)));
  return p;
}

// The largest power of two <= min(cap, the device's work-group limit).
size_t PowerOfTwoGroup(size_t cap, size_t device_max) {
  size_t wg = 1;
  while (wg * 2 <= cap && (device_max == 0 || wg * 2 <= device_max)) wg *= 2;
  return wg;
}

// The plan. GPUs (tiled kernels) take "rows" for LayerNorms (`rows`: it has
// a plan): [8192, 320], 15 a UNet step, took 24 us as "coop" (a row a
// work-group, 40% of a same-size copy) and 12 us (77%) as "rows" on the H100
// (2026-11). Otherwise they take "coop", one kernel that reads x once
// from memory and writes y once, while its slices are at most kCoopMaxChunks
// chunks (the chunks but the last are read again, from cache while x fits in
// it: on the H100, 8 chunks a slice is ~50 MB, its L2). Two kernels cost at
// least ~30 us on the H100 (a kernel ~7 us even when tiny, and 3-10 us
// between dependent ones), and "one" runs a group per work-group (64
// work-groups at batch 2 on 132 compute units): "coop" beat both at every SD
// 1.5 UNet GroupNorm shape (lab/gpu_gn_sweep.py, 2026-11).
// Larger tensors (the VAE's 64-268 MB) take "one" when its work-groups, one
// per (sample, group), fill the device or each group is small enough that a
// second kernel costs more than the idle compute units (at most
// kOneMaxGroupElems elements), else "split": it reads x twice from memory as
// "coop" would, in whole rows of channels. CPU-like devices
// (flat kernels) take "split": their work-groups run one after another, so
// "coop" would wait out its polls. DIFFLITE_GN_PLAN=rows|coop|one|split
// overrides (an A/B on a new GPU; "rows" only where it has a plan).
Plan PickPlan(bool flat, bool rows, int coop_chunks, int64_t n, int groups, int64_t group_elems,
              uint32_t cus) {
  const char* env = std::getenv("DIFFLITE_GN_PLAN");
  if (env != nullptr && std::strcmp(env, "one") == 0) return Plan::kOne;
  if (env != nullptr && std::strcmp(env, "split") == 0) return Plan::kSplit;
  if (env != nullptr && std::strcmp(env, "coop") == 0) return Plan::kCoop;
  if (env != nullptr && std::strcmp(env, "rows") == 0 && rows) return Plan::kRows;
  if (flat) return Plan::kSplit;
  if (rows) return Plan::kRows;
  if (coop_chunks <= kCoopMaxChunks) return Plan::kCoop;
  return n * groups >= static_cast<int64_t>(cus) || group_elems <= kOneMaxGroupElems ? Plan::kOne
                                                                                     : Plan::kSplit;
}

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

// kMaxPartials, or DIFFLITE_GN_PARTIALS=N (1..1024; an A/B of the split plan's stats launch on
// a large GPU, where 64 partials a group leave compute units idle).
int MaxPartials() {
  const char* env = std::getenv("DIFFLITE_GN_PARTIALS");
  const int forced = env != nullptr ? std::atoi(env) : 0;
  return forced >= 1 && forced <= 1024 ? forced : kMaxPartials;
}

ColsPlan PlanCols(int64_t n, int groups, int64_t spatial, int c, uint32_t cus, int limit) {
  ColsPlan p;
  const int cg = c / groups;
  p.vw = OneVectorWidth(cg);
  p.cv = c / p.vw;
  const int cgv = cg / p.vw;
  if (cgv <= limit) {
    p.gpw = GroupsPerBlock(cgv, groups, limit);
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
  p.ys = static_cast<int>(std::max<int64_t>(1, std::min({want, by_rows, int64_t{std::max(1, MaxPartials() / p.xb)}})));
  p.ya = static_cast<int>(std::max<int64_t>(1, CeilDiv(spatial, int64_t{p.ly} * kApplyRows)));
  return p;
}

class GroupNormGpu final : public GpuOp {
 public:
  ~GroupNormGpu() override {
    if (coop_partial_ != nullptr) cl_->ReleaseMemObject(coop_partial_);
  }

  std::string Init(const group_norm::Options& o, const Shape& x, GpuContext& ctx) {
    o_ = o;
    n_ = x[0];
    c_ = x.back();
    spatial_ = NumElements(x) / (static_cast<int64_t>(n_) * c_);
    cg_ = c_ / o.groups;
    if (NumElements(x) > builtin::kMaxIndex) {
      return "x has more than 2^31-1 elements";
    }
    coop_ = PlanCoopFor(ctx, WorkGroupLimit(ctx, kCoopGroup));
    rows_ = PlanRows(n_, o.groups, spatial_, c_, WorkGroupLimit(ctx, kRowsGroup));
    plan_kind_ = PickPlan(ctx.PreferFlatKernels(), rows_.rv > 0, coop_.chunks, n_, o.groups,
                          spatial_ * cg_, ctx.device().compute_units);
    if (plan_kind_ == Plan::kRows) return InitRows(ctx);
    if (plan_kind_ == Plan::kCoop) return InitCoop(ctx);
    if (plan_kind_ == Plan::kOne) return InitOne(ctx);
    return InitCols(ctx);
  }

  size_t ScratchSlotBytes(int slot) const override {
    return slot == 0 && plan_kind_ == Plan::kSplit ? PartialBytes() : 0;
  }

  // gn_coop's partial-sum words live as long as the op (a few KB: two per
  // (sample, group, slice)); reported with the memory the op holds.
  size_t WeightBytes() const override { return coop_partial_ != nullptr ? CoopPartialBytes() : 0; }

  std::string Run(GpuContext& ctx, const std::vector<GpuTensor>& in,
                  const std::vector<GpuTensor>& out) override {
    std::string e = builtin::CheckRunTensors(ctx, in, out, 3, 1);
    if (!e.empty()) return e;
    if (plan_kind_ == Plan::kOne) return RunOne(ctx, in, out);
    if (plan_kind_ == Plan::kCoop) return RunCoop(ctx, in, out);
    if (plan_kind_ == Plan::kRows) return RunRows(ctx, in, out);
    const gpu::ClApi& cl = ctx.cl();
    cl_mem partial = ctx.Scratch(PartialBytes(), 0, &e);
    if (partial == nullptr) return "group norm partial statistics: " + e;
    const cl_int s = static_cast<cl_int>(spatial_), c = c_, cg = cg_, groups = o_.groups,
                 xb = plan_.xb, parts = plan_.Partials(), silu = o_.silu ? 1 : 0;
    const cl_float eps = o_.epsilon;
    const size_t local[3] = {static_cast<size_t>(plan_.lx), static_cast<size_t>(plan_.ly), 1};
    e = SetArgs(cl, stats_k_, {Arg(in[0].mem), Arg(partial), Arg(s), Arg(c), Arg(cg),
                                     Arg(groups), Arg(xb)});
    if (!e.empty()) return e;
    const size_t g1[3] = {static_cast<size_t>(plan_.cv), local[1] * plan_.ys,
                          static_cast<size_t>(n_)};
    e = ctx.Enqueue(stats_k_, 3, g1, local, "group_norm.stats");
    if (!e.empty()) return e;
    e = SetArgs(cl, apply_k_,
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
    int limit = WorkGroupLimit(ctx, kColsGroup);
    for (;;) {
      plan_ = PlanCols(n_, o_.groups, spatial_, c_, ctx.device().compute_units, limit);
      const std::string opts = plan_.Options();
      std::string e = builtin::GetKernel(ctx, kProgram, "gn_stats_cols", opts, &stats_k_);
      if (e.empty()) e = builtin::GetKernel(ctx, kProgram, "gn_apply_cols", opts, &apply_k_);
      if (!e.empty()) return e;
      size_t accepted = static_cast<size_t>(plan_.lx) * plan_.ly;
      for (cl_kernel k : {stats_k_, apply_k_}) {
        const size_t kmax = ctx.KernelWorkGroupSize(k);
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
    wg_ = PowerOfTwoGroup(kOneGroup, ctx.device().max_work_group_size);
    const int64_t group_elems = spatial_ * cg_;
    while (wg_ > kOneMinGroup && static_cast<int64_t>(wg_) * kOneUnroll * vw_ > group_elems) {
      wg_ /= 2;
    }
    for (;; wg_ /= 2) {
      const std::string opts = "-DGN_WG=" + std::to_string(wg_) + " -DGN_VW=" +
                               std::to_string(vw_) + " -DGN_UNROLL=" + std::to_string(kOneUnroll);
      std::string e = builtin::GetKernel(ctx, kProgram, "gn_one", opts, &one_k_);
      if (!e.empty()) return e;
      const size_t kmax = ctx.KernelWorkGroupSize(one_k_);
      if (kmax == 0 || kmax >= wg_) return "";
      if (wg_ == 1) return "gn_one fits no work-group size";
    }
  }

  std::string RunOne(GpuContext& ctx, const std::vector<GpuTensor>& in,
                     const std::vector<GpuTensor>& out) {
    const cl_int s = static_cast<cl_int>(spatial_), c = c_, cg = cg_, silu = o_.silu ? 1 : 0;
    const cl_float eps = o_.epsilon;
    std::string e = SetArgs(ctx.cl(), one_k_,
                                  {Arg(in[0].mem), Arg(in[1].mem), Arg(in[2].mem),
                                   Arg(out[0].mem), Arg(s), Arg(c), Arg(cg), Arg(silu), Arg(eps)});
    if (!e.empty()) return e;
    const size_t global[2] = {wg_ * o_.groups, static_cast<size_t>(n_)};
    const size_t local[2] = {wg_, 1};
    return ctx.Enqueue(one_k_, 2, global, local, "group_norm.one");
  }

  // gn_rows, replanned with a smaller work-group limit while the kernel does
  // not accept the plan's work-group; "coop" (plan_kind_ changed) when no
  // work-group it accepts holds a row.
  std::string InitRows(GpuContext& ctx) {
    for (;;) {
      if (rows_.rv == 0) {
        plan_kind_ = Plan::kCoop;
        return InitCoop(ctx);
      }
      std::string e = builtin::GetKernel(ctx, kProgram, "gn_rows", rows_.Options(), &rows_k_);
      if (!e.empty()) return e;
      const size_t kmax = ctx.KernelWorkGroupSize(rows_k_);
      if (kmax == 0 || kmax >= static_cast<size_t>(rows_.lx) * rows_.ly) return "";
      rows_ = PlanRows(n_, o_.groups, spatial_, c_, static_cast<int>(kmax));
    }
  }

  std::string RunRows(GpuContext& ctx, const std::vector<GpuTensor>& in,
                      const std::vector<GpuTensor>& out) {
    const cl_int n = n_, c = c_, silu = o_.silu ? 1 : 0;
    const cl_float eps = o_.epsilon;
    std::string e = SetArgs(ctx.cl(), rows_k_,
                                  {Arg(in[0].mem), Arg(in[1].mem), Arg(in[2].mem),
                                   Arg(out[0].mem), Arg(n), Arg(c), Arg(silu), Arg(eps)});
    if (!e.empty()) return e;
    const size_t lx = static_cast<size_t>(rows_.lx), ly = static_cast<size_t>(rows_.ly);
    const size_t global[2] = {lx, ly * CeilDiv(static_cast<size_t>(n_), ly)};
    const size_t local[2] = {lx, ly};
    return ctx.Enqueue(rows_k_, 2, global, local, "group_norm.rows");
  }

  // min(cap, the device's work-group limit).
  static int WorkGroupLimit(GpuContext& ctx, int cap) {
    const size_t device_max = ctx.device().max_work_group_size;
    return device_max != 0 && device_max < static_cast<size_t>(cap) ? static_cast<int>(device_max)
                                                                      : cap;
  }

  // PlanCoop for this op on this device (32-byte sectors of the storage type).
  CoopPlan PlanCoopFor(GpuContext& ctx, int limit) const {
    return PlanCoop(n_, o_.groups, spatial_, cg_, limit, kCoopMaxFloats, ctx.device().compute_units,
                    kCoopGroupsPerCu, 32 / static_cast<int>(DTypeSize(ctx.storage())));
  }

  // gn_coop for Init's plan, replanned with a smaller work-group limit while
  // the kernel does not accept the plan's work-group, and its zeroed
  // partial-sum words (they outlive a launch: a tag from the launch before
  // must still be there, not another op's scratch). Falls back to "one"
  // (plan_kind_ changed) when no work-group the kernel accepts holds a group.
  std::string InitCoop(GpuContext& ctx) {
    for (;;) {
      if (coop_.chunks == kNoCoop) {
        plan_kind_ = Plan::kOne;
        return InitOne(ctx);
      }
      std::string e = builtin::GetKernel(ctx, kProgram, "gn_coop", coop_.Options(), &coop_k_);
      if (!e.empty()) return e;
      const size_t kmax = ctx.KernelWorkGroupSize(coop_k_);
      if (kmax == 0 || kmax >= static_cast<size_t>(coop_.lx) * coop_.ly) break;
      coop_ = PlanCoopFor(ctx, static_cast<int>(kmax));
    }
    cl_ = &ctx.cl();
    std::vector<cl_ulong> zeros(CoopPartialBytes() / sizeof(cl_ulong), 0);
    cl_int err = CL_SUCCESS;
    coop_partial_ = cl_->CreateBuffer(ctx.context(), CL_MEM_READ_WRITE | CL_MEM_COPY_HOST_PTR,
                                      zeros.size() * sizeof(cl_ulong), zeros.data(), &err);
    if (coop_partial_ == nullptr || err != CL_SUCCESS) {
      coop_partial_ = nullptr;
      return "group norm partial sums: clCreateBuffer failed (" + std::to_string(err) + ")";
    }
    return "";
  }

  std::string RunCoop(GpuContext& ctx, const std::vector<GpuTensor>& in,
                      const std::vector<GpuTensor>& out) {
    const cl_int s = static_cast<cl_int>(spatial_), c = c_, cg = cg_, groups = o_.groups,
                 k = coop_.k, rows = coop_.rows, silu = o_.silu ? 1 : 0, spin = kCoopSpinLimit;
    const cl_float eps = o_.epsilon;
    const cl_uint tag = static_cast<cl_uint>(launches_ % 0xFFFFFFFFu) + 1;  // never 0
    std::string e = SetArgs(
        ctx.cl(), coop_k_,
        {Arg(in[0].mem), Arg(in[1].mem), Arg(in[2].mem), Arg(out[0].mem), Arg(coop_partial_),
         Arg(s), Arg(c), Arg(cg), Arg(groups), Arg(k), Arg(rows), Arg(silu), Arg(eps), Arg(tag),
         Arg(spin)});
    if (!e.empty()) return e;
    const size_t lx = static_cast<size_t>(coop_.lx), ly = static_cast<size_t>(coop_.ly);
    const size_t global[3] = {lx * coop_.k * (o_.groups / coop_.gpw), ly, static_cast<size_t>(n_)};
    const size_t local[3] = {lx, ly, 1};
    e = ctx.Enqueue(coop_k_, 3, global, local, "group_norm.coop");
    if (e.empty()) ++launches_;
    return e;
  }

  size_t CoopPartialBytes() const {
    return 2 * sizeof(cl_ulong) * static_cast<size_t>(n_) * o_.groups * coop_.k;
  }
  size_t PartialBytes() const {
    return sizeof(cl_float4) * static_cast<size_t>(n_) * o_.groups * plan_.Partials();
  }

  group_norm::Options o_;
  int n_ = 0, c_ = 0, cg_ = 0, vw_ = 1;
  Plan plan_kind_ = Plan::kSplit;
  int64_t spatial_ = 0;
  size_t wg_ = kOneGroup;  // gn_one's work-group
  ColsPlan plan_;
  CoopPlan coop_;
  RowsPlan rows_;
  uint64_t launches_ = 0;  // gn_coop launches so far (its tags)
  const gpu::ClApi* cl_ = nullptr;
  cl_mem coop_partial_ = nullptr;
  cl_kernel stats_k_ = nullptr, apply_k_ = nullptr, one_k_ = nullptr, coop_k_ = nullptr,
            rows_k_ = nullptr;
};

std::unique_ptr<GpuOp> Create(const NodeView& node, GpuContext& ctx, std::string* error) {
  const auto* parsed = builtin::CheckedCustomNode<group_norm::Parsed>(node, error);
  if (parsed == nullptr) return nullptr;
  auto op = std::make_unique<GroupNormGpu>();
  *error = op->Init(parsed->options(), node.inputs[0].shape, ctx);
  if (!error->empty()) return nullptr;
  return op;
}

}  // namespace

const GpuOpDef kGpuGroupNormOps[] = {{group_norm::kOpName, &Create}};
DIFFLITE_REGISTER_OPS(kGpuGroupNormOps);

}  // namespace difflite::gpu
