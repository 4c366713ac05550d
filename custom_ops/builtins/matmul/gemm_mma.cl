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
          int c_base, int b_base DL_WQ_PARAMS) {
  A += a_base;
  B += b_base;
  C += c_base;
  DL_WQ_AT_BASE;
  MMA_TILE_LOCALS;
  TILE_ITEM(tx, ty, tid, n0, m0);
  MMA_ITEM_AND_ACC(tid);
  GEMM_SPLIT_PROLOGUE;

  // gemm.cl's walk over K, each slice multiplied on the tensor cores.
  GEMM_SLICE_WALK(MMA_SLICE, MMA_STAGE_A, MMA_STAGE_B)

  __global DL_T* Cb = C + (split * batches + batch) * c_bs;
  const int vec_c = ((ldc | c_bs | c_base) & 1) == 0;
  MMA_STORE_TILE(Cb, ldc, vec_c);
}
