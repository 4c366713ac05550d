// difflite.Gelu: y = gelu(x), elementwise, any shape.
// approximate: "erf" | "tanh" | "sigmoid" (x * sigmoid(1.702 x)).
#include <string>

#include "difflite/op_api.h"
#include "difflite/registry.h"
#include "difflite/parallel.h"
#include "gelu.h"
#include "gelu_math.h"

namespace difflite {
namespace {

using gelu::kOpName;

class Gelu final : public gelu::Parsed {
 public:
  explicit Gelu(gelu::Mode m) : Parsed(m) {}

  std::string Infer(const std::vector<TensorInfo>& in,
                    std::vector<TensorInfo>* out) const override {
    const std::string e = ExpectX(in);
    if (!e.empty()) return e;
    out->assign(1, TensorInfo{DType::kFloat32, in[0].shape, nullptr});
    return "";
  }

  std::string Run(const std::vector<InTensor>& in,
                  const std::vector<OutTensor>& out,
                  const ExecOptions& exec) const override {
    const float* x = static_cast<const float*>(in[0].data);
    float* y = static_cast<float*>(out[0].data);
    const gelu::Mode mode = mode_;
    ParallelFor(exec.num_threads, NumElements(in[0].shape), 20.0,
                [&](int64_t b, int64_t e) {
                  for (int64_t i = b; i < e; ++i) y[i] = gelu::Apply(mode, x[i]);
                });
    return "";
  }
};

std::unique_ptr<OpInstance> Create(const AttrMap& attrs, std::string* error) {
  return gelu::CreateModeOp<Gelu>(attrs, gelu::kApproximate, error);
}

}  // namespace

const OpDef kGeluOps[] = {{kOpName, &Create}};
DIFFLITE_REGISTER_OPS(kGeluOps);

}  // namespace difflite
