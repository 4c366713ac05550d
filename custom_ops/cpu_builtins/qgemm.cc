// The quantized-weight GEMM of the CPU backend (qgemm.h).
//
// Work is split into tasks of (a group of output channels) x (a range of rows). A task
// dequantizes its group's weight columns once, for the whole K, into a buffer of its thread laid
// out as 16-channel panels [K][16] (at most ~256 KiB: the group is narrowed for long K), then
// walks its rows a micro-tile at a time: MR rows (6 where the CPU has AVX2 and FMA or is
// aarch64, else 4) x one panel, accumulated in registers over the whole K and stored once with
// the bias and the clamp. A convolution's rows are gathered (implicit im2col) MR at a time into a
// second small buffer. Nothing of the size of the weight is ever allocated: per thread, the panel
// buffer and MR x K floats.
#include "qgemm.h"

#include <algorithm>
#include <cstring>
#include <memory>

#include "difflite/parallel.h"
#include "opencl/half.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace difflite {
namespace cpu {

std::string QuantWeight::Check() const {
  if (bits != 8 && bits != 4) return "weights of " + std::to_string(bits) + " bits";
  if (values == nullptr || scales == nullptr) return "the weight has no data";
  if (n <= 0 || k <= 0 || group <= 0 || scale_count <= 0) return "an empty weight";
  if (n > INT32_MAX || k > INT32_MAX || n * k > INT32_MAX) return "more than 2^31 - 1 weights";
  if (scale_count * group != n * k) {
    return std::to_string(scale_count) + " scales of " + std::to_string(group) +
           " values do not cover " + std::to_string(n) + " x " + std::to_string(k);
  }
  if (group % k != 0 && k % group != 0) {
    return "scale groups of " + std::to_string(group) + " values straddle rows of " + std::to_string(k);
  }
  return "";
}

std::string QuantWeight::Describe() const {
  return std::string(bits == 8 ? "int8" : "int4") + "[" + std::to_string(n) + "," +
         std::to_string(k) + "] " + std::to_string(scale_count) + " " +
         (scales_f16 ? "float16" : "float32") + " scales of " + std::to_string(group);
}

namespace {

#if defined(__GNUC__) || defined(__clang__)
#define DL_INLINE inline __attribute__((always_inline))
#else
#define DL_INLINE inline
#endif

constexpr int kPanel = 16;                 // output channels per panel (the panel kernel)
constexpr int kDotCols = 2;                // weight rows per micro-tile (the dot kernel)
constexpr int kDotRows = 4;                // rows of A per micro-tile (the dot kernel)
constexpr int64_t kPanelRowsMin = 16;      // a task of fewer rows of A takes the dot kernel
constexpr int64_t kKChunk = 64;            // k per step of the dequantizing transpose
constexpr int64_t kTaskBytes = 256 << 10;  // a task's dequantized weight columns, at most

// One task list: every pointer and size the threads share.
struct Job {
  const QuantWeight* w;
  const float* x;
  int64_t m;
  const ConvShape* conv;  // null or Direct(): rows of x
  const float* bias;
  Clamp clamp;
  float* y;
  bool panels;     // the panel kernel (else the dot kernel)
  int64_t nc;      // output channels a task dequantizes
  int64_t mparts;  // row ranges per channel group
  int64_t mchunk;  // rows per range
};

// W(n, k0 .. k0 + len) of one row into out: the integers widened and scaled, a run of one scale
// at a time (contiguous: vectorized).
DL_INLINE void DequantRowBody(const QuantWeight& w, int64_t n, int64_t k0, int64_t len, float* out) {
  int64_t f = n * w.k + k0;
  const int64_t end = f + len;
  int64_t si = f / w.group;
  while (f < end) {
    const int64_t run_end = std::min(end, (si + 1) * w.group);
    const float s = w.scales_f16 ? gpu::HalfToFloat(static_cast<const uint16_t*>(w.scales)[si])
                                 : static_cast<const float*>(w.scales)[si];
    if (w.bits == 8) {
      const int8_t* q = reinterpret_cast<const int8_t*>(w.values) + f;
      const int64_t len_run = run_end - f;
      for (int64_t i = 0; i < len_run; ++i) out[i] = static_cast<float>(q[i]) * s;
      out += len_run;
    } else {
      const uint8_t* v = w.values;
      int64_t i = f;
      if ((i & 1) != 0) {  // a run starting at a high nibble
        *out++ = static_cast<float>(static_cast<int8_t>(v[i >> 1]) >> 4) * s;
        ++i;
      }
      const int64_t pairs = (run_end - i) / 2;
      const uint8_t* bytes = v + (i >> 1);
      for (int64_t p = 0; p < pairs; ++p) {
        const uint8_t b = bytes[p];
        out[2 * p] = static_cast<float>(static_cast<int8_t>(static_cast<uint8_t>(b << 4)) >> 4) * s;
        out[2 * p + 1] = static_cast<float>(static_cast<int8_t>(b) >> 4) * s;
      }
      out += 2 * pairs;
      i += 2 * pairs;
      if (i < run_end) {  // a run ending at a low nibble
        *out++ = static_cast<float>(static_cast<int8_t>(static_cast<uint8_t>(v[i >> 1] << 4)) >> 4) * s;
      }
    }
    f = run_end;
    ++si;
  }
}

// dst[kk][lane] = tmp[lane][kk] for kk < kl: one 16 x kl block into the panel layout.
struct TransposeScalar {
  static DL_INLINE void Apply(const float (*tmp)[kKChunk], int64_t kl, float* dst) {
    for (int64_t kk = 0; kk < kl; ++kk) {
      for (int lane = 0; lane < kPanel; ++lane) dst[kk * kPanel + lane] = tmp[lane][kk];
    }
  }
};

// Channels n0 .. n0 + ncols as panels [K][kPanel] (channels past ncols zero): kKChunk values of
// 16 rows dequantized at a time, then transposed into the panel.
template <typename Transpose>
DL_INLINE void DequantPanelsBody(const QuantWeight& w, int64_t n0, int64_t ncols, float* dst) {
  const int64_t k = w.k;
  const int64_t panels = (ncols + kPanel - 1) / kPanel;
  float tmp[kPanel][kKChunk];
  for (int64_t p = 0; p < panels; ++p) {
    float* panel = dst + p * k * kPanel;
    for (int64_t kb = 0; kb < k; kb += kKChunk) {
      const int64_t kl = std::min(kKChunk, k - kb);
      for (int lane = 0; lane < kPanel; ++lane) {
        const int64_t col = p * kPanel + lane;
        if (col < ncols) {
          DequantRowBody(w, n0 + col, kb, kl, tmp[lane]);
        } else {
          std::fill(tmp[lane], tmp[lane] + kl, 0.0f);
        }
      }
      Transpose::Apply(tmp, kl, panel + kb * kPanel);
    }
  }
}

#if defined(__x86_64__) || defined(__i386__)
// The same with AVX: 8 x 8 blocks through registers (unpack, shuffle, swap the 128-bit halves).
struct TransposeAvx {
  __attribute__((target("avx2,fma"), noinline)) static void Apply(
      const float (*tmp)[kKChunk], int64_t kl, float* dst) {
    const int64_t k8 = kl & ~int64_t{7};
    for (int half = 0; half < kPanel; half += 8) {
      for (int64_t kk = 0; kk < k8; kk += 8) {
        __m256 r[8];
        for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(tmp[half + i] + kk);
        const __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
        const __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
        const __m256 t4 = _mm256_unpacklo_ps(r[4], r[5]), t5 = _mm256_unpackhi_ps(r[4], r[5]);
        const __m256 t6 = _mm256_unpacklo_ps(r[6], r[7]), t7 = _mm256_unpackhi_ps(r[6], r[7]);
        const __m256 s0 = _mm256_shuffle_ps(t0, t2, 0x44), s1 = _mm256_shuffle_ps(t0, t2, 0xEE);
        const __m256 s2 = _mm256_shuffle_ps(t1, t3, 0x44), s3 = _mm256_shuffle_ps(t1, t3, 0xEE);
        const __m256 s4 = _mm256_shuffle_ps(t4, t6, 0x44), s5 = _mm256_shuffle_ps(t4, t6, 0xEE);
        const __m256 s6 = _mm256_shuffle_ps(t5, t7, 0x44), s7 = _mm256_shuffle_ps(t5, t7, 0xEE);
        float* out = dst + kk * kPanel + half;
        _mm256_storeu_ps(out + 0 * kPanel, _mm256_permute2f128_ps(s0, s4, 0x20));
        _mm256_storeu_ps(out + 1 * kPanel, _mm256_permute2f128_ps(s1, s5, 0x20));
        _mm256_storeu_ps(out + 2 * kPanel, _mm256_permute2f128_ps(s2, s6, 0x20));
        _mm256_storeu_ps(out + 3 * kPanel, _mm256_permute2f128_ps(s3, s7, 0x20));
        _mm256_storeu_ps(out + 4 * kPanel, _mm256_permute2f128_ps(s0, s4, 0x31));
        _mm256_storeu_ps(out + 5 * kPanel, _mm256_permute2f128_ps(s1, s5, 0x31));
        _mm256_storeu_ps(out + 6 * kPanel, _mm256_permute2f128_ps(s2, s6, 0x31));
        _mm256_storeu_ps(out + 7 * kPanel, _mm256_permute2f128_ps(s3, s7, 0x31));
      }
    }
    for (int64_t kk = k8; kk < kl; ++kk) {
      for (int lane = 0; lane < kPanel; ++lane) dst[kk * kPanel + lane] = tmp[lane][kk];
    }
  }
};
#endif

// Rows m0 .. m0 + rows of the convolution's patch matrix into out [rows][K].
DL_INLINE void GatherPatches(const ConvShape& c, const float* x, int64_t m0, int rows, float* out) {
  const int64_t cin = c.cin;
  const int64_t k = static_cast<int64_t>(c.kh) * c.kw * cin;
  const int64_t per_image = static_cast<int64_t>(c.oh) * c.ow;
  for (int r = 0; r < rows; ++r) {
    const int64_t mi = m0 + r;
    const int64_t b = mi / per_image;
    const int64_t rem = mi % per_image;
    const int64_t oy = rem / c.ow;
    const int64_t ox = rem % c.ow;
    float* dst = out + r * k;
    for (int ky = 0; ky < c.kh; ++ky) {
      const int64_t iy = oy * c.sh - c.pad_top + static_cast<int64_t>(ky) * c.dh;
      for (int kx = 0; kx < c.kw; ++kx) {
        const int64_t ix = ox * c.sw - c.pad_left + static_cast<int64_t>(kx) * c.dw;
        float* d = dst + (static_cast<int64_t>(ky) * c.kw + kx) * cin;
        if (iy >= 0 && iy < c.ih && ix >= 0 && ix < c.iw) {
          std::memcpy(d, x + ((b * c.ih + iy) * c.iw + ix) * cin, static_cast<size_t>(cin) * sizeof(float));
        } else {
          std::fill(d, d + cin, 0.0f);
        }
      }
    }
  }
}

#if defined(__GNUC__) || defined(__clang__)
typedef float V8 __attribute__((vector_size(32)));

// The panel kernel: out[R][16] = sum over p < k of a[r][p] * panel[p][0..16), a[r][p] broadcast.
template <int R>
DL_INLINE void PanelTileBody(int64_t k, const float* const* a, const float* b, float* out) {
  V8 c0[R];
  V8 c1[R];
  for (int r = 0; r < R; ++r) {
    c0[r] = V8{};
    c1[r] = V8{};
  }
  for (int64_t p = 0; p < k; ++p) {
    V8 b0;
    V8 b1;
    std::memcpy(&b0, b + p * kPanel, sizeof(V8));
    std::memcpy(&b1, b + p * kPanel + 8, sizeof(V8));
    for (int r = 0; r < R; ++r) {
      const float s = a[r][p];
      c0[r] += b0 * s;
      c1[r] += b1 * s;
    }
  }
  for (int r = 0; r < R; ++r) {
    std::memcpy(out + r * kPanel, &c0[r], sizeof(V8));
    std::memcpy(out + r * kPanel + 8, &c1[r], sizeof(V8));
  }
}

// The dot kernel: out[r][j] = sum over k of a[r][k] * b[j][k], 8 values of k at a time in
// R x kDotCols vector accumulators, summed across their lanes at the end.
template <int R>
DL_INLINE void DotTileBody(int64_t k, const float* const* a, const float* const* b, float* out) {
  V8 acc[R][kDotCols];
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < kDotCols; ++j) acc[r][j] = V8{};
  }
  const int64_t k8 = k & ~int64_t{7};
  for (int64_t p = 0; p < k8; p += 8) {
    V8 bv[kDotCols];
    for (int j = 0; j < kDotCols; ++j) std::memcpy(&bv[j], b[j] + p, sizeof(V8));
    for (int r = 0; r < R; ++r) {
      V8 av;
      std::memcpy(&av, a[r] + p, sizeof(V8));
      for (int j = 0; j < kDotCols; ++j) acc[r][j] += av * bv[j];
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < kDotCols; ++j) {
      float l[8];
      std::memcpy(l, &acc[r][j], sizeof(l));
      float s = ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
      for (int64_t p = k8; p < k; ++p) s += a[r][p] * b[j][p];
      out[r * kDotCols + j] = s;
    }
  }
}
#else
template <int R>
DL_INLINE void PanelTileBody(int64_t k, const float* const* a, const float* b, float* out) {
  float c[R][kPanel] = {};
  for (int64_t p = 0; p < k; ++p) {
    for (int r = 0; r < R; ++r) {
      for (int j = 0; j < kPanel; ++j) c[r][j] += a[r][p] * b[p * kPanel + j];
    }
  }
  for (int r = 0; r < R; ++r) std::memcpy(out + r * kPanel, c[r], sizeof(c[r]));
}

template <int R>
DL_INLINE void DotTileBody(int64_t k, const float* const* a, const float* const* b, float* out) {
  for (int r = 0; r < R; ++r) {
    for (int j = 0; j < kDotCols; ++j) {
      float s = 0.0f;
      for (int64_t p = 0; p < k; ++p) s += a[r][p] * b[j][p];
      out[r * kDotCols + j] = s;
    }
  }
}
#endif

// The kernels of one instruction set, each compiled on its own (register allocation stays local
// to the loop): the AVX2 + FMA ones where the CPU has them, the baseline ones otherwise.
struct Kernels {
  int panel_rows;  // rows of A per panel tile
  void (*panel[7])(int64_t, const float* const*, const float*, float*);  // by rows, 1..panel_rows
  void (*dot[kDotRows + 1])(int64_t, const float* const*, const float* const*, float*);
  void (*dequant_row)(const QuantWeight&, int64_t, int64_t, int64_t, float*);
  void (*dequant_panels)(const QuantWeight&, int64_t, int64_t, float*);
};

#define DL_KERNELS(NAME, ATTR, ROWS, TRANSPOSE)                                                             \
  template <int R>                                                                               \
  ATTR void Panel##NAME(int64_t k, const float* const* a, const float* b, float* out) {          \
    PanelTileBody<R>(k, a, b, out);                                                              \
  }                                                                                              \
  template <int R>                                                                               \
  ATTR void Dot##NAME(int64_t k, const float* const* a, const float* const* b, float* out) {     \
    DotTileBody<R>(k, a, b, out);                                                                \
  }                                                                                              \
  ATTR void DequantRow##NAME(const QuantWeight& w, int64_t n, int64_t k0, int64_t len,           \
                             float* out) {                                                       \
    DequantRowBody(w, n, k0, len, out);                                                          \
  }                                                                                              \
  ATTR void DequantPanels##NAME(const QuantWeight& w, int64_t n0, int64_t ncols, float* dst) {   \
    DequantPanelsBody<TRANSPOSE>(w, n0, ncols, dst);                                             \
  }                                                                                              \
  const Kernels k##NAME = {                                                                      \
      ROWS,                                                                                      \
      {nullptr, &Panel##NAME<1>, &Panel##NAME<2>, &Panel##NAME<3>, &Panel##NAME<4>,              \
       ROWS >= 5 ? &Panel##NAME<5> : nullptr, ROWS >= 6 ? &Panel##NAME<6> : nullptr},            \
      {nullptr, &Dot##NAME<1>, &Dot##NAME<2>, &Dot##NAME<3>, &Dot##NAME<4>},                     \
      &DequantRow##NAME,                                                                         \
      &DequantPanels##NAME};

#if defined(__x86_64__) || defined(__i386__)
DL_KERNELS(Baseline, __attribute__((noinline)), 4, TransposeScalar)  // SSE: 16 vector registers
DL_KERNELS(Avx2, __attribute__((noinline, target("avx2,fma"))), 6, TransposeAvx)
const Kernels& Pick() {
  static const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return avx2 ? kAvx2 : kBaseline;
}
#elif defined(__GNUC__) || defined(__clang__)
DL_KERNELS(Baseline, __attribute__((noinline)), 6, TransposeScalar)  // aarch64: 32 vector registers
const Kernels& Pick() { return kBaseline; }
#else
DL_KERNELS(Baseline, , 4, TransposeScalar)
const Kernels& Pick() { return kBaseline; }
#endif

// out[r][0..cols) of a tile (row stride `ld`) -> y with the bias and the clamp.
DL_INLINE void Store(const Job& job, const float* tile, int ld, int rows, int64_t cols, int64_t m0,
                     int64_t c0) {
  const float* bias = job.bias != nullptr ? job.bias + c0 : nullptr;
  for (int r = 0; r < rows; ++r) {
    float* out = job.y + (m0 + r) * job.w->n + c0;
    const float* v = tile + r * ld;
    for (int64_t j = 0; j < cols; ++j) {
      const float s = v[j] + (bias != nullptr ? bias[j] : 0.0f);
      out[j] = std::min(std::max(s, job.clamp.lo), job.clamp.hi);
    }
  }
}

// Tasks t0 .. t1 of `job` on this thread.
void RunTasks(const Kernels& kern, const Job& job, int64_t t0, int64_t t1) {
  constexpr int kRowsMax = 6;
  const QuantWeight& w = *job.w;
  const int64_t k = w.k;
  const int64_t n = w.n;
  const int step = job.panels ? kern.panel_rows : kDotRows;
  const bool gather = job.conv != nullptr && !job.conv->Direct();
  std::unique_ptr<float[]> weights(new float[static_cast<size_t>(job.nc * k)]);
  std::unique_ptr<float[]> patches(gather ? new float[static_cast<size_t>(step * k)] : nullptr);
  float acc[kRowsMax * kPanel];
  int64_t have = -1;
  for (int64_t t = t0; t < t1; ++t) {
    const int64_t group = t / job.mparts;
    const int64_t n0 = group * job.nc;
    const int64_t ncols = std::min(job.nc, n - n0);
    if (group != have) {  // this group's weights, dequantized once
      if (job.panels) {
        kern.dequant_panels(w, n0, ncols, weights.get());
      } else {
        for (int64_t j = 0; j < ncols; ++j) kern.dequant_row(w, n0 + j, 0, k, weights.get() + j * k);
      }
      have = group;
    }
    const int64_t m_begin = (t % job.mparts) * job.mchunk;
    const int64_t m_end = std::min(job.m, m_begin + job.mchunk);
    for (int64_t m0 = m_begin; m0 < m_end; m0 += step) {
      const int rows = static_cast<int>(std::min<int64_t>(step, m_end - m0));
      const float* a[kRowsMax];
      if (gather) {
        GatherPatches(*job.conv, job.x, m0, rows, patches.get());
        for (int r = 0; r < kRowsMax; ++r) a[r] = patches.get() + std::min(r, rows - 1) * k;
      } else {
        for (int r = 0; r < kRowsMax; ++r) a[r] = job.x + (m0 + std::min(r, rows - 1)) * k;
      }
      if (job.panels) {
        for (int64_t c0 = 0; c0 < ncols; c0 += kPanel) {
          kern.panel[rows](k, a, weights.get() + c0 * k, acc);
          Store(job, acc, kPanel, rows, std::min<int64_t>(kPanel, ncols - c0), m0, n0 + c0);
        }
      } else {
        for (int64_t c0 = 0; c0 < ncols; c0 += kDotCols) {
          const int64_t cols = std::min<int64_t>(kDotCols, ncols - c0);
          const float* b[kDotCols];
          for (int j = 0; j < kDotCols; ++j) b[j] = weights.get() + (c0 + std::min<int64_t>(j, cols - 1)) * k;
          kern.dot[rows](k, a, b, acc);
          Store(job, acc, kDotCols, rows, cols, m0, n0 + c0);
        }
      }
    }
  }
}

}  // namespace

void QuantizedGemm(const QuantWeight& w, const GemmA& a, const float* bias, Clamp clamp, float* y,
                   int num_threads) {
  const int64_t m = a.m;
  const int64_t n = w.n;
  const int64_t k = w.k;
  if (m <= 0 || n <= 0 || k <= 0) return;
  const Kernels& kern = Pick();
  const int64_t threads = std::max(1, num_threads);
  // Channel groups of at most kTaskBytes of dequantized weights; rows are split too where there
  // are few groups: ranges of at least 64 rows (each range dequantizes its group again), up to
  // four tasks a thread.
  Job job{&w, a.x, m, a.conv, bias, clamp, y, m >= kPanelRowsMin, 0, 1, m};
  const int64_t unit = job.panels ? kPanel : kDotCols;
  const int64_t per_task = std::clamp<int64_t>(kTaskBytes / (k * 4), 1, n);
  job.nc = (per_task + unit - 1) / unit * unit;
  const int64_t groups = (n + job.nc - 1) / job.nc;
  const int64_t want = std::min<int64_t>((4 * threads + groups - 1) / groups, std::max<int64_t>(1, m / 64));
  if (want > 1) {
    const int64_t tile = job.panels ? kern.panel_rows : kDotRows;
    job.mchunk = ((m + want - 1) / want + tile - 1) / tile * tile;
    job.mparts = (m + job.mchunk - 1) / job.mchunk;
  }
  const double cost = 2.0 * static_cast<double>(job.mchunk) * static_cast<double>(job.nc) *
                      static_cast<double>(k);
  ParallelFor(static_cast<int>(threads), groups * job.mparts, cost,
              [&](int64_t t0, int64_t t1) { RunTasks(kern, job, t0, t1); });
}

bool DequantizeRows(const QuantWeight& w, const int32_t* rows, int64_t count, float* out,
                    int num_threads, int64_t* bad) {
  for (int64_t i = 0; i < count; ++i) {
    if (rows[i] < 0 || rows[i] >= w.n) {
      *bad = i;
      return false;
    }
  }
  const Kernels& kern = Pick();
  ParallelFor(num_threads, count, 2.0 * static_cast<double>(w.k), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) kern.dequant_row(w, rows[i], 0, w.k, out + i * w.k);
  });
  return true;
}

}  // namespace cpu
}  // namespace difflite
