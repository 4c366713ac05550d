// The tiled GEMM launcher shared by FULLY_CONNECTED, BATCH_MATMUL and the
// 1x1 convolutions (gemm.cl), and the tile choice shared with conv.cl.
#ifndef DIFFLITE_BUILTINS_MATMUL_GEMM_H_
#define DIFFLITE_BUILTINS_MATMUL_GEMM_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/kernel_util.h"

namespace difflite::gpu::builtin {

struct TileConfig {
  int tm = 64, tn = 64, tk = 16, wm = 4, wn = 4;
  // The vectorised kernels (-DVEC=1: contiguous WM x WN block per item, float4
  // local reads, double-buffered tiles); needs wm and wn multiples of 4.
  bool vec = false;
  // Taken only where its kernel spills nothing (KernelPrivateBytes 0): the
  // large tile's 64 accumulators a work-item fit an H100's registers, not
  // necessarily a phone GPU's.
  bool unspilled_only = false;
  // The vectorised tile walk on tensor cores (gemm_mma.cl, -DMMA=1; vec too): warps of 32
  // items in two columns, each owning whole 16 x 8 fragments.
  bool mma = false;
  // The instruction emulated in OpenCL C (-DMMA_EMULATE=1): set by PickTile where
  // GpuContext::TensorCoresEmulated().
  bool mma_emulated = false;
  int threads() const { return (tm / wm) * (tn / wn); }
  // Whether gemm_mma.cl can lay its warps over this tile.
  bool MmaFits() const;
  // -DTM=... -DTN=... -DTK=... -DWM=... -DWN=... [-DVEC=1 [-DMMA=1 [-DMMA_EMULATE=1]]]
  std::string Options() const;
  std::string Name() const;     // DIFFLITE_GEMM_TILE's form: TMxTNxTKxWMxWN[v|m]
};

// Candidate tiles, best first, for a GEMM of m x n outputs per batch and
// `macs` multiply-adds in all: 128x128 with 8x8 outputs a work-item for
// GEMMs of at least kLargeTileMacs (on the H100 1.06-1.23x the 64x64 tile at
// the SD 1.5 UNet's large projections and convolutions, 0.82-0.88x at its
// 0.8 G-MAC ones: too few tiles; lab/gpu_gemm_sweep.py, 2026-11),
// then 64x64 (for m, n > 32), 32x32, 16x16. DIFFLITE_GEMM_TILE=TMxTNxTKxWMxWN
// (e.g. 128x128x16x8x8) puts one tile first, a trailing v (128x128x16x8x8v)
// selects the vectorised variant, a trailing m (128x128x32x8x8m) the tensor-core one where
// `mma` allows it; for benchmarking.
// `mma` (GpuContext::TensorCores(), for gemm.cl's GEMMs): tensor-core tiles first, 128x128x16
// (8 warps of 32 x 64 outputs) for m, n > 64, then 64x64x32 (2 warps of 64 x 32).
constexpr int64_t kLargeTileMacs = 1073741824;  // 2^30
std::vector<TileConfig> TileCandidates(int m, int n, int64_t macs, bool mma = false);

// The first candidate tile that `kernel_of(config)` can run on this device.
// kernel_of returns "" and the kernel, or a reason.
// `vec_only`: the vectorised tiles only (those that read quantized weights).
// Where GpuContext::TensorCores() allows them, tensor-core tiles come first (kernel_of builds
// config.Options(), which carries -DMMA=1 and its emulation); one that does not build is passed
// over, not an error. The tile taken is noted for the stats (GpuContext::NoteGemmTile).
template <typename F>
std::string PickTile(GpuContext& ctx, int m, int n, int64_t macs, F kernel_of, TileConfig* out,
                     cl_kernel* kernel, bool vec_only = false) {
  std::string last;
  for (TileConfig c : TileCandidates(m, n, macs, ctx.TensorCores())) {
    c.mma_emulated = c.mma && ctx.TensorCoresEmulated();
    if (static_cast<size_t>(c.threads()) > ctx.device().max_work_group_size) continue;
    if (vec_only && !c.vec) continue;
    cl_kernel k = nullptr;
    last = kernel_of(c, &k);
    if (!last.empty() && c.mma) continue;
    if (!last.empty()) return last;  // a build error is not a size problem
    if (c.unspilled_only && KernelPrivateBytes(ctx, k) != 0) {
      last = "tile spills registers on the device";
      continue;
    }
    if (ctx.KernelWorkGroupSize(k) >= static_cast<size_t>(c.threads())) {
      *out = c;
      *kernel = k;
      ctx.NoteGemmTile(c.Name());
      return "";
    }
    last = "work-group of " + std::to_string(c.threads()) + " items too large for the device";
  }
  return last.empty() ? "no GEMM tile fits the device" : last;
}

// Split-K. A GEMM whose output tiles give fewer than two work-groups per
// compute unit (the SD 1.5 UNet's 8x8 and 16x16 levels: M = 128 or 512 rows,
// K up to 23040) leaves most of a big GPU idle for its whole, long K loop.
// Such a GEMM (vectorised tiles only) splits K over up to kMaxSplitK groups
// of work-groups, each >= kMinSplitKDepth deep; each writes a dense [M][N]
// partial plane to scratch slot kSplitKSlot, and splitk_sum (gemm.cl) adds
// the planes and the bias. DIFFLITE_SPLIT_K=N forces N splits wherever the
// vectorised kernels run (tests on PoCL, benchmarks).
constexpr int kSplitKSlot = 2;
constexpr int kMaxSplitK = 16;
constexpr int kMinSplitKDepth = 256;
// Splits for `work_groups` output tiles (all batches) of depth k; 1: none.
// `out_elements`: batches * M * N, to keep the partials 32-bit indexable.
int ChooseSplitK(GpuContext& ctx, int64_t work_groups, int k, int64_t out_elements);

// One GEMM's split-K: the choice, the partial planes' scratch and splitk_sum.
class SplitK {
 public:
  // Chooses the splits for `tiles` output tiles (all batches) of depth k and
  // `out_elements` = batches * M * N outputs. The tiled kernels read the split
  // count from their NDRange, so the same kernel runs split or not.
  std::string Plan(GpuContext& ctx, int64_t tiles, int k, int64_t out_elements) {
    splits_ = ChooseSplitK(ctx, tiles, k, out_elements);
    if (splits_ == 1) return "";
    partial_bytes_ = static_cast<size_t>(splits_) * out_elements * DTypeSize(ctx.storage());
    return InitSum(ctx);
  }
  int splits() const { return splits_; }
  size_t bytes() const { return partial_bytes_; }
  // Where the split kernel writes: the partial planes (kSplitKSlot), or `c` without splits.
  cl_mem Target(GpuContext& ctx, cl_mem c, std::string* error) const;
  // Adds the planes into C[c_base + b*c_bs + m*ldc + n] (+ bias[n]); nothing without splits.
  std::string Sum(GpuContext& ctx, cl_mem partials, cl_mem bias, cl_mem c, int m, int n, int ldc,
                  int c_bs, int batches, const char* label, int c_base = 0) const;

 private:
  std::string InitSum(GpuContext& ctx);
  int splits_ = 1;
  size_t partial_bytes_ = 0;
  cl_kernel sum_ = nullptr;
};

// At most this many rows (one batch, B k-major) take gemm.cl's gemm_skinny.
constexpr int kSkinnyMaxRows = 8;
constexpr size_t kSkinnyGroup = 64;  // its SK_WG
constexpr int kSkinnyColumns = 4;    // its SK_NC

// How the GEMM-style kernels read a quantized weight W[N][K] (dl_qweights.cl): the element
// (n, k) is q(n*K + k) * scale[n*kg + (k >> shift)]. Off (bits 0) where the weight is float or
// its scales follow a pattern the kernels do not read: it is then dequantized at upload.
struct WeightQuant {
  int bits = 0;      // 8 or 4; 0: read as float
  int kg = 0;        // scales per row: 0 per tensor, 1 per output channel, K >> shift blocks
  int shift = 31;
  int blocks = 1;    // distinct k >> shift values: rows of the packed scales
  bool half_scales = false;  // float16 scales (int4 blocks), read with vload_half
  // For the constant `w` read as [n][k]; `quads`: the kernel reads k in aligned runs of 4.
  static WeightQuant Of(const TensorInfo& w, int n, int k, bool quads);
  bool on() const { return bits != 0; }
  // How the flat kernels read the int8 copy PackedWeight makes of it (int4 widened; the packed
  // scales' row length `np` in kg); off stays off.
  WeightQuant PackedCopy(int np) const;
  // Build options: -DDL_WQ=<bits> (and -DDL_WQ_HALF_SCALES=1), or "" when off.
  std::string Options() const;
  // The kernels' last arguments (dl_qweights.cl's DL_WQ_PARAMS) where on; the scales start
  // `wq_base` scales into their buffer (WeightBases).
  Args& AppendArgs(Args& args, cl_mem scales, int wq_base = 0) const;
  // Bytes of one scale as the kernels read it.
  size_t ScaleBytes() const { return half_scales ? 2 : 4; }
};

// Where a weight and its scales start in their buffers, in bytes (GpuTensor::offset and
// scales_offset: nonzero in a weight slab, for ops that say GpuOp::ReadsAtOffset).
struct WeightOffsets {
  size_t w = 0;
  size_t scales = 0;
  static WeightOffsets Of(const GpuTensor& t) { return {t.offset, t.scales_offset}; }
};

// The kernels' w_base / b_base (in elements of the weight's pointer: bytes where quantized, int4
// included) and wq_base (in scales) for a weight at `at`: "" or the reason.
std::string WeightBases(const WeightOffsets& at, const WeightQuant& wq, DType storage, int* w_base,
                        int* wq_base);

struct GemmShape {
  int m = 0, n = 0, k = 0;
  int a_sm = 0, a_sk = 0, b_sk = 0, b_sn = 0, ldc = 0;
  // Batch dims (outermost first, at most 4 after collapsing) and strides.
  std::vector<int> bdims, a_bs, b_bs;
  int c_bs = 0;
  bool has_bias = false;
  // C += A B (+ bias): C's values are read where they are stored (gemm.cl's GEMM_ACC; never split
  // over K, since the split planes would each add them).
  bool accumulate = false;
  // B is this quantized weight [N][K] (k-major, one batch), or its packed [K][NP] int8 copy
  // on CPU-like devices (then kg is NP); off: B is float.
  WeightQuant wq;
};

// The first row of A and of C a GEMM reads and writes (rows of a_sm and ldc elements): a GEMM
// over a window of larger tensors (the attention's query-row chunks) without a sub-buffer, which
// costs a driver call per window and which PoCL's CUDA driver mishandles. Each row start must
// fall on 4 elements (the vector kernels' alignment).
struct GemmRows {
  int a = 0;
  int c = 0;
};

// Tiled local-memory kernel on GPUs; on CPU-like devices (PreferFlatKernels)
// the barrier-free gemm_rows, whose items walk n: give it n-major B
// (b_sn == 1) where possible.
class Gemm {
 public:
  std::string Init(GpuContext& ctx, const GemmShape& s);
  // `b_scales`: the scales of a quantized B (reads_quantized()); `b_at`: where B and its scales
  // start in their buffers (a weight in a slab).
  std::string Run(GpuContext& ctx, cl_mem a, cl_mem b, cl_mem bias, cl_mem c,
                  const char* label, cl_mem b_scales = nullptr, GemmRows rows = {},
                  WeightOffsets b_at = {}) const;
  // Whether Run reads B where b_at says: not when it first copies B (the flat kernels' n-major
  // copy of a k-major B).
  bool ReadsBAtOffset() const { return !transpose_b_; }
  // Whether B is read quantized: Init turns the shape's wq off where no kernel reads it so.
  bool reads_quantized() const { return s_.wq.on(); }
  // What Run asks of scratch slot `slot`: 0, the n-major copy of B; kSplitKSlot, the partials.
  size_t ScratchSlotBytes(int slot) const {
    return slot == 0 ? b_scratch_bytes_ : slot == kSplitKSlot ? split_.bytes() : 0;
  }
  size_t TransposedBBytes() const { return b_scratch_bytes_; }  // its scratch slot 0

 private:
  GemmShape s_;
  TileConfig tile_;
  cl_kernel kernel_ = nullptr;
  int batches_ = 1;
  SplitK split_;
  bool flat_ = false;
  size_t flat_local_ = 64;
  bool skinny_ = false;  // gemm_skinny
  // Flat kernels with a k-major B (e.g. A * B^T): B is first copied n-major
  // into scratch memory.
  bool transpose_b_ = false;
  StridedCopy b_copy_;
  size_t b_scratch_bytes_ = 0;
};

// The op of a GEMM whose B is the constant weight `w` [N][K] of shape `s` (B k-major, bias
// input `bias_input` or -1): read in place, quantized where s.wq is on and a kernel reads it
// so, or packed for the flat kernels (matmul.cc; FULLY_CONNECTED and 1x1 CONV_2D).
std::unique_ptr<GpuOp> MakeWeightGemm(GpuContext& ctx, const TensorInfo& w, GemmShape s,
                                      int bias_input, const char* label, std::string* error);

// Rows of C per item of the flat kernels (-DRM).
constexpr int kFlatRows = 8;

// For CPU-like devices: a constant [N][K] float matrix (FULLY_CONNECTED
// weights, OHWI filters) kept transposed as [K][NP], NP = N rounded up to
// `pad_to` (zeros), so that the flat kernels read it n-major. The copy is made
// on the device from the uploaded weight (GpuOp::PackWeights), never on the host.
class PackedWeight {
 public:
  // Plans the packed copy where the device prefers flat kernels and `w` is a
  // float constant; planned() tells.
  // A quantized `w` (wq on) is packed as int8 (int4 widened) with NP a multiple of 16, and
  // its scales as [wq.blocks][NP] floats.
  void Plan(GpuContext& ctx, const TensorInfo& w, int n, int k, int pad_to,
            const WeightQuant& wq = WeightQuant());
  bool planned() const { return np_ > 0; }
  // Makes the copy from `w` (the uploaded [N][K] weight; `scales` where quantized). "" or a
  // reason.
  std::string Pack(GpuContext& ctx, cl_mem w, cl_mem scales = nullptr);
  cl_mem mem() const { return buffer_.mem(); }
  cl_mem scales() const { return scales_.mem(); }
  int np() const { return np_; }
  size_t bytes() const;

 private:
  std::string PackScales(GpuContext& ctx, cl_mem scales);
  int n_ = 0, k_ = 0, np_ = 0;
  size_t element_bytes_ = 4;
  WeightQuant wq_;
  OwnedBuffer buffer_;
  OwnedBuffer scales_;
};

}  // namespace difflite::gpu::builtin

#endif  // DIFFLITE_BUILTINS_MATMUL_GEMM_H_
