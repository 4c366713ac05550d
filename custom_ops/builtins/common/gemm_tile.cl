// The work-group tile of the GEMM kernels (gemm.cl's gemm, conv.cl's conv2d): TM x TN
// outputs, walked in TK-deep K slices, WM x WN outputs an item, on (TN / WN) x (TM / WM)
// items; the host passes the tile as build options (gemm.h: TileConfig), these are the
// defaults. For the scalar kernels (VEC=0), the loops over an item's float acc[WM][WN]:
// rows ty + i*TY, columns tx + j*TX (stores coalesced along n). As vec_tile.cl's, they are
// macros so that the accumulators stay plain registers.
#ifndef TM
#define TM 64
#endif
#ifndef TN
#define TN 64
#endif
#ifndef TK
#define TK 16
#endif
#ifndef WM
#define WM 4
#endif
#ifndef WN
#define WN 4
#endif
#ifndef VEC
#define VEC 0
#endif
// GEMM_ACC=1 (gemm.h: GemmShape::accumulate): C += A B (+ bias), each output read just before
// it is stored (difflite.LoRA adds its up projection to y in place this way).
#ifndef GEMM_ACC
#define GEMM_ACC 0
#endif
// C's value at element i where the GEMM accumulates, else 0.
#if GEMM_ACC
#define GEMM_PRIOR(C, i) DL_LOAD(C, i)
#else
#define GEMM_PRIOR(C, i) 0.0f
#endif
#define TX (TN / WN)
#define TY (TM / WM)
#define NT (TX * TY)

// An item's place in its work-group's tile: (tx, ty) and rank tid in the group, and the first
// column n0 and row m0 of the group's tile (work-group dimensions 0 and 1).
#define TILE_ITEM(tx, ty, tid, n0, m0)     \
  const int tx = get_local_id(0);          \
  const int ty = get_local_id(1);          \
  const int tid = ty * TX + tx;            \
  const int n0 = get_group_id(0) * TN;     \
  const int m0 = get_group_id(1) * TM

#define ST_ZERO(acc)                                     \
  do {                                                   \
    _Pragma("unroll") for (int i_ = 0; i_ < WM; ++i_) {  \
      _Pragma("unroll") for (int j_ = 0; j_ < WN; ++j_) { \
        acc[i_][j_] = 0.0f;                              \
      }                                                  \
    }                                                    \
  } while (0)

// acc += the TK-deep slice staged in the local tiles As[TK][TM + 1] and Bs[TK][TN + 1].
#define ST_FMA_SLICE(As, Bs, tx, ty, acc)                                       \
  do {                                                                          \
    _Pragma("unroll") for (int kk_ = 0; kk_ < TK; ++kk_) {                      \
      float a_[WM], b_[WN];                                                     \
      _Pragma("unroll") for (int i_ = 0; i_ < WM; ++i_) a_[i_] = As[kk_][(ty) + i_ * TY]; \
      _Pragma("unroll") for (int j_ = 0; j_ < WN; ++j_) b_[j_] = Bs[kk_][(tx) + j_ * TX]; \
      _Pragma("unroll") for (int i_ = 0; i_ < WM; ++i_) {                       \
        _Pragma("unroll") for (int j_ = 0; j_ < WN; ++j_) {                     \
          acc[i_][j_] = fma(a_[i_], b_[j_], acc[i_][j_]);                       \
        }                                                                       \
      }                                                                         \
    }                                                                           \
  } while (0)

// C[m * ldc + n] = acc (+ bias[n] where has_bias) (+ C[m * ldc + n] with GEMM_ACC) for the item's outputs inside M x N.
#define ST_STORE(C, ldc, bias, has_bias, tx, ty, m0, n0, M, N, acc)                       \
  do {                                                                                    \
    _Pragma("unroll") for (int i_ = 0; i_ < WM; ++i_) {                                   \
      const int m_ = (m0) + (ty) + i_ * TY;                                               \
      if (m_ >= (M)) continue;                                                            \
      _Pragma("unroll") for (int j_ = 0; j_ < WN; ++j_) {                                 \
        const int n_ = (n0) + (tx) + j_ * TX;                                             \
        if (n_ < (N)) {                                                                   \
          const int e_ = m_ * (ldc) + n_;                                                 \
          DL_STORE(C, e_, acc[i_][j_] + ((has_bias) ? DL_LOAD(bias, n_) : 0.0f) + GEMM_PRIOR(C, e_)); \
        }                                                                                 \
      }                                                                                   \
    }                                                                                     \
  } while (0)
