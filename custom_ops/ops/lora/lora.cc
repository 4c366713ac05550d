// difflite.LoRA: out = y + (x D^T) U^T, the rows m running over the flattened leading dims of
// y [..., N] (a linear layer's or 1x1 convolution's output, bias included) and x [..., K] (its
// input); D [r, K] and U [N, r] the factors set for the op's `slot` on its delegate
// (difflite_lora_set; the LoRA's scale folded into U). No factors set: out = y exactly.
// slot: int, 0 .. 65535.
//
// The CPU kernel: float32, rows split over threads; each row's t = x D^T (r values) then
// out = y + t U^T, in float. The factors are the host copies its store made at the last set.
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "difflite/lora_slots.h"
#include "difflite/op_api.h"
#include "difflite/parallel.h"
#include "difflite/registry.h"
#include "lora.h"

namespace difflite {
namespace {

using lora::kOpName;
using lora::kSlot;

// The CPU backend's copy of one set: D [r][K] and U [N][r] as the caller gave them.
class HostFactors final : public LoraFactors {
 public:
  std::vector<float> down, up;
};

std::unique_ptr<LoraFactors> StoreOnHost(int rank, int k, int n, const float* down, const float* up,
                                         std::string* /*error*/) {
  auto f = std::make_unique<HostFactors>();
  f->down.assign(down, down + static_cast<size_t>(rank) * k);
  f->up.assign(up, up + static_cast<size_t>(n) * rank);
  f->bytes = (f->down.size() + f->up.size()) * sizeof(float);
  return f;
}

class LoRA final : public lora::Parsed {
 public:
  explicit LoRA(int slot) : Parsed(slot) {}

  std::string BindDelegate(const std::vector<TensorInfo>& inputs,
                           const DelegateServices& services) override {
    const lora::Layer layer = lora::LayerOf(inputs);
    if (hold_ != nullptr && hold_->in_features() == layer.k && hold_->out_features() == layer.n) {
      return "";
    }
    hold_.reset();
    if (services.lora == nullptr) return "";  // no delegate: never any factors
    std::string e;
    hold_ = services.lora->Attach(slot_, layer.k, layer.n, &StoreOnHost, &e);
    return e;
  }

  std::string Run(const std::vector<InTensor>& in, const std::vector<OutTensor>& out,
                  const ExecOptions& exec) const override {
    const auto* y = static_cast<const float*>(in[0].data);
    const auto* x = static_cast<const float*>(in[1].data);
    auto* o = static_cast<float*>(out[0].data);
    const int64_t n = in[0].shape.back(), k = in[1].shape.back();
    const int64_t rows = NumElements(in[0].shape) / n;
    const std::shared_ptr<const LoraFactors> set = hold_ != nullptr ? hold_->Factors() : nullptr;
    if (set == nullptr) {
      if (o != y) std::memcpy(o, y, static_cast<size_t>(rows * n) * sizeof(float));
      return "";
    }
    const auto* f = dynamic_cast<const HostFactors*>(set.get());
    if (f == nullptr || f->in_features != k || f->out_features != n) {
      return "slot " + std::to_string(slot_) + "'s factors are not the CPU backend's for a " +
             std::to_string(k) + " -> " + std::to_string(n) + " layer";
    }
    const int64_t r = f->rank;
    const float* d = f->down.data();
    const float* u = f->up.data();
    ParallelFor(exec.num_threads, rows, 2.0 * r * static_cast<double>(k + n),
                [&](int64_t begin, int64_t end) {
                  std::vector<float> t(static_cast<size_t>(r));
                  for (int64_t m = begin; m < end; ++m) {
                    const float* xm = x + m * k;
                    for (int64_t j = 0; j < r; ++j) {
                      const float* dj = d + j * k;
                      float s = 0.f;
                      for (int64_t i = 0; i < k; ++i) s += xm[i] * dj[i];
                      t[j] = s;
                    }
                    const float* ym = y + m * n;
                    float* om = o + m * n;
                    for (int64_t c = 0; c < n; ++c) {
                      const float* uc = u + c * r;
                      float s = 0.f;
                      for (int64_t j = 0; j < r; ++j) s += t[j] * uc[j];
                      om[c] = ym[c] + s;
                    }
                  }
                });
    return "";
  }

 private:
  std::unique_ptr<LoraSlots::Hold> hold_;
};

std::unique_ptr<OpInstance> Create(const AttrMap& attrs, std::string* error) {
  int64_t slot = 0;
  std::string e = attrs.CheckKnown({kSlot});
  if (e.empty()) e = attrs.GetInt(kSlot, &slot);
  if (e.empty() && (slot < 0 || slot > LoraSlots::kMaxSlot)) {
    e = std::string(kSlot) + " must be in [0, " + std::to_string(LoraSlots::kMaxSlot) + "], got " +
        std::to_string(slot);
  }
  if (!e.empty()) {
    *error = e;
    return nullptr;
  }
  return std::unique_ptr<OpInstance>(new LoRA(static_cast<int>(slot)));
}

}  // namespace

const OpDef kLoraOps[] = {{kOpName, &Create}};
DIFFLITE_REGISTER_OPS(kLoraOps);

}  // namespace difflite
