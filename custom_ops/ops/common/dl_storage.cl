// The storage types every difflite op kernel is written in: DL_T (float or half) and DL_T4, its
// 4-vector; the runtime passes both (-DDL_T=...), the defaults are for standalone builds.
// Kernels read and write DL_T memory through DL_LOAD* / DL_STORE* (values in float): plain
// accesses for float, and for half where the device has cl_khr_fp16. With DL_HALF_IO (half
// storage on a device without cl_khr_fp16) they are core OpenCL 1.2's vload_half* /
// vstore_half*, which need no half arithmetic: `half` then only names buffers.
//   DL_LOAD(p, i), DL_STORE(p, i, v)      element i
//   DL_LOAD4(p, i), DL_STORE4(p, i, v)    elements i .. i+3, any i (vload4 / vstore4)
//   DL_LOAD16(p, i), DL_STORE16(p, i, v)  elements i .. i+15, any i (vload16 / vstore16)
//   DL_LOAD2A, DL_LOAD4A, DL_STORE2A, DL_STORE4A: elements i .. i+1 or i+3 where p + i is
//   aligned to the vector (i a multiple of 2 or 4, buffers aligned): through a vector pointer,
//   which tells the compiler so: one wide access, where vload4 / vload_half4 may become 4
//   narrow ones.
#ifndef DL_STORAGE_CL
#define DL_STORAGE_CL
#if defined(cl_khr_fp16)
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
#endif
#ifndef DL_T
#define DL_T float
#endif
#ifndef DL_T4
#define DL_T4 float4
#endif
#define DL_CAT_(a, b) a##b
#define DL_CAT(a, b) DL_CAT_(a, b)
#define DL_T2 DL_CAT(DL_T, 2)
#define DL_T16 DL_CAT(DL_T, 16)
#ifdef DL_HALF_IO
#define DL_LOAD(p, i) vload_half((i), (p))
#define DL_STORE(p, i, v) vstore_half((v), (i), (p))
#define DL_LOAD4(p, i) vload_half4(0, (p) + (i))
#define DL_STORE4(p, i, v) vstore_half4((v), 0, (p) + (i))
#define DL_LOAD16(p, i) vload_half16(0, (p) + (i))
#define DL_STORE16(p, i, v) vstore_half16((v), 0, (p) + (i))
// The aligned forms move the bits as one ushort2 / ushort4 and convert them in
// a private variable: NVIDIA compiles vloada_half4 / vstorea_half4 on global
// memory to four 2-byte accesses.
#define DL_LOAD2A(p, i) dl_load2a_half((p) + (i))
#define DL_LOAD4A(p, i) dl_load4a_half((p) + (i))
#define DL_STORE2A(p, i, v) dl_store2a_half((p) + (i), (v))
#define DL_STORE4A(p, i, v) dl_store4a_half((p) + (i), (v))
inline float2 dl_load2a_half(__global const half* p) {
  const ushort2 bits = *(__global const ushort2*)p;
  return vload_half2(0, (__private const half*)&bits);
}
inline float4 dl_load4a_half(__global const half* p) {
  const ushort4 bits = *(__global const ushort4*)p;
  return vload_half4(0, (__private const half*)&bits);
}
inline void dl_store2a_half(__global half* p, float2 v) {
  ushort2 bits;
  vstore_half2(v, 0, (__private half*)&bits);
  *(__global ushort2*)p = bits;
}
inline void dl_store4a_half(__global half* p, float4 v) {
  ushort4 bits;
  vstore_half4(v, 0, (__private half*)&bits);
  *(__global ushort4*)p = bits;
}
#else
#define DL_LOAD(p, i) ((float)(p)[i])
#define DL_STORE(p, i, v) ((p)[i] = (DL_T)(v))
#define DL_LOAD4(p, i) convert_float4(vload4(0, (p) + (i)))
#define DL_LOAD16(p, i) convert_float16(vload16(0, (p) + (i)))
#ifdef DL_FP16
// Half's bits are stored as ushortN (p a __global half*): the same store, but PoCL's CUDA kernel
// library (6.0) has no vstore4 / vstore16 of half, and NVIDIA's PTX JIT refuses the call left to
// the missing function (cuModuleLoad fails).
#define DL_STORE4(p, i, v) vstore4(as_ushort4(convert_half4(v)), 0, (__global ushort*)((p) + (i)))
#define DL_STORE16(p, i, v) \
  vstore16(as_ushort16(convert_half16(v)), 0, (__global ushort*)((p) + (i)))
#else
#define DL_STORE4(p, i, v) vstore4(DL_CAT(convert_, DL_T4)(v), 0, (p) + (i))
#define DL_STORE16(p, i, v) vstore16(DL_CAT(convert_, DL_T16)(v), 0, (p) + (i))
#endif
#define DL_LOAD2A(p, i) convert_float2(*(__global const DL_T2*)((p) + (i)))
#define DL_LOAD4A(p, i) convert_float4(*(__global const DL_T4*)((p) + (i)))
#define DL_STORE2A(p, i, v) (*(__global DL_T2*)((p) + (i)) = DL_CAT(convert_, DL_T2)(v))
#define DL_STORE4A(p, i, v) (*(__global DL_T4*)((p) + (i)) = DL_CAT(convert_, DL_T4)(v))
#endif

// Prefetching into registers: DL_RAW / DL_RAW4 hold elements as stored (the
// bits, as ushort, with DL_HALF_IO), so a kernel can issue its loads early and
// convert only where it uses the values. A vload_half's conversion sits right
// after its load and waits for it there: the GEMMs' prefetch across a slice's
// multiply-adds then stalls (0.70x of float storage on the H100).
//   DL_LOAD_RAW(p, i), DL_LOAD4A_RAW(p, i)  element i, aligned elements i .. i+3
//   DL_FROM_RAW(r), DL_FROM_RAW4(r)         their values in float (r an lvalue)
#ifdef DL_HALF_IO
#define DL_RAW ushort
#define DL_RAW4 ushort4
#define DL_LOAD_RAW(p, i) (((__global const ushort*)(p))[i])
#define DL_LOAD4A_RAW(p, i) (*(__global const ushort4*)((p) + (i)))
#define DL_FROM_RAW(r) vload_half(0, (__private const half*)&(r))
#define DL_FROM_RAW4(r) vload_half4(0, (__private const half*)&(r))
#else
#define DL_RAW DL_T
#define DL_RAW4 DL_T4
#define DL_LOAD_RAW(p, i) ((p)[i])
#define DL_LOAD4A_RAW(p, i) (*(__global const DL_T4*)((p) + (i)))
#define DL_FROM_RAW(r) ((float)(r))
#define DL_FROM_RAW4(r) convert_float4(r)
#endif

// The multiply-add type of the GEMM tiles (vec_tile.cl) and the attention
// kernels' products: DL_C, DL_C4. With
// DL_FP16_MATH (precision=fp16 on a device with cl_khr_fp16, unless the
// delegate's math=fp32) it is half, which mobile GPUs run at twice float's
// rate, and the tiles in local memory take half the bytes; float otherwise.
// DL_TO_C / DL_TO_C4 convert a float value into it.
#ifdef DL_FP16_MATH
#ifndef DL_FP16
#error "DL_FP16_MATH needs DL_FP16 (half storage with cl_khr_fp16)"
#endif
#define DL_C half
#define DL_C4 half4
#define DL_TO_C(v) ((half)(v))
#define DL_TO_C4(v) convert_half4(v)
// A short run of products is summed in half partial sums, then carried into
// float accumulators: the rounding error of a half sum grows with its length,
// so it stays bounded by the run's, not by the whole reduction's.
//   DL_HALF_PARTS(part, R, C)        declares half4 part[R][C], all zero
//   DL_CARRY_PARTS(acc, part, R, C)  acc[i][j] += part[i][j] (float4 acc)
#define DL_HALF_PARTS(part, R, C)                                  \
  half4 part[R][C];                                                \
  _Pragma("unroll") for (int i_ = 0; i_ < (R); ++i_) {             \
    _Pragma("unroll") for (int j_ = 0; j_ < (C); ++j_) {           \
      part[i_][j_] = (half4)(0.0h);                                \
    }                                                              \
  }
#define DL_CARRY_PARTS(acc, part, R, C)                            \
  _Pragma("unroll") for (int i_ = 0; i_ < (R); ++i_) {             \
    _Pragma("unroll") for (int j_ = 0; j_ < (C); ++j_) {           \
      acc[i_][j_] += convert_float4(part[i_][j_]);                 \
    }                                                              \
  }
#else
#define DL_C float
#define DL_C4 float4
#define DL_TO_C(v) ((float)(v))
#define DL_TO_C4(v) (v)
#endif
#endif  // DL_STORAGE_CL
