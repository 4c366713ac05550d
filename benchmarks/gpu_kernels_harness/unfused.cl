// Unfused baselines for benchmarks/gpu_ablation.py: the computations of the
// fused difflite kernels written as separate kernels, one per graph operator,
// each reading and writing whole tensors, as an engine without the fused ops
// would run them. Each kernel is written plainly but not handicapped: the
// elementwise ones are coalesced, the group reduction splits over work-groups
// like the fused one, the attention's matrix products are the backend's own
// GEMM (gemm.cl, through launch.py) and the Winograd case's baseline is the
// backend's direct convolution (conv.cl).
// float storage (fp32), float math.

#define EW_GUARD(n) const int i = get_global_id(0); if (i >= (n)) return

// ---------------------------------------------------------------- copy
// The ceiling for a kernel that reads and writes n4 float4s once: the
// ablation times it at each case's byte count.
__kernel void un_copy4(__global const float4* x, __global float4* y, int n4) {
  EW_GUARD(n4);
  y[i] = x[i];
}

// ---------------------------------------------------------------- elementwise
__kernel void un_square(__global const float* x, __global float* y, int n) {
  EW_GUARD(n);
  const float v = x[i];
  y[i] = v * v;
}
__kernel void un_mul(__global const float* a, __global const float* b, __global float* y, int n) {
  EW_GUARD(n);
  y[i] = a[i] * b[i];
}
__kernel void un_scale(__global const float* x, __global float* y, int n, float s) {
  EW_GUARD(n);
  y[i] = x[i] * s;
}
__kernel void un_add_scalar(__global const float* x, __global float* y, int n, float s) {
  EW_GUARD(n);
  y[i] = x[i] + s;
}
__kernel void un_erf(__global const float* x, __global float* y, int n) {
  EW_GUARD(n);
  y[i] = erf(x[i]);
}
__kernel void un_sigmoid(__global const float* x, __global float* y, int n) {
  EW_GUARD(n);
  y[i] = 1.0f / (1.0f + exp(-x[i]));
}
// Broadcast over the last dimension C: y = x (op) v[c].
__kernel void un_mul_channel(__global const float* x, __global const float* v, __global float* y,
                             int n, int C) {
  EW_GUARD(n);
  y[i] = x[i] * v[i % C];
}
__kernel void un_add_channel(__global const float* x, __global const float* v, __global float* y,
                             int n, int C) {
  EW_GUARD(n);
  y[i] = x[i] + v[i % C];
}
// Broadcast of a per-(sample, group) value over [N, S, C]: y = x (op) g[n, c / cg].
__kernel void un_sub_group(__global const float* x, __global const float* g, __global float* y,
                           int n, int S, int C, int cg, int groups) {
  EW_GUARD(n);
  const int row = i / C;
  y[i] = x[i] - g[(row / S) * groups + (i - row * C) / cg];
}
__kernel void un_mul_group(__global const float* x, __global const float* g, __global float* y,
                           int n, int S, int C, int cg, int groups) {
  EW_GUARD(n);
  const int row = i / C;
  y[i] = x[i] * g[(row / S) * groups + (i - row * C) / cg];
}
// y = rsqrt(x + eps) on the small [N, groups] tensor.
__kernel void un_add_eps_rsqrt(__global const float* x, __global float* y, int n, float eps) {
  EW_GUARD(n);
  y[i] = rsqrt(x[i] + eps);
}
// y[r, c] = x[r, off + c] for c < D (x rows of width Dx): a slice along the last axis.
__kernel void un_slice_last(__global const float* x, __global float* y, int rows, int Dx, int off,
                            int D) {
  EW_GUARD(rows * D);
  const int r = i / D;
  y[i] = x[r * Dx + off + (i - r * D)];
}

// ------------------------------------------------------- group mean (reduce)
#define UN_WG 256
// Global (UN_WG * groups, splits, N), local (UN_WG): partial sums of one
// group over a slice of rows.
__kernel void un_group_sum_partial(__global const float* x, __global float* partial, int S, int C,
                                   int cg, int splits) {
  __local float acc[UN_WG];
  const int lid = get_local_id(0);
  const int g = get_group_id(0);
  const int groups = get_num_groups(0);
  const int sp = get_global_id(1);
  const int n = get_global_id(2);
  const int rows_per = (S + splits - 1) / splits;
  const int s0 = min(S, sp * rows_per);
  const int s1 = min(S, s0 + rows_per);
  const int total = (s1 - s0) * cg;
  __global const float* base = x + ((long)n * S + s0) * C + g * cg;
  float sum = 0.0f;
  int s = lid / cg, k = lid - (lid / cg) * cg;  // (row, channel) of element e, stepped
  const int ds = UN_WG / cg, dk = UN_WG - (UN_WG / cg) * cg;
  for (int e = lid; e < total; e += UN_WG) {
    sum += base[(long)s * C + k];
    k += dk;
    s += ds;
    if (k >= cg) { k -= cg; s += 1; }
  }
  acc[lid] = sum;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int h = UN_WG / 2; h > 0; h >>= 1) {
    if (lid < h) acc[lid] += acc[lid + h];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  if (lid == 0) partial[((long)n * groups + g) * splits + sp] = acc[0];
}
// mean[ng] = sum of the partials / count.
__kernel void un_group_mean_final(__global const float* partial, __global float* mean, int count,
                                  int splits, float inv_elems) {
  EW_GUARD(count);
  float s = 0.0f;
  for (int p = 0; p < splits; ++p) s += partial[(long)i * splits + p];
  mean[i] = s * inv_elems;
}

// ------------------------------------------------------------------- softmax
// One work-group of UN_WG per row of `cols`: max, sum of exp, write.
// TFLite SOFTMAX with beta: p = softmax(beta * s) along rows.
__kernel void un_softmax_rows(__global const float* s, __global float* p, int cols, float beta) {
  __local float red[UN_WG];
  const int lid = get_local_id(0);
  const long row = get_group_id(0);
  __global const float* in = s + row * cols;
  __global float* out = p + row * cols;
  float m = -INFINITY;
  for (int j = lid; j < cols; j += UN_WG) m = fmax(m, in[j]);
  red[lid] = m;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int h = UN_WG / 2; h > 0; h >>= 1) {
    if (lid < h) red[lid] = fmax(red[lid], red[lid + h]);
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  m = red[0];
  barrier(CLK_LOCAL_MEM_FENCE);
  float sum = 0.0f;
  for (int j = lid; j < cols; j += UN_WG) sum += exp(beta * (in[j] - m));
  red[lid] = sum;
  barrier(CLK_LOCAL_MEM_FENCE);
  for (int h = UN_WG / 2; h > 0; h >>= 1) {
    if (lid < h) red[lid] += red[lid + h];
    barrier(CLK_LOCAL_MEM_FENCE);
  }
  const float inv = 1.0f / red[0];
  for (int j = lid; j < cols; j += UN_WG) out[j] = exp(beta * (in[j] - m)) * inv;
}

// [N, H, L, D] -> [N, L, H, D] (the TRANSPOSE after the per-head BATCH_MATMUL).
__kernel void un_heads_to_rows(__global const float* t, __global float* o, int L, int H, int D, int total) {
  EW_GUARD(total);
  const int d = i % D;
  int r = i / D;
  const int h = r % H;
  r /= H;
  const int l = r % L;
  const int n = r / L;
  o[i] = t[(((long)n * H + h) * L + l) * D + d];
}


