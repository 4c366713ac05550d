// The CPU backend's GEMM over a weight held quantized (issue 21): Y[M][N] = act(A[M][K] W[N][K]^T
// + bias), W read as the model stores it (int8, or int4 two a byte), dequantized a tile at a time
// into a small buffer of the thread that uses it, never as a whole. A is float32: the rows of a
// FULLY_CONNECTED's input, or the patches of a CONV_2D's input (an implicit im2col, gathered a few
// rows at a time). Used by fully_connected.cc and conv_2d.cc.
#ifndef DIFFLITE_CPU_BUILTINS_QGEMM_H_
#define DIFFLITE_CPU_BUILTINS_QGEMM_H_

#include <cstdint>
#include <string>

namespace difflite {
namespace cpu {

// W[N][K] (k contiguous: FULLY_CONNECTED's [N, K]; CONV_2D's OHWI filter as [Cout, KH*KW*Cin])
// as the model stores it: `bits` 8 (int8 values) or 4 (two a byte, the element at an even flat
// index in the low nibble, each sign-extended from 4 bits), zero points 0, and one scale for each
// run of `group` consecutive elements of the flat N*K values: group N*K (per tensor), K (per
// output channel), or a block of the row (int4 blockwise). W(n, k) = q(n*K + k) *
// scale[(n*K + k) / group], one float rounding, as TFLite's DEQUANTIZE (and its MUL by block
// scales) compute it. Every pointer is into the model and outlives the op.
struct QuantWeight {
  int bits = 0;
  const uint8_t* values = nullptr;
  const void* scales = nullptr;  // float32, or float16 where scales_f16
  bool scales_f16 = false;
  int64_t scale_count = 0;
  int64_t group = 0;
  int64_t n = 0;
  int64_t k = 0;

  // "" if the fields agree (sizes, a group that divides K or is a whole number of rows);
  // else a one-line reason.
  std::string Check() const;
  // "int8 [N, K], 1 scale per K" for logs.
  std::string Describe() const;
};

// The fused activation of TFLite's FULLY_CONNECTED and CONV_2D, as a clamp.
struct Clamp {
  float lo;
  float hi;
};

// A[M][K]: the rows of `x` (stride K), or, for a convolution, the patches of an NHWC input: row
// m = (b, oy, ox), column k = (ky, kx, c), zero outside the input.
struct ConvShape {
  int batch = 0, ih = 0, iw = 0, cin = 0;
  int oh = 0, ow = 0, kh = 0, kw = 0;
  int sh = 1, sw = 1, dh = 1, dw = 1;
  int pad_top = 0, pad_left = 0;
  // true where the patches are the input's own rows (1x1, stride 1, no padding)
  bool Direct() const {
    return kh == 1 && kw == 1 && sh == 1 && sw == 1 && pad_top == 0 && pad_left == 0 &&
           oh == ih && ow == iw;
  }
};

struct GemmA {
  const float* x = nullptr;
  int64_t m = 0;
  const ConvShape* conv = nullptr;  // null: rows of x
};

// y[M][N] = clamp(A W^T + bias) on up to `num_threads` threads. `bias`: N floats or null.
void QuantizedGemm(const QuantWeight& w, const GemmA& a, const float* bias, Clamp clamp, float* y,
                   int num_threads);

// out[i][0..K) = W(rows[i], 0..K) for i < count (a GATHER of the weight's rows). false, with
// *bad the first offending position, where an index is outside [0, N) (nothing is read there).
bool DequantizeRows(const QuantWeight& w, const int32_t* rows, int64_t count, float* out,
                    int num_threads, int64_t* bad);

}  // namespace cpu
}  // namespace difflite

#endif  // DIFFLITE_CPU_BUILTINS_QGEMM_H_
