// difflite.GroupNorm: x [N,H,W,C] or [N,L,C], gamma [C], beta [C].
// y = act(gamma * (x - mean_g) / sqrt(var_g + eps) + beta), with biased
// variance over each (sample, group): all spatial positions times the
// C/groups channels of the group. act is none or silu.
#include <algorithm>
#include <cmath>
#include <sstream>

#include "difflite/op_api.h"
#include "difflite/registry.h"
#include "difflite/parallel.h"
#include "group_norm.h"

namespace difflite {
namespace {

using group_norm::kOpName;
using group_norm::Options;
constexpr const char* kGroups = "groups";
constexpr const char* kEpsilon = "epsilon";
constexpr const char* kActivation = "activation";

class GroupNorm final : public group_norm::Parsed {
 public:
  explicit GroupNorm(const Options& o) : ParsedOp(o) {}

  std::string Infer(const std::vector<TensorInfo>& in,
                    std::vector<TensorInfo>* out) const override {
    std::string e = ExpectInputCount(in, 3);
    if (e.empty()) e = ExpectFloat32(in[0], "x");
    if (e.empty()) e = ExpectFloat32(in[1], "gamma");
    if (e.empty()) e = ExpectFloat32(in[2], "beta");
    if (!e.empty()) return e;
    const Shape& x = in[0].shape;
    if (x.size() != 3 && x.size() != 4) {
      return "x must be [N,H,W,C] or [N,L,C], got " + ShapeToString(x);
    }
    if (!(e = ExpectPositiveDims(in[0], "x")).empty()) return e;
    const int c = x.back();
    if (c % o_.groups != 0) {
      return "channels " + std::to_string(c) + " not divisible by groups " +
             std::to_string(o_.groups);
    }
    const Shape want = {c};
    if (in[1].shape != want) {
      return "gamma must be " + ShapeToString(want) + ", got " +
             ShapeToString(in[1].shape);
    }
    if (in[2].shape != want) {
      return "beta must be " + ShapeToString(want) + ", got " +
             ShapeToString(in[2].shape);
    }
    out->assign(1, TensorInfo{DType::kFloat32, x, nullptr});
    return "";
  }

  std::string Run(const std::vector<InTensor>& in,
                  const std::vector<OutTensor>& out,
                  const ExecOptions& exec) const override {
    const Shape& xs = in[0].shape;
    const float* x = static_cast<const float*>(in[0].data);
    const float* gamma = static_cast<const float*>(in[1].data);
    const float* beta = static_cast<const float*>(in[2].data);
    float* y = static_cast<float*>(out[0].data);
    const int64_t n_batch = xs[0];
    const int c = xs.back();
    const int64_t spatial = NumElements(xs) / (n_batch * c);
    const int groups = o_.groups;
    const int cg = c / groups;
    const double count = static_cast<double>(spatial) * cg;
    const int threads = exec.num_threads;

    std::vector<double> mean(groups), rstd(groups);
    std::vector<float> mean_c(c), scale_c(c);
    for (int64_t n = 0; n < n_batch; ++n) {
      const float* xn = x + n * spatial * c;
      float* yn = y + n * spatial * c;
      // Pass 1 and 2: per-group mean, then the centred sum of squares
      // (two passes, double accumulators: no cancellation trouble).
      for (int pass = 0; pass < 2; ++pass) {
        const int parts = std::max(1, std::min<int>(threads, 64));
        std::vector<double> partial(static_cast<size_t>(parts) * groups, 0.0);
        const int64_t per = (spatial + parts - 1) / parts;
        ParallelFor(parts, parts, static_cast<double>(per) * c,
                    [&](int64_t b, int64_t e) {
                      for (int64_t part = b; part < e; ++part) {
                        double* acc = &partial[part * groups];
                        const int64_t s0 = part * per;
                        const int64_t s1 = std::min(spatial, s0 + per);
                        for (int64_t s = s0; s < s1; ++s) {
                          const float* row = xn + s * c;
                          for (int g = 0; g < groups; ++g) {
                            double sum = 0.0;
                            const float* v = row + g * cg;
                            if (pass == 0) {
                              for (int k = 0; k < cg; ++k) sum += v[k];
                            } else {
                              const double m = mean[g];
                              for (int k = 0; k < cg; ++k) {
                                const double d = v[k] - m;
                                sum += d * d;
                              }
                            }
                            acc[g] += sum;
                          }
                        }
                      }
                    });
        for (int g = 0; g < groups; ++g) {
          double total = 0.0;
          for (int p = 0; p < parts; ++p) total += partial[p * groups + g];
          if (pass == 0) {
            mean[g] = total / count;
          } else {
            rstd[g] = 1.0 / std::sqrt(total / count + o_.epsilon);
          }
        }
      }
      for (int ch = 0; ch < c; ++ch) {
        const int g = ch / cg;
        mean_c[ch] = static_cast<float>(mean[g]);
        scale_c[ch] = static_cast<float>(rstd[g] * gamma[ch]);
      }
      const bool silu = o_.silu;
      ParallelFor(threads, spatial, static_cast<double>(c),
                  [&](int64_t b, int64_t e) {
                    for (int64_t s = b; s < e; ++s) {
                      const float* xr = xn + s * c;
                      float* yr = yn + s * c;
                      for (int ch = 0; ch < c; ++ch) {
                        float v = (xr[ch] - mean_c[ch]) * scale_c[ch] + beta[ch];
                        if (silu) v = v / (1.0f + std::exp(-v));
                        yr[ch] = v;
                      }
                    }
                  });
    }
    return "";
  }

  std::string Describe() const override {
    std::ostringstream os;
    os << kGroups << "=" << o_.groups << ", " << kEpsilon << "=" << o_.epsilon
       << ", " << kActivation << "=" << (o_.silu ? "silu" : "none");
    return os.str();
  }
};

std::unique_ptr<OpInstance> Create(const AttrMap& attrs, std::string* error) {
  Options o;
  int64_t groups = 0;
  double eps = 0.0;
  std::string act;
  std::string e = attrs.CheckKnown({kGroups, kEpsilon, kActivation});
  if (e.empty()) e = attrs.GetInt(kGroups, &groups);
  if (e.empty()) e = attrs.GetFloat(kEpsilon, &eps);
  if (e.empty()) e = attrs.GetString(kActivation, &act);
  if (e.empty() && (groups < 1 || groups > (1 << 20))) {
    e = std::string(kGroups) + " must be >= 1, got " + std::to_string(groups);
  }
  if (e.empty() && !(eps >= 0.0 && eps < 1.0)) {
    e = std::string(kEpsilon) + " must be in [0, 1), got " +
        std::to_string(eps);
  }
  if (e.empty() && act != "none" && act != "silu") {
    e = std::string(kActivation) + " must be \"none\" or \"silu\", got \"" +
        act + "\"";
  }
  if (!e.empty()) {
    *error = e;
    return nullptr;
  }
  o.groups = static_cast<int>(groups);
  o.epsilon = static_cast<float>(eps);
  o.silu = act == "silu";
  return std::unique_ptr<OpInstance>(new GroupNorm(o));
}

}  // namespace

const OpDef kGroupNormOps[] = {{kOpName, &Create}};
DIFFLITE_REGISTER_OPS(kGroupNormOps);

}  // namespace difflite
