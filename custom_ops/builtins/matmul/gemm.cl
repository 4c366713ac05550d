// Tiled GEMM: C[b][m][n] = sum_k A(b,m,k) * B(b,k,n) (+ bias[n]) (+ C[b][m][n] with
// -DGEMM_ACC=1, gemm_tile.cl; never split over K), float
// accumulation, operands in DL_T storage with arbitrary element strides:
//   A(b,m,k) = A[a_off(b) + m*a_sm + k*a_sk], B(b,k,n) = B[b_off(b) + k*b_sk + n*b_sn]
//   C[b*c_bs + m*ldc + n]
// a_base / c_base (elements, multiples of 4) move A and C to a window of rows (the attention's
// query-row chunks) without a sub-buffer: one driver call less per chunk, and no sub-buffer
// alignment rule on the chunk.
// A work-group of (TN/WN) x (TM/WM) items computes a TM x TN tile of C,
// walking K in TK-deep slices staged in local memory; each item owns WM x WN
// outputs (rows ty + i*TY, cols tx + j*TX, so stores are coalesced along n).
// A_KMAJOR / B_KMAJOR: which index of the operand is contiguous in memory,
// so that neighbouring items load neighbouring addresses.
// Batches: up to 4 collapsed dims (bdims, innermost in .w), with per-operand
// strides (0 broadcasts).
// With -DDL_WQ=8|4 (dl_qweights.cl) B is a quantized weight [N][K] read k-major in
// quads (one batch, K % 4 == 0; gemm_rows: its packed [K][NP] copy) and dequantized where
// it is staged; the scales follow as the last arguments.
#include "dl_storage.cl"
#include "dl_qweights.cl"
#include "gemm_tile.cl"
#if DL_WQ
#define DL_B_PTR DL_WQ_PTR
#else
#define DL_B_PTR __global const DL_T*
#define DL_WQ_PARAMS
#endif
#ifndef A_KMAJOR
#define A_KMAJOR 1
#endif
#ifndef B_KMAJOR
#define B_KMAJOR 0
#endif
// -DMMA=1 (with -DVEC=1): the vectorised kernel's tile walk on NVIDIA's tensor cores
// (gemm_mma.cl).
#ifndef MMA
#define MMA 0
#endif
// Element e of a staged TK-deep slice of A (TM rows) or B (TN columns):
// its k index and row / column, walking the operand's contiguous index first.
#if A_KMAJOR
#define A_SLICE_INDEX(e, kk, mm) const int kk = (e) % TK, mm = (e) / TK
#else
#define A_SLICE_INDEX(e, kk, mm) const int mm = (e) % TM, kk = (e) / TM
#endif
#if B_KMAJOR
#define B_SLICE_INDEX(e, kk, nn) const int kk = (e) % TK, nn = (e) / TK
#else
#define B_SLICE_INDEX(e, kk, nn) const int nn = (e) % TN, kk = (e) / TN
#endif

// Element offset of batch `batch` (up to 4 collapsed dims, innermost in .w).
inline int batch_offset(int batch, int4 bdims, int4 strides) {
  const int c3 = batch % bdims.w;
  batch /= bdims.w;
  const int c2 = batch % bdims.z;
  batch /= bdims.z;
  const int c1 = batch % bdims.y;
  const int c0 = batch / bdims.y;
  return c0 * strides.x + c1 * strides.y + c2 * strides.z + c3 * strides.w;
}

#if !VEC
__kernel __attribute__((reqd_work_group_size(TX, TY, 1)))
void gemm(__global const DL_T* A, __global const DL_T* B, __global const DL_T* bias,
          __global DL_T* C, int M, int N, int K, int a_sm, int a_sk, int b_sk, int b_sn,
          int ldc, int4 bdims, int4 a_bs, int4 b_bs, int c_bs, int has_bias, int a_base, int c_base,
          int b_base) {
  A += a_base;
  B += b_base;
  C += c_base;
  __local float As[TK][TM + 1];
  __local float Bs[TK][TN + 1];
  TILE_ITEM(tx, ty, tid, n0, m0);
  const int batch = get_group_id(2);
  const int a_off = batch_offset(batch, bdims, a_bs);
  const int b_off = batch_offset(batch, bdims, b_bs);
  __global const DL_T* Ab = A + a_off;
  __global const DL_T* Bb = B + b_off;

  float acc[WM][WN];
  ST_ZERO(acc);

  for (int k0 = 0; k0 < K; k0 += TK) {
    for (int e = tid; e < TM * TK; e += NT) {
      A_SLICE_INDEX(e, kk, mm);
      const int m = m0 + mm;
      const int k = k0 + kk;
      As[kk][mm] = (m < M && k < K) ? DL_LOAD(Ab, m * a_sm + k * a_sk) : 0.0f;
    }
    for (int e = tid; e < TN * TK; e += NT) {
      B_SLICE_INDEX(e, kk, nn);
      const int n = n0 + nn;
      const int k = k0 + kk;
      Bs[kk][nn] = (n < N && k < K) ? DL_LOAD(Bb, k * b_sk + n * b_sn) : 0.0f;
    }
    barrier(CLK_LOCAL_MEM_FENCE);
    ST_FMA_SLICE(As, Bs, tx, ty, acc);
    barrier(CLK_LOCAL_MEM_FENCE);
  }

  __global DL_T* Cb = C + batch * c_bs;
  ST_STORE(Cb, ldc, bias, has_bias, tx, ty, m0, n0, M, N, acc);
}

#else  // VEC
// Vectorised variant (-DVEC=1, WM and WN multiples of 4): an item owns the
// contiguous block rows ty*WM.., cols tx*WN.. of the tile, so its operands per
// k are WM/4 + WN/4 4-vector reads of the k-major local tiles (not WM + WN
// strided scalar reads; DL_C4: float4, or half4 with half arithmetic). Rows
// are padded by 4 elements: spreads the banks of the staging writes and keeps
// every 4-vector aligned. The tiles are double
// buffered and slice k+1 is fetched into registers before slice k is
// computed, so the global loads overlap the arithmetic; one barrier per slice.
#define LDA (TM + 4)
#define LDB (TN + 4)
// A_QUADS / B_QUADS (set by the host where the operand's contiguous extent and
// other strides are multiples of 4): the operand is staged as aligned runs of 4
// elements along its contiguous index, one vector load each (4x fewer loads;
// with half storage one 8-byte load instead of 4 2-byte ones).
#ifndef A_QUADS
#define A_QUADS 0
#endif
#ifndef B_QUADS
#define B_QUADS 0
#endif
// Quad e of a staged slice: its first k index and row / column.
#if A_KMAJOR
#define A_QUAD_INDEX(e, kk, mm) const int kk = 4 * ((e) % (TK / 4)), mm = (e) / (TK / 4)
#else
#define A_QUAD_INDEX(e, kk, mm) const int mm = 4 * ((e) % (TM / 4)), kk = (e) / (TM / 4)
#endif
#if B_KMAJOR
#define B_QUAD_INDEX(e, kk, nn) const int kk = 4 * ((e) % (TK / 4)), nn = (e) / (TK / 4)
#else
#define B_QUAD_INDEX(e, kk, nn) const int nn = 4 * ((e) % (TN / 4)), kk = (e) / (TN / 4)
#endif
// Writes quad q (first index kk, row / column rc) into local tile t (row
// length ld, buffer buf): k-major quads go down 4 k rows, the others are one
// aligned 4-vector of a k row.
inline void stage_quad(__local DL_C* t, int ld, int buf, int kk, int rc, float4 q, int kmajor) {
  __local DL_C* p = t + (buf * TK + kk) * ld + rc;
  const DL_C4 c = DL_TO_C4(q);
  if (kmajor) {
    p[0] = c.x;
    p[ld] = c.y;
    p[2 * ld] = c.z;
    p[3 * ld] = c.w;
  } else {
    *(__local DL_C4*)p = c;
  }
}

// One operand's TK-deep slice, EXT rows (A) or columns (B) from rc0: the
// registers an item fetches it into (N elements or N / 4 quads a slice, raw
// until staged: see dl_storage.cl's DL_RAW), the fetch of slice k0 (element
// (rc, k) at p[rc * s_rc + k * s_k], zero at and past BOUND or kend) and its
// staging into local tile t (row length LD, buffer buf). INDEX is the
// operand's A/B_SLICE_INDEX or A/B_QUAD_INDEX.
#define SLICE_REGS(N) (((N) + NT - 1) / NT)
#define FETCH_ELEMS(r, INDEX, EXT, rc0, BOUND, p, s_rc, s_k)                        \
  _Pragma("unroll") for (int l_ = 0; l_ < SLICE_REGS(EXT * TK); ++l_) {            \
    const int e_ = tid + l_ * NT;                                                   \
    INDEX(e_, kk_, rr_);                                                            \
    const int rc_ = (rc0) + rr_, k_ = k0 + kk_;                                     \
    r[l_] = (rc_ < (BOUND) && k_ < kend && e_ < EXT * TK)                           \
                ? DL_LOAD_RAW(p, rc_ * (s_rc) + k_ * (s_k)) : (DL_RAW)0;            \
  }
#define FETCH_QUADS(r, INDEX, EXT, rc0, BOUND, p, s_rc, s_k)                        \
  _Pragma("unroll") for (int l_ = 0; l_ < SLICE_REGS(EXT * TK / 4); ++l_) {        \
    const int e_ = tid + l_ * NT;                                                   \
    INDEX(e_, kk_, rr_);                                                            \
    const int rc_ = (rc0) + rr_, k_ = k0 + kk_;                                     \
    r[l_] = (rc_ < (BOUND) && k_ < kend && e_ < EXT * TK / 4)                       \
                ? DL_LOAD4A_RAW(p, rc_ * (s_rc) + k_ * (s_k)) : (DL_RAW4)(0);       \
  }
#define STAGE_ELEMS(r, INDEX, EXT, t, LD)                                           \
  _Pragma("unroll") for (int l_ = 0; l_ < SLICE_REGS(EXT * TK); ++l_) {            \
    const int e_ = tid + l_ * NT;                                                   \
    INDEX(e_, kk_, rr_);                                                            \
    if (e_ < EXT * TK) t[(buf * TK + kk_) * (LD) + rr_] = DL_TO_C(DL_FROM_RAW(r[l_])); \
  }
#define STAGE_QUADS(r, INDEX, EXT, t, LD, KMAJOR)                                   \
  _Pragma("unroll") for (int l_ = 0; l_ < SLICE_REGS(EXT * TK / 4); ++l_) {        \
    const int e_ = tid + l_ * NT;                                                   \
    INDEX(e_, kk_, rr_);                                                            \
    if (e_ < EXT * TK / 4) stage_quad(t, LD, buf, kk_, rr_, DL_FROM_RAW4(r[l_]), KMAJOR);  \
  }
#if A_QUADS
#define A_REGS DL_RAW4 ra[SLICE_REGS(TM * TK / 4)]
#define FETCH_A FETCH_QUADS(ra, A_QUAD_INDEX, TM, m0, M, Ab, a_sm, a_sk)
#define STAGE_A STAGE_QUADS(ra, A_QUAD_INDEX, TM, as, LDA, A_KMAJOR)
#else
#define A_REGS DL_RAW ra[SLICE_REGS(TM * TK)]
#define FETCH_A FETCH_ELEMS(ra, A_SLICE_INDEX, TM, m0, M, Ab, a_sm, a_sk)
#define STAGE_A STAGE_ELEMS(ra, A_SLICE_INDEX, TM, as, LDA)
#endif
#if DL_WQ
// The quantized weight, in quads along k: raw integers and their scale until staged.
#define B_REGS DL_WQ_RAW4 rb[SLICE_REGS(TN * TK / 4)]; float rbs[SLICE_REGS(TN * TK / 4)]
#define FETCH_B                                                                     \
  _Pragma("unroll") for (int l_ = 0; l_ < SLICE_REGS(TN * TK / 4); ++l_) {         \
    const int e_ = tid + l_ * NT;                                                   \
    B_QUAD_INDEX(e_, kk_, rr_);                                                     \
    const int n_ = n0 + rr_, k_ = k0 + kk_;                                         \
    const bool in_ = n_ < N && k_ < kend && e_ < TN * TK / 4;                       \
    rb[l_] = in_ ? DL_WQ_LOAD4_RAW(B, n_ * K + k_) : (DL_WQ_RAW4)(0);               \
    rbs[l_] = in_ ? DL_WQ_SCALE(n_, k_) : 0.0f;                                     \
  }
#define STAGE_B                                                                     \
  _Pragma("unroll") for (int l_ = 0; l_ < SLICE_REGS(TN * TK / 4); ++l_) {         \
    const int e_ = tid + l_ * NT;                                                   \
    B_QUAD_INDEX(e_, kk_, rr_);                                                     \
    if (e_ < TN * TK / 4) {                                                         \
      stage_quad(bs, LDB, buf, kk_, rr_, DL_WQ_FROM_RAW4(rb[l_]) * rbs[l_], B_KMAJOR); \
    }                                                                               \
  }
#elif B_QUADS
#define B_REGS DL_RAW4 rb[SLICE_REGS(TN * TK / 4)]
#define FETCH_B FETCH_QUADS(rb, B_QUAD_INDEX, TN, n0, N, Bb, b_sn, b_sk)
#define STAGE_B STAGE_QUADS(rb, B_QUAD_INDEX, TN, bs, LDB, B_KMAJOR)
#else
#define B_REGS DL_RAW rb[SLICE_REGS(TN * TK)]
#define FETCH_B FETCH_ELEMS(rb, B_SLICE_INDEX, TN, n0, N, Bb, b_sn, b_sk)
#define STAGE_B STAGE_ELEMS(rb, B_SLICE_INDEX, TN, bs, LDB)
#endif
#include "vec_tile.cl"

// The vectorised kernels' work-group in its launch. Split-K (splits > 1): dimension 2 is
// batch * splits + split; split s sums its K range [kbeg, kend) into partial plane s of C
// (splitk_sum adds them). Ab / Bb: the batch's A and B.
#if DL_WQ
#define GEMM_B_OF_BATCH
#else
#define GEMM_B_OF_BATCH __global const DL_T* Bb = B + batch_offset(batch, bdims, b_bs)
#endif
#define GEMM_SPLIT_PROLOGUE                                                 \
  const int batches = bdims.x * bdims.y * bdims.z * bdims.w;               \
  const int splits = get_num_groups(2) / batches;                          \
  const int batch = get_group_id(2) / splits;                              \
  const int split = get_group_id(2) % splits;                              \
  VT_SPLIT_RANGE(K, split, splits, kbeg, kend);                            \
  __global const DL_T* Ab = A + batch_offset(batch, bdims, a_bs);          \
  GEMM_B_OF_BATCH

// The double-buffered walk over K: iteration k0 fetches slice k0 into registers (ra / rb),
// multiplies slice k0 - TK from local buffer buf ^ 1 (MULTIPLY(cb)), then stages the registers
// into buffer buf. The barrier that ends an iteration also separates the reads of a buffer from
// the next writes to it.
#define GEMM_SLICE_WALK(MULTIPLY, STAGE_A_, STAGE_B_) \
  A_REGS;                                             \
  B_REGS;                                             \
  int buf = 0;                                        \
  for (int k0 = kbeg; k0 < kend + TK; k0 += TK) {     \
    if (k0 < kend) {                                  \
      FETCH_A;                                        \
      FETCH_B;                                        \
    }                                                 \
    if (k0 > kbeg) {                                  \
      MULTIPLY(buf ^ 1);                              \
    }                                                 \
    if (k0 < kend) {                                  \
      STAGE_A_;                                       \
      STAGE_B_;                                       \
      barrier(CLK_LOCAL_MEM_FENCE);                   \
      buf ^= 1;                                       \
    }                                                 \
  }

#if MMA
#include "gemm_mma.cl"
#else

__kernel __attribute__((reqd_work_group_size(TX, TY, 1)))
void gemm(__global const DL_T* A, DL_B_PTR B, __global const DL_T* bias,
          __global DL_T* C, int M, int N, int K, int a_sm, int a_sk, int b_sk, int b_sn,
          int ldc, int4 bdims, int4 a_bs, int4 b_bs, int c_bs, int has_bias, int a_base,
          int c_base, int b_base DL_WQ_PARAMS) {
  A += a_base;
  B += b_base;
  C += c_base;
  DL_WQ_AT_BASE;
  __local DL_C4 As[2][TK][LDA / 4];
  __local DL_C4 Bs[2][TK][LDB / 4];
  __local DL_C* as = (__local DL_C*)As;
  __local DL_C* bs = (__local DL_C*)Bs;
  TILE_ITEM(tx, ty, tid, n0, m0);
  GEMM_SPLIT_PROLOGUE;

  float4 acc[WM][WN / 4];
  VT_ZERO(acc);
#define VEC_MULTIPLY(cb) VT_FMA_SLICE(As, Bs, cb, acc)
  GEMM_SLICE_WALK(VEC_MULTIPLY, STAGE_A, STAGE_B)

  __global DL_T* Cb = C + (split * batches + batch) * c_bs;
  const bool vec_c = ((ldc | c_bs | c_base) & 3) == 0;  // with n % 4 == 0: 16-byte aligned rows
  VT_STORE(acc, bias, has_bias, M, N, vec_c, Cb + m * ldc);
}
#endif  // MMA
#endif  // VEC

// The split-K epilogue: C[b][m][n] = sum over the `splits` partial planes
// P[s][b][m][n] (dense [M][N] planes, batch-major within a split) + bias[n].
// One item per element of C; global (N, M, batches).
__kernel void splitk_sum(__global const DL_T* P, __global const DL_T* bias, __global DL_T* C,
                         int M, int N, int ldc, int c_bs, int splits, int has_bias,
                         int c_base) {
  C += c_base;
  const int n = get_global_id(0);
  const int m = get_global_id(1);
  const int batch = get_global_id(2);
  if (n >= N || m >= M) return;
  const int plane = M * N;
  const int stride = (int)get_global_size(2) * plane;
  __global const DL_T* p = P + batch * plane + m * N + n;
  float v = has_bias ? DL_LOAD(bias, n) : 0.0f;
  for (int s = 0; s < splits; ++s) v += DL_LOAD(p, s * stride);
  DL_STORE(C, batch * c_bs + m * ldc + n, v);
}

// GEMM for CPU-like devices (no local memory, no barriers, explicit
// vectors): an item owns 16 consecutive columns n0..n0+15 (one float16) and RM
// consecutive rows of C; dimension 2 is the batch. B rows are one vload16
// when B is n-major (b_sn == 1) and the 16 columns exist, else 16 loads.
#ifndef RM
#define RM 8
#endif
// With DL_WQ, B is the int8 copy packed [K][NP] (int4 widened; NP = wq_kg, a multiple of 16)
// and its scales [KB][NP]: one batch, each row one vload16.
#if DL_WQ
#define DL_ROWS_B_PTR __global const char*
#else
#define DL_ROWS_B_PTR __global const DL_T*
#endif
__kernel void gemm_rows(__global const DL_T* A, DL_ROWS_B_PTR B,
                        __global const DL_T* bias, __global DL_T* C, int M, int N, int K,
                        int a_sm, int a_sk, int b_sk, int b_sn, int ldc, int4 bdims,
                        int4 a_bs, int4 b_bs, int c_bs, int has_bias, int a_base,
                        int c_base, int b_base DL_WQ_PARAMS) {
  A += a_base;
  B += b_base;
  C += c_base;
  DL_WQ_AT_BASE;
  const int n0 = get_global_id(0) * 16;
  const int m0 = get_global_id(1) * RM;
  const int batch = get_global_id(2);
  if (n0 >= N) return;
  __global const DL_T* Ab = A + batch_offset(batch, bdims, a_bs);
#if DL_WQ
  int block = -1;
  float16 bscale = (float16)(0.0f);
#else
  __global const DL_T* Bb = B + batch_offset(batch, bdims, b_bs);
#endif
  const int lanes = min(16, N - n0);
  const bool vec_b = b_sn == 1 && lanes == 16;
  float16 b0 = (float16)(0.0f);
  if (has_bias) {
    float bv[16];
    for (int j = 0; j < 16; ++j) bv[j] = j < lanes ? DL_LOAD(bias, n0 + j) : 0.0f;
    b0 = vload16(0, bv);
  }
  float16 acc[RM];
  int rows[RM];
  for (int i = 0; i < RM; ++i) {
    acc[i] = b0;
    rows[i] = min(m0 + i, M - 1) * a_sm;  // clamped rows are computed, not stored
  }
  for (int k = 0; k < K; ++k) {
    float16 b;
#if DL_WQ
    if ((k >> wq_shift) != block) {
      block = k >> wq_shift;
      bscale = vload16(0, wq_scale + (size_t)block * wq_kg + n0);
    }
    b = convert_float16(vload16(0, B + (size_t)k * wq_kg + n0)) * bscale;
#else
    __global const DL_T* bp = Bb + k * b_sk + n0 * b_sn;
    if (vec_b) {
      b = DL_LOAD16(bp, 0);
    } else {
      float bv[16];
      for (int j = 0; j < 16; ++j) bv[j] = j < lanes ? DL_LOAD(bp, j * b_sn) : 0.0f;
      b = vload16(0, bv);
    }
#endif
    const int ko = k * a_sk;
    for (int i = 0; i < RM; ++i) acc[i] = fma((float16)(DL_LOAD(Ab, rows[i] + ko)), b, acc[i]);
  }
  __global DL_T* Cb = C + batch * c_bs;
  for (int i = 0; i < RM; ++i) {
    const int m = m0 + i;
    if (m >= M) break;
    __global DL_T* cp = Cb + m * ldc + n0;
    if (lanes == 16) {
      DL_STORE16(cp, 0, GEMM_ACC ? acc[i] + DL_LOAD16(cp, 0) : acc[i]);
    } else {
      float av[16];
      vstore16(acc[i], 0, av);
      for (int j = 0; j < lanes; ++j) DL_STORE(cp, j, av[j] + GEMM_PRIOR(cp, j));
    }
  }
}


// GEMM with few rows (SK_M <= 8, one batch) and B k-major, as FULLY_CONNECTED
// has it for the UNet's time embedding (M = the batch): C[m][n] = sum_k
// A[m*a_sm + k] * B[n*b_sn + k] + bias[n]. The tiled kernels give such a GEMM
// a handful of work-groups that each walk all of K one slice at a time:
// latency-bound (25 us for 1280 x 1280 on the H100). Here a work-group of
// SK_WG items owns SK_NC columns and splits K among its items in aligned
// 4-element steps (K, a_sm, b_sn multiples of 4), then sums their partials in
// local memory: every weight is read once, by many work-groups at a time.
#ifdef SK_M
#define SK_NC 4
#define SK_WG 64
__kernel __attribute__((reqd_work_group_size(SK_WG, 1, 1)))
void gemm_skinny(__global const DL_T* A, DL_B_PTR B, __global const DL_T* bias,
                 __global DL_T* C, int N, int K, int a_sm, int b_sn, int ldc,
                 int has_bias, int a_base, int c_base, int b_base DL_WQ_PARAMS) {
  A += a_base;
  B += b_base;
  C += c_base;
  DL_WQ_AT_BASE;
  __local float red[SK_WG][SK_M * SK_NC + 1];
  const int t = get_local_id(0);
  const int n0 = get_group_id(0) * SK_NC;
  float acc[SK_M][SK_NC];
#pragma unroll
  for (int m = 0; m < SK_M; ++m) {
#pragma unroll
    for (int c = 0; c < SK_NC; ++c) acc[m][c] = 0.0f;
  }
  for (int k = 4 * t; k < K; k += 4 * SK_WG) {
    float4 a[SK_M];
#pragma unroll
    for (int m = 0; m < SK_M; ++m) a[m] = DL_LOAD4A(A, m * a_sm + k);
#pragma unroll
    for (int c = 0; c < SK_NC; ++c) {
      if (n0 + c < N) {
#if DL_WQ
        const float4 b = DL_WQ_FROM_RAW4(DL_WQ_LOAD4_RAW(B, (n0 + c) * K + k)) *
                         DL_WQ_SCALE(n0 + c, k);
#else
        const float4 b = DL_LOAD4A(B, (n0 + c) * b_sn + k);
#endif
#pragma unroll
        for (int m = 0; m < SK_M; ++m) acc[m][c] += dot(a[m], b);
      }
    }
  }
#pragma unroll
  for (int m = 0; m < SK_M; ++m) {
#pragma unroll
    for (int c = 0; c < SK_NC; ++c) red[t][m * SK_NC + c] = acc[m][c];
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int s = SK_WG / 2; s > 0; s >>= 1) {
    if (t < s) {
      for (int e = 0; e < SK_M * SK_NC; ++e) red[t][e] += red[t + s][e];
    }
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (t < SK_M * SK_NC) {
    const int m = t / SK_NC, n = n0 + t % SK_NC;
    if (n < N) DL_STORE(C, m * ldc + n, red[0][t] + (has_bias ? DL_LOAD(bias, n) : 0.0f) + GEMM_PRIOR(C, m * ldc + n));
  }
}
#endif  // SK_M
