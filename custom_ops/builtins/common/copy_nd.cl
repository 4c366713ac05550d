// Strided copy over an index space of up to 8 dims (dims outermost first,
// padded with 1): element i, decomposed over `dims`, is read at
// src_off + sum(c_k * sstr_k) and written at dst_off + sum(c_k * dstr_k).
// COPY_T is the element's bit type (uint or ushort, or a vector of them: the
// host then counts dims, strides and offsets in vectors): the op never looks
// at values, so one program serves float, half and int32 tensors. Strides may
// be negative (reversed slices) or zero (broadcast).
#include "nd_index.cl"
#ifndef COPY_T
#define COPY_T uint
#endif

__kernel void copy_nd(__global const COPY_T* src, int src_off, __global COPY_T* dst,
                      int dst_off, int n, int rank, int8 dims_v, int8 sstr_v,
                      int8 dstr_v) {
  const int i = get_global_id(0);
  if (i >= n) return;
  const int2 o = nd_offsets(i, rank, dims_v, sstr_v, dstr_v);
  dst[dst_off + o.y] = src[src_off + o.x];
}

#ifndef COPY_VECTOR  // copy_rows moves scalars in vload16s
// Rows variant: the innermost dim (`inner` elements) is contiguous in both
// source and destination; an item copies 16 of them (CPU-like devices).
__kernel void copy_rows(__global const COPY_T* src, int src_off, __global COPY_T* dst,
                        int dst_off, int inner, int chunks, int n_items, int rank, int8 dims_v,
                        int8 sstr_v, int8 dstr_v) {
  const int item = get_global_id(0);
  if (item >= n_items) return;
  const int row = item / chunks;
  const int c0 = (item - row * chunks) * 16;
  const int2 o = nd_offsets(row, rank, dims_v, sstr_v, dstr_v);
  const int so = src_off + c0 + o.x, d = dst_off + c0 + o.y;
  if (c0 + 16 <= inner) {
    vstore16(vload16(0, src + so), 0, dst + d);
  } else {
    for (int j = 0; j < inner - c0; ++j) dst[d + j] = src[so + j];
  }
}
#endif  // COPY_VECTOR
