// Quantized weights, read by the GEMM-style kernels (gemm.cl, conv.cl) where the host builds
// them with -DDL_WQ=8 (int8) or -DDL_WQ=4 (int4, two a byte, the even element in the low
// nibble, each sign-extended from 4 bits). The weight is W[N][K], k contiguous, and
//   W(n, k) = q(n*K + k) * wq_scale[n*wq_kg + (k >> wq_shift)]
// per tensor: wq_kg 0, wq_shift 31; per output channel: 1, 31; blocks of 2^s along k: K >> s, s.
// The scales are float, or half with -DDL_WQ_HALF_SCALES=1 (int4 blocks stored float16).
// The flat kernels read the copy packed [K][NP] as int8 (int4 widened to a byte) with its
// scales packed [KB][NP] (row k >> wq_shift; wq_kg then carries NP).
// Values are dequantized in registers, where a tile is staged: the integers are loaded raw
// (DL_WQ_RAW, DL_WQ_RAW4) and converted later, as dl_storage.cl's DL_RAW, so the prefetch
// does not wait on its loads.
#ifndef DL_QWEIGHTS_CL
#define DL_QWEIGHTS_CL
#ifndef DL_WQ
#define DL_WQ 0
#endif
#if DL_WQ && DL_WQ_HALF_SCALES
// int4 blocks' float16 scales as the model stores them (vload_half needs no cl_khr_fp16)
#define DL_WQ_SCALE_PTR __global const half*
#define DL_WQ_SCALE_AT(i) vload_half((i), wq_scale)
#elif DL_WQ
#define DL_WQ_SCALE_PTR __global const float*
#define DL_WQ_SCALE_AT(i) wq_scale[i]
#endif
#if DL_WQ
#define DL_WQ_PARAMS , DL_WQ_SCALE_PTR wq_scale, int wq_kg, int wq_shift, int wq_base
#define DL_WQ_SCALE(n, k) DL_WQ_SCALE_AT((n) * wq_kg + ((k) >> wq_shift))
#endif
// A weight need not start its buffer: the backend may place it in a weight slab shared with other
// weights (GpuTensor::offset). A kernel that reads one takes its start (w_base or b_base, in
// elements of its pointer) and moves the pointer there first; DL_WQ_AT_BASE does the same for
// the scales (wq_base, in scales).
#if DL_WQ
#define DL_WQ_AT_BASE (wq_scale += wq_base)
#else
#define DL_WQ_AT_BASE ((void)0)
#endif
#if DL_WQ == 8
#define DL_WQ_PTR __global const char*
#define DL_WQ_RAW char
#define DL_WQ_RAW4 char4
// Element e, and aligned elements e .. e+3 (e % 4 == 0).
#define DL_WQ_LOAD_RAW(p, e) ((p)[e])
#define DL_WQ_LOAD4_RAW(p, e) (*(__global const char4*)((p) + (e)))
#define DL_WQ_FROM_RAW(r, e) ((float)(r))
#define DL_WQ_FROM_RAW4(r) convert_float4(r)
#elif DL_WQ == 4
#define DL_WQ_PTR __global const uchar*
#define DL_WQ_RAW uchar
#define DL_WQ_RAW4 ushort
#define DL_WQ_LOAD_RAW(p, e) ((p)[(e) >> 1])
#define DL_WQ_LOAD4_RAW(p, e) (*(__global const ushort*)((p) + ((e) >> 1)))
// The byte's low nibble for even e, high nibble for odd e: shifted to the top of a signed
// char, then arithmetically back down, which sign-extends it.
inline float dl_wq_nibble(uchar b, int high) {
  return (float)(as_char((uchar)(high ? b : (uchar)(b << 4))) >> 4);
}
#define DL_WQ_FROM_RAW(r, e) dl_wq_nibble((r), (e) & 1)
// Four nibbles in a little-endian ushort: elements e .. e+3 low to high.
inline float4 dl_wq_from_raw4(ushort r) {
  const uchar lo = (uchar)(r & 0xFF), hi = (uchar)(r >> 8);
  return (float4)(dl_wq_nibble(lo, 0), dl_wq_nibble(lo, 1), dl_wq_nibble(hi, 0),
                  dl_wq_nibble(hi, 1));
}
#define DL_WQ_FROM_RAW4(r) dl_wq_from_raw4(r)
#endif
#endif  // DL_QWEIGHTS_CL
