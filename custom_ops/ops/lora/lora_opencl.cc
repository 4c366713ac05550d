// difflite.LoRA on the OpenCL backend (kernel: lora.cl).
//
// The output shares y's buffer (AliasInput, written in place: WritesAliasInPlace, which the
// memory plan honours where nothing else reads that buffer afterwards), so with no factors set
// the op costs nothing: no kernel, no copy. Where the plan declined the alias, Run copies y.
// With factors set, one launch adds up to LORA_RMAX ranks into the output (the next ranks, if
// any, launch again on the output): a work-group per 4 x LORA_WY rows keeps t = x D^T of its rows
// in local memory, in float, and reads x and y once.
//
// The factors live in the delegate's LoraSlots (lora_slots.h): the op holds its slot from its
// creation (the layer's K and N), and each difflite_lora_set uploads the slot's factors once, as
// float (transposed on the host to DT = D^T [K][R] and UT = U^T [R][N], so that the kernel's
// slices are contiguous rows), in buffers of exactly that rank, freed when replaced or cleared.
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

constexpr int kColumnsPerSlice = 128;  // lora.cl: LORA_NC
constexpr int kRanksPerStage = 16;     // LORA_JC
constexpr int kDepthPerSlice = 32;     // LORA_KC

// lora.cl's build parameters: LORA_WY (the work-group is 32 x wy items, 4 x wy rows) and
// LORA_RMAX (ranks per launch).
struct Plan {
  int wy = 8;
  int rmax = 64;
  int items() const { return 32 * wy; }
  int rows() const { return 4 * wy; }
  size_t local_bytes() const {
    const size_t step1 = static_cast<size_t>(rows()) * kDepthPerSlice + size_t{kDepthPerSlice} * rmax;
    const size_t step2 = size_t{kRanksPerStage} * kColumnsPerSlice;
    return sizeof(float) * (static_cast<size_t>(rows()) * rmax + std::max(step1, step2));
  }
  std::string Options() const {
    return "-DLORA_WY=" + std::to_string(wy) + " -DLORA_RMAX=" + std::to_string(rmax);
  }
};

// The device's copy of one set: DT [K][R] and UT [R][N], float.
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
  for (size_t i = 0; i < kk; ++i) {  // DT[i][j] = D[j][i]
    for (size_t j = 0; j < r; ++j) host[i * r + j] = down[j * kk + i];
  }
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
  LoraGpu(cl_kernel k, Plan plan, lora::Layer layer, std::unique_ptr<LoraSlots::Hold> hold)
      : kernel_(k), plan_(plan), layer_(layer), hold_(std::move(hold)) {}

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
    const size_t local = static_cast<size_t>(plan_.items());
    const size_t global = static_cast<size_t>(CeilDiv(layer_.rows, plan_.rows())) * local;
    for (cl_int r0 = 0; r0 < r; r0 += plan_.rmax) {
      const cl_int rc = std::min<cl_int>(plan_.rmax, r - r0);
      const cl_mem y = r0 == 0 ? in[0].mem : out[0].mem;  // later ranks add to the output
      e = SetArgs(ctx.cl(), kernel_,
                  {Arg(in[1].mem), Arg(y), Arg(out[0].mem), Arg(f->dt), Arg(f->ut), Arg(m), Arg(k),
                   Arg(n), Arg(r), Arg(r0), Arg(rc)});
      if (e.empty()) e = ctx.Enqueue(kernel_, 1, &global, &local, "lora");
      if (!e.empty()) return e;
    }
    return "";
  }

 private:
  cl_kernel kernel_;
  Plan plan_;
  lora::Layer layer_;
  std::unique_ptr<LoraSlots::Hold> hold_;
};

// The largest plan the device runs: 64 ranks a launch where local memory allows, else 32; work-
// groups of 256 items where the kernel takes them, else smaller. nullptr kernel and *error (a
// program that does not build) or a refusal when none fits.
std::string PickPlan(GpuContext& ctx, Plan* plan, cl_kernel* kernel) {
  const DeviceInfo& dev = ctx.device();
  for (int rmax : {64, 32}) {
    for (int wy : {8, 4, 2, 1}) {
      const Plan p{wy, rmax};
      if (static_cast<size_t>(p.items()) > dev.max_work_group_size ||
          (dev.local_mem_bytes > 0 && p.local_bytes() > dev.local_mem_bytes)) {
        continue;
      }
      cl_kernel k = nullptr;
      const std::string e = builtin::GetKernel(ctx, "lora", "lora", p.Options(), &k);
      if (!e.empty()) return e;
      if (ctx.KernelWorkGroupSize(k) < static_cast<size_t>(p.items())) continue;
      *plan = p;
      *kernel = k;
      return "";
    }
  }
  return "no work-group of lora.cl fits this device (" + std::to_string(dev.local_mem_bytes) +
         " bytes of local memory, work-groups of at most " + std::to_string(dev.max_work_group_size) + ")";
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
  cl_kernel k = nullptr;
  *error = PickPlan(ctx, &plan, &k);
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
  return std::unique_ptr<GpuOp>(new LoraGpu(k, plan, layer, std::move(hold)));
}

}  // namespace

const GpuOpDef kGpuLoraOps[] = {{lora::kOpName, &Create}};
DIFFLITE_REGISTER_OPS(kGpuLoraOps);

}  // namespace difflite::gpu
