// Offsets of element i of an index space of up to 8 collapsed dims (dims
// outermost first, `rank` of them used) in two tensors with their own strides
// (0 broadcasts): (sum c_k * s0_k, sum c_k * s1_k) for i's coordinates c_k.
#ifndef ND_INDEX_CL
#define ND_INDEX_CL
inline int2 nd_offsets(int i, int rank, int8 dims_v, int8 s0_v, int8 s1_v) {
  const int dims[8] = {dims_v.s0, dims_v.s1, dims_v.s2, dims_v.s3,
                       dims_v.s4, dims_v.s5, dims_v.s6, dims_v.s7};
  const int s0[8] = {s0_v.s0, s0_v.s1, s0_v.s2, s0_v.s3, s0_v.s4, s0_v.s5, s0_v.s6, s0_v.s7};
  const int s1[8] = {s1_v.s0, s1_v.s1, s1_v.s2, s1_v.s3, s1_v.s4, s1_v.s5, s1_v.s6, s1_v.s7};
  int r = i, o0 = 0, o1 = 0;
#pragma unroll
  for (int k = 7; k >= 0; --k) {
    if (k < rank) {
      const int q = r / dims[k];
      const int c = r - q * dims[k];
      r = q;
      o0 += c * s0[k];
      o1 += c * s1[k];
    }
  }
  return (int2)(o0, o1);
}
#endif  // ND_INDEX_CL
