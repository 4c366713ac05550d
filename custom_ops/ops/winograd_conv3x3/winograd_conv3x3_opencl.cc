// difflite.WinogradConv3x3 on the OpenCL backend, F(4x4, 3x3):
//   wino_filter  w -> U [36, Cin, Cout]       (the filter form only: w is the 3x3 filter
//                OHWI, read as uploaded, quantized where the model stores it so; scratch
//                slot 3, rewritten once at every call, before the bands: the weights stay as
//                the file holds them)
// then, band by band of output tiles (below):
//   wino_input   x -> V [36, Tb, Cin]         (winograd_conv3x3.cl; scratch slot 0)
//   GEMM         M[p] = V[p] U[p], 36 GEMMs   (builtins/matmul's builtin::Gemm, gemm.cl:
//                tiled on GPUs, gemm_rows on CPU-like devices; scratch slot 1: M [36, Tb, Cout])
//   wino_output  y = A^T M A + bias, NHWC, cropped to H x W (winograd_conv3x3.cl)
// T = N * ceil(H/4) * ceil(W/4) tiles, numbered row-major over N * ceil(H/4) tile rows of
// ceil(W/4) tiles. U is the node's weight input [36, Cin, Cout] as uploaded by the backend
// (already transformed by the compiler), or wino_filter's.
// Bands: V and M of all T tiles are 36 T (Cin + Cout) elements, 2.25x the input and output
// together. SDXL's VAE decoder at 1024 x 1024 (a 1024 x 1024 conv, Cin 256, Cout 128:
// T = 65536) would take 1.8 GB of them at fp16 (2.43 GB of op scratch in all, unbanded): the
// main obstacle to SDXL at 1024 within ~2.6 GB on a phone. So the tiles go in bands of whole
// tile rows, t0 .. t0 + Tb - 1 (Tb a multiple of ceil(W/4); a band may cross from one sample
// into the next), each band's V and M within kScratchBytes (64 MiB, in the storage type's
// bytes; DIFFLITE_WINOGRAD_SCRATCH_BYTES=N replaces it: tests, benchmarks, tighter devices; a
// value that is not a positive integer refuses the node), at least one tile row a band
// whatever the bound; all of T in one band where V + M fit (then the launches are those of an
// unbanded run). The kernels take the band's first tile t0 and index V and M from the band's
// start (no sub-buffers); the GEMM is one builtin::Gemm for a full band and a second one for
// the last, shorter band where T is not a multiple of Tb. Only the bound's share of V and M is
// live at once; U is read once a band. Why 64 MiB: the bands are lent the intermediates' idle
// buffers (GpuOp::ScratchSlotBytes), and at 256 MiB they grew SDXL's 1024 x 1024 VAE decoder's
// 1,424 MiB of buffers by 156 MiB, at 64 MiB by 31 (PoCL's plan, fp16); a 64 MiB band still holds
// thousands of tiles, ample work for each of its 36 GEMMs. Where the scratch is lent, FitScratch
// may then take fewer rows a band (not under a quarter of the bound's V + M) so that V, M and U
// each fit a buffer the tensors leave idle at this step.
// The launch plan is mirrored by benchmarks/gpu_kernels_harness/launch.py.
#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/kernel_util.h"
#include "difflite/gpu_api.h"
#include "difflite/registry.h"
#include "matmul/gemm.h"
#include "winograd_conv3x3.h"

namespace difflite::gpu {
namespace {

using builtin::WeightQuant;
using builtin::Arg;
using builtin::CeilDiv;

constexpr const char* kProgram = "winograd_conv3x3";
constexpr size_t kTransformGroup = 128;
constexpr int kFilterSlot = 3;  // U of the filter form (V, M and split-K hold 0, 1 and 2)
static_assert(builtin::kSplitKSlot != kFilterSlot, "split-K scratch would overwrite U");
// The bound on a band's V + M, in bytes of the storage type (see the header comment).
constexpr size_t kScratchBytes = 67108864;  // 64 MiB
// FitScratch shrinks a band to fit idle buffers down to this share of the bound, into at most
// kMaxFitBands bands (or the bound's own count, where larger).
constexpr size_t kMinBandShare = 4;
constexpr int64_t kMaxFitBands = 6;

// Tiles per band: all `rows` tile rows (of `tiles_w` tiles) where V + M of all of them, 36
// (Cin + Cout) elements of `elem` bytes a tile, fit `bound`; else the fewest bands of whole rows
// within it (at least one row a band), the rows shared evenly: no short last band of a few
// rows, whose GEMMs would fill the GPU badly.
int64_t BandTiles(int64_t rows, int tiles_w, int cin, int cout, size_t elem, size_t bound) {
  const int64_t row_bytes = static_cast<int64_t>(winograd::kPositions) * tiles_w *
                            (static_cast<int64_t>(cin) + cout) * static_cast<int64_t>(elem);
  const int64_t fit = static_cast<int64_t>(bound / static_cast<size_t>(row_bytes));
  if (fit >= rows) return rows * tiles_w;
  const int64_t bands = CeilDiv(rows, std::max<int64_t>(fit, 1));
  return CeilDiv(rows, bands) * tiles_w;
}

class WinogradGpu final : public GpuOp {
 public:
  // `filter`: the weight is the 3x3 filter [Cout, 3, 3, Cin] (read as `wq` says), not U.
  std::string Init(const Shape& x, int cout, bool filter, const WeightQuant& wq, GpuContext& ctx) {
    filter_ = filter;
    wq_ = wq;
    n_ = x[0];
    h_ = x[1];
    w_ = x[2];
    cin_ = x[3];
    cout_ = cout;
    tiles_h_ = static_cast<int>(CeilDiv(h_, winograd::kTileOut));
    tiles_w_ = static_cast<int>(CeilDiv(w_, winograd::kTileOut));
    const int64_t rows = static_cast<int64_t>(n_) * tiles_h_;
    const int64_t t = rows * tiles_w_;
    elem_ = DTypeSize(ctx.storage());
    std::string e;
    const size_t bound =
        builtin::EnvBytes("DIFFLITE_WINOGRAD_SCRATCH_BYTES", kScratchBytes, &e);
    if (!e.empty()) return e;
    min_band_bytes_ = bound / kMinBandShare;
    const int64_t band = BandTiles(rows, tiles_w_, cin_, cout_, elem_, bound);
    const int64_t kMax = builtin::kMaxIndex;
    // A band's V and M are indexed with ints across all 36 positions (gemm.cl's batch offsets);
    // the kernels' tile indices t0 + t with ints too (t < T, bounded by x's or y's elements).
    if (winograd::kPositions * band * std::max(cin_, cout_) > kMax ||
        static_cast<int64_t>(n_) * h_ * w_ * std::max(cin_, cout_) > kMax) {
      return "tensors of more than 2^31-1 elements";
    }
    t_ = static_cast<int>(t);
    band_ = static_cast<int>(band);
    if (filter_ && static_cast<int64_t>(winograd::kPositions) * cin_ * cout_ > kMax) {
      return "a filter of more than 2^31-1 transformed elements";
    }
    e = builtin::GetKernel(ctx, kProgram, "wino_input", "", &input_k_);
    if (e.empty()) e = builtin::GetKernel(ctx, kProgram, "wino_output", "", &output_k_);
    if (e.empty() && filter_) {
      e = builtin::GetKernel(ctx, kProgram, "wino_filter", wq_.Options(), &filter_k_);
    }
    if (!e.empty()) return e;
    return InitGemms(ctx);
  }

  // Fewer tile rows a band where a band's V and M (with U in the filter form) would not each fit
  // a buffer idle at this step: the most even bands that fit, but no band's V + M under
  // min_band_bytes_ (a quarter of the bound) and no more than kMaxFitBands bands where the bound
  // gave fewer, since every band costs three launches (SDXL's VAE decoder at 1024 x 1024, bands
  // fitted down to 16 MiB without that cap: 2,235 more launches, 56.6 -> 77.1 ms on the H200).
  std::string FitScratch(GpuContext& ctx, const std::vector<size_t>& idle) override {
    const int64_t rows = static_cast<int64_t>(n_) * tiles_h_;
    int64_t chosen = band_ / tiles_w_;
    const int64_t most_bands = std::max<int64_t>(CeilDiv(rows, chosen), kMaxFitBands);
    const int64_t row_bytes = static_cast<int64_t>(TransformedBytes(tiles_w_, cin_ + cout_));
    const int64_t least = std::min<int64_t>(
        chosen, std::max<int64_t>({1, CeilDiv(static_cast<int64_t>(min_band_bytes_), row_bytes),
                                   CeilDiv(rows, most_bands)}));
    for (int64_t bands = CeilDiv(rows, chosen); chosen > least && !Fits(chosen, idle); ++bands) {
      chosen = std::max(least, CeilDiv(rows, bands + 1));
    }
    if (chosen * tiles_w_ == band_) return "";
    band_ = static_cast<int>(chosen * tiles_w_);
    return InitGemms(ctx);
  }

  bool ReadsQuantized(size_t input) const override { return input == 1 && wq_.on(); }
  bool ReadsAtOffset(size_t input) const override { return input == 1; }
  // A full band's V and M, U (filter form), and the larger of the two GEMMs' own in their slots.
  size_t ScratchSlotBytes(int slot) const override {
    const size_t own = slot == 0 ? VBytes() : slot == 1 ? MBytes() : slot == kFilterSlot ? UBytes() : 0;
    return std::max(own, std::max(gemm_[0].ScratchSlotBytes(slot), gemm_[1].ScratchSlotBytes(slot)));
  }

  std::string Run(GpuContext& ctx, const std::vector<GpuTensor>& in,
                  const std::vector<GpuTensor>& out) override {
    std::string e = builtin::CheckRunTensors(ctx, in, out, 3, 1, wq_.on() ? 1 : -1);
    if (!e.empty()) return e;
    cl_mem v = ctx.Scratch(VBytes(), 0, &e);
    if (v == nullptr) return "winograd V: " + e;
    cl_mem m = ctx.Scratch(MBytes(), 1, &e);
    if (m == nullptr) return "winograd M: " + e;
    cl_mem u = in[1].mem;
    builtin::WeightOffsets u_at = builtin::WeightOffsets::Of(in[1]);
    if (filter_) {  // once a call, for all the bands
      u = ctx.Scratch(UBytes(), kFilterSlot, &e);
      if (u == nullptr) return "winograd U: " + e;
      e = TransformFilter(ctx, in[1], u);
      if (!e.empty()) return e;
      u_at = builtin::WeightOffsets();
    }
    const gpu::ClApi& cl = ctx.cl();
    const cl_int h = h_, w = w_, cin = cin_, cout = cout_, th = tiles_h_, tw = tiles_w_;
    for (int t0 = 0; t0 < t_; t0 += band_) {
      const int tiles = std::min(band_, t_ - t0);
      const cl_int tb = tiles, t0c = t0;
      e = SetArgs(cl, input_k_,
                  {Arg(in[0].mem), Arg(v), Arg(h), Arg(w), Arg(cin), Arg(th), Arg(tw), Arg(tb),
                   Arg(t0c)});
      if (!e.empty()) return e;
      const size_t g1 = gpu::RoundUp(static_cast<size_t>(tiles) * cin_, kTransformGroup);
      e = ctx.Enqueue(input_k_, 1, &g1, &kTransformGroup, "winograd.input");
      if (!e.empty()) return e;
      e = gemm_[tiles == band_ ? 0 : 1].Run(ctx, v, u, nullptr, m, "winograd.gemm", nullptr, {},
                                            u_at);
      if (!e.empty()) return e;
      e = SetArgs(cl, output_k_,
                  {Arg(m), Arg(in[2].mem), Arg(out[0].mem), Arg(h), Arg(w), Arg(cout), Arg(th),
                   Arg(tw), Arg(tb), Arg(t0c)});
      if (!e.empty()) return e;
      const size_t g3 = gpu::RoundUp(static_cast<size_t>(tiles) * cout_, kTransformGroup);
      e = ctx.Enqueue(output_k_, 1, &g3, &kTransformGroup, "winograd.output");
      if (!e.empty()) return e;
    }
    return "";
  }

 private:
  // U = G g G^T of the filter `w` into `u`.
  std::string TransformFilter(GpuContext& ctx, const GpuTensor& w, cl_mem u) const {
    const builtin::WeightOffsets at = builtin::WeightOffsets::Of(w);
    int w_base = 0, wq_base = 0;
    std::string e = builtin::WeightBases(at, wq_, ctx.storage(), &w_base, &wq_base);
    if (!e.empty()) return e;
    builtin::Args args;
    args.Mem(w.mem).Mem(u).Int(cin_).Int(cout_).Int(w_base);
    e = wq_.AppendArgs(args, w.scales, wq_base).Set(ctx.cl(), filter_k_);
    if (!e.empty()) return e;
    const size_t g = gpu::RoundUp(static_cast<size_t>(cin_) * cout_, kTransformGroup);
    return ctx.Enqueue(filter_k_, 1, &g, &kTransformGroup, "winograd.filter");
  }
  // M[p] (Tb x Cout) = V[p] (Tb x Cin) * U[p] (Cin x Cout), batched over the 36 positions p:
  // gemm_[0] for a band of band_ tiles, gemm_[1] for the last, shorter one (T % band_).
  std::string InitGemms(GpuContext& ctx) {
    const int tail = t_ % band_;
    gemm_[1] = builtin::Gemm();
    for (int c = 0; c < (tail != 0 ? 2 : 1); ++c) {
      const int tiles = c == 0 ? band_ : tail;
      builtin::GemmShape s;
      s.m = tiles;
      s.n = cout_;
      s.k = cin_;
      s.a_sm = cin_;
      s.a_sk = 1;
      s.b_sk = cout_;
      s.b_sn = 1;
      s.ldc = cout_;
      s.bdims = {winograd::kPositions};
      s.a_bs = {tiles * cin_};
      s.b_bs = {cin_ * cout_};
      s.c_bs = tiles * cout_;
      std::string e = gemm_[c].Init(ctx, s);
      if (!e.empty()) return "winograd GEMM: " + e;
      // Scratch slots 0 and 1 hold V and M. The GEMM's slot-0 copy of a k-major B (CPU-like
      // devices) never happens here, U being n-major; its split-K partials use kSplitKSlot.
      static_assert(builtin::kSplitKSlot > 1, "split-K scratch would overwrite V or M");
      if (gemm_[c].TransposedBBytes() != 0) {
        return "winograd GEMM: wants scratch slot 0, which holds V";
      }
    }
    return "";
  }
  // Whether a band of `rows` tile rows has V, M and U each in a buffer of `idle`, largest need in
  // the largest buffer.
  bool Fits(int64_t rows, const std::vector<size_t>& idle) const {
    const int64_t tiles = rows * tiles_w_;
    std::vector<size_t> needs = {TransformedBytes(tiles, cin_), TransformedBytes(tiles, cout_)};
    if (filter_) needs.push_back(UBytes());
    std::sort(needs.begin(), needs.end(), std::greater<size_t>());
    if (needs.size() > idle.size()) return false;
    for (size_t i = 0; i < needs.size(); ++i) {
      if (needs[i] > idle[i]) return false;
    }
    return true;
  }
  // Bytes of `tiles` transformed tiles of `channels` channels at the 36 positions (V: Cin, M: Cout).
  size_t TransformedBytes(int64_t tiles, int channels) const {
    return elem_ * winograd::kPositions * static_cast<size_t>(tiles) * static_cast<size_t>(channels);
  }
  size_t UBytes() const {
    return filter_ ? elem_ * winograd::kPositions * static_cast<size_t>(cin_) * cout_ : 0;
  }
  // V and M of a full band.
  size_t VBytes() const { return TransformedBytes(band_, cin_); }
  size_t MBytes() const { return TransformedBytes(band_, cout_); }

  int n_ = 0, h_ = 0, w_ = 0, cin_ = 0, cout_ = 0, tiles_h_ = 0, tiles_w_ = 0, t_ = 0;
  int band_ = 0;  // tiles per band (a multiple of tiles_w_, or T)
  size_t min_band_bytes_ = 0;  // FitScratch's floor on a band's V + M
  size_t elem_ = 4;
  bool filter_ = false;
  WeightQuant wq_;
  cl_kernel input_k_ = nullptr, output_k_ = nullptr, filter_k_ = nullptr;
  builtin::Gemm gemm_[2];  // [0] a full band's GEMMs, [1] the last, shorter band's
};

std::unique_ptr<GpuOp> Create(const NodeView& node, GpuContext& ctx, std::string* error) {
  if (builtin::CheckedCustomNode<OpInstance>(node, error) == nullptr) return nullptr;
  // The op's Infer checked the shapes: [36, Cin, Cout] (transformed) or [Cout, 3, 3, Cin].
  const TensorInfo& w = node.inputs[1];
  const bool filter = w.shape.size() == 4;
  const int cin = node.inputs[0].shape[3];
  const int cout = filter ? w.shape[0] : w.shape[2];
  const WeightQuant wq = filter ? WeightQuant::Of(w, cout, 9 * cin, false) : WeightQuant();
  auto op = std::make_unique<WinogradGpu>();
  *error = op->Init(node.inputs[0].shape, cout, filter, wq, ctx);
  if (!error->empty()) return nullptr;
  return op;
}

}  // namespace

const GpuOpDef kGpuWinogradConv3x3Ops[] = {{winograd::kOpName, &Create}};
DIFFLITE_REGISTER_OPS(kGpuWinogradConv3x3Ops);

}  // namespace difflite::gpu
