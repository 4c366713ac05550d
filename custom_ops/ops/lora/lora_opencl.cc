// difflite.LoRA on the OpenCL backend (kernels: lora.cl).
//
// The output shares y's buffer (AliasInput, written in place: WritesAliasInPlace, which the
// memory plan honours where nothing else reads that buffer afterwards), so with no factors set
// the op costs nothing: no kernel, no copy, no buffer. Where the plan declined the alias, Run
// copies y. With factors set, each pass of at most kRanksPerPass ranks launches two kernels (the
// later passes add to the output): lora_down, t = x D^T into a float scratch [M][ld] (K split
// over the 32 lanes of a work-group's warps, the lanes' sums added in local memory), then
// lora_up, out = y + t U^T (an item per rows and 4 consecutive columns).
//
// The scratch is the backend's scratch slot 0 (GpuContext::Scratch): one buffer of the
// delegate, shared with every op that takes scratch (ops run one after another on one queue),
// grown on demand to the largest M x ld x 4 bytes a Run asked for, freed with the delegate; not
// in the memory plan (ScratchBytes stays 0: no factors, no scratch).
//
// The factors live in the delegate's LoraSlots (lora_slots.h): the op holds its slot from its
// creation (the layer's K and N), and each difflite_lora_set uploads the slot's factors once, as
// float (D [R][K] as given, U transposed on the host to UT = U^T [R][N], so that a rank's values
// are a row of each), in buffers of exactly that rank, freed when replaced or cleared.
#include <algorithm>
#include <memory>
#include <string>
#include <vector>

#include "common/kernel_util.h"
#include "difflite/gpu_api.h"
#include "difflite/lora_slots.h"
#include "difflite/registry.h"
#include "lora.h"

namespace difflite::gpu {
namespace {

using builtin::Arg;
using builtin::CeilDiv;

constexpr int kRanksPerPass = 128;  // t's columns at most (the scratch: M x 128 floats at most)
constexpr int kDownLanes = 32;      // lora.cl: LORA_KL, items along k
constexpr int kRanksPerGroup = 32;  // LORA_RB, lora_down's ranks per work-group (dimension 1)
constexpr int kUpColumnItems = 32;  // LORA_UC, lora_up's items along N (4 columns each)
constexpr int kScratchSlot = 0;     // GpuContext::Scratch: t
constexpr int kGroupsPerUnit = 2;   // rows per item: the most that leave this many work-groups
                                    // per compute unit

// lora.cl's build parameters, picked per layer at creation: lora_down's LORA_DR (rows per item)
// and LORA_DS (row slots: 128 x ds items), lora_up's LORA_UR and LORA_US (32 x us items).
struct Plan {
  int dr = 1, ds = 2, ur = 1, us = 8;
  int down_items() const { return 4 * kDownLanes * ds; }
  int down_rows() const { return dr * ds; }
  int up_items() const { return kUpColumnItems * us; }
  int up_rows() const { return ur * us; }
  size_t down_local_bytes() const { return sizeof(float) * kDownLanes * (static_cast<size_t>(ds) * kRanksPerGroup + 1); }
  std::string DownOptions() const { return "-DLORA_DR=" + std::to_string(dr) + " -DLORA_DS=" + std::to_string(ds); }
  std::string UpOptions() const { return "-DLORA_UR=" + std::to_string(ur) + " -DLORA_US=" + std::to_string(us); }
};

// Rows per item: the largest of 8, 4, 2, 1 that leaves at least `target` work-groups of `slots`
// row slots over `rows` rows (times `across` groups per row block), else 1.
int RowsPerItem(int64_t rows, int slots, int64_t across, int64_t target) {
  for (int r : {8, 4, 2}) {
    if (CeilDiv(rows, int64_t{r} * slots) * across >= target) return r;
  }
  return 1;
}

// The device's copy of one set: D [R][K] (as given: lora_down's lanes read a rank's row along k
// coalesced; D^T [K][R] measured 5x slower on the H200, lab/gpu_lora_sweep.py) and UT [R][N], float.
class DeviceFactors final : public LoraFactors {
 public:
  explicit DeviceFactors(const ClApi* cl) : cl_(cl) {}
  ~DeviceFactors() override {
    if (dt != nullptr) cl_->ReleaseMemObject(dt);
    if (ut != nullptr) cl_->ReleaseMemObject(ut);
  }
  cl_mem dt = nullptr;
  cl_mem ut = nullptr;

 private:
  const ClApi* cl_;  // the process's runtime, never unloaded
};

// LoraSlots::Store of the OpenCL backend. The runtime (ClApi, context) lives as long as the
// process (Runtime::Get), so the stored factors may outlive the op that made them.
std::unique_ptr<LoraFactors> StoreOnDevice(const ClApi* cl, cl_context context, uint64_t max_alloc,
                                           int slot, int rank, int k, int n, const float* down,
                                           const float* up, std::string* error) {
  const size_t r = static_cast<size_t>(rank), kk = static_cast<size_t>(k), nn = static_cast<size_t>(n);
  const size_t dt_bytes = kk * r * sizeof(float), ut_bytes = r * nn * sizeof(float);
  const std::string refused = "the device refused " + std::to_string(dt_bytes + ut_bytes) +
                              " bytes for slot " + std::to_string(slot) + "'s factors";
  if (max_alloc > 0 && std::max(dt_bytes, ut_bytes) > max_alloc) {
    *error = refused + " (at most " + std::to_string(max_alloc) + " bytes a buffer)";
    return nullptr;
  }
  std::vector<float> host(std::max(kk * r, r * nn));
  auto f = std::make_unique<DeviceFactors>(cl);
  cl_int err = CL_SUCCESS;
  std::copy(down, down + kk * r, host.begin());  // D as given
  f->dt = cl->CreateBuffer(context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, dt_bytes, host.data(), &err);
  if (f->dt != nullptr && err == CL_SUCCESS) {
    for (size_t j = 0; j < r; ++j) {  // UT[j][c] = U[c][j]
      for (size_t c = 0; c < nn; ++c) host[j * nn + c] = up[c * r + j];
    }
    f->ut = cl->CreateBuffer(context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, ut_bytes, host.data(), &err);
  }
  if (f->dt == nullptr || f->ut == nullptr || err != CL_SUCCESS) {
    *error = refused + ": " + ClErrorName(err);
    return nullptr;
  }
  f->bytes = dt_bytes + ut_bytes;
  return f;
}

class LoraGpu final : public GpuOp {
 public:
  LoraGpu(cl_kernel down, cl_kernel up, Plan plan, lora::Layer layer, std::unique_ptr<LoraSlots::Hold> hold)
      : down_(down), up_(up), plan_(plan), layer_(layer), hold_(std::move(hold)) {}

  int AliasInput(size_t output) const override { return output == 0 ? 0 : -1; }
  bool WritesAliasInPlace(size_t output) const override { return output == 0; }

  std::string Run(GpuContext& ctx, const std::vector<GpuTensor>& in,
                  const std::vector<GpuTensor>& out) override {
    std::string e = builtin::CheckRunTensors(ctx, in, out, 2, 1);
    if (!e.empty()) return e;
    const std::shared_ptr<const LoraFactors> set = hold_->Factors();
    if (set == nullptr) {
      if (in[0].mem == out[0].mem) return "";  // out is y: nothing to do
      const size_t bytes = static_cast<size_t>(layer_.rows) * layer_.n * DTypeSize(out[0].dtype);
      const cl_int err = ctx.cl().EnqueueCopyBuffer(ctx.queue(), in[0].mem, out[0].mem, 0, 0, bytes, 0,
                                                    nullptr, nullptr);
      return err == CL_SUCCESS ? "" : "clEnqueueCopyBuffer(y): " + ClErrorName(err);
    }
    const auto* f = dynamic_cast<const DeviceFactors*>(set.get());
    if (f == nullptr) return "slot " + std::to_string(hold_->slot()) + "'s factors are not on this device";
    const cl_int m = static_cast<cl_int>(layer_.rows), k = layer_.k, n = layer_.n, r = f->rank;
    // t [M][ld]: ld = the pass's ranks rounded up to 4 (lora_up reads t's rows as float4)
    const cl_int ld = static_cast<cl_int>(CeilDiv(std::min<cl_int>(r, kRanksPerPass), 4) * 4);
    if (int64_t{m} * ld > builtin::kMaxIndex) return "t of " + std::to_string(m) + " x " + std::to_string(ld) + " values";
    cl_mem t = ctx.Scratch(static_cast<size_t>(m) * ld * sizeof(float), kScratchSlot, &e);
    if (t == nullptr) return e;
    const size_t down_local[2] = {static_cast<size_t>(plan_.down_items()), 1};
    const size_t up_local[2] = {static_cast<size_t>(kUpColumnItems), static_cast<size_t>(plan_.us)};
    const size_t up_global[2] = {static_cast<size_t>(CeilDiv(n, 4 * kUpColumnItems)) * up_local[0],
                                 static_cast<size_t>(CeilDiv(m, plan_.up_rows())) * up_local[1]};
    for (cl_int r0 = 0; r0 < r; r0 += kRanksPerPass) {
      const cl_int rc = std::min<cl_int>(kRanksPerPass, r - r0);
      const size_t down_global[2] = {static_cast<size_t>(CeilDiv(m, plan_.down_rows())) * down_local[0],
                                     static_cast<size_t>(CeilDiv(rc, kRanksPerGroup))};
      const cl_mem y = r0 == 0 ? in[0].mem : out[0].mem;  // later passes add to the output
      e = SetArgs(ctx.cl(), down_, {Arg(in[1].mem), Arg(f->dt), Arg(t), Arg(m), Arg(k), Arg(r), Arg(r0), Arg(rc), Arg(ld)});
      if (e.empty()) e = ctx.Enqueue(down_, 2, down_global, down_local, "lora_down");
      if (e.empty()) {
        e = SetArgs(ctx.cl(), up_, {Arg(y), Arg(out[0].mem), Arg(t), Arg(f->ut), Arg(m), Arg(n), Arg(r), Arg(r0),
                                    Arg(rc), Arg(ld)});
      }
      if (e.empty()) e = ctx.Enqueue(up_, 2, up_global, up_local, "lora_up");
      if (!e.empty()) return e;
    }
    return "";
  }

 private:
  cl_kernel down_, up_;
  Plan plan_;
  lora::Layer layer_;
  std::unique_ptr<LoraSlots::Hold> hold_;
};

// The plan of one layer: row slots, the most the device takes (lora_down 2 then 1, lora_up 8, 4,
// 2, 1); rows per item, the most that leave kGroupsPerUnit work-groups per compute unit
// (RowsPerItem). nullptr kernels and *error (a program that does not build) or a refusal when no
// work-group fits.
std::string PickPlan(GpuContext& ctx, const lora::Layer& layer, Plan* plan, cl_kernel* down, cl_kernel* up) {
  const DeviceInfo& dev = ctx.device();
  const int64_t target = int64_t{kGroupsPerUnit} * std::max<uint32_t>(dev.compute_units, 1);
  Plan p;
  *down = *up = nullptr;
  for (int ds : {2, 1}) {
    p.ds = ds;
    p.dr = RowsPerItem(layer.rows, ds, 1, target);
    if (static_cast<size_t>(p.down_items()) > dev.max_work_group_size ||
        (dev.local_mem_bytes > 0 && p.down_local_bytes() > dev.local_mem_bytes)) {
      continue;
    }
    cl_kernel k = nullptr;
    const std::string e = builtin::GetKernel(ctx, "lora", "lora_down", p.DownOptions(), &k);
    if (!e.empty()) return e;
    if (ctx.KernelWorkGroupSize(k) < static_cast<size_t>(p.down_items())) continue;
    *down = k;
    break;
  }
  for (int us : {8, 4, 2, 1}) {
    p.us = us;
    p.ur = RowsPerItem(layer.rows, us, CeilDiv(layer.n, 4 * kUpColumnItems), target);
    if (static_cast<size_t>(p.up_items()) > dev.max_work_group_size) continue;
    cl_kernel k = nullptr;
    const std::string e = builtin::GetKernel(ctx, "lora", "lora_up", p.UpOptions(), &k);
    if (!e.empty()) return e;
    if (ctx.KernelWorkGroupSize(k) < static_cast<size_t>(p.up_items())) continue;
    *up = k;
    break;
  }
  if (*down == nullptr || *up == nullptr) {
    return "no work-group of lora.cl fits this device (" + std::to_string(dev.local_mem_bytes) +
           " bytes of local memory, work-groups of at most " + std::to_string(dev.max_work_group_size) + ")";
  }
  *plan = p;
  return "";
}

std::unique_ptr<GpuOp> Create(const NodeView& node, GpuContext& ctx, std::string* error) {
  const auto* parsed = builtin::CheckedCustomNode<lora::Parsed>(node, error);
  if (parsed == nullptr) return nullptr;
  const lora::Layer layer = lora::LayerOf(node.inputs);
  if (NumElements(node.inputs[0].shape) > builtin::kMaxIndex ||
      NumElements(node.inputs[1].shape) > builtin::kMaxIndex) {
    return builtin::Refuse(error, "y or x has more than 2^31-1 elements");
  }
  LoraSlots* slots = ctx.lora_slots();
  if (slots == nullptr) return builtin::Refuse(error, "this backend keeps no LoRA factors");
  Plan plan;
  cl_kernel down = nullptr, up = nullptr;
  *error = PickPlan(ctx, layer, &plan, &down, &up);
  if (!error->empty()) return nullptr;
  const ClApi* cl = &ctx.cl();
  const cl_context context = ctx.context();
  const uint64_t max_alloc = ctx.device().max_alloc_bytes;
  const int slot = parsed->slot();
  std::unique_ptr<LoraSlots::Hold> hold = slots->Attach(
      slot, layer.k, layer.n,
      [cl, context, max_alloc, slot](int rank, int k, int n, const float* down, const float* up,
                                     std::string* e) {
        return StoreOnDevice(cl, context, max_alloc, slot, rank, k, n, down, up, e);
      },
      error);
  if (hold == nullptr) return nullptr;
  return std::unique_ptr<GpuOp>(new LoraGpu(down, up, plan, layer, std::move(hold)));
}

}  // namespace

const GpuOpDef kGpuLoraOps[] = {{lora::kOpName, &Create}};
DIFFLITE_REGISTER_OPS(kGpuLoraOps);

}  // namespace difflite::gpu
