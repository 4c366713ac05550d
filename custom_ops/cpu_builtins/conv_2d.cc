// CONV_2D with a quantized filter on the CPU backend, TFLite's semantics: x [B, H, W, Cin] (NHWC),
// filter [Cout, KH, KW, Cin] (OHWI), strides and dilations >= 1, SAME (pads total / 2 before) or
// VALID padding, optional bias [Cout], activations none, RELU, RELU_N1_TO_1, RELU6; y [B, OH, OW,
// Cout]. Grouped convolutions (filter channels < Cin) are not run. An implicit GEMM over the
// filter taps (qgemm.h): M = B*OH*OW, K = KH*KW*Cin, N = Cout.
#include <algorithm>
#include <string>

#include "cpu_builtins.h"
#include "difflite/tflite_abi.h"
#include "winograd_conv3x3/winograd_conv3x3.h"

namespace difflite {
namespace cpu {
namespace {

// Output size and leading pad of one spatial dim (TFLite's ComputeOutSize and padding); false
// for an unknown padding or an empty output.
bool Geometry(int padding, int64_t in, int64_t k, int64_t stride, int64_t dilation, int* out,
              int* pad) {
  const int64_t eff = (k - 1) * dilation + 1;
  int64_t o = 0;
  if (padding == tfl::kPaddingSame) {
    o = (in + stride - 1) / stride;
    *pad = static_cast<int>(std::max<int64_t>((o - 1) * stride + eff - in, 0) / 2);
  } else if (padding == tfl::kPaddingValid) {
    o = in >= eff ? (in - eff + stride) / stride : 0;
    *pad = 0;
  } else {
    return false;
  }
  if (o <= 0 || o > INT32_MAX) return false;
  *out = static_cast<int>(o);
  return true;
}

class QuantizedConv2d final : public OpInstance {
 public:
  QuantizedConv2d(const QuantWeight& w, const Shape& filter, const tfl::ConvParams& p, Clamp clamp)
      : w_(w), filter_(filter), p_(p), clamp_(clamp) {}

  std::string Infer(const std::vector<TensorInfo>& in, std::vector<TensorInfo>* out) const override {
    std::string e = CheckReaderInputs(in, "filter", filter_[0]);
    if (!e.empty()) return e;
    if (in[1].shape != filter_) {
      return "filter " + ShapeToString(in[1].shape) + " is not the quantized " + ShapeToString(filter_);
    }
    if (in[0].shape.size() != 4) return "input must be 4-D NHWC, got " + ShapeToString(in[0].shape);
    if (in[0].shape[3] != filter_[3]) {
      return "filter " + ShapeToString(filter_) + " does not match the input's " +
             std::to_string(in[0].shape[3]) + " channels (grouped convolutions are not run)";
    }
    ConvShape c;
    e = Shape4(in[0].shape, &c);
    if (!e.empty()) return e;
    out->assign(1, TensorInfo{DType::kFloat32, {c.batch, c.oh, c.ow, filter_[0]}, nullptr});
    return "";
  }

  std::string Run(const std::vector<InTensor>& in, const std::vector<OutTensor>& out,
                  const ExecOptions& exec) const override {
    ConvShape c;
    const std::string e = Shape4(in[0].shape, &c);
    if (!e.empty()) return e;
    const bool has_bias = in.size() == 3 && in[2].dtype == DType::kFloat32;
    if (in[0].data == nullptr || out[0].data == nullptr || (has_bias && in[2].data == nullptr)) {
      return "a tensor has no data";
    }
    GemmA a;
    a.x = static_cast<const float*>(in[0].data);
    a.m = static_cast<int64_t>(c.batch) * c.oh * c.ow;
    a.conv = &c;
    QuantizedGemm(w_, a, has_bias ? static_cast<const float*>(in[2].data) : nullptr, clamp_,
                  static_cast<float*>(out[0].data), exec.num_threads);
    return "";
  }

  std::string Describe() const override {
    return "filter=" + ShapeToString(filter_) + " " + w_.Describe() + ", padding=" +
           (p_.padding == tfl::kPaddingSame ? "same" : "valid") + ", stride=" +
           std::to_string(p_.stride_height) + "x" + std::to_string(p_.stride_width) + ", dilation=" +
           std::to_string(p_.dilation_height_factor) + "x" + std::to_string(p_.dilation_width_factor) +
           ", activation=" + ActivationName(p_.activation);
  }

 private:
  std::string Shape4(const Shape& x, ConvShape* c) const {
    c->batch = x[0];
    c->ih = x[1];
    c->iw = x[2];
    c->cin = x[3];
    c->kh = filter_[1];
    c->kw = filter_[2];
    c->sh = p_.stride_height;
    c->sw = p_.stride_width;
    c->dh = p_.dilation_height_factor;
    c->dw = p_.dilation_width_factor;
    if (!Geometry(p_.padding, c->ih, c->kh, c->sh, c->dh, &c->oh, &c->pad_top) ||
        !Geometry(p_.padding, c->iw, c->kw, c->sw, c->dw, &c->ow, &c->pad_left)) {
      return "input " + ShapeToString(x) + " gives an empty output for filter " + ShapeToString(filter_);
    }
    const int64_t rows = static_cast<int64_t>(c->batch) * c->oh * c->ow;
    if (rows * filter_[0] > INT32_MAX) return "the output has more than 2^31 - 1 elements";
    return "";
  }

  QuantWeight w_;
  Shape filter_;
  tfl::ConvParams p_;
  Clamp clamp_;
};

// `w`'s n and k set: the filter as [O, H*W*I].
std::unique_ptr<OpInstance> CreateQuantizedConv2d(const void* params, const QuantWeight& w,
                                                  const Shape& filter, std::string* why) {
  if (params == nullptr) {
    *why = "no parameters";
    return nullptr;
  }
  const tfl::ConvParams p = *static_cast<const tfl::ConvParams*>(params);
  if (p.padding != tfl::kPaddingSame && p.padding != tfl::kPaddingValid) {
    *why = "padding " + std::to_string(p.padding) + " (SAME and VALID are run)";
    return nullptr;
  }
  if (p.stride_width < 1 || p.stride_height < 1 || p.dilation_width_factor < 1 ||
      p.dilation_height_factor < 1) {
    *why = "strides and dilations must be >= 1";
    return nullptr;
  }
  Clamp clamp{};
  if (!ActivationClamp(p.activation, &clamp, why)) return nullptr;
  if (filter.size() != 4) {
    *why = "filter " + ShapeToString(filter) + " is not 4-D OHWI";
    return nullptr;
  }
  for (int d : filter) {
    if (d <= 0) {
      *why = "filter " + ShapeToString(filter) + " has an empty dimension";
      return nullptr;
    }
  }
  if (w.n != filter[0] || w.k != static_cast<int64_t>(filter[1]) * filter[2] * filter[3]) {
    *why = "quantized weight " + w.Describe() + " is not the filter " + ShapeToString(filter);
    return nullptr;
  }
  *why = w.Check();
  if (!why->empty()) return nullptr;
  return std::unique_ptr<OpInstance>(new QuantizedConv2d(w, filter, p, clamp));
}

// `filter`: the model shape of the weight, OHWI; `w` that filter as [O, H*W*I] once checked 4-D.
bool SetFilterRows(const Shape& filter, QuantWeight* w) {
  if (filter.size() != 4) return false;
  w->n = filter[0];
  w->k = static_cast<int64_t>(filter[1]) * filter[2] * filter[3];
  return true;
}

std::unique_ptr<OpInstance> CreateQuantizedConv2dOfWeight(const void* params, QuantWeight w,
                                                          const Shape& filter, std::string* why) {
  if (!SetFilterRows(filter, &w)) {
    *why = "filter " + ShapeToString(filter) + " is not 4-D";
    return nullptr;
  }
  return CreateQuantizedConv2d(params, w, filter, why);
}

// difflite.WinogradConv3x3's function on its quantized filter [Cout, 3, 3, Cin]: a 3x3 CONV_2D of
// stride 1, dilation 1, SAME padding (one pixel each side) and no fused activation. Its node has
// no builtin parameters.
std::unique_ptr<OpInstance> CreateQuantizedConv3x3(const void* /*params*/, QuantWeight w,
                                                   const Shape& filter, std::string* why) {
  if (!SetFilterRows(filter, &w)) {
    *why = "w " + ShapeToString(filter) + " is not the 3x3 filter [Cout,3,3,Cin] (transformed "
           "weights are run as float32 only)";
    return nullptr;
  }
  if (filter[1] != 3 || filter[2] != 3) {
    *why = "filter " + ShapeToString(filter) + " is not [Cout,3,3,Cin]";
    return nullptr;
  }
  tfl::ConvParams p{};
  p.padding = tfl::kPaddingSame;  // 3x3, stride 1: one pixel before and after
  p.stride_width = 1;
  p.stride_height = 1;
  p.activation = tfl::kActNone;
  p.dilation_width_factor = 1;
  p.dilation_height_factor = 1;
  return CreateQuantizedConv2d(&p, w, filter, why);
}

const QuantizedOpDef kConv2dOps[] = {
    {"CONV_2D", 1, 2, 3, &CreateQuantizedConv2dOfWeight},
    {winograd::kOpName, 1, 3, 3, &CreateQuantizedConv3x3},
};
DIFFLITE_REGISTER_OPS(kConv2dOps);

}  // namespace

}  // namespace cpu
}  // namespace difflite
