// difflite.Attention on the OpenCL backend (kernels: attention.cl).
//
// Three variants; only the partial softmax on GPUs writes scores:
//   partial_softmax  on devices with tiled kernels (GPUs: !PreferFlatKernels,
//                    or kernels=tiled), the paper's partially fused softmax as
//                    GEMMs, chunk by chunk of query rows:
//                      S[n][h][m][j] = q[n, m0+m, h*Dk + :] . k[n, j, h*Dk + :]
//                    by one builtin::Gemm (batch dims [N, H]) into scratch
//                    slot kScoresSlot (4), in the storage type;
//                    attn_softmax_rows (a work-group per row: max and sum of
//                    exp in float, reduced in local memory) overwrites each
//                    row with its probabilities (causal: 0 past the query);
//                      O[n, m0+m, h*Dv + :] = P[n][h][m][:] . v[n, :, h*Dv + :]
//                    by a second Gemm: into o itself at N = 1 (from the chunk's
//                    first row, builtin::GemmRows), else into O' [N][H][rows][Dv]
//                    (slot kOutSlot = 1) that attn_scatter_rows copies into o.
//                    q's chunk is read from its first row the same way: no
//                    sub-buffer is made while the model runs. The chunk's
//                    rows keep S within kScoresBytes (16 MiB;
//                    DIFFLITE_ATTN_SCORES_BYTES), multiples of 64 rows, all of
//                    Lq where S fits. The GEMMs' own
//                    scratch: slot 0 (transposed B, flat devices only) and 2
//                    (split-K partials). Measured before it (H200, 2026-11):
//                    the recompute kernels below took 21.8 ms for the VAE
//                    decoder's 4096 x 4096 head of 512 and 18.6 of the batch-1
//                    UNet's 47.4 ms; the same FLOPs through the tiled GEMM are
//                    about 1 ms (lab/gpu_attention_partial.py times both).
//                    On CPU-like devices (flat kernels, CI's PoCL by default)
//                    and with DIFFLITE_ATTN_KERNEL=recompute: attn_rowstats
//                    (row max and sum of exp, [N,H,Lq] float2 in scratch slot
//                    0) + attn_output (scores recomputed, normalisation fused
//                    into the product with V); no S (CI's default path stays
//                    as it was; the GEMMs there would be gemm_rows with a
//                    transposed copy of K per chunk).
//   flash            attn_flash: one kernel, online softmax, K/V tiles in
//                    local memory, q row and accumulator in registers.
//   wide             attn_wide: FlashAttention-2 tiled per work-group (a
//                    block of query rows per work-group, score tile and V
//                    chunks in local memory, the output block's accumulator
//                    spread over the work-items' registers): one pass over
//                    the scores for any head size.
// `variant` is a hint. The rule:
//   * "partial_softmax": partial_softmax.
//   * A wide head (Dk or Dv > kFlashMaxHead) with "auto" or "flash" on a
//     device with tiled kernels (GPUs, !PreferFlatKernels): wide (it is
//     FlashAttention, tiled per work-group); if no wide tile fits, partial.
//     Except heads up to kFlashItemMaxHead whose attn_flash compiles without
//     spilling (CL_KERNEL_PRIVATE_MEM_SIZE 0; FlashInRegisters): flash. On the
//     H100 attn_flash spills nothing up to head 80 (8 bytes at 96, 848 at 160)
//     and ran SD 1.5's 1024 x 1024, 8 x 80 self-attention at batch 2 in
//     0.305 ms against 0.514 for attn_wide (2026-11).
//   * Otherwise "auto" takes flash when both head sizes are <= kFlashMaxHead
//     (its per-work-item registers: q row + accumulator) and its K/V tiles
//     fit in half the device's local memory, and "flash" takes it when the
//     tiles fit at all; otherwise, and whenever the flash kernel cannot be
//     built with its work-group size, partial_softmax. CPU-like devices (flat
//     kernels, e.g. PoCL) keep this rule for wide heads too.
// DIFFLITE_ATTN_KERNEL=wide|flash|partial|recompute forces that kernel
// whatever the hint and device (for tests and benchmarks; partial: the
// partial softmax as the device runs it, GEMMs with tiled kernels; recompute:
// attn_rowstats + attn_output anywhere); the node is refused when the forced
// kernel's tiles do not fit. DIFFLITE_ATTN_PARTIAL_TILE=BQxBKxRQ sets the
// recompute kernels' tile (rows per work-group, keys per tile, rows per
// work-item) for A/B runs.
// Split keys (flash only; attn_flash with AT_SPLIT, then attn_merge): a launch
// with too few work-items to fill a GPU gets 2 or 4 work-groups per row block
// and head, each over a contiguous 1/splits of the keys, writing partials
// (each row's max / sum in float, the rows in the storage type: half with
// fp16, scratch slot kSplitSlot) that attn_merge
// combines. Measured on an H100 (132 compute units), SD 1.5's 4096 x 4096,
// 8 x 40 self-attention: batch 1 launches 16384 work-items (124 per compute
// unit) and ran 0.98 ms (21.8 TFLOPS); batch 2, 32768 (248 per unit), 1.53 ms
// for twice the work (27.6 TFLOPS): about kSplitItemsPerCu work-items per
// compute unit fill the device. The rule (PickSplits):
//   * only flash on a device with tiled kernels (GPUs: the argument is about
//     resident warps hiding latency; a CPU device runs a work-group per core
//     to completion), never causal (a row block sees keys only up to its last
//     row, so even splits of [0, Lk) would leave the later ones idle for most
//     blocks), never wide or the partial softmax;
//   * splits = the most of 4, 2 that keep the split launch within
//     compute_units * kSplitItemsPerCu work-items (so batch 1 above takes 2:
//     32768 items; batch 2 keeps 1): splitting past a device's fill adds
//     partial traffic and a merge but no concurrency;
//   * each split keeps at least kMinSplitKeys keys (fewer, and the extra
//     partial row written and merged per split (Dv + 2 floats) is no longer
//     small against the split's K/V work).
// DIFFLITE_ATTN_SPLITS=1|2|4 forces the count on any device (for tests and
// benchmarks), still only for non-causal flash and clamped so that each split
// keeps kMinSplitKeys keys; another value refuses the node.
// Local memory holds float4s along the head dimension (each head size or
// chunk rounded up to a multiple of 4); each flash / partial work-item owns
// `rq` query rows (AT_RQ), so a work-group is bq / rq work-items; a wide
// work-group is `nt` work-items for bq rows.
// The plan is mirrored by benchmarks/gpu_kernels_harness/launch.py
// (attention_plan); keep the two in step.
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/kernel_util.h"
#include "attention.h"
#include "matmul/gemm.h"
#include "difflite/gpu_api.h"
#include "difflite/registry.h"

namespace difflite::gpu {
namespace {

using builtin::Arg;
using builtin::CeilDiv;

constexpr const char* kProgram = "attention";
constexpr int kFlashMaxHead = 64;
constexpr int kFlashItemMaxHead = 80;  // flash past kFlashMaxHead when it does not spill
constexpr int kSplitItemsPerCu = 256;  // work-items per compute unit that fill a GPU
constexpr int kMinSplitKeys = 256;     // fewest keys per split
constexpr int kMaxSplits = 4;
// Split partials: a slot of its own (slot 0 holds the partial softmax's row
// statistics; the two never run in one Run, but distinct slots keep it so).
constexpr int kSplitSlot = 1;
constexpr size_t kMergeGroup = 64;  // attn_merge's work-group

// The partial softmax through the backend's GEMM (devices with tiled kernels;
// see the header comment). The scores S of one chunk of query rows,
// N x H x rows x Lk in the storage type, are the only large intermediate:
// the chunk's rows are the most that keep S within kScoresBytes (a multiple
// of kChunkRowQuantum rows), all of Lq where it fits. 16 MiB: a phone's intermediate
// memory is tight (the paper's whole SD 1.5 UNet ran in 84 MB of
// intermediates), and 16 MiB already holds 128 rows of SD 1.5's largest
// self-attention (batch 2, 8 heads, 4096 keys, half), enough work per GEMM to
// fill a big GPU. DIFFLITE_ATTN_SCORES_BYTES=N replaces the bound (tests,
// benchmarks).
constexpr size_t kScoresBytes = 16777216;  // 16 MiB
// The partial softmax takes the GEMM form for heads of at least this many
// dims (either of Dk, Dv), or when DIFFLITE_ATTN_KERNEL=partial; narrower heads
// keep the recompute kernels. Per score the GEMM form does 2 (Dk + Dv) FLOPs
// and moves it ~5 times through memory (written, read for the row's max and
// sum, rewritten as a probability, read by the second GEMM): at Dk = Dv = 40
// that is 16 FLOPs per byte of half S, below a phone GPU's ratio of peak
// arithmetic to bandwidth (Adreno 740 ~70) and about the H200's (~14), where
// 2 x 4096 x 4096, 8 x 40 measured 4.30 ms as GEMMs against 3.23 recomputed,
// while 8 x 80 took 0.40 against 0.97 and the VAE's 1 x 512 1.06 against 21.8
// (lab/gpu_attention_partial.py, 2026-11-29).
constexpr int kGemmMinHead = 64;
constexpr int kChunkRowQuantum = 64;
// S lives in a scratch slot no other user touches while the op runs: slot 0
// is the GEMM's transposed-B copy on flat devices (and the row statistics of
// the recompute kernels), 1 the flash split partials (here: the second GEMM's
// output O' before attn_scatter_rows), builtin::kSplitKSlot (2) the GEMMs'
// split-K partials, 3 Winograd's filter.
constexpr int kScoresSlot = 4;
constexpr int kOutSlot = kSplitSlot;
static_assert(kScoresSlot != builtin::kSplitKSlot && kScoresSlot != 0 && kScoresSlot != kSplitSlot,
              "S would share a slot with another scratch of the op");
static_assert(kOutSlot != builtin::kSplitKSlot && kOutSlot != 0, "O' would share a GEMM's slot");
constexpr int kSoftmaxGroup = 128;  // attn_softmax_rows' work-items per row (AT_SMW), halved to fit
constexpr size_t kScatterGroup = 64;  // attn_scatter_rows' work-group

// Rows per work-item (AT_RQ), flash only: 2 when the two rows' q and
// accumulator registers stay within kRowRegs floats, else 1. Measured on an
// H100 (fp32): head 40 with 2 rows 1.4x faster than with 1; heads 80 and 160
// and the partial softmax (scores + accumulator chunk: 96 floats a row) were
// 2-3x slower with 2 rows (register spills), 4 rows slower everywhere. The
// partial-softmax kernels take AT_RQ too but run with 1.
constexpr int kRowRegs = 160;

// attn_wide tiles: {rows per work-group, keys per block, work-items, Dk chunk
// cap, V keys per chunk}: the first whose local memory fits the device, whose
// work-group the device and kernel accept, and whose output accumulator takes
// at most kWideMaxAcc floats per work-item. For the VAE's heads of 512 the
// first takes 41472 bytes (H100: 48 KB), the second 25088 (32 KB devices),
// the last 10496.
constexpr int kWideLadder[4][5] = {{32, 64, 256, 64, 16}, {32, 64, 256, 32, 8}, {16, 32, 128, 32, 8}, {16, 32, 64, 16, 4}};
constexpr int kWideMaxAcc = 128;

enum class Kernel { kPartial, kFlash, kWide };

int Round4(int d) { return (d + 3) / 4 * 4; }

struct Plan {
  Kernel kernel = Kernel::kPartial;
  int bq = 64, bk = 32, kc = 8, dc = 0, dvc = 0;
  int rq = 1;  // query rows per work-item (flash, partial)
  int splits = 1;  // flash: key ranges per row block and head (AT_SPLIT)
  int nt = 0, vk = 0, sx = 0, ox = 0;  // wide: work-items, V chunk keys, layouts

  // attn_wide's float4 columns per work-item (AT_OC) and output rows (AT_OR).
  int WideCols(int dv) const { return static_cast<int>(CeilDiv(Round4(dv) / 4, ox)); }
  int WideRows() const { return bq / (nt / ox); }
  size_t LocalBytes(int dk, int dv) const {
    if (kernel == Kernel::kFlash) return 4u * bk * (Round4(dk) + Round4(dv));  // Ks Vs
    if (kernel == Kernel::kWide) {  // attn_wide's AT_SMEM4 float4s, Ss, Ms Ls Cs
      const int dc4 = dc / 4;
      const int qs = bq * (dc4 + 1), ks = bk * (dc4 + 1);
      const int vs = vk * WideCols(dv) * ox;
      const int voff = dk <= dc ? qs : 0;
      const int smem4 = qs + ks > voff + vs ? qs + ks : voff + vs;
      return 16u * smem4 + 4u * bq * (bk + 1) + 12u * bq;
    }
    return 4u * (bq * (Round4(dc) + 4) + bk * Round4(dc) + bk * Round4(dvc) +
                 bq * (bk + 1));  // Qs Ks Vs Ps
  }
  int WorkGroup() const { return kernel == Kernel::kWide ? nt : bq / rq; }
  void PickRows(int dk, int dv) {
    rq = kernel == Kernel::kFlash && bq % 2 == 0 && 2 * (Round4(dk) + Round4(dv)) <= kRowRegs
             ? 2
             : 1;
  }
  // attn_wide's work-item layouts: sy = min(bq, 16) rows x sx keys for the
  // scores; ox float4 columns x (nt / ox) rows for the output, ox the power of
  // two with the fewest padded columns, then the squarest register block.
  void PickWideLayout(int dv) {
    sx = nt / (bq < 16 ? bq : 16);
    const int dv4 = Round4(dv) / 4;
    int best_pad = 0, best_side = 0;
    for (int x = 1; x <= nt; x *= 2) {
      if (bq * x < nt) continue;  // nt / x rows must fit in bq
      const int cols = static_cast<int>(CeilDiv(dv4, x)), rows = bq / (nt / x);
      const int pad = cols * x, side = cols > rows ? cols : rows;
      if (ox == 0 || pad < best_pad || (pad == best_pad && side < best_side)) {
        ox = x;
        best_pad = pad;
        best_side = side;
      }
    }
  }
  std::string Options(int dk, int dv) const {
    const std::string heads = "-DAT_DK=" + std::to_string(dk) + " -DAT_DV=" + std::to_string(dv);
    const std::string rows = " -DAT_RQ=" + std::to_string(rq);
    if (kernel == Kernel::kWide) {
      return heads + " -DAT_BQ=" + std::to_string(bq) + " -DAT_BK=" + std::to_string(bk) +
             " -DAT_DC=" + std::to_string(dc) + " -DAT_NT=" + std::to_string(nt) +
             " -DAT_VK=" + std::to_string(vk) + " -DAT_SX=" + std::to_string(sx) +
             " -DAT_OX=" + std::to_string(ox);
    }
    if (kernel == Kernel::kFlash) {
      const std::string split = splits > 1 ? " -DAT_SPLIT=" + std::to_string(splits) : "";
      return heads + " -DAT_BQ=" + std::to_string(bq) + " -DAT_BK=" + std::to_string(bk) +
             " -DAT_KC=" + std::to_string(kc) + rows + split;
    }
    return "-DAT_BQ=" + std::to_string(bq) + " -DAT_BK=" + std::to_string(bk) +
           " -DAT_DC=" + std::to_string(dc) + " -DAT_DVC=" + std::to_string(dvc) + rows;
  }
};

// The fewest chunks of at most `cap`; returns the chunk size.
int Chunk(int d, int cap) { return static_cast<int>(CeilDiv(d, CeilDiv(d, cap))); }

// Flash tiles (K/V tiles of 32 keys, 16 if local memory is tight), or false.
// attn_flash tiles: kFlashRows query rows per work-group (halved while the
// work-group exceeds the device's limit) and the largest key tile of 64, 32,
// 16 that fits local memory. On the H100, 256 rows x 64 keys ran SD 1.5's
// 4096 x 4096, 8 x 40 self-attention in 1.00 ms against 1.50 ms for 64 x 32
// (lab/gpu_flash_sweep.py, 2026-11): a work-group of 64 rows is a
// single warp, too few per compute unit to hide the latencies.
constexpr int kFlashRows = 256;

bool PlanFlash(int dk, int dv, size_t local_mem, size_t max_wg, Plan* p) {
  Plan f;
  f.kernel = Kernel::kFlash;
  f.bq = kFlashRows;
  for (int bk : {64, 32, 16}) {
    f.bk = bk;
    if (f.LocalBytes(dk, dv) <= local_mem) break;
  }
  if (f.LocalBytes(dk, dv) > local_mem) return false;
  f.PickRows(dk, dv);
  while (f.bq > 32 && max_wg != 0 && static_cast<size_t>(f.WorkGroup()) > max_wg) {
    f.bq /= 2;
    f.PickRows(dk, dv);
  }
  *p = f;
  return true;
}

bool PlanPartial(int dk, int dv, size_t local_mem, Plan* p) {
  // {Dv chunk cap, rows per work-group, keys per tile, Dk chunk cap}: the
  // first that fits.
  const int ladder[4][4] = {{128, 64, 32, 64}, {64, 64, 32, 64}, {64, 32, 32, 64}, {32, 32, 16, 32}};
  for (const auto& o : ladder) {
    Plan q;
    q.bq = o[1];
    q.bk = o[2];
    q.dc = Chunk(dk, o[3]);
    q.dvc = Chunk(dv, o[0]);
    if (q.LocalBytes(dk, dv) <= local_mem) {
      q.PickRows(dk, dv);
      *p = q;
      return true;
    }
  }
  return false;
}

// DIFFLITE_ATTN_PARTIAL_TILE=BQxBKxRQ: the recompute kernels' rows per
// work-group, keys per tile and rows per work-item instead of the ladder's
// (for A/B runs; the Dk / Dv chunks stay the ladder's). false and `error`
// set for a malformed value; false alone when unset.
bool ForcedPartialTile(int* bq, int* bk, int* rq, std::string* error) {
  const char* env = std::getenv("DIFFLITE_ATTN_PARTIAL_TILE");
  if (env == nullptr || *env == '\0') return false;
  int v[3] = {0, 0, 0};
  const char* p = env;
  for (int i = 0; i < 3; ++i) {
    char* end = nullptr;
    const long x = std::strtol(p, &end, 10);
    if (end == p || x <= 0 || x > 1024 || *end != (i < 2 ? 'x' : '\0')) {
      *error = std::string("DIFFLITE_ATTN_PARTIAL_TILE=") + env +
               ": expected BQxBKxRQ (positive integers, RQ dividing BQ)";
      return false;
    }
    v[i] = static_cast<int>(x);
    p = end + 1;
  }
  if (v[0] % v[2] != 0) {
    *error = std::string("DIFFLITE_ATTN_PARTIAL_TILE=") + env + ": RQ must divide BQ";
    return false;
  }
  *bq = v[0];
  *bk = v[1];
  *rq = v[2];
  return true;
}

// Wide tiles from kWideLadder, starting at entry `first`; false when none
// fits. `max_wg`: the device's work-group limit (0: unknown).
bool PlanWide(int dk, int dv, size_t local_mem, size_t max_wg, int first, Plan* p,
              int* entry) {
  for (int i = first; i < 4; ++i) {
    const int* o = kWideLadder[i];
    Plan w;
    w.kernel = Kernel::kWide;
    w.bq = o[0];
    w.bk = o[1];
    w.nt = o[2];
    w.dc = Round4(Chunk(dk, o[3]));
    w.vk = o[4];
    w.PickWideLayout(dv);
    if (max_wg != 0 && static_cast<size_t>(w.nt) > max_wg) continue;
    if (w.LocalBytes(dk, dv) > local_mem) continue;
    if (4 * w.WideRows() * w.WideCols(dv) > kWideMaxAcc) continue;
    *p = w;
    *entry = i;
    return true;
  }
  return false;
}

// DIFFLITE_ATTN_KERNEL: the forced kernel ("" when unset or empty), or an
// error for another value.
std::string ForcedKernel(std::string* error) {
  const char* env = std::getenv("DIFFLITE_ATTN_KERNEL");
  if (env == nullptr || *env == '\0') return "";
  for (const char* k : {"wide", "flash", "partial", "recompute"}) {
    if (std::strcmp(env, k) == 0) return k;
  }
  *error = std::string("DIFFLITE_ATTN_KERNEL=") + env +
           ": expected wide, flash, partial or recompute";
  return "";
}

// DIFFLITE_ATTN_SPLITS: the forced split count (0 when unset or empty), or
// an error for another value.
int ForcedSplits(std::string* error) {
  const char* env = std::getenv("DIFFLITE_ATTN_SPLITS");
  if (env == nullptr || *env == '\0') return 0;
  for (const char* k : {"1", "2", "4"}) {
    if (std::strcmp(env, k) == 0) return std::atoi(k);
  }
  *error = std::string("DIFFLITE_ATTN_SPLITS=") + env + ": expected 1, 2 or 4";
  return 0;
}

// Query rows per chunk of the GEMM path: all of Lq where S of all rows
// (n * h * lk elements of `es` bytes a row) fits `bound`; else the most
// rows within it that are a multiple of kChunkRowQuantum, at least one
// quantum. (A chunk's rows start at a multiple of the quantum, so its
// offsets into q and o fall on 4 elements, as GemmRows needs.)
int GemmChunkRows(int n, int h, int lq, int lk, size_t es, size_t bound) {
  const int64_t row_bytes = static_cast<int64_t>(n) * h * lk * static_cast<int64_t>(es);
  const int64_t fit = static_cast<int64_t>(bound) / std::max<int64_t>(row_bytes, 1);
  if (fit >= lq) return lq;
  const int64_t rows = std::max<int64_t>(kChunkRowQuantum, fit / kChunkRowQuantum * kChunkRowQuantum);
  return rows >= lq ? lq : static_cast<int>(rows);
}

// What PickSplits needs to know of the launch and device.
struct SplitQuery {
  int64_t items = 0;  // work-items of the unsplit launch
  int lk = 0;
  bool causal = false;
  bool flat = false;      // the device prefers flat kernels (CPU-like)
  int64_t compute_units = 0;
  int forced = 0;         // DIFFLITE_ATTN_SPLITS, 0: unset
};

// Key splits for attn_flash (see the header comment): 1, 2 or 4.
int PickSplits(const SplitQuery& s) {
  if (s.causal) return 1;
  int most = kMaxSplits;  // each split keeps kMinSplitKeys keys
  while (most > 1 && s.lk < static_cast<int64_t>(kMinSplitKeys) * most) most /= 2;
  if (s.forced != 0) return s.forced < most ? s.forced : most;
  if (s.flat) return 1;
  const int64_t target = s.compute_units * kSplitItemsPerCu;
  int splits = most;
  while (splits > 1 && s.items * splits > target) splits /= 2;
  return splits;
}

class AttentionGpu final : public GpuOp {
 public:
  std::string Init(const attention::Options& o, const Shape& q, const Shape& k,
                   const Shape& v, GpuContext& ctx) {
    o_ = o;
    n_ = q[0];
    lq_ = q[1];
    lk_ = k[1];
    dk_ = q[2] / o.heads;
    dv_ = v[2] / o.heads;
    storage_bytes_ = DTypeSize(ctx.storage());
    for (const Shape* s : {&q, &k, &v}) {
      if (NumElements(*s) > builtin::kMaxIndex) {
        return "q, k or v has more than 2^31-1 elements";
      }
    }
    if (static_cast<int64_t>(n_) * lq_ * v[2] > builtin::kMaxIndex) {
      return "the output has more than 2^31-1 elements";
    }
    const size_t local_mem = ctx.device().local_mem_bytes;
    std::string e;
    const std::string forced = ForcedKernel(&e);
    if (e.empty()) forced_splits_ = ForcedSplits(&e);
    if (!e.empty()) return e;
    const bool wide_head = dk_ > kFlashMaxHead || dv_ > kFlashMaxHead;
    const bool hinted =
        forced.empty() && o.variant != "partial_softmax" && !ctx.PreferFlatKernels();
    const bool item_head = hinted && wide_head && FlashInRegisters(ctx);
    const bool want_wide = forced == "wide" || (hinted && wide_head && !item_head);
    if (want_wide) {
      e = InitWide(ctx);
      if (e.empty()) return "";
      if (forced == "wide") return "DIFFLITE_ATTN_KERNEL=wide: " + e;
      e.clear();  // a hint only: fall back to the partial softmax
    }
    const bool want_flash =
        forced == "flash" ||
        (forced.empty() && !want_wide &&
         (o.variant == "flash" || item_head ||
          (o.variant == "auto" && !wide_head &&
           Plan{Kernel::kFlash}.LocalBytes(dk_, dv_) <= local_mem / 2)));
    if (want_flash && PlanFlash(dk_, dv_, local_mem, ctx.device().max_work_group_size, &plan_)) {
      e = builtin::GetKernel(ctx, kProgram, "attn_flash", plan_.Options(dk_, dv_),
                                    &flash_k_);
      const size_t wg = e.empty() ? ctx.KernelWorkGroupSize(flash_k_) : 0;
      if (e.empty() && (wg == 0 || wg >= static_cast<size_t>(plan_.WorkGroup()))) {
        InitSplits(ctx);
        return "";
      }
      flash_k_ = nullptr;  // a hint only: fall back to the partial softmax
    }
    if (forced == "flash") {
      return "DIFFLITE_ATTN_KERNEL=flash: attn_flash does not fit head sizes " +
             std::to_string(dk_) + "/" + std::to_string(dv_) + " on this device";
    }
    // The partial softmax: as GEMMs on devices with tiled kernels for heads of
    // kGemmMinHead or more (any head with DIFFLITE_ATTN_KERNEL=partial; none
    // with =recompute), else (or where they cannot be set up) the recompute
    // kernels.
    plan_ = Plan{};
    if (forced != "recompute" && !ctx.PreferFlatKernels() &&
        (forced == "partial" || std::max(dk_, dv_) >= kGemmMinHead)) {
      const size_t bound = builtin::EnvBytes("DIFFLITE_ATTN_SCORES_BYTES", kScoresBytes, &e);
      if (!e.empty()) return e;
      if (InitGemm(ctx, bound).empty()) return "";
      gemm_ = false;
    }
    if (!PlanPartial(dk_, dv_, local_mem, &plan_)) {
      return "attention tiles for head sizes " + std::to_string(dk_) + "/" +
             std::to_string(dv_) + " exceed the device's local memory";
    }
    if (ForcedPartialTile(&plan_.bq, &plan_.bk, &plan_.rq, &e) &&
        plan_.LocalBytes(dk_, dv_) > local_mem) {
      return "DIFFLITE_ATTN_PARTIAL_TILE: the tiles take " +
             std::to_string(plan_.LocalBytes(dk_, dv_)) + " bytes of local memory";
    }
    if (!e.empty()) return e;
    const std::string opts = plan_.Options(dk_, dv_);
    e = builtin::GetKernel(ctx, kProgram, "attn_rowstats", opts, &stats_k_);
    if (e.empty()) e = builtin::GetKernel(ctx, kProgram, "attn_output", opts, &out_k_);
    if (!e.empty()) return e;
    for (cl_kernel kk : {stats_k_, out_k_}) {
      const size_t wg = ctx.KernelWorkGroupSize(kk);
      if (wg != 0 && wg < static_cast<size_t>(plan_.WorkGroup())) {
        return "attention kernels accept work-groups of at most " + std::to_string(wg) +
               " (need " + std::to_string(plan_.WorkGroup()) + ")";
      }
    }
    return "";
  }

  // The GEMM path (see the header comment): the chunk rows under `bound`, the
  // two GEMMs of a full chunk and of the last, shorter one, attn_softmax_rows
  // (its work-group halved until the kernel takes it) and, for N > 1,
  // attn_scatter_rows. "" (gemm_ set), or the reason it cannot run here.
  std::string InitGemm(GpuContext& ctx, size_t bound) {
    chunk_rows_ = GemmChunkRows(n_, o_.heads, lq_, lk_, storage_bytes_, bound);
    const int h = o_.heads;
    const int tail = lq_ % chunk_rows_;
    for (int c = 0; c < (tail != 0 ? 2 : 1); ++c) {
      const int rows = c == 0 ? chunk_rows_ : tail;
      // S[n][h][m][j] = q[n, m0 + m, h*Dk + :] . k[n, j, h*Dk + :]
      builtin::GemmShape qk;
      qk.m = rows, qk.n = lk_, qk.k = dk_;
      qk.a_sm = h * dk_, qk.a_sk = 1, qk.b_sk = 1, qk.b_sn = h * dk_, qk.ldc = lk_;
      qk.bdims = {n_, h};
      qk.a_bs = {lq_ * h * dk_, dk_};
      qk.b_bs = {lk_ * h * dk_, dk_};
      qk.c_bs = rows * lk_;
      std::string e = scores_[c].Init(ctx, qk);
      if (!e.empty()) return e;
      // O[n, m0 + m, h*Dv + :] = P[n][h][m][:] . v[n, :, h*Dv + :]: into o
      // itself when N = 1 (heads c_bs = Dv apart), else into O' [N][H][rows][Dv].
      builtin::GemmShape pv;
      pv.m = rows, pv.n = dv_, pv.k = lk_;
      pv.a_sm = lk_, pv.a_sk = 1, pv.b_sk = h * dv_, pv.b_sn = 1;
      pv.bdims = {n_, h};
      pv.a_bs = {h * rows * lk_, rows * lk_};
      pv.b_bs = {lk_ * h * dv_, dv_};
      pv.ldc = n_ == 1 ? h * dv_ : dv_;
      pv.c_bs = n_ == 1 ? dv_ : rows * dv_;
      e = pv_[c].Init(ctx, pv);
      if (!e.empty()) return e;
    }
    std::string e;
    for (smw_ = kSoftmaxGroup; smw_ >= 1; smw_ /= 2) {
      e = builtin::GetKernel(ctx, kProgram, "attn_softmax_rows",
                             "-DAT_SMW=" + std::to_string(smw_), &softmax_k_);
      if (!e.empty()) return e;
      const size_t wg = ctx.KernelWorkGroupSize(softmax_k_);
      if (wg == 0 || wg >= static_cast<size_t>(smw_)) break;
    }
    if (smw_ < 1) return "attn_softmax_rows takes no work-group";
    if (n_ > 1) {
      e = builtin::GetKernel(ctx, kProgram, "attn_scatter_rows", "", &scatter_k_);
      if (!e.empty()) return e;
    }
    gemm_ = true;
    return "";
  }

  // Whether a head of at most kFlashItemMaxHead builds attn_flash (its plan's
  // tiles and work-group) with nothing spilled from registers.
  bool FlashInRegisters(GpuContext& ctx) const {
    if (dk_ > kFlashItemMaxHead || dv_ > kFlashItemMaxHead) return false;
    Plan f;
    if (!PlanFlash(dk_, dv_, ctx.device().local_mem_bytes, ctx.device().max_work_group_size, &f)) {
      return false;
    }
    cl_kernel k = nullptr;
    if (!builtin::GetKernel(ctx, kProgram, "attn_flash", f.Options(dk_, dv_), &k).empty()) {
      return false;
    }
    const size_t wg = ctx.KernelWorkGroupSize(k);
    return gpu::KernelPrivateBytes(ctx, k) == 0 &&
           (wg == 0 || wg >= static_cast<size_t>(f.WorkGroup()));
  }

  // Key splits for the flash plan (PickSplits): the split attn_flash and
  // attn_merge when splits > 1 and both build with their work-groups, else
  // (a speed-up only) the unsplit kernel already in flash_k_.
  void InitSplits(GpuContext& ctx) {
    SplitQuery s;
    s.forced = forced_splits_;
    s.items = CeilDiv(lq_, plan_.bq) * plan_.WorkGroup() * o_.heads * static_cast<int64_t>(n_);
    s.lk = lk_;
    s.causal = o_.causal;
    s.flat = ctx.PreferFlatKernels();
    s.compute_units = ctx.device().compute_units;
    Plan split = plan_;
    split.splits = PickSplits(s);
    if (split.splits == 1) return;
    cl_kernel fk = nullptr, mk = nullptr;
    const std::string opts = split.Options(dk_, dv_);
    std::string e = builtin::GetKernel(ctx, kProgram, "attn_flash", opts, &fk);
    if (e.empty()) e = builtin::GetKernel(ctx, kProgram, "attn_merge", opts, &mk);
    const size_t wg = e.empty() ? ctx.KernelWorkGroupSize(fk) : 0;
    const size_t mwg = e.empty() ? ctx.KernelWorkGroupSize(mk) : 0;
    const bool fits = (wg == 0 || wg >= static_cast<size_t>(split.WorkGroup())) &&
                      (mwg == 0 || mwg >= kMergeGroup);
    if (!e.empty() || !fits) return;
    plan_ = split;
    flash_k_ = fk;
    merge_k_ = mk;
  }

  // attn_wide with the first ladder entry that fits and builds with its
  // work-group size: "" (plan_ set), or the reason none does.
  std::string InitWide(GpuContext& ctx) {
    const size_t local_mem = ctx.device().local_mem_bytes;
    const size_t max_wg = ctx.device().max_work_group_size;
    std::string why = "no attn_wide tiles fit head sizes " + std::to_string(dk_) + "/" +
                      std::to_string(dv_) + " on this device";
    Plan w;
    for (int entry = -1; PlanWide(dk_, dv_, local_mem, max_wg, entry + 1, &w, &entry);) {
      cl_kernel kk = nullptr;
      const std::string e =
          builtin::GetKernel(ctx, kProgram, "attn_wide", w.Options(dk_, dv_), &kk);
      const size_t wg = e.empty() ? ctx.KernelWorkGroupSize(kk) : 0;
      if (e.empty() && (wg == 0 || wg >= static_cast<size_t>(w.WorkGroup()))) {
        plan_ = w;
        wide_k_ = kk;
        return "";
      }
      why = e.empty() ? "attn_wide accepts work-groups of at most " + std::to_string(wg) : e;
    }
    return why;
  }

  size_t ScratchSlotBytes(int slot) const override {
    if (gemm_) {  // S, O' and the GEMMs' own (split-K partials), each in a slot of its own
      size_t bytes = slot == kScoresSlot ? ScoresBytes() : slot == kOutSlot ? OutBytes() : 0;
      for (const builtin::Gemm* x : {&scores_[0], &scores_[1], &pv_[0], &pv_[1]}) {
        bytes = std::max(bytes, x->ScratchSlotBytes(slot));
      }
      return bytes;
    }
    if (plan_.kernel == Kernel::kPartial) return slot == 0 ? StatsBytes() : 0;
    return slot == kSplitSlot && plan_.splits > 1 ? SplitBytes() : 0;
  }

  std::string Run(GpuContext& ctx, const std::vector<GpuTensor>& in,
                  const std::vector<GpuTensor>& out) override {
    std::string e = builtin::CheckRunTensors(ctx, in, out, 3, 1);
    if (!e.empty()) return e;
    const gpu::ClApi& cl = ctx.cl();
    const cl_int lq = lq_, lk = lk_, h = o_.heads, dk = dk_, dv = dv_;
    const cl_int causal = o_.causal ? 1 : 0;
    const cl_float scale = o_.scale;
    const size_t wg = static_cast<size_t>(plan_.WorkGroup());
    // ceil(Lq / bq) work-groups of bq / rq (wide: nt) work-items, bq rows each.
    const size_t rows = static_cast<size_t>(CeilDiv(lq_, plan_.bq)) * wg;
    const size_t local[3] = {wg, 1, 1};
    if (gemm_) return RunGemm(ctx, in, out[0].mem);
    if (plan_.splits > 1) return RunSplit(ctx, in, out[0].mem, rows);
    if (plan_.kernel != Kernel::kPartial) {  // flash or wide: one kernel, same arguments
      const bool wide = plan_.kernel == Kernel::kWide;
      cl_kernel kk = wide ? wide_k_ : flash_k_;
      e = SetArgs(cl, kk,
                        {Arg(in[0].mem), Arg(in[1].mem), Arg(in[2].mem), Arg(out[0].mem),
                         Arg(lq), Arg(lk), Arg(h), Arg(scale), Arg(causal)});
      if (!e.empty()) return e;
      const size_t global[3] = {rows, static_cast<size_t>(h), static_cast<size_t>(n_)};
      return ctx.Enqueue(kk, 3, global, local, wide ? "attention.wide" : "attention.flash");
    }
    cl_mem stats = ctx.Scratch(StatsBytes(), 0, &e);
    if (stats == nullptr) return "attention row statistics: " + e;
    e = SetArgs(cl, stats_k_,
                      {Arg(in[0].mem), Arg(in[1].mem), Arg(stats), Arg(lq), Arg(lk),
                       Arg(h), Arg(dk), Arg(scale), Arg(causal)});
    if (!e.empty()) return e;
    const size_t g1[3] = {rows, static_cast<size_t>(h), static_cast<size_t>(n_)};
    e = ctx.Enqueue(stats_k_, 3, g1, local, "attention.rowstats");
    if (!e.empty()) return e;
    e = SetArgs(cl, out_k_,
                      {Arg(in[0].mem), Arg(in[1].mem), Arg(in[2].mem), Arg(stats),
                       Arg(out[0].mem), Arg(lq), Arg(lk), Arg(h), Arg(dk), Arg(dv),
                       Arg(scale), Arg(causal)});
    if (!e.empty()) return e;
    const size_t chunks = static_cast<size_t>(CeilDiv(dv_, plan_.dvc));
    const size_t g2[3] = {rows, static_cast<size_t>(h) * chunks, static_cast<size_t>(n_)};
    return ctx.Enqueue(out_k_, 3, g2, local, "attention.output");
  }

 private:
  // The GEMM path, chunk by chunk of query rows: S = q k^T into kScoresSlot,
  // attn_softmax_rows in place, O = P v (into o, or O' and attn_scatter_rows).
  std::string RunGemm(GpuContext& ctx, const std::vector<GpuTensor>& in, cl_mem o) {
    const gpu::ClApi& cl = ctx.cl();
    std::string e;
    cl_mem s = ctx.Scratch(ScoresBytes(), kScoresSlot, &e);
    if (s == nullptr) return "attention scores: " + e;
    cl_mem ob = nullptr;
    if (n_ > 1) {
      ob = ctx.Scratch(OutBytes(), kOutSlot, &e);
      if (ob == nullptr) return "attention output rows: " + e;
    }
    const int h = o_.heads;
    const cl_int lk = lk_, causal = o_.causal ? 1 : 0, lq = lq_, heads = h, dv = dv_;
    const cl_float scale = o_.scale;
    for (int m0 = 0; m0 < lq_; m0 += chunk_rows_) {
      const int rows = std::min(chunk_rows_, lq_ - m0);
      const int c = rows == chunk_rows_ ? 0 : 1;
      e = scores_[c].Run(ctx, in[0].mem, in[1].mem, nullptr, s, "attention.scores", nullptr,
                         builtin::GemmRows{m0, 0});
      if (!e.empty()) return e;
      const cl_int r = rows, m0c = m0;
      e = SetArgs(cl, softmax_k_,
                  {Arg(s), Arg(r), Arg(lk), Arg(m0c), Arg(scale), Arg(causal)});
      if (!e.empty()) return e;
      const size_t g1[2] = {static_cast<size_t>(smw_),
                            static_cast<size_t>(n_) * h * static_cast<size_t>(rows)};
      const size_t l1[2] = {static_cast<size_t>(smw_), 1};
      e = ctx.Enqueue(softmax_k_, 2, g1, l1, "attention.softmax");
      if (!e.empty()) return e;
      if (n_ == 1) {
        e = pv_[c].Run(ctx, s, in[2].mem, nullptr, o, "attention.pv", nullptr,
                       builtin::GemmRows{0, m0});
        if (!e.empty()) return e;
        continue;
      }
      e = pv_[c].Run(ctx, s, in[2].mem, nullptr, ob, "attention.pv");
      if (!e.empty()) return e;
      e = SetArgs(cl, scatter_k_,
                  {Arg(ob), Arg(o), Arg(r), Arg(lq), Arg(m0c), Arg(heads), Arg(dv)});
      if (!e.empty()) return e;
      const size_t items = static_cast<size_t>(rows) * h * dv_;
      const size_t g2[2] = {static_cast<size_t>(CeilDiv(items, kScatterGroup)) * kScatterGroup,
                            static_cast<size_t>(n_)};
      const size_t l2[2] = {kScatterGroup, 1};
      e = ctx.Enqueue(scatter_k_, 2, g2, l2, "attention.scatter");
      if (!e.empty()) return e;
    }
    return "";
  }

  // S of a full chunk; O' (N > 1 only) of a full chunk.
  size_t ScoresBytes() const {
    return static_cast<size_t>(n_) * o_.heads * chunk_rows_ * static_cast<size_t>(lk_) *
           storage_bytes_;
  }
  size_t OutBytes() const {
    return n_ > 1 ? static_cast<size_t>(n_) * o_.heads * chunk_rows_ * static_cast<size_t>(dv_) *
                        storage_bytes_
                  : 0;
  }

  // Split attn_flash into the partials' scratch, then attn_merge into `o`.
  // `row_items`: global dimension 0, as unsplit.
  std::string RunSplit(GpuContext& ctx, const std::vector<GpuTensor>& in, cl_mem o,
                       size_t row_items) {
    const gpu::ClApi& cl = ctx.cl();
    std::string e;
    cl_mem part = ctx.Scratch(SplitBytes(), kSplitSlot, &e);
    if (part == nullptr) return "attention split partials: " + e;
    const cl_int lq = lq_, lk = lk_, h = o_.heads, causal = o_.causal ? 1 : 0;
    const cl_float scale = o_.scale;
    e = SetArgs(cl, flash_k_,
                      {Arg(in[0].mem), Arg(in[1].mem), Arg(in[2].mem), Arg(part), Arg(lq),
                       Arg(lk), Arg(h), Arg(scale), Arg(causal)});
    if (!e.empty()) return e;
    const size_t wg = static_cast<size_t>(plan_.WorkGroup());
    const size_t local[3] = {wg, 1, 1};
    const size_t global[3] = {row_items, static_cast<size_t>(h) * plan_.splits,
                              static_cast<size_t>(n_)};
    e = ctx.Enqueue(flash_k_, 3, global, local, "attention.flash_split");
    if (!e.empty()) return e;
    const cl_int out_rows = SplitRows();
    e = SetArgs(cl, merge_k_, {Arg(part), Arg(o), Arg(out_rows)});
    if (!e.empty()) return e;
    const size_t items = static_cast<size_t>(out_rows) * (Round4(dv_) / 4);  // a float4 each
    const size_t mglobal[1] = {static_cast<size_t>(CeilDiv(items, kMergeGroup)) * kMergeGroup};
    const size_t mlocal[1] = {kMergeGroup};
    return ctx.Enqueue(merge_k_, 1, mglobal, mlocal, "attention.merge");
  }

  size_t StatsBytes() const {
    return sizeof(cl_float2) * static_cast<size_t>(n_) * o_.heads * lq_;
  }
  // (n, query, head) rows of the output: one partial row and (m, l) per split each.
  int SplitRows() const { return n_ * lq_ * o_.heads; }
  // attn_flash's split scratch: (m, l) float2s, then the rows in the storage type.
  size_t SplitBytes() const {
    return static_cast<size_t>(plan_.splits) * SplitRows() *
           (sizeof(cl_float2) + storage_bytes_ * static_cast<size_t>(dv_));
  }

  attention::Options o_;
  int n_ = 0, lq_ = 0, lk_ = 0, dk_ = 0, dv_ = 0;
  size_t storage_bytes_ = 4;  // bytes of an element of the storage type
  int forced_splits_ = 0;  // DIFFLITE_ATTN_SPLITS, 0: unset
  Plan plan_;
  cl_kernel flash_k_ = nullptr, wide_k_ = nullptr, stats_k_ = nullptr, out_k_ = nullptr;
  cl_kernel merge_k_ = nullptr;
  // The GEMM path (gemm_): chunk rows, [0] a full chunk's GEMMs, [1] the last chunk's.
  bool gemm_ = false;
  int chunk_rows_ = 0;
  int smw_ = kSoftmaxGroup;
  builtin::Gemm scores_[2], pv_[2];
  cl_kernel softmax_k_ = nullptr, scatter_k_ = nullptr;
};

std::unique_ptr<GpuOp> Create(const NodeView& node, GpuContext& ctx, std::string* error) {
  const auto* parsed = builtin::CheckedCustomNode<attention::Parsed>(node, error);
  if (parsed == nullptr) return nullptr;
  auto op = std::make_unique<AttentionGpu>();
  *error = op->Init(parsed->options(), node.inputs[0].shape, node.inputs[1].shape,
                    node.inputs[2].shape, ctx);
  if (!error->empty()) return nullptr;
  return op;
}

}  // namespace

const GpuOpDef kGpuAttentionOps[] = {{attention::kOpName, &Create}};
DIFFLITE_REGISTER_OPS(kGpuAttentionOps);

}  // namespace difflite::gpu
