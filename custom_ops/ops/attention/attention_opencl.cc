// difflite.Attention on the OpenCL backend (kernels: attention.cl).
//
// Two variants; neither writes the Lq x Lk score matrix:
//   partial_softmax  attn_rowstats (row max and sum of exp, [N,H,Lq] float2
//                    in scratch slot 0) + attn_output (scores recomputed,
//                    normalisation fused into the product with V).
//   flash            attn_flash: one kernel, online softmax, K/V tiles in
//                    local memory, q row and accumulator in registers.
// `variant` is a hint: "auto" takes flash when both head sizes are <= 64
// (its per-work-item registers: q row + accumulator) and its K/V tiles fit in
// half the device's local memory; otherwise, and whenever the flash kernel
// cannot be built with its work-group size, partial_softmax.
// Local memory holds float4s along the head dimension (each head size or
// chunk rounded up to a multiple of 4); each work-item owns `rq` query rows
// (AT_RQ), so a work-group is bq / rq work-items.
// The plan is mirrored by benchmarks/gpu_kernels_harness/launch.py
// (attention_plan); keep the two in step.
#include <memory>
#include <string>
#include <vector>

#include "../opencl_common.h"
#include "attention.h"
#include "difflite/gpu_api.h"

namespace difflite {
namespace {

using gpu::GpuContext;
using gpu::GpuOp;
using gpu::GpuTensor;
using gpu::NodeView;
using gpu::opsupport::Arg;
using gpu::opsupport::CeilDiv;
using gpu::opsupport::SetKernelArgs;

constexpr const char* kProgram = "attention";
constexpr int kFlashMaxHead = 64;

// Rows per work-item (AT_RQ), flash only: 2 when the two rows' q and
// accumulator registers stay within kRowRegs floats, else 1. Measured on an
// H100 (fp32): head 40 with 2 rows 1.4x faster than with 1; heads 80 and 160
// and the partial softmax (scores + accumulator chunk: 96 floats a row) were
// 2-3x slower with 2 rows (register spills), 4 rows slower everywhere. The
// partial-softmax kernels take AT_RQ too but run with 1.
constexpr int kRowRegs = 160;

int Round4(int d) { return (d + 3) / 4 * 4; }

struct Plan {
  bool flash = false;
  int bq = 64, bk = 32, kc = 8, dc = 0, dvc = 0;
  int rq = 1;  // query rows per work-item

  size_t LocalBytes(int dk, int dv) const {
    if (flash) return 4u * bk * (Round4(dk) + Round4(dv));  // Ks Vs
    return 4u * (bq * (Round4(dc) + 4) + bk * Round4(dc) + bk * Round4(dvc) +
                 bq * (bk + 1));  // Qs Ks Vs Ps
  }
  int WorkGroup() const { return bq / rq; }
  void PickRows(int dk, int dv) {
    rq = flash && bq % 2 == 0 && 2 * (Round4(dk) + Round4(dv)) <= kRowRegs ? 2 : 1;
  }
  std::string Options(int dk, int dv) const {
    const std::string rows = " -DAT_RQ=" + std::to_string(rq);
    if (flash) {
      return "-DAT_DK=" + std::to_string(dk) + " -DAT_DV=" + std::to_string(dv) +
             " -DAT_BQ=" + std::to_string(bq) + " -DAT_BK=" + std::to_string(bk) +
             " -DAT_KC=" + std::to_string(kc) + rows;
    }
    return "-DAT_BQ=" + std::to_string(bq) + " -DAT_BK=" + std::to_string(bk) +
           " -DAT_DC=" + std::to_string(dc) + " -DAT_DVC=" + std::to_string(dvc) + rows;
  }
};

// The fewest chunks of at most `cap`; returns the chunk size.
int Chunk(int d, int cap) { return static_cast<int>(CeilDiv(d, CeilDiv(d, cap))); }

// Flash tiles (K/V tiles of 32 keys, 16 if local memory is tight), or false.
bool PlanFlash(int dk, int dv, size_t local_mem, Plan* p) {
  Plan f;
  f.flash = true;
  if (f.LocalBytes(dk, dv) > local_mem) f.bk = 16;
  if (f.LocalBytes(dk, dv) > local_mem) return false;
  f.PickRows(dk, dv);
  *p = f;
  return true;
}

bool PlanPartial(int dk, int dv, size_t local_mem, Plan* p) {
  // {Dv chunk cap, rows per work-group, keys per tile, Dk chunk cap}: the
  // first that fits.
  const int ladder[4][4] = {{128, 64, 32, 64}, {64, 64, 32, 64}, {64, 32, 32, 64}, {32, 32, 16, 32}};
  for (const auto& o : ladder) {
    Plan q;
    q.bq = o[1];
    q.bk = o[2];
    q.dc = Chunk(dk, o[3]);
    q.dvc = Chunk(dv, o[0]);
    if (q.LocalBytes(dk, dv) <= local_mem) {
      q.PickRows(dk, dv);
      *p = q;
      return true;
    }
  }
  return false;
}

class AttentionGpu final : public GpuOp {
 public:
  std::string Init(const attention::Options& o, const Shape& q, const Shape& k,
                   const Shape& v, GpuContext& ctx) {
    o_ = o;
    n_ = q[0];
    lq_ = q[1];
    lk_ = k[1];
    dk_ = q[2] / o.heads;
    dv_ = v[2] / o.heads;
    for (const Shape* s : {&q, &k, &v}) {
      if (NumElements(*s) > gpu::opsupport::kMaxIndex) {
        return "q, k or v has more than 2^31-1 elements";
      }
    }
    if (static_cast<int64_t>(n_) * lq_ * v[2] > gpu::opsupport::kMaxIndex) {
      return "the output has more than 2^31-1 elements";
    }
    const size_t local_mem = ctx.device().local_mem_bytes;
    const bool want_flash =
        o.variant == "flash" ||
        (o.variant == "auto" && dk_ <= kFlashMaxHead && dv_ <= kFlashMaxHead &&
         Plan{true}.LocalBytes(dk_, dv_) <= local_mem / 2);
    if (want_flash && PlanFlash(dk_, dv_, local_mem, &plan_)) {
      const std::string e = gpu::opsupport::GetKernel(
          ctx, kProgram, "attn_flash", plan_.Options(dk_, dv_), &flash_k_);
      const size_t wg = e.empty() ? gpu::opsupport::KernelMaxWorkGroup(ctx, flash_k_) : 0;
      if (e.empty() && (wg == 0 || wg >= static_cast<size_t>(plan_.WorkGroup()))) return "";
      flash_k_ = nullptr;  // a hint only: fall back to the partial softmax
    }
    if (!PlanPartial(dk_, dv_, local_mem, &plan_)) {
      return "attention tiles for head sizes " + std::to_string(dk_) + "/" +
             std::to_string(dv_) + " exceed the device's local memory";
    }
    const std::string opts = plan_.Options(dk_, dv_);
    std::string e = gpu::opsupport::GetKernel(ctx, kProgram, "attn_rowstats", opts, &stats_k_);
    if (e.empty()) e = gpu::opsupport::GetKernel(ctx, kProgram, "attn_output", opts, &out_k_);
    if (!e.empty()) return e;
    for (cl_kernel kk : {stats_k_, out_k_}) {
      const size_t wg = gpu::opsupport::KernelMaxWorkGroup(ctx, kk);
      if (wg != 0 && wg < static_cast<size_t>(plan_.WorkGroup())) {
        return "attention kernels accept work-groups of at most " + std::to_string(wg) +
               " (need " + std::to_string(plan_.WorkGroup()) + ")";
      }
    }
    return "";
  }

  size_t ScratchBytes() const override { return plan_.flash ? 0 : StatsBytes(); }

  std::string Run(GpuContext& ctx, const std::vector<GpuTensor>& in,
                  const std::vector<GpuTensor>& out) override {
    std::string e = gpu::opsupport::CheckRunTensors(ctx, in, out, 3, 1);
    if (!e.empty()) return e;
    const gpu::ClApi& cl = ctx.cl();
    const cl_int lq = lq_, lk = lk_, h = o_.heads, dk = dk_, dv = dv_;
    const cl_int causal = o_.causal ? 1 : 0;
    const cl_float scale = o_.scale;
    const size_t wg = static_cast<size_t>(plan_.WorkGroup());
    // ceil(Lq / bq) work-groups of bq / rq work-items (bq rows each).
    const size_t rows = static_cast<size_t>(CeilDiv(lq_, plan_.bq)) * wg;
    const size_t local[3] = {wg, 1, 1};
    if (plan_.flash) {
      e = SetKernelArgs(cl, flash_k_,
                        {Arg(in[0].mem), Arg(in[1].mem), Arg(in[2].mem), Arg(out[0].mem),
                         Arg(lq), Arg(lk), Arg(h), Arg(scale), Arg(causal)});
      if (!e.empty()) return e;
      const size_t global[3] = {rows, static_cast<size_t>(h), static_cast<size_t>(n_)};
      return ctx.Enqueue(flash_k_, 3, global, local, "attention.flash");
    }
    cl_mem stats = ctx.Scratch(StatsBytes(), 0, &e);
    if (stats == nullptr) return "attention row statistics: " + e;
    e = SetKernelArgs(cl, stats_k_,
                      {Arg(in[0].mem), Arg(in[1].mem), Arg(stats), Arg(lq), Arg(lk),
                       Arg(h), Arg(dk), Arg(scale), Arg(causal)});
    if (!e.empty()) return e;
    const size_t g1[3] = {rows, static_cast<size_t>(h), static_cast<size_t>(n_)};
    e = ctx.Enqueue(stats_k_, 3, g1, local, "attention.rowstats");
    if (!e.empty()) return e;
    e = SetKernelArgs(cl, out_k_,
                      {Arg(in[0].mem), Arg(in[1].mem), Arg(in[2].mem), Arg(stats),
                       Arg(out[0].mem), Arg(lq), Arg(lk), Arg(h), Arg(dk), Arg(dv),
                       Arg(scale), Arg(causal)});
    if (!e.empty()) return e;
    const size_t chunks = static_cast<size_t>(CeilDiv(dv_, plan_.dvc));
    const size_t g2[3] = {rows, static_cast<size_t>(h) * chunks, static_cast<size_t>(n_)};
    return ctx.Enqueue(out_k_, 3, g2, local, "attention.output");
  }

 private:
  size_t StatsBytes() const {
    return sizeof(cl_float2) * static_cast<size_t>(n_) * o_.heads * lq_;
  }

  attention::Options o_;
  int n_ = 0, lq_ = 0, lk_ = 0, dk_ = 0, dv_ = 0;
  Plan plan_;
  cl_kernel flash_k_ = nullptr, stats_k_ = nullptr, out_k_ = nullptr;
};

std::unique_ptr<GpuOp> Create(const NodeView& node, GpuContext& ctx, std::string* error) {
  const auto* parsed = dynamic_cast<const attention::Parsed*>(node.custom);
  if (parsed == nullptr) {
    *error = "not a parsed difflite.Attention node";
    return nullptr;
  }
  std::vector<TensorInfo> outs;
  std::string e = gpu::opsupport::InferAsFloat(*parsed, node.inputs, &outs);
  std::unique_ptr<AttentionGpu> op(new AttentionGpu());
  if (e.empty()) {
    e = op->Init(parsed->options(), node.inputs[0].shape, node.inputs[1].shape,
                 node.inputs[2].shape, ctx);
  }
  if (!e.empty()) {
    *error = e;
    return nullptr;
  }
  return op;
}

}  // namespace

namespace gpu {
extern const GpuOpDef kGpuAttention;
const GpuOpDef kGpuAttention = {attention::kOpName, &Create};
}  // namespace gpu

}  // namespace difflite
