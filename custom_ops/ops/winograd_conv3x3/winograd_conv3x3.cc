// difflite.WinogradConv3x3: x [N,H,W,Cin], w, bias [Cout] -> [N,H,W,Cout], the
// 3x3 / stride 1 / pad 1 convolution plus bias. w comes in one of two forms,
// told apart by its rank:
//  (a) [36,Cin,Cout]: the transformed filters U = G g G^T of F(4x4, 3x3)
//      (interpolation points 0, +-1, +-2, inf), position index 6*i + j (the
//      definition lives in compiler/winograd.py: transform_weights);
//  (b) [Cout,3,3,Cin]: the 3x3 filter itself, OHWI like a CONV_2D filter (what
//      a quantized model file keeps quantized). Run transforms it into U in a
//      buffer of that Run (36/9 of the filter's floats), freed when it returns:
//      the op keeps no copy of the weights. (On the CPU backend a form-(b) filter
//      that is a quantized constant never reaches this kernel: the delegate runs
//      the node as a quantized 3x3 CONV_2D, delegate/cpu/quantized_claim.cc.)
//
// CPU kernel, the real algorithm: the output is cut into 4x4 tiles (the
// border tiles of H, W not multiple of 4 read zeros and are cropped); each
// 6x6 input tile d goes through V = B^T d B; 36 GEMMs M[p] = V[p] U[p]
// (tiles x Cin by Cin x Cout) per block of tiles; then Y = A^T M A + bias.
#include <algorithm>
#include <sstream>
#include <string>
#include <vector>

#include "difflite/op_api.h"
#include "difflite/registry.h"
#include "difflite/parallel.h"
#include "winograd_conv3x3.h"

namespace difflite {
namespace {

using winograd::kOpName;
using winograd::kPositions;
using winograd::kTileIn;
using winograd::kTileOut;
constexpr const char* kTile = "tile";
constexpr const char* kActivation = "activation";
constexpr int kTilesPerBlock = 16;

// B^T (6x6) and A^T (4x6) of F(4x4, 3x3).
constexpr float kBT[6][6] = {
    {4, 0, -5, 0, 1, 0},  {0, -4, -4, 1, 1, 0}, {0, 4, -4, -1, 1, 0},
    {0, -2, -1, 2, 1, 0}, {0, 2, -1, -2, 1, 0}, {0, 4, 0, -5, 0, 1},
};
constexpr float kAT[4][6] = {
    {1, 1, 1, 1, 1, 0},
    {0, 1, -1, 2, -2, 0},
    {0, 1, 1, 4, 4, 0},
    {0, 1, -1, 8, -8, 1},
};
// G (6x3) of F(4x4, 3x3), as compiler/winograd.py defines it; the filter
// transform runs in double.
constexpr double kG[6][3] = {
    {1.0 / 4, 0, 0},
    {-1.0 / 6, -1.0 / 6, -1.0 / 6},
    {-1.0 / 6, 1.0 / 6, -1.0 / 6},
    {1.0 / 24, 1.0 / 12, 1.0 / 6},
    {1.0 / 24, -1.0 / 12, 1.0 / 6},
    {0, 0, 1},
};

// u[6i+j][ci][co] = sum_{a,b} G[i][a] G[j][b] w[co][a][b][ci] for a filter w
// [cout,3,3,cin] (OHWI); u holds 36 * cin * cout floats.
void TransformFilter(const float* w, int64_t cin, int64_t cout, float* u,
                     int num_threads) {
  auto work = [&](int64_t ci_begin, int64_t ci_end) {
    for (int64_t ci = ci_begin; ci < ci_end; ++ci) {
      for (int64_t co = 0; co < cout; ++co) {
        double g[3][3];
        for (int a = 0; a < 3; ++a) {
          for (int b = 0; b < 3; ++b) {
            g[a][b] = w[((co * 3 + a) * 3 + b) * cin + ci];
          }
        }
        double gg[6][3];  // G g
        for (int i = 0; i < 6; ++i) {
          for (int b = 0; b < 3; ++b) {
            gg[i][b] = kG[i][0] * g[0][b] + kG[i][1] * g[1][b] + kG[i][2] * g[2][b];
          }
        }
        for (int i = 0; i < 6; ++i) {
          for (int j = 0; j < 6; ++j) {
            const double v = gg[i][0] * kG[j][0] + gg[i][1] * kG[j][1] +
                             gg[i][2] * kG[j][2];
            u[((i * 6 + j) * cin + ci) * cout + co] = static_cast<float>(v);
          }
        }
      }
    }
  };
  ParallelFor(num_threads, cin, 100.0 * static_cast<double>(cout), work);
}

// The weight forms Infer accepts, for its messages.
std::string WeightForms(int64_t cin) {
  const std::string c = std::to_string(cin);
  return "[36," + c + ",Cout] (transformed filters) or [Cout,3,3," + c +
         "] (the 3x3 filter, OHWI)";
}

// out[a][b][:] = sum_{i,j} T[a][i] * in[i][j][:] * T[b][j] for a vector of
// `len` channels per tile element; T is rows x 6. `tmp` holds rows*6*len.
template <int Rows>
void TwoSidedTransform(const float (&t)[Rows][6], const float* in, float* tmp,
                       float* out, int64_t len) {
  // tmp[a][j] = sum_i T[a][i] in[i][j]
  for (int a = 0; a < Rows; ++a) {
    for (int j = 0; j < 6; ++j) {
      float* dst = tmp + (a * 6 + j) * len;
      std::fill(dst, dst + len, 0.f);
      for (int i = 0; i < 6; ++i) {
        const float c = t[a][i];
        if (c == 0.f) continue;
        const float* src = in + (i * 6 + j) * len;
        for (int64_t x = 0; x < len; ++x) dst[x] += c * src[x];
      }
    }
  }
  // out[a][b] = sum_j tmp[a][j] T[b][j]
  for (int a = 0; a < Rows; ++a) {
    for (int b = 0; b < Rows; ++b) {
      float* dst = out + (a * Rows + b) * len;
      std::fill(dst, dst + len, 0.f);
      for (int j = 0; j < 6; ++j) {
        const float c = t[b][j];
        if (c == 0.f) continue;
        const float* src = tmp + (a * 6 + j) * len;
        for (int64_t x = 0; x < len; ++x) dst[x] += c * src[x];
      }
    }
  }
}

class WinogradConv3x3 final : public OpInstance {
 public:
  std::string Infer(const std::vector<TensorInfo>& in,
                    std::vector<TensorInfo>* out) const override {
    std::string e = ExpectInputCount(in, 3);
    if (e.empty()) e = ExpectFloat32(in[0], "x");
    if (e.empty()) e = ExpectFloat32(in[1], "w");
    if (e.empty()) e = ExpectFloat32(in[2], "bias");
    if (!e.empty()) return e;
    const Shape& x = in[0].shape;
    if (x.size() != 4) return "x must be [N,H,W,Cin], got " + ShapeToString(x);
    if (!(e = ExpectPositiveDims(in[0], "x")).empty()) return e;
    const Shape& w = in[1].shape;
    const bool transformed = w.size() == 3 && w[0] == kPositions &&
                             w[1] == x[3] && w[2] > 0;
    const bool filter = w.size() == 4 && w[0] > 0 && w[1] == 3 && w[2] == 3 &&
                        w[3] == x[3];
    if (!transformed && !filter) {
      return "w must be " + WeightForms(x[3]) + ", got " + ShapeToString(w);
    }
    const int cout = transformed ? w[2] : w[0];
    if (in[2].shape != Shape{cout}) {
      return "bias must be [" + std::to_string(cout) + "], got " +
             ShapeToString(in[2].shape);
    }
    out->assign(1, TensorInfo{DType::kFloat32, Shape{x[0], x[1], x[2], cout},
                              nullptr});
    return "";
  }

  std::string Run(const std::vector<InTensor>& in,
                  const std::vector<OutTensor>& out,
                  const ExecOptions& exec) const override {
    const float* x = static_cast<const float*>(in[0].data);
    const float* u = static_cast<const float*>(in[1].data);
    const float* bias = static_cast<const float*>(in[2].data);
    float* y = static_cast<float*>(out[0].data);
    const int64_t n_batch = in[0].shape[0];
    const int64_t h = in[0].shape[1];
    const int64_t w = in[0].shape[2];
    const int64_t cin = in[0].shape[3];
    const bool filter = in[1].shape.size() == 4;  // form (b): [Cout,3,3,Cin]
    const int64_t cout = filter ? in[1].shape[0] : in[1].shape[2];
    std::vector<float> transformed;  // form (b)'s U, for this Run only
    if (filter) {
      transformed.resize(static_cast<size_t>(kPositions) * cin * cout);
      TransformFilter(u, cin, cout, transformed.data(), exec.num_threads);
      u = transformed.data();
    }
    const int64_t tiles_h = (h + kTileOut - 1) / kTileOut;
    const int64_t tiles_w = (w + kTileOut - 1) / kTileOut;
    const int64_t tiles = n_batch * tiles_h * tiles_w;
    const int64_t blocks = (tiles + kTilesPerBlock - 1) / kTilesPerBlock;
    const int64_t cmax = std::max(cin, cout);

    auto work = [&](int64_t block_begin, int64_t block_end) {
      std::vector<float> d(kPositions * cmax), tmp(kPositions * cmax),
          tv(kPositions * cmax);
      // v[p][t][ci] and m[p][t][co] for one block of tiles.
      std::vector<float> v(static_cast<size_t>(kPositions) * kTilesPerBlock *
                           cin);
      std::vector<float> m(static_cast<size_t>(kPositions) * kTilesPerBlock *
                           cout);
      for (int64_t blk = block_begin; blk < block_end; ++blk) {
        const int64_t t0 = blk * kTilesPerBlock;
        const int nt = static_cast<int>(std::min<int64_t>(kTilesPerBlock,
                                                          tiles - t0));
        // 1. Input transform of each tile.
        for (int t = 0; t < nt; ++t) {
          const int64_t tile = t0 + t;
          const int64_t tx = tile % tiles_w;
          const int64_t ty = (tile / tiles_w) % tiles_h;
          const int64_t n = tile / (tiles_w * tiles_h);
          for (int r = 0; r < kTileIn; ++r) {
            const int64_t iy = ty * kTileOut - 1 + r;
            for (int c = 0; c < kTileIn; ++c) {
              const int64_t ix = tx * kTileOut - 1 + c;
              float* dst = d.data() + (r * kTileIn + c) * cin;
              if (iy < 0 || iy >= h || ix < 0 || ix >= w) {
                std::fill(dst, dst + cin, 0.f);
              } else {
                const float* src = x + ((n * h + iy) * w + ix) * cin;
                std::copy(src, src + cin, dst);
              }
            }
          }
          TwoSidedTransform(kBT, d.data(), tmp.data(), tv.data(), cin);
          for (int p = 0; p < kPositions; ++p) {
            std::copy(tv.data() + p * cin, tv.data() + (p + 1) * cin,
                      v.data() + (static_cast<int64_t>(p) * kTilesPerBlock + t) * cin);
          }
        }
        // 2. 36 GEMMs: m[p] (nt x cout) = v[p] (nt x cin) * u[p] (cin x cout).
        for (int p = 0; p < kPositions; ++p) {
          const float* up = u + static_cast<int64_t>(p) * cin * cout;
          for (int t = 0; t < nt; ++t) {
            const float* vrow =
                v.data() + (static_cast<int64_t>(p) * kTilesPerBlock + t) * cin;
            float* mrow =
                m.data() + (static_cast<int64_t>(p) * kTilesPerBlock + t) * cout;
            std::fill(mrow, mrow + cout, 0.f);
            for (int64_t ci = 0; ci < cin; ++ci) {
              const float a = vrow[ci];
              const float* urow = up + ci * cout;
              for (int64_t co = 0; co < cout; ++co) mrow[co] += a * urow[co];
            }
          }
        }
        // 3. Output transform, bias, crop to H x W.
        for (int t = 0; t < nt; ++t) {
          const int64_t tile = t0 + t;
          const int64_t tx = tile % tiles_w;
          const int64_t ty = (tile / tiles_w) % tiles_h;
          const int64_t n = tile / (tiles_w * tiles_h);
          for (int p = 0; p < kPositions; ++p) {
            const float* src =
                m.data() + (static_cast<int64_t>(p) * kTilesPerBlock + t) * cout;
            std::copy(src, src + cout, d.data() + p * cout);
          }
          TwoSidedTransform(kAT, d.data(), tmp.data(), tv.data(), cout);
          for (int a = 0; a < kTileOut; ++a) {
            const int64_t oy = ty * kTileOut + a;
            if (oy >= h) break;
            for (int b = 0; b < kTileOut; ++b) {
              const int64_t ox = tx * kTileOut + b;
              if (ox >= w) break;
              const float* src = tv.data() + (a * kTileOut + b) * cout;
              float* dst = y + ((n * h + oy) * w + ox) * cout;
              for (int64_t co = 0; co < cout; ++co) dst[co] = src[co] + bias[co];
            }
          }
        }
      }
    };
    const double cost =
        static_cast<double>(kTilesPerBlock) * kPositions * (cin * cout + 12 * cmax);
    ParallelFor(exec.num_threads, blocks, cost, work);
    return "";
  }

  std::string Describe() const override {
    std::ostringstream os;
    os << kTile << "=" << kTileOut << ", " << kActivation << "=none";
    return os.str();
  }
};

std::unique_ptr<OpInstance> Create(const AttrMap& attrs, std::string* error) {
  int64_t tile = 0;
  std::string act;
  std::string e = attrs.CheckKnown({kTile, kActivation});
  if (e.empty()) e = attrs.GetInt(kTile, &tile);
  if (e.empty()) e = attrs.GetString(kActivation, &act);
  if (e.empty() && tile != kTileOut) {
    e = std::string(kTile) + " must be 4 (F(4x4,3x3)), got " +
        std::to_string(tile);
  }
  if (e.empty() && act != "none") {
    e = std::string(kActivation) + " must be \"none\", got \"" + act + "\"";
  }
  if (!e.empty()) {
    *error = e;
    return nullptr;
  }
  return std::unique_ptr<OpInstance>(new WinogradConv3x3());
}

}  // namespace

const OpDef kWinogradConv3x3Ops[] = {{kOpName, &Create}};
DIFFLITE_REGISTER_OPS(kWinogradConv3x3Ops);

}  // namespace difflite
