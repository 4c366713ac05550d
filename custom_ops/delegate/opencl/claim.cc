// Delegate::Prepare of the OpenCL backend (BackendImpl::PrepareDelegate):
// walks the execution plan. A node is claimed when a GPU op is registered under
// its name (the builtin's name, e.g. "CONV_2D", or the custom_code) and that
// op's factory accepts the node's types, shapes and parameters. Factories run
// here, once, with model shapes (the writer emits static shapes); the ops are
// kept until a partition kernel takes them.
// Constants are read-only model tensors, seen in place (HostConst): float16
// weights are not widened (only small float16 constants are, for factories
// that read values); bool and int64 constants become int32. DEQUANTIZE of a
// constant is folded: its output becomes a constant too and the node runs
// nothing (it is claimed only when a claimed node consumes the output). That
// constant is float16 / float32, or int8 / int4 with affine quantization (per
// tensor or per axis; int4 blockwise weights are per-axis [N*K/B, B] tensors):
// those become float32 constants, dequantized while they are uploaded. A
// RESHAPE of a float constant (such a folded output included: int4 weights
// reach their FULLY_CONNECTED / CONV_2D through one) is folded the same way,
// the constant seen in the new shape, so the consumer still sees a constant
// weight and nothing is copied per Invoke. int4's compact form (the writer's:
// a folded DEQUANTIZE of per-tensor scale 1 and zero point 0, times a
// [rows, 1, 1, 1] float constant of block scales) folds its MUL into one
// quantized constant with those block scales.
// A refused node gets a one-line reason on stderr and stays with TFLite, unless it is a difflite
// op (no TFLite kernel) or its program did not build (a device fault): then the delegate fails.
// Factories run on several threads (ClaimAll): they compile programs.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstring>
#include <set>
#include <thread>

#include "difflite/parallel.h"
#include "opencl/backend.h"
#include "opencl/executor.h"
#include "opencl/half.h"

namespace difflite::gpu {

namespace {

using tfl::Context;
using tfl::Node;
using tfl::Registration;
using tfl::Tensor;

constexpr const char* kOpPrefix = "difflite.";

bool HasDynamicDims(const Tensor* t) {
  if (t->dims_signature == nullptr) return false;
  for (int i = 0; i < t->dims_signature->size; ++i) {
    if (t->dims_signature->data[i] < 0) return true;
  }
  return false;
}

// int32 0/1 for a bool constant, int32 for an int64 one ("" or why not).
std::string ConvertToInt32(const Tensor* t, int idx, HostConst* h) {
  const size_t n = h->elements();
  h->converted.resize(n * 4);
  auto* d = reinterpret_cast<int32_t*>(h->converted.data());
  if (t->type == tfl::kBool) {
    const auto* s = static_cast<const uint8_t*>(t->data.data);
    for (size_t i = 0; i < n; ++i) d[i] = s[i] ? 1 : 0;
  } else {
    const auto* s = static_cast<const int64_t*>(t->data.data);
    for (size_t i = 0; i < n; ++i) {
      if (s[i] < INT32_MIN || s[i] > INT32_MAX) {
        return "int64 constant tensor " + std::to_string(idx) + " does not fit int32";
      }
      d[i] = static_cast<int32_t>(s[i]);
    }
  }
  h->dtype = DType::kInt32;
  h->model_type = tfl::kInt32;
  h->bytes = h->values = h->converted.data();
  return "";
}

// The float32 view of the int8 / int4 constant `t` (the input of a DEQUANTIZE): its values are
// dequantized when uploaded (weights.cc), never here, except small ones for the op factories.
// "" or why not. Strict: anything but well-formed affine quantization is refused, and the node
// stays with TFLite.
std::string QuantizedConstant(const Tensor* t, std::shared_ptr<HostConst>* out) {
  if (t->dims == nullptr) return "it has no shape";
  const Shape shape = ToVector(t->dims);
  for (int d : shape) {
    if (d < 0) return "its shape " + ShapeToString(shape) + " is not static";
  }
  const int64_t n = NumElements(shape);
  if (n <= 0 || n > INT32_MAX) return "it has " + std::to_string(n) + " elements";
  const bool int4 = t->type == tfl::kInt4;
  if (int4 && n % 2 != 0) {
    return "an int4 constant of an odd element count (" + std::to_string(n) +
           ") is not supported";
  }
  const size_t want_bytes = static_cast<size_t>(int4 ? n / 2 : n);
  if (t->bytes != want_bytes) {
    return "it holds " + std::to_string(t->bytes) + " bytes for " + std::to_string(n) +
           " elements (expected " + std::to_string(want_bytes) +
           (int4 ? ": two int4 values a byte)" : ")");
  }
  if (t->quantization.type != tfl::kAffineQuantization || t->quantization.params == nullptr) {
    return "it has no affine quantization parameters";
  }
  const auto* aq = static_cast<const tfl::AffineQuantization*>(t->quantization.params);
  if (aq->scale == nullptr || aq->scale->size < 1) return "it has no scales";
  const int count = aq->scale->size;
  if (aq->zero_point == nullptr || aq->zero_point->size != count) {
    return "it has " + std::to_string(aq->zero_point ? aq->zero_point->size : 0) +
           " zero points for " + std::to_string(count) + " scales";
  }
  QuantScales qs;
  qs.scale = aq->scale->data;
  qs.zero_point = aq->zero_point->data;
  qs.channels = static_cast<size_t>(count);
  const int lowest = int4 ? -8 : -128;
  const int highest = int4 ? 7 : 127;
  for (int c = 0; c < count; ++c) {
    if (!std::isfinite(qs.scale[c])) return "scale " + std::to_string(c) + " is not finite";
    if (qs.zero_point[c] < lowest || qs.zero_point[c] > highest) {
      return "zero point " + std::to_string(c) + " (" + std::to_string(qs.zero_point[c]) +
             ") is outside [" + std::to_string(lowest) + ", " + std::to_string(highest) + "]";
    }
  }
  const int rank = static_cast<int>(shape.size());
  if (count > 1) {  // per axis
    const int axis = aq->quantized_dimension;
    if (axis < 0 || axis >= rank) {
      return "quantized dimension " + std::to_string(axis) + " is outside rank " +
             std::to_string(rank);
    }
    if (shape[axis] != count) {
      return std::to_string(count) + " scales for dimension " + std::to_string(axis) + " of " +
             ShapeToString(shape);
    }
    for (int d = axis + 1; d < rank; ++d) qs.inner *= static_cast<size_t>(shape[d]);
  } else if (t->params.scale != qs.scale[0] || t->params.zero_point != qs.zero_point[0]) {
    // Per tensor, TFLite's own DEQUANTIZE reads the older pair (Tensor::params), which the
    // runtime fills from the same numbers; a disagreement is a tensor it did not load.
    return "its per-tensor scale and zero point disagree with Tensor::params";
  }
  auto h = std::make_shared<HostConst>();
  h->dtype = DType::kFloat32;
  h->model_type = t->type;
  h->shape = shape;
  h->bytes = t->data.data;
  h->quant = qs;
  if (h->elements() <= kWidenedElements) {
    h->converted.resize(h->elements() * 4);
    WidenTo(*h, 0, h->elements(), reinterpret_cast<float*>(h->converted.data()));
    h->values = h->converted.data();
  }
  *out = std::move(h);
  return "";
}

// The tensor a RESHAPE reads is a float constant (of the model, or a folded node's output).
bool IsFloatConstant(Context* ctx, int idx, const std::map<int, std::shared_ptr<HostConst>>& folded) {
  if (idx < 0 || static_cast<size_t>(idx) >= ctx->tensors_size) return false;
  auto it = folded.find(idx);
  if (it != folded.end()) return it->second->dtype == DType::kFloat32;
  const Tensor* t = TensorAt(ctx, idx);
  return IsConstantTensor(t) && t->data.data != nullptr &&
         (t->type == tfl::kFloat32 || t->type == tfl::kFloat16);
}

}  // namespace

// "CONV_2D 2x64x64x320,320x3x3x320,320->2x64x64x320": a node's profile=2 key
// (nodes with the same op and shapes add up).
std::string DetailLabel(const ClaimedNode& n) {
  auto dims = [](const Shape& shape) {
    std::string d;
    for (size_t i = 0; i < shape.size(); ++i) d += (i ? "x" : "") + std::to_string(shape[i]);
    return d;
  };
  std::string label = n.name + " ";
  for (size_t i = 0; i < n.in_info.size(); ++i) label += (i ? "," : "") + dims(n.in_info[i].shape);
  label += "->";
  for (size_t i = 0; i < n.out_info.size(); ++i) label += (i ? "," : "") + dims(n.out_info[i].shape);
  return label;
}

namespace {

// What an op sees of a runtime tensor's type: float16 and float32 tensors are both floats, held
// in the storage type (the partition converts at its boundary, Slot::model); a CAST between them
// is a copy.
DType RuntimeDType(tfl::Type t) {
  return t == tfl::kFloat16 ? DType::kFloat32 : ToDType(t);
}

}  // namespace

std::shared_ptr<HostConst> BackendImpl::ConstantOf(Context* ctx, int idx, std::string* why) {
  std::lock_guard<std::mutex> lock(host_consts_mutex);
  auto it = host_consts.find(idx);
  if (it != host_consts.end()) return it->second;
  const Tensor* t = TensorAt(ctx, idx);
  if (!IsConstantTensor(t) || t->data.data == nullptr) return nullptr;
  auto h = std::make_shared<HostConst>();
  h->shape = t->dims ? ToVector(t->dims) : Shape{};
  switch (t->type) {
    case tfl::kFloat32:
    case tfl::kInt32:
      h->dtype = t->type == tfl::kInt32 ? DType::kInt32 : DType::kFloat32;
      h->model_type = t->type;
      h->bytes = h->values = t->data.data;
      break;
    case tfl::kFloat16:
      h->dtype = DType::kFloat32;
      h->model_type = tfl::kFloat16;
      h->bytes = t->data.data;
      if (h->elements() <= kWidenedElements) {
        h->converted.resize(h->elements() * 4);
        WidenTo(*h, 0, h->elements(), reinterpret_cast<float*>(h->converted.data()));
        h->values = h->converted.data();
      }
      break;
    case tfl::kBool:
    case tfl::kInt64:
      *why = ConvertToInt32(t, idx, h.get());
      if (!why->empty()) return nullptr;
      break;
    default:
      *why = std::string("constant tensor ") + std::to_string(idx) + " is " +
             TfLiteTypeName(t->type);
      return nullptr;
  }
  host_consts[idx] = h;
  return h;
}

std::string BackendImpl::ClaimInputs(Context* ctx, ClaimedNode* cn) {
  for (size_t i = 0; i < cn->inputs.size(); ++i) {
    const int idx = cn->inputs[i];
    TensorInfo info;
    if (idx < 0) {  // omitted optional input
      info.dtype = DType::kOther;
      cn->in_info.push_back(info);
      continue;
    }
    if (static_cast<size_t>(idx) >= ctx->tensors_size) {
      return "input tensor index " + std::to_string(idx) + " is out of range";
    }
    const Tensor* t = TensorAt(ctx, idx);
    if (HasDynamicDims(t)) return "input " + std::to_string(i) + " has a dynamic shape";
    std::string e;
    std::shared_ptr<HostConst> h = ConstantOf(ctx, idx, &e);
    if (!e.empty()) return e;
    if (h != nullptr) {
      info.dtype = h->dtype;
      info.shape = h->shape;
      info.const_data = h->values;
      info.is_constant = true;
      const size_t group = h->ScaleGroup();
      if (group > 0 && group <= INT32_MAX) {
        info.quant_bits = h->model_type == tfl::kInt4 ? 4 : 8;
        info.quant_group = static_cast<int>(group);
        info.quant_half_scales = h->HalfScales();
      }
      cn->consts[idx] = h;
    } else {
      info.dtype = RuntimeDType(t->type);
      info.shape = t->dims ? ToVector(t->dims) : Shape{};
      if (info.dtype != DType::kFloat32 && info.dtype != DType::kInt32) {
        return "input " + std::to_string(i) + " is " + TfLiteTypeName(t->type) +
               " (the OpenCL backend exchanges float32, float16 and int32 tensors)";
      }
    }
    const std::string count = CheckElementCount(info, "input " + std::to_string(i));
    if (!count.empty()) return count;
    cn->in_info.push_back(info);
  }
  return "";
}

std::string BackendImpl::ClaimOutputs(Context* ctx, ClaimedNode* cn) {
  for (size_t o = 0; o < cn->outputs.size(); ++o) {
    const int idx = cn->outputs[o];
    if (idx < 0 || static_cast<size_t>(idx) >= ctx->tensors_size) {
      return "output tensor index " + std::to_string(idx) + " is out of range";
    }
    const Tensor* t = TensorAt(ctx, idx);
    TensorInfo info;
    info.dtype = RuntimeDType(t->type);
    info.shape = t->dims ? ToVector(t->dims) : Shape{};
    if (HasDynamicDims(t)) return "output " + std::to_string(o) + " has a dynamic shape";
    if (info.dtype != DType::kFloat32 && info.dtype != DType::kInt32) {
      return "output " + std::to_string(o) + " is " + TfLiteTypeName(t->type);
    }
    const std::string count = CheckElementCount(info, "output " + std::to_string(o));
    if (!count.empty()) return count;
    if (NumElements(info.shape) == 0) return "output " + std::to_string(o) + " has no elements";
    cn->out_info.push_back(info);
  }
  return "";
}

// A DEQUANTIZE of a constant: its output is that constant, float16 / float32 as the model
// stores it, int8 / int4 seen as float32 ("" or why not).
std::string BackendImpl::FoldDequantize(Context* ctx, ClaimedNode* cn) {
  const char* only = "only DEQUANTIZE of a constant is supported (folded at prepare)";
  if (cn->inputs.size() != 1 || cn->outputs.size() != 1 || cn->inputs[0] < 0 ||
      static_cast<size_t>(cn->inputs[0]) >= ctx->tensors_size) {
    return only;
  }
  const int idx = cn->inputs[0];
  const Tensor* src = TensorAt(ctx, idx);
  if (!IsConstantTensor(src) || src->data.data == nullptr) return only;
  std::shared_ptr<HostConst> h;
  if (src->type == tfl::kFloat16 || src->type == tfl::kFloat32) {
    const std::string e = ClaimInputs(ctx, cn);
    if (!e.empty()) return e;
    h = cn->consts.at(idx);
  } else if (src->type == tfl::kInt8 || src->type == tfl::kInt4) {
    const std::string e = QuantizedConstant(src, &h);
    if (!e.empty()) {
      return std::string("DEQUANTIZE of ") + TfLiteTypeName(src->type) + " constant tensor " +
             std::to_string(idx) + ": " + e;
    }
    TensorInfo info;  // for the verbose log: the integers are no tensor the ops see
    info.shape = h->shape;
    cn->in_info.push_back(info);
  } else {
    return std::string("DEQUANTIZE of ") + TfLiteTypeName(src->type) +
           " is not supported (float16, float32, int8 and int4 constants are)";
  }
  if (cn->out_info[0].dtype != DType::kFloat32 || cn->out_info[0].shape != h->shape) {
    return "DEQUANTIZE output must be float32 of the input's shape";
  }
  cn->folded = true;
  cn->folded_value = h;
  return "";
}

// A MUL of int4's compact form: `values` a folded DEQUANTIZE [rows, B] (or [rows, 1, .., 1, B])
// of per-tensor scale 1 and zero point 0, `scales` a float32 / float16 constant of that rank,
// [rows, 1, .., 1], no fused activation. Its
// output is `values` with scale r = scales[r], exactly what TFLite computes (the integer as a
// float, times 1, times scales[r], rounded once). false where the node is no such MUL (it is then
// claimed as an op).
static bool FoldBlockScales(ClaimedNode* cn, const void* builtin_data) {
  if (cn->inputs.size() != 2 || cn->outputs.size() != 1 || cn->consts.size() != 2) return false;
  if (builtin_data != nullptr &&
      static_cast<const tfl::MulDivParams*>(builtin_data)->activation != tfl::kActNone) {
    return false;
  }
  for (int order = 0; order < 2; ++order) {
    auto v = cn->consts.find(cn->inputs[order]);
    auto sc = cn->consts.find(cn->inputs[1 - order]);
    if (v == cn->consts.end() || sc == cn->consts.end()) return false;
    const HostConst& values = *v->second;
    const HostConst& scales = *sc->second;
    const size_t rank = values.shape.size();
    if (!values.quantized() || values.quant.channels != 1 || values.quant.scale == nullptr ||
        values.quant.scale[0] != 1.0f || values.quant.Zero(0) != 0 || rank < 2 ||
        NumElements(values.shape) != static_cast<int64_t>(values.shape[0]) * values.shape[rank - 1]) {
      continue;
    }
    Shape want(rank, 1);
    want[0] = values.shape[0];
    if (scales.quantized() || scales.dtype != DType::kFloat32 || scales.shape != want ||
        (scales.model_type != tfl::kFloat32 && scales.model_type != tfl::kFloat16) ||
        cn->out_info[0].dtype != DType::kFloat32 || cn->out_info[0].shape != values.shape) {
      return false;
    }
    auto folded = std::make_shared<HostConst>(values);
    folded->quant = QuantScales();
    folded->quant.channels = static_cast<size_t>(values.shape[0]);
    folded->quant.inner = static_cast<size_t>(values.shape[rank - 1]);
    folded->quant.block_scales = scales.bytes;
    folded->quant.block_scales_type = scales.model_type;
    folded->converted.clear();
    folded->values = nullptr;
    if (folded->elements() <= kWidenedElements) {  // small: widened for the op factories
      folded->converted.resize(folded->elements() * 4);
      WidenTo(*folded, 0, folded->elements(), reinterpret_cast<float*>(folded->converted.data()));
      folded->values = folded->converted.data();
    }
    cn->folded = true;
    cn->folded_value = std::move(folded);
    return true;
  }
  return false;
}

// A RESHAPE of a float constant: its output is the same constant in the output's shape (the
// same model bytes, nothing copied). false where the node is no such RESHAPE (it is then
// claimed as an op, a view or one copy per Invoke).
static bool FoldReshape(ClaimedNode* cn) {
  if (cn->inputs.empty() || cn->inputs[0] < 0 || cn->outputs.size() != 1) return false;
  auto it = cn->consts.find(cn->inputs[0]);
  if (it == cn->consts.end()) return false;
  const HostConst& h = *it->second;
  const TensorInfo& out = cn->out_info[0];
  if (h.dtype != DType::kFloat32 || out.dtype != DType::kFloat32 ||
      static_cast<size_t>(NumElements(out.shape)) != h.elements()) {
    return false;
  }
  auto v = std::make_shared<HostConst>(h);
  v->shape = out.shape;
  if (!h.converted.empty()) {  // the copy's pointers into its own `converted`
    if (h.bytes == h.converted.data()) v->bytes = v->converted.data();
    if (h.values == h.converted.data()) v->values = v->converted.data();
  }
  cn->folded = true;
  cn->folded_value = std::move(v);
  return true;
}

std::string BackendImpl::CreateOp(Node* node, Registration* reg, bool is_custom,
                                  ClaimedNode* cn) {
  std::string why;
  if (is_custom) {
    cn->custom = ParseCustomNode(node, reg->custom_name, &why);
    if (cn->custom == nullptr) return why;
    for (size_t i = 0; i < cn->inputs.size(); ++i) {
      if (cn->inputs[i] < 0) {
        return "input " + std::to_string(i) + " is omitted (difflite ops have no optional inputs)";
      }
    }
    std::vector<TensorInfo> inferred;
    const std::string e = cn->custom->Infer(cn->in_info, &inferred);
    if (!e.empty()) return e;
    if (inferred.size() != cn->out_info.size()) {
      return "expects " + std::to_string(inferred.size()) + " outputs, got " +
             std::to_string(cn->out_info.size());
    }
    for (size_t o = 0; o < inferred.size(); ++o) {
      if (inferred[o].dtype != cn->out_info[o].dtype ||
          inferred[o].shape != cn->out_info[o].shape) {
        return "output " + std::to_string(o) + " is declared " + InfoString(cn->out_info[o]) +
               ", the op produces " + InfoString(inferred[o]);
      }
    }
  }
  const GpuOpDef* def = OpRegistry<GpuOpDef>::Find(cn->name.c_str());
  if (def == nullptr) return "no OpenCL kernel for " + cn->name;
  NodeView view;
  view.op_name = cn->name.c_str();
  view.builtin_data = is_custom ? nullptr : node->builtin_data;
  view.custom = cn->custom.get();
  view.inputs = cn->in_info;
  view.outputs = cn->out_info;
  std::string e;
  cn->op = def->create(view, *gctx, &e);
  if (cn->op == nullptr) return e.empty() ? "refused by its OpenCL op" : e;
  return "";
}

std::unique_ptr<ClaimedNode> BackendImpl::Claim(Context* ctx, int node_index, Node* node,
                                                Registration* reg, std::string* name,
                                                std::string* why) {
  auto cn = std::make_unique<ClaimedNode>();
  cn->node_index = node_index;
  const bool is_custom = reg->builtin_code == tfl::kBuiltinCustom;
  if (is_custom) {
    *name = reg->custom_name ? reg->custom_name : "";
    if (name->compare(0, std::strlen(kOpPrefix), kOpPrefix) != 0) {
      *why = "custom op without an OpenCL kernel";
      return nullptr;
    }
  } else {
    const char* n = BuiltinName(reg->builtin_code);
    if (n == nullptr) {
      *name = "builtin " + std::to_string(reg->builtin_code);
      *why = "no OpenCL kernel for this builtin operator";
      return nullptr;
    }
    *name = n;
  }
  cn->name = *name;
  cn->inputs = ToVector(node->inputs);
  cn->outputs = ToVector(node->outputs);
  const bool dequantize =
      !is_custom && reg->builtin_code == static_cast<int32_t>(tfl::BuiltinOp::kDequantize);
  if (dequantize) {  // its input may be integers: no tensor of the ops (FoldDequantize)
    *why = ClaimOutputs(ctx, cn.get());
    if (why->empty()) *why = FoldDequantize(ctx, cn.get());
  } else {
    *why = ClaimInputs(ctx, cn.get());
    if (why->empty()) *why = ClaimOutputs(ctx, cn.get());
  }
  if (!why->empty()) return nullptr;
  const auto builtin = [&](tfl::BuiltinOp op) {
    return !is_custom && reg->builtin_code == static_cast<int32_t>(op);
  };
  if (dequantize || (builtin(tfl::BuiltinOp::kReshape) && FoldReshape(cn.get())) ||
      (builtin(tfl::BuiltinOp::kMul) && FoldBlockScales(cn.get(), node->builtin_data))) {
    std::lock_guard<std::mutex> lock(host_consts_mutex);
    host_consts[cn->outputs[0]] = cn->folded_value;
    return cn;
  }
  *why = CreateOp(node, reg, is_custom, cn.get());
  if (!why->empty()) return nullptr;
  return cn;
}

// One node of the execution plan and what claiming it gave.
struct Candidate {
  int node_index = -1;
  Node* node = nullptr;
  Registration* reg = nullptr;
  std::string name, why;
  std::unique_ptr<ClaimedNode> claimed;
  bool is_dequantize() const {
    return reg->builtin_code == static_cast<int32_t>(tfl::BuiltinOp::kDequantize);
  }
  bool is_difflite_op() const {
    return reg->builtin_code == tfl::kBuiltinCustom && reg->custom_name != nullptr &&
           std::strncmp(reg->custom_name, kOpPrefix, std::strlen(kOpPrefix)) == 0;
  }
  bool is_mul() const { return reg->builtin_code == static_cast<int32_t>(tfl::BuiltinOp::kMul); }
  bool is_reshape() const {
    return reg->builtin_code == static_cast<int32_t>(tfl::BuiltinOp::kReshape);
  }
};

namespace {

int ClaimThreads(const Options& options) {
  const int hardware = static_cast<int>(std::thread::hardware_concurrency());
  return std::clamp(options.num_threads > 0 ? options.num_threads : hardware, 1, 16);
}

// The op and every tensor's shape: nodes of one kind ask for the same programs.
std::string KindOf(Context* ctx, const Candidate& c) {
  std::string kind = std::to_string(c.reg->builtin_code) + (c.reg->custom_name ? c.reg->custom_name : "");
  for (const tfl::IntArray* list : {c.node->inputs, c.node->outputs}) {
    for (int idx : ToVector(list)) {
      kind += "|";
      if (idx < 0 || static_cast<size_t>(idx) >= ctx->tensors_size) continue;
      const Tensor* t = TensorAt(ctx, idx);
      if (t->dims != nullptr) kind += ShapeToString(ToVector(t->dims));
    }
  }
  return kind;
}

// The first node of each kind ahead of the rest (order kept within both groups): threads
// taking nodes in order then start distinct programs' compiles together, instead of queueing
// behind the first kind's.
void FirstOfEachKindFirst(Context* ctx, std::vector<Candidate*>* nodes) {
  std::set<std::string> seen;
  std::vector<Candidate*> first, later;
  for (Candidate* c : *nodes) (seen.insert(KindOf(ctx, *c)).second ? first : later).push_back(c);
  first.insert(first.end(), later.begin(), later.end());
  nodes->swap(first);
}

}  // namespace

void BackendImpl::ClaimOne(Context* ctx, Candidate* c) {
  try {
    c->claimed = Claim(ctx, c->node_index, c->node, c->reg, &c->name, &c->why);
  } catch (...) {
    c->why = "exception: " + ExceptionText();
    c->claimed.reset();
  }
}

// DEQUANTIZE nodes, and RESHAPEs and MULs of float constants, first, in order (cheap: they
// fold, and each sees the folds before it): a consumer must see its weight as a constant.
// Then every other node's op factory on a pool of threads, so that the distinct OpenCL
// programs the factories ask for compile (or load from the disk cache) at once.
void BackendImpl::ClaimAll(Context* ctx, std::vector<Candidate>* candidates) {
  std::vector<Candidate*> rest;
  for (Candidate& c : *candidates) {
    if (!c.why.empty()) continue;  // refused for its wiring (PrepareDelegate)
    bool folds = c.is_dequantize();
    if (!folds && (c.is_reshape() || c.is_mul()) && c.node->inputs != nullptr &&
        c.node->inputs->size > 0) {
      std::lock_guard<std::mutex> lock(host_consts_mutex);
      const int reads = c.is_mul() ? c.node->inputs->size : 1;
      folds = true;
      for (int i = 0; i < reads; ++i) folds = folds && IsFloatConstant(ctx, c.node->inputs->data[i], host_consts);
    }
    if (folds) {
      ClaimOne(ctx, &c);
    } else {
      rest.push_back(&c);
    }
  }
  FirstOfEachKindFirst(ctx, &rest);
  const int threads = ClaimThreads(options);
  std::atomic<size_t> next{0};
  ParallelFor(threads, threads, 1e9, [&](int64_t begin, int64_t end) {
    for (int64_t worker = begin; worker < end; ++worker) {
      for (size_t i = next++; i < rest.size(); i = next++) ClaimOne(ctx, rest[i]);
    }
  });
}

tfl::Status BackendImpl::PrepareDelegate(tfl::Context* ctx, tfl::Delegate* delegate) {
  if (!TensorAbiMatches(ctx)) return tfl::kDelegateError;
  tfl::IntArray* plan = nullptr;
  if (ctx->GetExecutionPlan(ctx, &plan) != tfl::kOk || plan == nullptr) {
    LogError(ctx, "cannot read the execution plan");
    return tfl::kDelegateError;
  }
  const auto t0 = std::chrono::steady_clock::now();
  const std::vector<int> plan_nodes = ToVector(plan);
  nodes_total = static_cast<int>(plan_nodes.size());
  std::vector<Candidate> candidates;
  for (int node_index : plan_nodes) {
    Candidate c;
    c.node_index = node_index;
    if (ctx->GetNodeAndRegistration(ctx, node_index, &c.node, &c.reg) == tfl::kOk &&
        c.node != nullptr && c.reg != nullptr) {
      candidates.push_back(std::move(c));
    }
  }
  // Wiring no backend can run (a cycle, two writers, a constant written): refused before any
  // factory sees the node.
  const PlanOrder order(ctx, plan_nodes);
  for (Candidate& c : candidates) {
    c.why = order.Check(ctx, c.node_index, c.node);
    if (c.why.empty()) continue;
    const bool custom = c.reg->builtin_code == tfl::kBuiltinCustom;
    const char* builtin = custom ? nullptr : BuiltinName(c.reg->builtin_code);
    c.name = custom ? (c.reg->custom_name ? c.reg->custom_name : "custom")
                    : builtin ? builtin : "builtin " + std::to_string(c.reg->builtin_code);
  }
  std::unique_lock<std::mutex> lock(rt->exec_mutex());
  ClaimAll(ctx, &candidates);
  std::vector<int> claimed;
  std::map<int, std::vector<int>> consumers;  // tensor -> claimed consumer nodes
  for (Candidate& c : candidates) {
    if (c.claimed == nullptr) {
      Log("not delegating node " + std::to_string(c.node_index) + " (" + c.name + "): " + c.why);
      // A difflite op has no TFLite kernel (loading would fail without the reason), and a program
      // that does not build is a device fault, not an op to leave to the CPU without a word.
      if (c.is_difflite_op() || c.why.find(kBuildFailed) != std::string::npos) {
        LogError(ctx, "node " + std::to_string(c.node_index) + " (" + c.name +
                          ") cannot run on the OpenCL backend: " + c.why);
        return tfl::kDelegateError;
      }
      continue;
    }
    const ClaimedNode& cn = *c.claimed;
    if (options.verbose) {
      std::string in_s, out_s;
      for (size_t i = 0; i < cn.in_info.size(); ++i) {
        std::string s;
        if (cn.inputs[i] < 0) {
          s = "none";
        } else if (cn.in_info[i].dtype == DType::kOther && cn.folded_value != nullptr &&
                   cn.folded_value->quantized()) {  // a folded DEQUANTIZE's integers
          s = std::string(TfLiteTypeName(cn.folded_value->model_type)) +
              ShapeToString(cn.in_info[i].shape) + " (" +
              std::to_string(cn.folded_value->quant.channels) + " scales)";
        } else {
          s = InfoString(cn.in_info[i]);
        }
        in_s += (i ? ", " : "") + s;
      }
      for (size_t i = 0; i < cn.out_info.size(); ++i) {
        out_s += (i ? ", " : "") + InfoString(cn.out_info[i]);
      }
      Log("claim node " + std::to_string(c.node_index) + " " + c.name + " inputs=(" + in_s +
          ") outputs=(" + out_s + ")" + (cn.folded ? " folded" : ""));
    }
    if (!cn.folded) {
      for (int idx : cn.inputs) {
        if (idx >= 0) consumers[idx].push_back(c.node_index);
      }
    }
    claimed.push_back(c.node_index);
    pending[c.node_index] = std::move(c.claimed);
  }
  // A folded node is only worth claiming for a claimed consumer, a kept folded node included:
  // walked backwards (the plan is in order), so a DEQUANTIZE feeding a folded RESHAPE goes or
  // stays with it.
  std::set<int> dropped;
  for (auto it = claimed.rbegin(); it != claimed.rend(); ++it) {
    const ClaimedNode& cn = *pending[*it];
    if (!cn.folded) continue;
    if (consumers[cn.outputs[0]].empty()) {
      dropped.insert(*it);
      pending.erase(*it);
      continue;
    }
    for (int idx : cn.inputs) {
      if (idx >= 0) consumers[idx].push_back(cn.node_index);
    }
  }
  std::vector<int> kept;
  for (int node_index : claimed) {
    if (dropped.count(node_index) == 0) kept.push_back(node_index);
  }
  host_consts.clear();
  lock.unlock();
  claim_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  nodes_claimed = static_cast<int>(kept.size());
  if (options.verbose) {
    Log("opencl: claimed " + std::to_string(kept.size()) + " of " +
        std::to_string(plan_nodes.size()) + " nodes on " + std::to_string(ClaimThreads(options)) +
        " threads in " + std::to_string(claim_seconds) + " s; " +
        std::to_string(rt->programs().built) + " programs built so far");
  }
  if (kept.empty()) {
    WriteStats();
    return tfl::kOk;
  }
  tfl::IntArray* list = NewIntArray(kept);
  if (list == nullptr) return tfl::kDelegateError;
  tfl::Registration r = PartitionRegistration();
  const tfl::Status s = ctx->ReplaceNodeSubsetsWithDelegateKernels(ctx, r, list, delegate);
  std::free(list);
  pending.clear();
  if (options.verbose) {
    Log("opencl: " + std::to_string(partitions.size()) + " partition(s)");
  }
  return s;
}

}  // namespace difflite::gpu
