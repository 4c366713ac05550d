// difflite.Attention: q [N,Lq,H*Dk], k [N,Lk,H*Dk], v [N,Lk,H*Dv]
//   -> [N,Lq,H*Dv] = per head softmax(scale * q k^T [+ causal mask]) v.
// Causal: key j is masked for query i when j > i.
// `variant` is a GPU hint; the CPU kernel ignores it.
//
// CPU kernel: one task per (batch, head, block of query rows); keys are
// streamed in blocks with an online softmax (running row max and sum, the
// accumulator rescaled when the max grows), so no Lq x Lk score matrix is
// ever formed: a task holds one block of scores for one row at a time.
#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>
#include <string>

#include "attention.h"
#include "difflite/op_api.h"
#include "difflite/registry.h"
#include "difflite/parallel.h"

namespace difflite {
namespace {

using attention::kOpName;
using attention::Options;
constexpr const char* kHeads = "heads";
constexpr const char* kScale = "scale";
constexpr const char* kCausal = "causal";
constexpr const char* kVariant = "variant";

constexpr int kRowBlock = 16;
constexpr int kKeyBlock = 64;

class Attention final : public attention::Parsed {
 public:
  explicit Attention(const Options& o) : ParsedOp(o) {}

  std::string Infer(const std::vector<TensorInfo>& in,
                    std::vector<TensorInfo>* out) const override {
    std::string e = ExpectInputCount(in, 3);
    const char* names[3] = {"q", "k", "v"};
    for (int i = 0; e.empty() && i < 3; ++i) {
      e = ExpectFloat32(in[i], names[i]);
      if (e.empty() && in[i].shape.size() != 3) {
        e = std::string(names[i]) + " must be rank 3 [N,L,H*D], got " +
            ShapeToString(in[i].shape);
      }
      if (e.empty()) e = ExpectPositiveDims(in[i], names[i]);
    }
    if (!e.empty()) return e;
    const Shape& q = in[0].shape;
    const Shape& k = in[1].shape;
    const Shape& v = in[2].shape;
    const int h = o_.heads;
    if (k[0] != q[0] || v[0] != q[0]) {
      return "batch sizes differ: q " + ShapeToString(q) + ", k " +
             ShapeToString(k) + ", v " + ShapeToString(v);
    }
    if (v[1] != k[1]) {
      return "k and v lengths differ: k " + ShapeToString(k) + ", v " +
             ShapeToString(v);
    }
    if (q[2] % h != 0 || v[2] % h != 0) {
      return "q and v channels must be divisible by heads " +
             std::to_string(h) + ": q " + ShapeToString(q) + ", v " +
             ShapeToString(v);
    }
    if (k[2] != q[2]) {
      return "q and k channels differ: q " + ShapeToString(q) + ", k " +
             ShapeToString(k);
    }
    out->assign(1, TensorInfo{DType::kFloat32, Shape{q[0], q[1], v[2]},
                              nullptr});
    return "";
  }

  std::string Run(const std::vector<InTensor>& in,
                  const std::vector<OutTensor>& out,
                  const ExecOptions& exec) const override {
    const float* q = static_cast<const float*>(in[0].data);
    const float* k = static_cast<const float*>(in[1].data);
    const float* v = static_cast<const float*>(in[2].data);
    float* y = static_cast<float*>(out[0].data);
    const int64_t n_batch = in[0].shape[0];
    const int64_t lq = in[0].shape[1];
    const int64_t lk = in[1].shape[1];
    const int64_t heads = o_.heads;
    const int64_t dk = in[0].shape[2] / heads;
    const int64_t dv = in[2].shape[2] / heads;
    const int64_t q_stride = heads * dk;  // row stride of q and k
    const int64_t v_stride = heads * dv;  // row stride of v and y
    const int64_t row_blocks = (lq + kRowBlock - 1) / kRowBlock;
    const float scale = o_.scale;
    const bool causal = o_.causal;

    auto work = [&](int64_t task_begin, int64_t task_end) {
      std::vector<float> scores(kKeyBlock);
      std::vector<float> acc(static_cast<size_t>(kRowBlock * dv));
      float row_max[kRowBlock];
      double row_sum[kRowBlock];
      for (int64_t task = task_begin; task < task_end; ++task) {
        const int64_t qb = task % row_blocks;
        const int64_t h = (task / row_blocks) % heads;
        const int64_t n = task / (row_blocks * heads);
        const int64_t i0 = qb * kRowBlock;
        const int64_t i1 = std::min(lq, i0 + kRowBlock);
        std::fill(acc.begin(), acc.end(), 0.f);
        for (int r = 0; r < kRowBlock; ++r) {
          row_max[r] = -std::numeric_limits<float>::infinity();
          row_sum[r] = 0.0;
        }
        // With the causal mask no row of this block sees a key >= i1.
        const int64_t key_end = causal ? std::min(lk, i1) : lk;
        for (int64_t j0 = 0; j0 < key_end; j0 += kKeyBlock) {
          const int64_t j1 = std::min(key_end, j0 + kKeyBlock);
          for (int64_t i = i0; i < i1; ++i) {
            const int r = static_cast<int>(i - i0);
            const int64_t jmax = causal ? std::min(j1, i + 1) : j1;
            if (jmax <= j0) continue;  // every key of this block is masked
            const float* qi = q + (n * lq + i) * q_stride + h * dk;
            float block_max = -std::numeric_limits<float>::infinity();
            for (int64_t j = j0; j < jmax; ++j) {
              const float* kj = k + (n * lk + j) * q_stride + h * dk;
              float dot = 0.f;
              for (int64_t d = 0; d < dk; ++d) dot += qi[d] * kj[d];
              const float s = scale * dot;
              scores[j - j0] = s;
              block_max = std::max(block_max, s);
            }
            const float new_max = std::max(row_max[r], block_max);
            // exp(-inf) == 0 on the first block: nothing to rescale.
            const float correction = std::exp(row_max[r] - new_max);
            float* a = acc.data() + r * dv;
            if (correction != 1.f) {
              for (int64_t d = 0; d < dv; ++d) a[d] *= correction;
            }
            double sum = row_sum[r] * correction;
            for (int64_t j = j0; j < jmax; ++j) {
              const float p = std::exp(scores[j - j0] - new_max);
              sum += p;
              const float* vj = v + (n * lk + j) * v_stride + h * dv;
              for (int64_t d = 0; d < dv; ++d) a[d] += p * vj[d];
            }
            row_sum[r] = sum;
            row_max[r] = new_max;
          }
        }
        for (int64_t i = i0; i < i1; ++i) {
          const int r = static_cast<int>(i - i0);
          float* yi = y + (n * lq + i) * v_stride + h * dv;
          const float* a = acc.data() + r * dv;
          const float inv = row_sum[r] > 0.0
                                ? static_cast<float>(1.0 / row_sum[r])
                                : 0.f;
          for (int64_t d = 0; d < dv; ++d) yi[d] = a[d] * inv;
        }
      }
    };
    const double cost = static_cast<double>(kRowBlock) * lk * (dk + dv) * 2;
    ParallelFor(exec.num_threads, n_batch * heads * row_blocks, cost, work);
    return "";
  }

  std::string Describe() const override {
    std::ostringstream os;
    os << kHeads << "=" << o_.heads << ", " << kScale << "=" << o_.scale
       << ", " << kCausal << "=" << (o_.causal ? "true" : "false") << ", "
       << kVariant << "=" << o_.variant;
    return os.str();
  }
};

std::unique_ptr<OpInstance> Create(const AttrMap& attrs, std::string* error) {
  Options o;
  int64_t heads = 0;
  double scale = 0.0;
  std::string e =
      attrs.CheckKnown({kHeads, kScale, kCausal, kVariant});
  if (e.empty()) e = attrs.GetInt(kHeads, &heads);
  if (e.empty()) e = attrs.GetFloat(kScale, &scale);
  if (e.empty()) e = attrs.GetBool(kCausal, &o.causal);
  if (e.empty()) e = attrs.GetString(kVariant, &o.variant);
  if (e.empty() && (heads < 1 || heads > 65536)) {
    e = std::string(kHeads) + " must be >= 1, got " + std::to_string(heads);
  }
  if (e.empty() && std::fabs(scale) > 3.0e38) {
    e = std::string(kScale) + " out of float range";
  }
  if (e.empty() && o.variant != "auto" && o.variant != "partial_softmax" &&
      o.variant != "flash") {
    e = std::string(kVariant) +
        " must be \"auto\", \"partial_softmax\" or \"flash\", got \"" +
        o.variant + "\"";
  }
  if (!e.empty()) {
    *error = e;
    return nullptr;
  }
  o.heads = static_cast<int>(heads);
  o.scale = static_cast<float>(scale);
  return std::unique_ptr<OpInstance>(new Attention(o));
}

}  // namespace

const OpDef kAttentionOps[] = {{kOpName, &Create}};
DIFFLITE_REGISTER_OPS(kAttentionOps);

}  // namespace difflite
