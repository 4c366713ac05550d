// gemm.cl's tiled GEMM on NVIDIA tensor cores (-DMMA=1, with -DVEC=1): the same arguments, tile
// walk, split-K and epilogue as the vectorised kernel, but each K slice is multiplied on the
// tensor cores by common/mma_tile.cl's fragments (shared with conv.cl's tensor-core
// convolution); the staging of gemm.cl's operands is here. The host (gemm.cc) builds it only
// where GpuContext::TensorCores() says the device runs it (NVIDIA's OpenCL, compute capability
// 8.0 or later, or DIFFLITE_TENSOR_CORES=on), or with the instruction emulated (-DMMA_EMULATE=1).
#include "mma_tile.cl"

// A quad of A from p: along k (one 8-byte store) or down 4 rows (A m-major).
inline void mma_stage_quad(__local ushort* p, ushort4 q, int along_k) {
  if (along_k) {
    *(__local ushort4*)p = q;
  } else {
    p[0] = q.x;
    p[MMA_LD] = q.y;
    p[2 * MMA_LD] = q.z;
    p[3 * MMA_LD] = q.w;
  }
}

#if A_QUADS
#define MMA_STAGE_A                                                                          \
  _Pragma("unroll") for (int l_ = 0; l_ < SLICE_REGS(TM * TK / 4); ++l_) {                  \
    const int e_ = tid + l_ * NT;                                                            \
    A_QUAD_INDEX(e_, kk_, rr_);                                                              \
    if (e_ < TM * TK / 4) mma_stage_quad(MMA_A_AT(buf, rr_, kk_), MMA_BITS4(ra[l_]), A_KMAJOR); \
  }
#else
#define MMA_STAGE_A                                                                          \
  _Pragma("unroll") for (int l_ = 0; l_ < SLICE_REGS(TM * TK); ++l_) {                      \
    const int e_ = tid + l_ * NT;                                                            \
    A_SLICE_INDEX(e_, kk_, rr_);                                                             \
    if (e_ < TM * TK) *MMA_A_AT(buf, rr_, kk_) = MMA_BITS(ra[l_]);                     \
  }
#endif
#if DL_WQ
#define MMA_STAGE_B                                                                          \
  _Pragma("unroll") for (int l_ = 0; l_ < SLICE_REGS(TN * TK / 4); ++l_) {                  \
    const int e_ = tid + l_ * NT;                                                            \
    B_QUAD_INDEX(e_, kk_, rr_);                                                              \
    if (e_ < TN * TK / 4) {                                                                  \
      *(__local ushort4*)MMA_B_AT(buf, rr_, kk_) =                                           \
          mma_half_bits4(DL_WQ_FROM_RAW4(rb[l_]) * rbs[l_]);                                 \
    }                                                                                        \
  }
#elif B_QUADS
#define MMA_STAGE_B                                                                          \
  _Pragma("unroll") for (int l_ = 0; l_ < SLICE_REGS(TN * TK / 4); ++l_) {                  \
    const int e_ = tid + l_ * NT;                                                            \
    B_QUAD_INDEX(e_, kk_, rr_);                                                              \
    if (e_ < TN * TK / 4) *(__local ushort4*)MMA_B_AT(buf, rr_, kk_) = MMA_BITS4(rb[l_]);  \
  }
#else
#define MMA_STAGE_B                                                                          \
  _Pragma("unroll") for (int l_ = 0; l_ < SLICE_REGS(TN * TK); ++l_) {                      \
    const int e_ = tid + l_ * NT;                                                            \
    B_SLICE_INDEX(e_, kk_, rr_);                                                             \
    if (e_ < TN * TK) *MMA_B_AT(buf, rr_, kk_) = MMA_BITS(rb[l_]);                           \
  }
#endif

__kernel __attribute__((reqd_work_group_size(TX, TY, 1)))
void gemm(__global const DL_T* A, DL_B_PTR B, __global const DL_T* bias,
          __global DL_T* C, int M, int N, int K, int a_sm, int a_sk, int b_sk, int b_sn,
          int ldc, int4 bdims, int4 a_bs, int4 b_bs, int c_bs, int has_bias, int a_base,
          int c_base DL_WQ_PARAMS) {
  A += a_base;
  C += c_base;
  // ushort4 arrays: the staged quads are 8-byte stores, which need the 8-byte alignment a uint
  // array would not promise (a misaligned shared-memory access faults on NVIDIA).
  __local ushort4 As[2 * TM * MMA_LD / 4];
  __local ushort4 Bs[MMA_B_HALVES / 4];
  __local ushort* as = (__local ushort*)As;
  __local ushort* bs = (__local ushort*)Bs;
#if MMA_EMULATE
  __local float mma_x[MMA_WARPS * MMA_XW];
#endif
  TILE_ITEM(tx, ty, tid, n0, m0);
  const int warp = tid >> 5, lane = tid & 31;
  const int g = lane >> 2, t = lane & 3;
  const int wm0 = (warp / MMA_WARPS_N) * MMA_WTM;
  const int wn0 = (warp % MMA_WARPS_N) * MMA_WTN;
  GEMM_SPLIT_PROLOGUE;

  float acc[MMA_MI][MMA_NI][4];
  MMA_UNROLL for (int i = 0; i < MMA_MI; ++i) {
    MMA_UNROLL for (int j = 0; j < MMA_NI; ++j) {
      MMA_UNROLL for (int c = 0; c < 4; ++c) acc[i][j][c] = 0.0f;
    }
  }

  // gemm.cl's walk over K, each slice multiplied on the tensor cores.
  GEMM_SLICE_WALK(MMA_SLICE, MMA_STAGE_A, MMA_STAGE_B)

  __global DL_T* Cb = C + (split * batches + batch) * c_bs;
  const int vec_c = ((ldc | c_bs | c_base) & 1) == 0;
  MMA_UNROLL for (int i = 0; i < MMA_MI; ++i) {
    const int m = m0 + wm0 + i * 16 + g;
    MMA_UNROLL for (int j = 0; j < MMA_NI; ++j) {
      const int n = n0 + wn0 + j * 8 + 2 * t;
      if (m < M) mma_store2(Cb + m * ldc, bias, has_bias, n, N, vec_c, acc[i][j][0], acc[i][j][1]);
      if (m + 8 < M) {
        mma_store2(Cb + (m + 8) * ldc, bias, has_bias, n, N, vec_c, acc[i][j][2], acc[i][j][3]);
      }
    }
  }
}
