// The storage types every difflite op kernel is written in: DL_T (float or half) and DL_T4, its
// 4-vector; the runtime passes both (-DDL_T=...), the defaults are for standalone builds.
#if defined(cl_khr_fp16)
#pragma OPENCL EXTENSION cl_khr_fp16 : enable
#endif
#ifndef DL_T
#define DL_T float
#endif
#ifndef DL_T4
#define DL_T4 float4
#endif
