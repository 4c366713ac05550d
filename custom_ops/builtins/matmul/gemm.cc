#include "matmul/gemm.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <limits>

namespace difflite::gpu::builtin {

std::string TileConfig::Options() const {
  return "-DTM=" + std::to_string(tm) + " -DTN=" + std::to_string(tn) +
         " -DTK=" + std::to_string(tk) + " -DWM=" + std::to_string(wm) +
         " -DWN=" + std::to_string(wn) + (vec ? " -DVEC=1" : "") + (mma ? " -DMMA=1" : "") +
         (mma && mma_emulated ? " -DMMA_EMULATE=1" : "");
}

std::string TileConfig::Name() const {
  return std::to_string(tm) + "x" + std::to_string(tn) + "x" + std::to_string(tk) + "x" +
         std::to_string(wm) + "x" + std::to_string(wn) + (mma ? "m" : vec ? "v" : "");
}

bool TileConfig::MmaFits() const {
  const int warps = threads() / 32;
  if (threads() % 64 != 0 || tk % 16 != 0 || tn % 16 != 0) return false;
  const int warp_rows = tm / (warps / 2);
  return tm % (warps / 2) == 0 && warp_rows % 16 == 0;
}

std::vector<TileConfig> TileCandidates(int m, int n, int64_t macs, bool mma) {
  std::vector<TileConfig> configs;
  const char* env = std::getenv("DIFFLITE_GEMM_TILE");
  TileConfig forced;
  int used = 0;
  if (env != nullptr && std::sscanf(env, "%dx%dx%dx%dx%d%n", &forced.tm, &forced.tn, &forced.tk,
                                    &forced.wm, &forced.wn, &used) == 5) {
    const std::string rest = env + used;
    forced.mma = rest == "m";
    forced.vec = rest == "v" || forced.mma;
    if ((rest.empty() || forced.vec) && forced.wm > 0 && forced.wn > 0 && forced.tk > 0 &&
        forced.tm % forced.wm == 0 && forced.tn % forced.wn == 0 &&
        (!forced.vec || (forced.wm % 4 == 0 && forced.wn % 4 == 0)) &&
        (!forced.mma || (mma && forced.MmaFits()))) {
      configs.push_back(forced);
    }
  }
  // Tensor cores. On the H200 (2026-11-30, SD 1.5 nvidia-h100 profile, kernels a call) the
  // 128x128 tile 16 deep ran the VAE decoder in 13.5 ms against 16.2 ms 32 deep, 17.9 for
  // 128x64 and 17.4 for 64x128 (float tiles: 25.9); the UNet (batch 1) 22.0 against 22.7.
  if (mma && m > 64 && n > 64) configs.push_back({128, 128, 16, 8, 8, true, true, true});
  if (mma && m > 16 && n > 16) configs.push_back({64, 64, 32, 8, 8, true, false, true});
  // Vectorised by default: on the H100 it ran the SD 1.5 UNet's convolutions and projections
  // 2x faster than the scalar kernel, and larger tiles did not help (2026-11).
  if (macs >= kLargeTileMacs && m > 64 && n > 64) configs.push_back({128, 128, 16, 8, 8, true, true});
  if (m > 32 && n > 32) configs.push_back({64, 64, 16, 4, 4, true});
  configs.push_back({32, 32, 16, 4, 4, true});
  configs.push_back({16, 16, 16, 2, 2});
  return configs;
}

int ChooseSplitK(GpuContext& ctx, int64_t work_groups, int k, int64_t out_elements) {
  int splits = 1;
  const char* env = std::getenv("DIFFLITE_SPLIT_K");
  if (env != nullptr && *env != '\0') {
    splits = std::atoi(env);
  } else {
    const int64_t target = 2 * static_cast<int64_t>(ctx.device().compute_units);
    if (work_groups <= 0 || work_groups >= target) return 1;
    splits = static_cast<int>((target + work_groups - 1) / work_groups);
    splits = std::min(splits, k / kMinSplitKDepth);
  }
  splits = std::max(1, std::min(splits, kMaxSplitK));
  while (splits > 1 && splits * out_elements > std::numeric_limits<int32_t>::max()) --splits;
  return splits;
}

std::string SplitK::InitSum(GpuContext& ctx) {
  return GetKernel(ctx, "gemm", "splitk_sum", "", &sum_);
}

cl_mem SplitK::Target(GpuContext& ctx, cl_mem c, std::string* error) const {
  if (splits_ == 1) return c;
  cl_mem partials = ctx.Scratch(partial_bytes_, kSplitKSlot, error);
  if (partials == nullptr) *error = "split-K partials: " + *error;
  return partials;
}

std::string SplitK::Sum(GpuContext& ctx, cl_mem partials, cl_mem bias, cl_mem c, int m, int n,
                        int ldc, int c_bs, int batches, const char* label, int c_base) const {
  if (splits_ == 1) return "";
  std::string e = Args()
                      .Mem(partials)
                      .Mem(bias)
                      .Mem(c)
                      .Int(m)
                      .Int(n)
                      .Int(ldc)
                      .Int(c_bs)
                      .Int(splits_)
                      .Int(bias != nullptr ? 1 : 0)
                      .Int(c_base)
                      .Set(ctx.cl(), sum_);
  if (!e.empty()) return e;
  const size_t local[3] = {std::min<size_t>(64, ctx.KernelWorkGroupSize(sum_)), 1, 1};
  const size_t global[3] = {RoundUp(static_cast<size_t>(n), local[0]), static_cast<size_t>(m),
                            static_cast<size_t>(batches)};
  return ctx.Enqueue(sum_, 3, global, local, label);
}

WeightQuant WeightQuant::Of(const TensorInfo& w, int n, int k, bool quads) {
  WeightQuant q;
  if (w.quant_bits == 0 || n <= 0 || k <= 0 || (quads && k % 4 != 0)) return q;
  const int64_t group = w.quant_group;
  if (group == static_cast<int64_t>(n) * k) {
    q.kg = 0;  // one scale
  } else if (group == k) {
    q.kg = 1;
  } else if (group < k && k % group == 0 && (group & (group - 1)) == 0 && group >= 4) {
    q.kg = static_cast<int>(k / group);
    q.shift = 0;
    while ((int64_t{1} << q.shift) < group) ++q.shift;
    q.blocks = q.kg;
  } else {
    return q;
  }
  q.bits = w.quant_bits;
  q.half_scales = w.quant_half_scales;
  return q;
}

WeightQuant WeightQuant::PackedCopy(int np) const {
  WeightQuant q = *this;
  if (on()) {
    q.bits = 8;
    q.kg = np;
    q.half_scales = false;  // pack_scales widens them
  }
  return q;
}

std::string WeightQuant::Options() const {
  if (!on()) return "";
  return " -DDL_WQ=" + std::to_string(bits) + (half_scales ? " -DDL_WQ_HALF_SCALES=1" : "");
}

void PackedWeight::Plan(GpuContext& ctx, const TensorInfo& w, int n, int k, int pad_to,
                        const WeightQuant& wq) {
  if (!ctx.PreferFlatKernels() || !w.is_constant || w.dtype != DType::kFloat32) return;
  n_ = n;
  k_ = k;
  wq_ = wq;
  if (wq.on()) pad_to = (std::max(pad_to, 16) + 15) / 16 * 16;  // whole vload16 rows
  np_ = (n + pad_to - 1) / pad_to * pad_to;
  element_bytes_ = wq.on() ? 1 : DTypeSize(ctx.storage());
}

size_t PackedWeight::bytes() const {
  const size_t scales = wq_.on() ? static_cast<size_t>(wq_.blocks) * np_ * sizeof(float) : 0;
  return static_cast<size_t>(np_) * static_cast<size_t>(k_) * element_bytes_ + scales;
}

std::string PackedWeight::PackScales(GpuContext& ctx, cl_mem scales) {
  if (scales == nullptr) return "packing a quantized weight without its scales";
  std::string e = scales_.Allocate(ctx, static_cast<size_t>(wq_.blocks) * np_ * sizeof(float));
  if (!e.empty()) return e;
  cl_kernel kernel = nullptr;
  e = GetKernel(ctx, "weight_pack", "pack_scales", wq_.Options(), &kernel);
  if (!e.empty()) return e;
  e = Args().Mem(scales).Mem(scales_.mem()).Int(n_).Int(wq_.kg).Int(np_).Int(wq_.blocks)
          .Set(ctx.cl(), kernel);
  if (!e.empty()) return e;
  const size_t local[2] = {16, 1};
  const size_t global[2] = {RoundUp(static_cast<size_t>(np_), local[0]),
                            static_cast<size_t>(wq_.blocks)};
  return ctx.Enqueue(kernel, 2, global, local, "pack_scales");
}

std::string PackedWeight::Pack(GpuContext& ctx, cl_mem w, cl_mem scales) {
  if (w == nullptr) return "packing a weight that was not uploaded";
  std::string e = buffer_.Allocate(ctx, static_cast<size_t>(np_) * k_ * element_bytes_);
  if (!e.empty()) return e;
  if (wq_.on()) {
    e = PackScales(ctx, scales);
    if (!e.empty()) return e;
  }
  cl_kernel kernel = nullptr;
  e = GetKernel(ctx, "weight_pack", wq_.on() ? "pack_transposed_q" : "pack_transposed",
                wq_.Options(), &kernel);
  if (!e.empty()) return e;
  cl_mem out = buffer_.mem();
  e = Args().Mem(w).Mem(out).Int(n_).Int(k_).Int(np_).Set(ctx.cl(), kernel);
  if (!e.empty()) return e;
  const size_t local[2] = {16, 4};
  const size_t global[2] = {RoundUp(static_cast<size_t>(np_), local[0]),
                            RoundUp(static_cast<size_t>(k_), local[1])};
  return ctx.Enqueue(kernel, 2, global, local, "pack_transposed");
}

// Whether an operand whose contiguous index runs over `extent` elements, with
// stride `other` for its other index and `batch` strides, splits into aligned
// runs of 4 elements (gemm.cl's A_QUADS / B_QUADS; buffers start aligned).
static bool StagesInQuads(int extent, int other, const std::vector<int>& batch) {
  if (extent % 4 != 0 || other % 4 != 0) return false;
  return std::all_of(batch.begin(), batch.end(), [](int b) { return b % 4 == 0; });
}

Args& WeightQuant::AppendArgs(Args& args, cl_mem scales, int wq_base) const {
  return on() ? args.Mem(scales).Int(kg).Int(shift).Int(wq_base) : args;
}

// `bytes` as the kernels' index of its start: a whole number of `element_bytes` within int range.
static std::string WeightBase(size_t bytes, size_t element_bytes, int* base) {
  if (bytes % element_bytes != 0 || bytes / element_bytes > static_cast<size_t>(kMaxIndex)) {
    return "a weight " + std::to_string(bytes) + " bytes into its buffer is not at an element the "
           "kernels can index";
  }
  *base = static_cast<int>(bytes / element_bytes);
  return "";
}

std::string WeightBases(const WeightOffsets& at, const WeightQuant& wq, DType storage, int* w_base,
                        int* wq_base) {
  std::string e = WeightBase(at.w, wq.on() ? 1 : DTypeSize(storage), w_base);
  *wq_base = 0;
  if (e.empty() && wq.on()) e = WeightBase(at.scales, wq.ScaleBytes(), wq_base);
  return e;
}

std::string Gemm::Init(GpuContext& ctx, const GemmShape& s) {
  s_ = s;
  const std::string acc = s_.accumulate ? " -DGEMM_ACC=1" : "";
  if (s_.bdims.size() > 4) return "more than 4 batch dims after collapsing";
  // Right-align the batch dims into 4 slots (padding with 1, stride 0).
  while (s_.bdims.size() < 4) {
    s_.bdims.insert(s_.bdims.begin(), 1);
    s_.a_bs.insert(s_.a_bs.begin(), 0);
    s_.b_bs.insert(s_.b_bs.begin(), 0);
  }
  batches_ = 1;
  for (int d : s_.bdims) batches_ *= d;
  if (batches_ != 1) s_.wq = WeightQuant();
  if (ctx.PreferFlatKernels()) {
    flat_ = true;
    s_.wq = s_.b_sn == 1 ? s_.wq.PackedCopy(s_.b_sk) : WeightQuant();  // B: the packed [K][NP]
    if (s_.b_sn != 1 && s_.n > 1) {
      // Copy B n-major, one dense [K][N] block per batch of the output.
      IndexSpace space;
      space.dims = s_.bdims;
      space.dims.push_back(s_.k);
      space.dims.push_back(s_.n);
      space.strides.assign(2, {});
      space.strides[0] = s_.b_bs;
      space.strides[0].push_back(s_.b_sk);
      space.strides[0].push_back(s_.b_sn);
      space.strides[1] = Strides(space.dims);
      s_.b_bs.assign(space.strides[1].begin(), space.strides[1].begin() + 4);
      std::string e = b_copy_.Init(ctx, ctx.storage(), space, 0, 0);
      if (!e.empty()) return e;
      transpose_b_ = true;
      b_scratch_bytes_ = static_cast<size_t>(batches_) * s_.k * s_.n * DTypeSize(ctx.storage());
      s_.b_sk = s_.n;
      s_.b_sn = 1;
    }
    std::string e = GetKernel(ctx, "gemm", "gemm_rows",
                              "-DRM=" + std::to_string(kFlatRows) + s_.wq.Options() + acc, &kernel_);
    if (!e.empty()) return e;
    const size_t items = static_cast<size_t>((s_.n + 15) / 16);
    size_t l = 1;
    while (l < items && l < 16) l *= 2;
    flat_local_ = std::min(l, std::max<size_t>(ctx.KernelWorkGroupSize(kernel_), 1));
    return "";
  }
  const bool a_kmajor = s_.a_sk == 1;
  const bool b_kmajor = s_.b_sk == 1 && s_.b_sn != 1;
  if (!b_kmajor || s_.b_sn != s_.k) s_.wq = WeightQuant();
  // Half storage with B n-major (the Winograd GEMMs' U): quads made the H100 slower (VAE
  // 128x128x512: 0.608 ms with both operands in quads, 0.537 with none; float 0.464 with both;
  // 2026-11), where with B k-major (FULLY_CONNECTED) both in quads is fastest.
  // The tensor-core tiles copy the stored bits, so quads cost them nothing to convert.
  const bool quads_allowed = DTypeSize(ctx.storage()) != 2 || b_kmajor;
  const bool a_in_quads = a_kmajor ? StagesInQuads(s_.k, s_.a_sm, s_.a_bs)
                                   : s_.a_sm == 1 && StagesInQuads(s_.m, s_.a_sk, s_.a_bs);
  const bool b_in_quads = b_kmajor ? StagesInQuads(s_.k, s_.b_sn, s_.b_bs)
                                   : s_.b_sn == 1 && StagesInQuads(s_.n, s_.b_sk, s_.b_bs);
  if (s_.m <= kSkinnyMaxRows && batches_ == 1 && b_kmajor && s_.a_sk == 1 &&
      s_.k % 4 == 0 && s_.a_sm % 4 == 0 && s_.b_sn % 4 == 0) {
    std::string e = GetKernel(ctx, "gemm", "gemm_skinny",
                              "-DSK_M=" + std::to_string(s_.m) + s_.wq.Options() + acc, &kernel_);
    if (e.empty() && ctx.KernelWorkGroupSize(kernel_) >= kSkinnyGroup) {
      skinny_ = true;
      ctx.NoteGemmTile("skinny");
      return "";
    }
  }
  auto kernel_of = [&](const TileConfig& c, cl_kernel* k) {
    const bool quads = c.vec && (quads_allowed || c.mma);
    const std::string opts = c.Options() + " -DA_KMAJOR=" + (a_kmajor ? "1" : "0") +
                             " -DB_KMAJOR=" + (b_kmajor ? "1" : "0") +
                             (quads && a_in_quads ? " -DA_QUADS=1" : "") +
                             (quads && b_in_quads ? " -DB_QUADS=1" : "") + s_.wq.Options() + acc;
    return GetKernel(ctx, "gemm", "gemm", opts, k);
  };
  const int64_t macs = static_cast<int64_t>(batches_) * s_.m * s_.n * s_.k;
  std::string e = PickTile(ctx, s_.m, s_.n, macs, kernel_of, &tile_, &kernel_, s_.wq.on());
  if (!e.empty() && s_.wq.on()) {  // no vectorised tile fits: B dequantized at upload
    s_.wq = WeightQuant();
    e = PickTile(ctx, s_.m, s_.n, macs, kernel_of, &tile_, &kernel_);
  }
  if (!e.empty() || !tile_.vec || s_.accumulate) return e;
  const int64_t tiles = static_cast<int64_t>((s_.m + tile_.tm - 1) / tile_.tm) *
                        ((s_.n + tile_.tn - 1) / tile_.tn) * batches_;
  return split_.Plan(ctx, tiles, s_.k, static_cast<int64_t>(batches_) * s_.m * s_.n);
}

std::string Gemm::Run(GpuContext& ctx, cl_mem a, cl_mem b, cl_mem bias, cl_mem c,
                      const char* label, cl_mem b_scales, GemmRows rows, WeightOffsets b_at) const {
  if (s_.wq.on() && b_scales == nullptr) return "a quantized weight without its scales";
  int b_base = 0, wq_base = 0;
  std::string e = WeightBases(b_at, s_.wq, ctx.storage(), &b_base, &wq_base);
  if (!e.empty()) return e;
  if (transpose_b_ && b_base != 0) return "a k-major B copied for the flat kernels must start its buffer";
  const int64_t a_base = static_cast<int64_t>(rows.a) * s_.a_sm;
  const int64_t c_base = static_cast<int64_t>(rows.c) * s_.ldc;
  if (a_base < 0 || c_base < 0 || a_base > kMaxIndex || c_base > kMaxIndex ||
      ((a_base | c_base) & 3) != 0) {
    return "GEMM row starts " + std::to_string(rows.a) + "/" + std::to_string(rows.c) +
           " are not 4-element aligned offsets";
  }
  if (transpose_b_) {
    std::string err;
    cl_mem t = ctx.Scratch(b_scratch_bytes_, 0, &err);
    if (t == nullptr) return err;
    err = b_copy_.Run(ctx, b, t, label);
    if (!err.empty()) return err;
    b = t;
  }
  const bool has_bias = s_.has_bias && bias != nullptr;
  if (skinny_) {
    Args args;
    args.Mem(a).Mem(b).Mem(bias).Mem(c).Int(s_.n).Int(s_.k).Int(s_.a_sm).Int(s_.b_sn)
        .Int(s_.ldc).Int(has_bias ? 1 : 0).Int(static_cast<int>(a_base)).Int(static_cast<int>(c_base))
        .Int(b_base);
    e = s_.wq.AppendArgs(args, b_scales, wq_base).Set(ctx.cl(), kernel_);
    if (!e.empty()) return e;
    const size_t local[1] = {kSkinnyGroup};
    const size_t global[1] = {static_cast<size_t>((s_.n + kSkinnyColumns - 1) / kSkinnyColumns) *
                              kSkinnyGroup};
    return ctx.Enqueue(kernel_, 1, global, local, label);
  }
  const bool split = split_.splits() > 1;
  cl_mem out = split_.Target(ctx, c, &e);
  if (out == nullptr) return e;
  Args args;
  args.Mem(a).Mem(b).Mem(bias).Mem(out).Int(s_.m).Int(s_.n).Int(s_.k).Int(s_.a_sm)
      .Int(s_.a_sk).Int(s_.b_sk).Int(s_.b_sn).Int(split ? s_.n : s_.ldc).Int4(s_.bdims, 1)
      .Int4(s_.a_bs).Int4(s_.b_bs).Int(split ? s_.m * s_.n : s_.c_bs)
      .Int(has_bias && !split ? 1 : 0).Int(static_cast<int>(a_base))
      .Int(split ? 0 : static_cast<int>(c_base))  // split: dense partial planes first
      .Int(b_base);
  e = s_.wq.AppendArgs(args, b_scales, wq_base).Set(ctx.cl(), kernel_);
  if (!e.empty()) return e;
  if (flat_) {
    const size_t local[3] = {flat_local_, 1, 1};
    const size_t global[3] = {RoundUp(static_cast<size_t>((s_.n + 15) / 16), flat_local_),
                              static_cast<size_t>((s_.m + kFlatRows - 1) / kFlatRows),
                              static_cast<size_t>(batches_)};
    return ctx.Enqueue(kernel_, 3, global, local, label);
  }
  const size_t local[3] = {static_cast<size_t>(tile_.tn / tile_.wn),
                           static_cast<size_t>(tile_.tm / tile_.wm), 1};
  const size_t global[3] = {static_cast<size_t>((s_.n + tile_.tn - 1) / tile_.tn) * local[0],
                            static_cast<size_t>((s_.m + tile_.tm - 1) / tile_.tm) * local[1],
                            static_cast<size_t>(batches_) * split_.splits()};
  e = ctx.Enqueue(kernel_, 3, global, local, label);
  if (!e.empty()) return e;
  return split_.Sum(ctx, out, has_bias ? bias : nullptr, c, s_.m, s_.n, s_.ldc, s_.c_bs, batches_,
                    label, static_cast<int>(c_base));
}

}  // namespace difflite::gpu::builtin
