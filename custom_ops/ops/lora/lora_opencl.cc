// difflite.LoRA on the OpenCL backend: out = y + (x D^T) U^T as two launches of the backend's
// tiled GEMM (builtins/matmul/gemm.h), the one that runs the layer itself:
//   1. t [M][R] = x [M][K] . DT, DT = D^T [K][R]: into the backend's scratch slot 0, in the
//      storage type (split over K where the rows give the device too few tiles);
//   2. out [M][N] += t . UT, UT = U^T [R][N]: the GEMM's accumulating epilogue (GEMM_ACC) reads
//      each output where it stores it, so y is added in place.
// The op's own kernels it replaced (a split-K dot product and an item-per-column update) ran at
// a tenth of the GEMM's arithmetic rate on the H200 (docs/lab-notebook.md §47).
//
// The output shares y's buffer (AliasInput, written in place: WritesAliasInPlace, which the
// memory plan honours where nothing else reads that buffer afterwards), so with no factors set
// the op costs nothing: no kernel, no copy, no buffer. Where the plan declined the alias, Run
// copies y first.
//
// The scratch is the backend's scratch slot 0 (GpuContext::Scratch): one buffer of the delegate,
// shared with every op that takes scratch (ops run one after another on one queue), grown on
// demand to the largest M x R t a Run asked for, freed with the delegate; not in the memory plan
// (ScratchBytes stays 0: no factors, no scratch). The GEMMs never take slot 0 themselves: both
// read B n-major, so neither copies it transposed.
//
// The factors live in the delegate's LoraSlots (lora_slots.h): the op holds its slot from its
// creation (the layer's K and N), and each difflite_lora_set uploads the slot's factors once, in
// the storage type (half storage: the file's own bytes, not twice them), transposed on the host
// to DT and UT, in buffers of exactly that rank, freed when replaced or cleared. The GEMMs of a
// rank are planned at the first Run with it.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/kernel_util.h"
#include "difflite/gpu_api.h"
#include "difflite/lora_slots.h"
#include "difflite/registry.h"
#include "lora.h"
#include "matmul/gemm.h"
#include "opencl/half.h"

namespace difflite::gpu {
namespace {

constexpr int kScratchSlot = 0;  // GpuContext::Scratch: t
constexpr float kHalfMax = 65504.0f;

// The device's copy of one set: DT = D^T [K][R] and UT = U^T [R][N] in the storage type.
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

// The largest |v[i]| of finite values (LoraSlots::Set checked them): the bits of non-negative
// floats order as integers do, and an integer maximum vectorises where a float one may not.
float MaxAbs(const float* v, size_t n) {
  uint32_t m = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, v + i, 4);
    m = std::max(m, bits & 0x7fffffffu);
  }
  float f;
  std::memcpy(&f, &m, 4);
  return f;
}

// dst [cols][rows] = (src [rows][cols] * scale)^T in the storage type (float or half), one pass.
std::vector<uint8_t> TransposedInStorage(const float* src, size_t rows, size_t cols, float scale, DType storage) {
  std::vector<uint8_t> bytes(rows * cols * DTypeSize(storage));
  if (storage == DType::kFloat16) {
    auto* h = reinterpret_cast<uint16_t*>(bytes.data());
    for (size_t i = 0; i < rows; ++i) {
      for (size_t c = 0; c < cols; ++c) h[c * rows + i] = FloatToHalf(src[i * cols + c] * scale);
    }
  } else {
    auto* f = reinterpret_cast<float*>(bytes.data());
    for (size_t i = 0; i < rows; ++i) {
      for (size_t c = 0; c < cols; ++c) f[c * rows + i] = src[i * cols + c] * scale;
    }
  }
  return bytes;
}

// LoraSlots::Store of the OpenCL backend. The runtime (ClApi, context) lives as long as the
// process (Runtime::Get), so the stored factors may outlive the op that made them.
// D and U are stored scaled by s and 1 / s (their product unchanged), s = sqrt(max|U| / max|D|),
// so that their largest values meet: in half storage a LoRA's small up weights (often 1e-4 ..
// 1e-3) then keep their precision instead of sinking into half's subnormals, and t = x D^T stays
// far from half's range.
std::unique_ptr<LoraFactors> StoreOnDevice(const ClApi* cl, cl_context context, uint64_t max_alloc,
                                           DType storage, int slot, int rank, int k, int n,
                                           const float* down, const float* up, std::string* error) {
  const size_t r = static_cast<size_t>(rank), kk = static_cast<size_t>(k), nn = static_cast<size_t>(n);
  const size_t dt_bytes = kk * r * DTypeSize(storage), ut_bytes = r * nn * DTypeSize(storage);
  const std::string refused = "the device refused " + std::to_string(dt_bytes + ut_bytes) +
                              " bytes for slot " + std::to_string(slot) + "'s factors";
  if (max_alloc > 0 && std::max(dt_bytes, ut_bytes) > max_alloc) {
    *error = refused + " (at most " + std::to_string(max_alloc) + " bytes a buffer)";
    return nullptr;
  }
  const float d_max = MaxAbs(down, r * kk), u_max = MaxAbs(up, nn * r);
  const float s = d_max > 0.0f && u_max > 0.0f ? std::sqrt(u_max / d_max) : 1.0f;
  if (storage == DType::kFloat16 && std::max(d_max * s, u_max / s) > kHalfMax) {
    *error = "slot " + std::to_string(slot) + "'s factors exceed half precision's range (65504), " +
             "which this half-storage backend keeps them in";
    return nullptr;
  }
  auto f = std::make_unique<DeviceFactors>(cl);
  cl_int err = CL_SUCCESS;
  std::vector<uint8_t> bytes = TransposedInStorage(down, r, kk, s, storage);  // DT [K][R]
  f->dt = cl->CreateBuffer(context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, dt_bytes, bytes.data(), &err);
  if (f->dt != nullptr && err == CL_SUCCESS) {
    bytes = TransposedInStorage(up, nn, r, 1.0f / s, storage);  // UT [R][N]
    f->ut = cl->CreateBuffer(context, CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR, ut_bytes, bytes.data(), &err);
  }
  if (f->dt == nullptr || f->ut == nullptr || err != CL_SUCCESS) {
    *error = refused + ": " + ClErrorName(err);
    return nullptr;
  }
  f->bytes = dt_bytes + ut_bytes;
  return f;
}

// The two GEMMs of one rank over the layer's rows.
struct RankGemms {
  int rank = 0;
  builtin::Gemm down;  // t = x DT
  builtin::Gemm up;    // out += t UT

  std::string Init(GpuContext& ctx, const lora::Layer& layer, int r) {
    const int m = static_cast<int>(layer.rows);
    builtin::GemmShape d;
    d.m = m, d.n = r, d.k = layer.k;
    d.a_sm = layer.k, d.a_sk = 1, d.b_sk = r, d.b_sn = 1, d.ldc = r;
    builtin::GemmShape u;
    u.m = m, u.n = layer.n, u.k = r;
    u.a_sm = r, u.a_sk = 1, u.b_sk = layer.n, u.b_sn = 1, u.ldc = layer.n;
    u.accumulate = true;
    std::string e = down.Init(ctx, d);
    if (e.empty()) e = up.Init(ctx, u);
    if (e.empty() && (down.TransposedBBytes() != 0 || up.TransposedBBytes() != 0)) {
      e = "a LoRA GEMM would copy its factors into scratch slot 0, which holds t";
    }
    rank = e.empty() ? r : 0;
    return e;
  }
};

class LoraGpu final : public GpuOp {
 public:
  LoraGpu(lora::Layer layer, std::unique_ptr<LoraSlots::Hold> hold) : layer_(layer), hold_(std::move(hold)) {}

  int AliasInput(size_t output) const override { return output == 0 ? 0 : -1; }
  bool WritesAliasInPlace(size_t output) const override { return output == 0; }

  std::string Run(GpuContext& ctx, const std::vector<GpuTensor>& in,
                  const std::vector<GpuTensor>& out) override {
    std::string e = builtin::CheckRunTensors(ctx, in, out, 2, 1);
    if (!e.empty()) return e;
    const std::shared_ptr<const LoraFactors> set = hold_->Factors();
    if (in[0].mem != out[0].mem) {  // the plan declined the alias: out starts as y
      const size_t bytes = static_cast<size_t>(layer_.rows) * layer_.n * DTypeSize(ctx.storage());
      const cl_int err = ctx.cl().EnqueueCopyBuffer(ctx.queue(), in[0].mem, out[0].mem, 0, 0, bytes, 0,
                                                    nullptr, nullptr);
      if (err != CL_SUCCESS) return "clEnqueueCopyBuffer(y): " + ClErrorName(err);
    }
    if (set == nullptr) return "";
    const auto* f = dynamic_cast<const DeviceFactors*>(set.get());
    if (f == nullptr) return "slot " + std::to_string(hold_->slot()) + "'s factors are not on this device";
    if (int64_t{layer_.rows} * f->rank > builtin::kMaxIndex) {
      return "t of " + std::to_string(layer_.rows) + " x " + std::to_string(f->rank) + " values";
    }
    if (gemms_.rank != f->rank) {
      e = gemms_.Init(ctx, layer_, f->rank);
      if (!e.empty()) return e;
    }
    cl_mem t = ctx.Scratch(static_cast<size_t>(layer_.rows) * f->rank * DTypeSize(ctx.storage()),
                           kScratchSlot, &e);
    if (t == nullptr) return e;
    e = gemms_.down.Run(ctx, in[1].mem, f->dt, nullptr, t, "lora_down");
    if (e.empty()) e = gemms_.up.Run(ctx, t, f->ut, nullptr, out[0].mem, "lora_up");
    return e;
  }

 private:
  lora::Layer layer_;
  std::unique_ptr<LoraSlots::Hold> hold_;
  RankGemms gemms_;
};

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
  const ClApi* cl = &ctx.cl();
  const cl_context context = ctx.context();
  const uint64_t max_alloc = ctx.device().max_alloc_bytes;
  const DType storage = ctx.storage();
  const int slot = parsed->slot();
  std::unique_ptr<LoraSlots::Hold> hold = slots->Attach(
      slot, layer.k, layer.n,
      [cl, context, max_alloc, storage, slot](int rank, int k, int n, const float* down, const float* up,
                                              std::string* e) {
        return StoreOnDevice(cl, context, max_alloc, storage, slot, rank, k, n, down, up, e);
      },
      error);
  if (hold == nullptr) return nullptr;
  return std::unique_ptr<GpuOp>(new LoraGpu(layer, std::move(hold)));
}

}  // namespace

const GpuOpDef kGpuLoraOps[] = {{lora::kOpName, &Create}};
DIFFLITE_REGISTER_OPS(kGpuLoraOps);

}  // namespace difflite::gpu
