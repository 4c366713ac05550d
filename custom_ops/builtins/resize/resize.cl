// RESIZE_NEAREST_NEIGHBOR and RESIZE_BILINEAR on NHWC tensors, with
// TFLite's coordinate rules (align_corners, half_pixel_centers). Coordinates
// are computed in float exactly as TFLite's reference kernels do, so no
// contraction into fma.
#include "dl_storage.cl"
#pragma OPENCL FP_CONTRACT OFF

inline int nearest_index(int o, int in_size, float scale, int align, int half_px) {
  const float offset = half_px ? 0.5f : 0.0f;
  const float v = ((float)o + offset) * scale;
  int r = align ? (int)round(v) : (int)floor(v);
  r = min(r, in_size - 1);
  if (half_px) r = max(0, r);
  return r;
}

// Output element i of an NHWC [.., oh, ow, c] tensor as (b, oy, ox, ch).
inline int4 output_pixel(int i, int c, int oh, int ow) {
  int t = i / c;
  const int ch = i - t * c;
  const int ox = t % ow;
  t /= ow;
  return (int4)(t / oh, t % oh, ox, ch);
}

__kernel void resize_nearest(__global const DL_T* x, __global DL_T* y, int n, int ih, int iw,
                             int c, int oh, int ow, float sh, float sw, int align, int half_px) {
  const int i = get_global_id(0);
  if (i >= n) return;
  const int4 o = output_pixel(i, c, oh, ow);
  const int b = o.x, oy = o.y, ox = o.z, ch = o.w;
  const int iy = nearest_index(oy, ih, sh, align, half_px);
  const int ix = nearest_index(ox, iw, sw, align, half_px);
  DL_STORE(y, i, DL_LOAD(x, ((b * ih + iy) * iw + ix) * c + ch));
}

inline void interp(int o, float scale, int half_px, int in_size, float* v, int* lo, int* hi) {
  float s;
  if (half_px) {
    s = ((float)o + 0.5f) * scale - 0.5f;
  } else {
    s = (float)o * scale;
  }
  *v = s;
  *lo = max((int)floor(s), 0);
  *hi = min((int)ceil(s), in_size - 1);
}

__kernel void resize_bilinear(__global const DL_T* x, __global DL_T* y, int n, int ih, int iw,
                              int c, int oh, int ow, float sh, float sw, int half_px) {
  const int i = get_global_id(0);
  if (i >= n) return;
  const int4 o = output_pixel(i, c, oh, ow);
  const int b = o.x, oy = o.y, ox = o.z, ch = o.w;
  float fy, fx;
  int y0, y1, x0, x1;
  interp(oy, sh, half_px, ih, &fy, &y0, &y1);
  interp(ox, sw, half_px, iw, &fx, &x0, &x1);
  const float dy = fy - (float)y0;
  const float dx = fx - (float)x0;
  const int row0 = (b * ih + y0) * iw;
  const int row1 = (b * ih + y1) * iw;
  const float v00 = DL_LOAD(x, (row0 + x0) * c + ch);
  const float v01 = DL_LOAD(x, (row0 + x1) * c + ch);
  const float v10 = DL_LOAD(x, (row1 + x0) * c + ch);
  const float v11 = DL_LOAD(x, (row1 + x1) * c + ch);
  const float r = v00 * (1.0f - dy) * (1.0f - dx) + v10 * dy * (1.0f - dx) +
                  v01 * (1.0f - dy) * dx + v11 * dy * dx;
  DL_STORE(y, i, r);
}
