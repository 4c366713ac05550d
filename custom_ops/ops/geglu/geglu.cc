// difflite.GeGLU: x [..., 2D] -> y [..., D] = x[..., :D] * gelu(x[..., D:]).
// approximate: "erf" | "tanh" | "sigmoid", as for difflite.Gelu.
#include <string>

#include "../gelu/gelu_math.h"
#include "difflite/op_api.h"
#include "difflite/registry.h"
#include "difflite/parallel.h"
#include "geglu.h"

namespace difflite {
namespace {

using geglu::kOpName;

class GeGlu final : public geglu::Parsed {
 public:
  explicit GeGlu(gelu::Mode m) : Parsed(m) {}

  std::string Infer(const std::vector<TensorInfo>& in,
                    std::vector<TensorInfo>* out) const override {
    const std::string e = ExpectX(in);
    if (!e.empty()) return e;
    const Shape& x = in[0].shape;
    if (x.empty() || x.back() % 2 != 0) {
      return "x's last dimension must be even (2*D), got " + ShapeToString(x);
    }
    Shape y = x;
    y.back() /= 2;
    out->assign(1, TensorInfo{DType::kFloat32, y, nullptr});
    return "";
  }

  std::string Run(const std::vector<InTensor>& in,
                  const std::vector<OutTensor>& out,
                  const ExecOptions& exec) const override {
    const float* x = static_cast<const float*>(in[0].data);
    float* y = static_cast<float*>(out[0].data);
    const int64_t d = in[0].shape.back() / 2;
    const int64_t rows = NumElements(in[0].shape) / (2 * d);
    const gelu::Mode mode = mode_;
    ParallelFor(exec.num_threads, rows, 20.0 * d, [&](int64_t b, int64_t e) {
      for (int64_t r = b; r < e; ++r) {
        const float* hidden = x + r * 2 * d;
        const float* gate = hidden + d;
        float* yr = y + r * d;
        for (int64_t i = 0; i < d; ++i) {
          yr[i] = hidden[i] * gelu::Apply(mode, gate[i]);
        }
      }
    });
    return "";
  }
};

std::unique_ptr<OpInstance> Create(const AttrMap& attrs, std::string* error) {
  return gelu::CreateModeOp<GeGlu>(attrs, geglu::kApproximate, error);
}

}  // namespace

const OpDef kGeGluOps[] = {{kOpName, &Create}};
DIFFLITE_REGISTER_OPS(kGeGluOps);

}  // namespace difflite
