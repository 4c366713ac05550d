// The register tile of the vectorised GEMM kernels (-DVEC=1: gemm.cl's gemm
// and conv.cl's conv2d). A work-item owns WM rows ty*WM.. and WN / 4
// four-column groups (tx + j*TX)*4.. (j < WN / 4) of its work-group's TM x TN
// tile, held as float4 acc[WM][WN / 4]; the operands of one k are DL_C4 rows
// (float4, or half4 with DL_FP16_MATH) of the k-major local tiles As[cb][k] /
// Bs[cb][k]. Column groups TX apart
// (not WN / 4 adjacent ones): neighbouring items then read neighbouring
// float4s of Bs, which no two items of a warp's 8-item phase read from the
// same bank (adjacent groups of WN = 8 would make every read 2-way
// conflicted), and store neighbouring float4s of C. The loops over acc are macros rather than
// functions so that the accumulators stay plain registers whatever the
// compiler does with array arguments.
#include "dl_storage.cl"

#define C4(v, c) ((c) == 0 ? (v).s0 : (c) == 1 ? (v).s1 : (c) == 2 ? (v).s2 : (v).s3)

// Split-K (splits > 1): split `split` of `splits` sums the TK-aligned K range
// [kbeg, kend) (the last ranges may be short or empty); all of K otherwise.
// `splits` is a run-time value (the NDRange's), so one program serves every
// split count: a cold start compiles a GEMM or convolution tile once.
#define VT_SPLIT_RANGE(K, split, splits, kbeg, kend)                               \
  const int kbeg = (split) * (((K) + (splits) * TK - 1) / ((splits) * TK) * TK); \
  const int kend = min((K), kbeg + ((K) + (splits) * TK - 1) / ((splits) * TK) * TK)

#define VT_ZERO(acc)                                          \
  do {                                                        \
    _Pragma("unroll") for (int i_ = 0; i_ < WM; ++i_) {       \
      _Pragma("unroll") for (int j_ = 0; j_ < WN / 4; ++j_) { \
        acc[i_][j_] = (float4)(0.0f);                         \
      }                                                       \
    }                                                         \
  } while (0)

// acc += the TK-deep slice in local buffer cb (tiles of DL_C4).
#ifndef DL_FP16_MATH
#define VT_FMA_SLICE(As, Bs, cb, acc) VT_SLICE_FMAS(As, Bs, cb, acc)
#else
// Half arithmetic: the slice's TK multiply-adds go into half partial sums
// (dl_storage.cl), so their error is bounded by TK instead of by K (K = 11520
// for a 3x3 convolution over 1280 channels).
#define VT_FMA_SLICE(As, Bs, cb, acc)            \
  do {                                          \
    DL_HALF_PARTS(part_, WM, WN / 4);           \
    VT_SLICE_FMAS(As, Bs, cb, part_);           \
    DL_CARRY_PARTS(acc, part_, WM, WN / 4);     \
  } while (0)
#endif
// One multiply-add of the tile. Half arithmetic uses mad, not fma: OpenCL's fma
// must round once, which a compiler may meet by giving up the vector form; PoCL's
// LLVM (CUDA) turned each half4 fma into four scalar f16 FMAs, and mad into two
// packed f16x2 ones (lab/pocl_cuda_ptx_check.py: the 128x128 tile's PTX,
// fma.rn.f16 x1024 against fma.rn.f16x2 x512). Packed half multiply-adds are
// where a phone GPU's (and the H200's) twice-float rate comes from. Float
// keeps fma (the same instruction on GPUs; exact on CPU-like devices).
#ifdef DL_FP16_MATH
#define VT_MAD(a, b, c) mad(a, b, c)
#else
#define VT_MAD(a, b, c) fma(a, b, c)
#endif
// sum += the slice's products, in DL_C4.
#define VT_SLICE_FMAS(As, Bs, cb, sum)                                                         \
  do {                                                                                        \
    _Pragma("unroll") for (int kk_ = 0; kk_ < TK; ++kk_) {                                    \
      DL_C4 a_[WM / 4], b_[WN / 4];                                                           \
      _Pragma("unroll") for (int v_ = 0; v_ < WM / 4; ++v_) a_[v_] = As[cb][kk_][ty * (WM / 4) + v_]; \
      _Pragma("unroll") for (int v_ = 0; v_ < WN / 4; ++v_) b_[v_] = Bs[cb][kk_][v_ * TX + tx];  \
      _Pragma("unroll") for (int i_ = 0; i_ < WM; ++i_) {                                     \
        const DL_C4 ai_ = (DL_C4)(C4(a_[i_ / 4], i_ % 4));                                    \
        _Pragma("unroll") for (int j_ = 0; j_ < WN / 4; ++j_) {                               \
          sum[i_][j_] = VT_MAD(ai_, b_[j_], sum[i_][j_]);                                     \
        }                                                                                     \
      }                                                                                       \
    }                                                                                         \
  } while (0)

// bias[n .. n+3] (zeros past N or without a bias).
inline float4 vt_bias4(__global const DL_T* bias, int has_bias, int n, int N) {
  float t[4];
  for (int c = 0; c < 4; ++c) t[c] = (has_bias && n + c < N) ? DL_LOAD(bias, n + c) : 0.0f;
  return (float4)(t[0], t[1], t[2], t[3]);
}

// Stores acc (+ bias) (+ the values there, with GEMM_ACC) of the item's block: rows m < M at ROW(m) (a pointer
// expression in m), columns n < N; one aligned 4-vector store where `vec_c`
// says rows are aligned to 4 elements.
#define VT_STORE(acc, bias, has_bias, M, N, vec_c, ROW)                         \
  do {                                                                         \
    const int mb_ = m0 + ty * WM;                                              \
    float4 bv_[WN / 4];                                                        \
    _Pragma("unroll") for (int j_ = 0; j_ < WN / 4; ++j_) {                    \
      bv_[j_] = vt_bias4(bias, has_bias, n0 + 4 * (j_ * TX + tx), N);          \
    }                                                                          \
    _Pragma("unroll") for (int i_ = 0; i_ < WM; ++i_) {                        \
      const int m = mb_ + i_;                                                  \
      if (m >= (M)) break;                                                     \
      __global DL_T* row_ = (ROW);                                             \
      _Pragma("unroll") for (int j_ = 0; j_ < WN / 4; ++j_) {                  \
        const int n_ = n0 + 4 * (j_ * TX + tx);                                \
        const float4 v_ = acc[i_][j_] + bv_[j_];                               \
        if ((vec_c) && n_ + 4 <= (N)) {                                        \
          DL_STORE4A(row_, n_, GEMM_ACC ? v_ + DL_LOAD4A(row_, n_) : v_);      \
        } else {                                                               \
          _Pragma("unroll") for (int c_ = 0; c_ < 4; ++c_) {                   \
            if (n_ + c_ < (N)) {                                               \
              DL_STORE(row_, n_ + c_, C4(v_, c_) + GEMM_PRIOR(row_, n_ + c_)); \
            }                                                                  \
          }                                                                    \
        }                                                                      \
      }                                                                        \
    }                                                                          \
  } while (0)
