// The tensor-core tile machinery shared by gemm.cl's GEMM (gemm_mma.cl) and conv.cl's implicit
// GEMM (-DMMA=1, with -DVEC=1): each K slice of a TM x TN tile is multiplied by PTX's
// mma.sync.m16n8k16 (half operands, float accumulators), issued by inline assembly, which
// NVIDIA's OpenCL compiler passes to ptxas, or emulated in OpenCL C (-DMMA_EMULATE=1, below),
// which builds anywhere: how tests check the tiles without the hardware. Only for half storage
// (DL_HALF_IO or DL_FP16): the staged operands are the stored half bits, so nothing is rounded
// that was not already.
//
// The work-group's NT items are NT / 32 warps, in MMA_WARPS_M x 2; each warp owns an
// MMA_WTM x MMA_WTN block of the TM x TN tile: MMA_MI x MMA_NI fragments of 16 x 8 outputs,
// four floats a lane each. The slices are staged in local memory as half bits: A as [m][k]
// and a k-major B as [n][k], the fragments' order (a lane's operands are 32-bit reads of two
// neighbouring k; rows padded to MMA_LD = TK + 8 halves so that the eight row groups of a
// fragment read fall in distinct banks), an n-major B as [k][n] (MMA_B_AT).
//
// A kernel declares its slices with MMA_TILE_LOCALS (`as`, `bs`: two buffers each; `mma_x`
// under MMA_EMULATE) and its item with MMA_ITEM_AND_ACC(tid) (the warp block wm0, wn0, the lane
// g, t = lane / 4, lane % 4, and `acc`), stages each slice at MMA_A_AT / MMA_B_AT, multiplies it
// with MMA_SLICE and stores with MMA_STORE_TILE, which reads its m0, n0, M, N, bias and has_bias.
#if !defined(DL_HALF_IO) && !defined(DL_FP16)
#error "mma_tile.cl needs half storage"
#endif
#if TK % 16 != 0
#error "mma_tile.cl needs TK a multiple of 16"
#endif
#define MMA_WARPS (NT / 32)
#define MMA_WARPS_N 2
#define MMA_WARPS_M (MMA_WARPS / MMA_WARPS_N)
#define MMA_WTM (TM / MMA_WARPS_M)
#define MMA_WTN (TN / MMA_WARPS_N)
#define MMA_MI (MMA_WTM / 16)
#define MMA_NI (MMA_WTN / 8)
#define MMA_LD (TK + 8)
#ifndef MMA_EMULATE
#define MMA_EMULATE 0
#endif
// The fragment loops are unrolled so that the accumulators stay registers; the emulation keeps
// them rolled (a CPU compiler spends minutes on the unrolled emulation).
#if MMA_EMULATE
#define MMA_UNROLL _Pragma("unroll 1")
#else
#define MMA_UNROLL _Pragma("unroll")
#endif

// The stored bits of a raw element or quad (dl_storage.cl's DL_RAW).
#ifdef DL_HALF_IO
#define MMA_BITS(r) (r)
#define MMA_BITS4(r) (r)
#else
#define MMA_BITS(r) as_ushort(r)
#define MMA_BITS4(r) as_ushort4(r)
#endif

// A float rounded to half bits (a dequantized weight element).
inline ushort mma_half_bits(float v) {
  ushort bits;
  vstore_half_rte(v, 0, (__private half*)&bits);
  return bits;
}

// A float quad rounded to half bits (a dequantized weight quad).
inline ushort4 mma_half_bits4(float4 v) {
  ushort4 bits;
  vstore_half4_rte(v, 0, (__private half*)&bits);
  return bits;
}

// Element (row, k) of buffer buf of A, staged [m][k].
#define MMA_A_AT(buf, row, k) (as + ((buf) * TM + (row)) * MMA_LD + (k))
// Element (n, k) of buffer buf of B: staged [n][k] where B is k-major (a weight [N][K]), else
// [k][n] as stored (the Winograd GEMMs' U): transposing an n-major B while staging it wrote
// rows 4 apart from neighbouring items, 16 of a warp's stores to one bank. Its fragments are
// then two 16-bit reads a register, which fall in distinct banks with rows of TN + 8 halves.
#if B_KMAJOR
#define MMA_B_AT(buf, n, k) (bs + ((buf) * TN + (n)) * MMA_LD + (k))
#define MMA_B_HALVES (2 * TN * MMA_LD)
#else
#define MMA_LDN (TN + 8)
#define MMA_B_AT(buf, n, k) (bs + ((buf) * TK + (k)) * MMA_LDN + (n))
#define MMA_B_HALVES (2 * TK * MMA_LDN)
#endif

// d (4 floats) += a (16 x 16 halves, 4 registers) * b (16 x 8, 2 registers).
#if !MMA_EMULATE
// NVIDIA's OpenCL compiler takes `asm` (checked on the H200); clang's OpenCL C only the GNU
// spelling: PoCL's CUDA driver (clang targeting NVPTX, __NVPTX__, with PoCL's own
// POCL_DEVICE_ADDRESS_BITS) gets `__asm__`. Elsewhere (PoCL's CPU device) `asm` stays a
// front-end error, a failed build, where an x86 assembler refusing the instruction would abort
// the process.
#if defined(__NVPTX__) && defined(POCL_DEVICE_ADDRESS_BITS)
#define MMA_ASM __asm__
#else
#define MMA_ASM asm
#endif
#define MMA_16816(d, a, b)                                                                 \
  MMA_ASM volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "                    \
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"                     \
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])                            \
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]))
#else
// -DMMA_EMULATE=1 (DIFFLITE_TENSOR_CORES=emulate, for tests on any OpenCL device): the same
// instruction in plain OpenCL C, the lanes of a warp trading fragments through local memory
// (`mma_x`, MMA_XW floats a warp), so the tile's indexing can be checked where no tensor core
// is. Every item of the work-group calls it together (uniform control flow), so it can
// use the work-group barrier.
#define MMA_XW (16 * 16 + 16 * 8)
inline float mma_half(uint bits, int hi) {
  const ushort h = (ushort)(hi ? bits >> 16 : bits & 0xffff);
  return vload_half(0, (__private const half*)&h);
}
inline void mma_emulate(float* d, const uint* a, const uint* b, __local float* x, int lane) {
  const int g = lane >> 2, t = lane & 3;
  __local float* xa = x;            // A [16][16]
  __local float* xb = x + 16 * 16;  // B [16 k][8 n]
  for (int h = 0; h < 2; ++h) {
    xa[g * 16 + 2 * t + h] = mma_half(a[0], h);
    xa[(g + 8) * 16 + 2 * t + h] = mma_half(a[1], h);
    xa[g * 16 + 2 * t + 8 + h] = mma_half(a[2], h);
    xa[(g + 8) * 16 + 2 * t + 8 + h] = mma_half(a[3], h);
    xb[(2 * t + h) * 8 + g] = mma_half(b[0], h);
    xb[(2 * t + 8 + h) * 8 + g] = mma_half(b[1], h);
  }
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int c = 0; c < 4; ++c) {
    const int row = g + (c >> 1) * 8, col = 2 * t + (c & 1);
    float s = 0.0f;
    for (int k = 0; k < 16; ++k) s += xa[row * 16 + k] * xb[k * 8 + col];
    d[c] += s;
  }
  barrier(CLK_LOCAL_MEM_FENCE);
}
#define MMA_16816(d, a, b) mma_emulate(d, a, b, mma_x + (tid >> 5) * MMA_XW, tid & 31)
#endif

// B's registers for column n, k pairs (k, k + 1) and (k + 8, k + 9).
#if B_KMAJOR
#define MMA_B_FRAGMENT(r, cb, n, k)                                 \
  do {                                                              \
    __local const uint* q_ = (__local const uint*)MMA_B_AT(cb, n, k); \
    r[0] = q_[0];                                                   \
    r[1] = q_[4];                                                   \
  } while (0)
#else
#define MMA_B_FRAGMENT(r, cb, n, k)                                          \
  do {                                                                       \
    __local const ushort* q_ = MMA_B_AT(cb, n, k);                           \
    r[0] = (uint)q_[0] | ((uint)q_[MMA_LDN] << 16);                          \
    r[1] = (uint)q_[8 * MMA_LDN] | ((uint)q_[9 * MMA_LDN] << 16);            \
  } while (0)
#endif

// acc += the TK-deep slice in buffer cb. Lane (g, t) = (lane / 4, lane % 4) holds A's rows
// g and g + 8 at k pairs 2t and 2t + 8, and B's column g at the same k pairs.
#define MMA_SLICE(cb)                                                                        \
  MMA_UNROLL for (int ks_ = 0; ks_ < TK; ks_ += 16) {                                \
    uint a_[MMA_MI][4], b_[MMA_NI][2];                                                       \
    MMA_UNROLL for (int i_ = 0; i_ < MMA_MI; ++i_) {                                 \
      __local const uint* p_ = (__local const uint*)MMA_A_AT(cb, wm0 + i_ * 16 + g, ks_) + t; \
      a_[i_][0] = p_[0];                                                                     \
      a_[i_][1] = p_[4 * MMA_LD];                                                            \
      a_[i_][2] = p_[4];                                                                     \
      a_[i_][3] = p_[4 * MMA_LD + 4];                                                        \
    }                                                                                        \
    MMA_UNROLL for (int j_ = 0; j_ < MMA_NI; ++j_) {                                 \
      MMA_B_FRAGMENT(b_[j_], cb, wn0 + j_ * 8 + g, ks_ + 2 * t);                             \
    }                                                                                        \
    MMA_UNROLL for (int i_ = 0; i_ < MMA_MI; ++i_) {                                 \
      MMA_UNROLL for (int j_ = 0; j_ < MMA_NI; ++j_) MMA_16816(acc[i_][j_], a_[i_], b_[j_]); \
    }                                                                                        \
  }

// Two neighbouring outputs (m, n) and (m, n + 1) of C (+ bias) (+ C's values with GEMM_ACC),
// those inside M x N; one 2-vector store where `vec_c` says rows are aligned to 2 elements.
inline void mma_store2(__global DL_T* row, __global const DL_T* bias, int has_bias, int n, int N,
                       int vec_c, float v0, float v1) {
  float2 v = (float2)(v0, v1);
  if (vec_c && n + 2 <= N) {
    if (has_bias) v += DL_LOAD2A(bias, n);
    DL_STORE2A(row, n, GEMM_ACC ? v + DL_LOAD2A(row, n) : v);
    return;
  }
  for (int c = 0; c < 2 && n + c < N; ++c) {
    const float x = (c == 0 ? v.x : v.y) + (has_bias ? DL_LOAD(bias, n + c) : 0.0f);
    DL_STORE(row, n + c, x + GEMM_PRIOR(row, n + c));
  }
}


// The kernel's staged slices: `as` and `bs` (ushort4 arrays underneath: the staged quads are
// 8-byte stores, which need the 8-byte alignment a uint array would not promise; a misaligned
// shared-memory access faults on NVIDIA), and the emulation's `mma_x`.
#if MMA_EMULATE
#define MMA_EMULATION_LOCALS __local float mma_x[MMA_WARPS * MMA_XW]
#else
#define MMA_EMULATION_LOCALS
#endif
#define MMA_TILE_LOCALS                            \
  __local ushort4 As[2 * TM * MMA_LD / 4];         \
  __local ushort4 Bs[MMA_B_HALVES / 4];            \
  __local ushort* as = (__local ushort*)As;        \
  __local ushort* bs = (__local ushort*)Bs;        \
  MMA_EMULATION_LOCALS

// Item tid's warp block (wm0, wn0), its lane (g, t), and its accumulators, zeroed.
#define MMA_ITEM_AND_ACC(tid)                                               \
  const int g = ((tid) & 31) >> 2, t = (tid) & 3;                           \
  const int wm0 = (((tid) >> 5) / MMA_WARPS_N) * MMA_WTM;                   \
  const int wn0 = (((tid) >> 5) % MMA_WARPS_N) * MMA_WTN;                   \
  float acc[MMA_MI][MMA_NI][4];                                             \
  MMA_UNROLL for (int i_ = 0; i_ < MMA_MI; ++i_) {                          \
    MMA_UNROLL for (int j_ = 0; j_ < MMA_NI; ++j_) {                        \
      MMA_UNROLL for (int c_ = 0; c_ < 4; ++c_) acc[i_][j_][c_] = 0.0f;     \
    }                                                                       \
  }

// The item's outputs into Cb (rows of ldc elements; `vec_c`: rows aligned to 2 elements), + bias.
#define MMA_STORE_TILE(Cb, ldc, vec_c)                                                           \
  MMA_UNROLL for (int i_ = 0; i_ < MMA_MI; ++i_) {                                               \
    const int m_ = m0 + wm0 + i_ * 16 + g;                                                       \
    MMA_UNROLL for (int j_ = 0; j_ < MMA_NI; ++j_) {                                             \
      const int n_ = n0 + wn0 + j_ * 8 + 2 * t;                                                  \
      if (m_ < M) mma_store2((Cb) + m_ * (ldc), bias, has_bias, n_, N, vec_c, acc[i_][j_][0], acc[i_][j_][1]); \
      if (m_ + 8 < M) {                                                                          \
        mma_store2((Cb) + (m_ + 8) * (ldc), bias, has_bias, n_, N, vec_c, acc[i_][j_][2], acc[i_][j_][3]); \
      }                                                                                          \
    }                                                                                            \
  }
