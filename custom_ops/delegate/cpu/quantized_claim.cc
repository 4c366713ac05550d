// The CPU backend's builtins (quantized_claim.h): FULLY_CONNECTED and CONV_2D reading a quantized
// weight as the model stores it, GATHER of a quantized table's rows (the int4 mix's token
// embedding: int8 rows of per-tensor scale 1), and the folded chain each comes through. A
// difflite.WinogradConv3x3 whose w is the 3x3 filter itself ([Cout, 3, 3, Cin], the contract's
// second form) coming through such a chain is claimed here too and runs as that quantized 3x3
// CONV_2D (SAME, stride 1, bias input 2): the same function, read from the model's integers. Any
// other WinogradConv3x3 (transformed weights, or a float filter) is a custom op of the op registry
// (cpu/claim.cc), as is one refused here (it then reads TFLite's float32 DEQUANTIZE of the filter).
//
// What `convert --weights int8|int4` writes (compiler/tflite/quantize.py), and what is folded:
//  * int8: DEQUANTIZE of an INT8 constant, zero points 0, one scale per tensor or per index of
//    an axis with nothing but 1s before it (per output channel: axis 0);
//  * int4, compact form: DEQUANTIZE of an INT4 [rows, 1.., B] constant of per-tensor scale 1,
//    MUL by a [rows, 1.., 1] float32 constant (or a folded DEQUANTIZE of a float16 one) of block
//    scales, RESHAPE to the weight's shape; int4 per axis: DEQUANTIZE of [rows, B] with a scale
//    a row, RESHAPE.
// Each folded tensor is the float32 value TFLite would compute, described by the model's bytes
// (cpu::QuantWeight: the integers, the scales, how many consecutive values share one).
//
// Why the folded nodes are claimed at all, and never produce anything: TFLite computes a DEQUANTIZE
// of a constant once, into a float32 tensor it keeps (4x an int8 weight, 8x an int4 one), and
// XNNPACK packs a float copy of its own. Claimed, the nodes are the delegate's; its partitions give
// their outputs no storage (partition_plan.cc). TFLite's partitioner is greedy: every DEQUANTIZE of
// a constant is ready at the start and lands in the first partition while its reader lands in a
// later one (TFLite's builtins run between them on this backend), so the weights cross partitions
// as partition outputs, which TFLite would allocate: they are given 0 bytes and no data at Prepare,
// which the arena plans as nothing and Invoke accepts (it refuses only an input with bytes and no
// data). Only claimed nodes read them, and those read the model's integers. A folded tensor any
// other node reads, or a graph output, is left to TFLite.
#include "cpu/quantized_claim.h"

#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <set>
#include <utility>

#include "cpu_builtins.h"
#include "qgemm.h"
#include "winograd_conv3x3/winograd_conv3x3.h"

namespace difflite {
namespace {

using tfl::Context;
using tfl::Node;
using tfl::Registration;
using tfl::Tensor;

constexpr int32_t kDequantize = static_cast<int32_t>(tfl::BuiltinOp::kDequantize);
constexpr int32_t kMul = static_cast<int32_t>(tfl::BuiltinOp::kMul);
constexpr int32_t kReshape = static_cast<int32_t>(tfl::BuiltinOp::kReshape);

// A folded tensor: quantized values with their scales (`q`: n and k unset, the value flat), or
// float block scales (a folded float16 DEQUANTIZE).
struct Folded {
  Shape shape;
  bool quantized = false;
  cpu::QuantWeight q;
  bool unit = false;  // quantized per tensor with scale exactly 1 (int4's compact form)
  const void* data = nullptr;  // float scales
  bool f16 = false;
};

const Tensor* At(Context* ctx, int idx) {
  if (idx < 0 || static_cast<size_t>(idx) >= ctx->tensors_size) return nullptr;
  return TensorAt(ctx, idx);
}

// The static, all-positive shape of `t`, or "" with a reason.
std::string StaticShape(const Tensor* t, Shape* shape) {
  if (t->dims == nullptr) return "it has no shape";
  *shape = ToVector(t->dims);
  for (int d : *shape) {
    if (d <= 0) return "its shape " + ShapeToString(*shape) + " has an empty or negative dimension";
  }
  return CheckElementCount(TensorInfo{DType::kOther, *shape, nullptr}, "it");
}

// An int8 / int4 constant as the integers of a folded DEQUANTIZE ("" or why not).
std::string QuantizedSource(const Tensor* t, Folded* f) {
  std::string e = StaticShape(t, &f->shape);
  if (!e.empty()) return e;
  const int64_t n = NumElements(f->shape);
  const bool int4 = t->type == tfl::kInt4;
  if (int4 && n % 2 != 0) return "an int4 constant of an odd element count (" + std::to_string(n) + ")";
  const size_t want = static_cast<size_t>(int4 ? n / 2 : n);
  if (t->bytes != want) {
    return "it holds " + std::to_string(t->bytes) + " bytes for " + std::to_string(n) +
           " elements (expected " + std::to_string(want) + ")";
  }
  if (t->quantization.type != tfl::kAffineQuantization || t->quantization.params == nullptr) {
    return "it has no affine quantization parameters";
  }
  const auto* aq = static_cast<const tfl::AffineQuantization*>(t->quantization.params);
  if (aq->scale == nullptr || aq->scale->size < 1) return "it has no scales";
  const int count = aq->scale->size;
  if (aq->zero_point == nullptr || aq->zero_point->size != count) return "its zero points do not match its scales";
  for (int c = 0; c < count; ++c) {
    if (aq->zero_point->data[c] != 0) return "zero point " + std::to_string(c) + " is not 0";
    if (!std::isfinite(aq->scale->data[c])) return "scale " + std::to_string(c) + " is not finite";
  }
  const int rank = static_cast<int>(f->shape.size());
  int64_t group = n;
  if (count > 1) {
    const int axis = aq->quantized_dimension;
    if (axis < 0 || axis >= rank || f->shape[axis] != count) {
      return std::to_string(count) + " scales for dimension " + std::to_string(axis) + " of " +
             ShapeToString(f->shape);
    }
    for (int d = 0; d < axis; ++d) {
      if (f->shape[d] != 1) return "per-axis scales on dimension " + std::to_string(axis) + " with outer dimensions";
    }
    group = n / count;
  } else if (t->params.scale != aq->scale->data[0] || t->params.zero_point != 0) {
    // TFLite's DEQUANTIZE reads the per-tensor pair of Tensor::params; the runtime fills it from
    // the same numbers, so a disagreement is a tensor it did not load.
    return "its per-tensor scale disagrees with Tensor::params";
  }
  f->quantized = true;
  f->q.bits = int4 ? 4 : 8;
  f->q.values = static_cast<const uint8_t*>(t->data.data);
  f->q.scales = aq->scale->data;
  f->q.scales_f16 = false;
  f->q.scale_count = count;
  f->q.group = group;
  f->unit = count == 1 && aq->scale->data[0] == 1.0f;
  return "";
}

// The node's single float32 output, declared `shape` ("" or why not).
std::string CheckOutput(Context* ctx, const Node* node, const Shape& shape) {
  const std::vector<int> outs = ToVector(node->outputs);
  if (outs.size() != 1) return "expects 1 output, got " + std::to_string(outs.size());
  const Tensor* t = At(ctx, outs[0]);
  if (t == nullptr) return "output tensor " + std::to_string(outs[0]) + " is out of range";
  if (t->type != tfl::kFloat32) return std::string("its output is ") + TfLiteTypeName(t->type);
  if (t->is_variable) return "its output is a variable tensor";
  if (t->dims == nullptr || ToVector(t->dims) != shape) {
    return "its output is declared " + (t->dims ? ShapeToString(ToVector(t->dims)) : "without a shape") +
           ", the value is " + ShapeToString(shape);
  }
  return "";
}

// A float constant of block scales: a float32 model constant, or a folded float16 DEQUANTIZE.
bool FloatScales(Context* ctx, int idx, const std::map<int, Folded>& folded, Folded* out) {
  auto it = folded.find(idx);
  if (it != folded.end()) {
    if (it->second.quantized) return false;
    *out = it->second;
    return true;
  }
  const Tensor* t = At(ctx, idx);
  if (t == nullptr || t->type != tfl::kFloat32 || !IsConstantTensor(t) || t->data.data == nullptr ||
      !StaticShape(t, &out->shape).empty() ||
      t->bytes != static_cast<size_t>(NumElements(out->shape)) * 4) {
    return false;
  }
  out->data = t->data.data;
  out->f16 = false;
  return true;
}

// The shape a RESHAPE computes (TFLite's rules for the forms the writer emits: a 1-D int32
// constant shape input, or the new_shape parameter), -1 resolved ("" or why not).
std::string ReshapeTarget(Context* ctx, const Node* node, int64_t elements, Shape* shape) {
  const std::vector<int> ins = ToVector(node->inputs);
  std::vector<int> want;
  if (ins.size() >= 2 && ins[1] >= 0) {
    const Tensor* s = At(ctx, ins[1]);
    if (s == nullptr || s->type != tfl::kInt32 || !IsConstantTensor(s) || s->data.data == nullptr ||
        s->dims == nullptr || s->dims->size != 1 || s->dims->data[0] < 1 || s->dims->data[0] > 8 ||
        s->bytes != static_cast<size_t>(s->dims->data[0]) * 4) {
      return "its shape is not a constant int32 vector of 1 to 8 values";
    }
    const auto* v = static_cast<const int32_t*>(s->data.data);
    want.assign(v, v + s->dims->data[0]);
  } else {
    const auto* p = static_cast<const tfl::ReshapeParams*>(node->builtin_data);
    if (p == nullptr || p->num_dimensions < 1 || p->num_dimensions > 8) return "it has no target shape";
    want.assign(p->shape, p->shape + p->num_dimensions);
  }
  int unknown = -1;
  int64_t known = 1;
  for (size_t i = 0; i < want.size(); ++i) {
    if (want[i] == -1 && unknown < 0) {
      unknown = static_cast<int>(i);
    } else if (want[i] < 1) {
      return "target shape " + ShapeToString(want);
    } else {
      known *= want[i];
      if (known > elements) return "target shape " + ShapeToString(want) + " holds more values";
    }
  }
  if (unknown >= 0) {
    if (elements % known != 0) return "target shape " + ShapeToString(want) + " does not divide the values";
    want[unknown] = static_cast<int>(elements / known);
  }
  if (NumElements(want) != elements) return "target shape " + ShapeToString(want) + " has another count";
  *shape = want;
  return "";
}

// Folds one node of a weight's chain into *out. Returns "" when folded; otherwise why not, with
// *candidate false where the node has nothing to do with a quantized weight (not worth a word).
std::string FoldNode(Context* ctx, int32_t code, const Node* node, const std::map<int, Folded>& folded,
                     Folded* out, bool* candidate) {
  const std::vector<int> ins = ToVector(node->inputs);
  *candidate = false;
  if (code == kDequantize) {
    if (ins.size() != 1) return "expects 1 input";
    const Tensor* src = At(ctx, ins[0]);
    if (src == nullptr || !IsConstantTensor(src) || src->data.data == nullptr) return "not a constant";
    if (src->type == tfl::kInt8 || src->type == tfl::kInt4) {
      *candidate = true;
      std::string e = QuantizedSource(src, out);
      if (!e.empty()) return std::string("its ") + TfLiteTypeName(src->type) + " constant: " + e;
    } else if (src->type == tfl::kFloat16) {
      std::string e = StaticShape(src, &out->shape);
      if (!e.empty() || src->bytes != static_cast<size_t>(NumElements(out->shape)) * 2) return "float16 data";
      out->data = src->data.data;
      out->f16 = true;
    } else {
      return "not an int8, int4 or float16 constant";
    }
    return CheckOutput(ctx, node, out->shape);
  }
  if (code == kMul) {
    if (ins.size() != 2) return "expects 2 inputs";
    for (int order = 0; order < 2; ++order) {
      auto v = folded.find(ins[order]);
      if (v == folded.end() || !v->second.quantized) continue;
      *candidate = true;
      const Folded& values = v->second;
      const size_t rank = values.shape.size();
      if (!values.unit || rank < 2 ||
          NumElements(values.shape) != static_cast<int64_t>(values.shape[0]) * values.shape.back()) {
        return "its values are not int4's compact form (per-tensor scale 1, [rows, 1.., B])";
      }
      const auto* p = static_cast<const tfl::MulDivParams*>(node->builtin_data);
      if (p != nullptr && p->activation != tfl::kActNone) return "a fused activation";
      Folded scales;
      Shape want(rank, 1);
      want[0] = values.shape[0];
      if (!FloatScales(ctx, ins[1 - order], folded, &scales) || scales.shape != want) {
        return "its scales are not a float constant of shape " + ShapeToString(want);
      }
      *out = values;
      out->unit = false;
      out->q.scales = scales.data;
      out->q.scales_f16 = scales.f16;
      out->q.scale_count = values.shape[0];
      out->q.group = values.shape.back();
      return CheckOutput(ctx, node, values.shape);
    }
    return "no quantized input";
  }
  if (code == kReshape) {
    if (ins.empty()) return "no input";
    auto v = folded.find(ins[0]);
    if (v == folded.end() || !v->second.quantized) return "no quantized input";
    *candidate = true;
    *out = v->second;
    const std::string e = ReshapeTarget(ctx, node, NumElements(v->second.shape), &out->shape);
    if (!e.empty()) return e;
    return CheckOutput(ctx, node, out->shape);
  }
  return "not a chain node";
}

// The graph's outputs (as far as nodes write them): the outputs of TFLite's partitioning of the
// whole plan, which can have no reader outside. Graph outputs are not in the context otherwise.
// false where the runtime cannot preview.
bool GraphOutputs(Context* ctx, const std::vector<int>& plan, std::set<int>* outputs) {
  if (ctx->PreviewDelegatePartitioning == nullptr) return false;
  tfl::IntArray* list = NewIntArray(plan);
  if (list == nullptr) return false;
  tfl::DelegateParams* parts = nullptr;
  int count = 0;
  const tfl::Status s = ctx->PreviewDelegatePartitioning(ctx, list, &parts, &count);
  std::free(list);
  if (s != tfl::kOk || count < 0 || (count > 0 && parts == nullptr)) return false;
  for (int i = 0; i < count; ++i) {
    for (int idx : ToVector(parts[i].output_tensors)) outputs->insert(idx);
  }
  return true;
}

std::string Inputs(const std::vector<TensorInfo>& ins) {
  std::string s;
  for (size_t i = 0; i < ins.size(); ++i) {
    s += (i ? ", " : "") + (ins[i].dtype == DType::kOther ? std::string("none") : InfoString(ins[i]));
  }
  return s;
}

// The CPU op that runs a builtin node reading a quantized weight (FULLY_CONNECTED, CONV_2D,
// GATHER); nullptr for any other code.
const cpu::QuantizedOpDef* QuantizedReader(int32_t code) {
  return OpRegistry<cpu::QuantizedOpDef>::Find(BuiltinName(code));
}

// A difflite.WinogradConv3x3 node (custom code).
bool IsWinograd(const Registration* reg) {
  return reg->builtin_code == tfl::kBuiltinCustom && reg->custom_name != nullptr &&
         std::strcmp(reg->custom_name, winograd::kOpName) == 0;
}

// What the claimed reader's Infer sees of the node's inputs: the weight as cn->weight_info, an
// omitted input (-1) as dtype kOther where `omissible` allows it, the others as the model
// declares them ("" or why not).
std::string ReaderInputs(Context* ctx, const std::vector<int>& ins, const CpuBuiltinNode& cn,
                         bool omissible, std::vector<TensorInfo>* infos) {
  for (size_t i = 0; i < ins.size(); ++i) {
    if (static_cast<int>(i) == cn.weight_input) {
      infos->push_back(cn.weight_info);
      continue;
    }
    if (ins[i] < 0) {
      if (i != 2 || !omissible) return "input " + std::to_string(i) + " is omitted";
      infos->push_back(TensorInfo());
      continue;
    }
    const Tensor* t = At(ctx, ins[i]);
    if (t == nullptr) return "input tensor " + std::to_string(ins[i]) + " is out of range";
    infos->push_back(InfoOf(t));
    const std::string e = CheckElementCount(infos->back(), "input " + std::to_string(i));
    if (!e.empty()) return e;
  }
  return "";
}

// The claimed reader's Infer on `infos`, its one float32 output checked, and the claim's log line
// ("" or why not).
std::string InferReader(Context* ctx, const Node* node, const CpuBuiltinNode& cn,
                        const std::vector<TensorInfo>& infos, std::string* log) {
  std::vector<TensorInfo> outs;
  std::string why = cn.op->Infer(infos, &outs);
  if (!why.empty()) return why;
  const std::vector<int> out_idx = ToVector(node->outputs);
  if (out_idx.size() != 1) return "expects 1 output, got " + std::to_string(out_idx.size());
  const Tensor* t = At(ctx, out_idx[0]);
  if (t == nullptr) return "output tensor " + std::to_string(out_idx[0]) + " is out of range";
  if (t->type != tfl::kFloat32) return std::string("output is ") + TfLiteTypeName(t->type);
  why = CheckElementCount(outs[0], "output");
  if (!why.empty()) return why;
  *log = "inputs=(" + Inputs(infos) + ") outputs=(" + InfoString(outs[0]) + ") attrs={" +
         cn.op->Describe() + "}";
  return "";
}

// A FULLY_CONNECTED / CONV_2D / GATHER (`def`) whose weight is the folded `w`: its op, and the
// inputs its Infer accepted ("" or why not).
std::string ClaimReader(Context* ctx, const cpu::QuantizedOpDef& def, const Node* node,
                        const Folded& w, CpuBuiltinNode* cn, std::string* log) {
  const std::vector<int> ins = ToVector(node->inputs);
  if (ins.size() < def.min_inputs || ins.size() > def.max_inputs) {
    return "expects " + std::to_string(def.min_inputs) +
           (def.max_inputs != def.min_inputs ? " or " + std::to_string(def.max_inputs) : "") +
           " inputs, got " + std::to_string(ins.size());
  }
  std::string why;
  cn->op = def.create(node->builtin_data, w.q, w.shape, &why);
  if (cn->op == nullptr) return why;
  cn->weight_input = def.weight_input;
  cn->weight_info = TensorInfo{DType::kFloat32, w.shape, nullptr};
  std::vector<TensorInfo> infos;
  why = ReaderInputs(ctx, ins, *cn, true, &infos);
  return why.empty() ? InferReader(ctx, node, *cn, infos, log) : why;
}

// A difflite.WinogradConv3x3 whose w (input 1) is the folded `w`: the op's own parser and Infer
// check the node against the contract first (attributes; x [N,H,W,Cin], w as the float32 tensor
// it stands for, bias [Cout]), then it becomes a quantized 3x3 CONV_2D, SAME, stride 1, no
// activation ("" or why not; a quantized w must be the filter form [Cout, 3, 3, Cin]).
std::string ClaimWinograd(Context* ctx, const Node* node, const Folded& w, CpuBuiltinNode* cn,
                          std::string* log) {
  std::string why;
  const std::unique_ptr<OpInstance> contract = ParseCustomNode(node, winograd::kOpName, &why);
  if (contract == nullptr) return why;
  const cpu::QuantizedOpDef* def = OpRegistry<cpu::QuantizedOpDef>::Find(winograd::kOpName);
  const std::vector<int> ins = ToVector(node->inputs);
  cn->weight_input = def->weight_input;
  cn->weight_info = TensorInfo{DType::kFloat32, w.shape, nullptr};
  std::vector<TensorInfo> infos, outs;
  why = ReaderInputs(ctx, ins, *cn, false, &infos);
  if (why.empty()) why = contract->Infer(infos, &outs);
  if (!why.empty()) return why;
  cn->op = def->create(nullptr, w.q, w.shape, &why);
  if (cn->op == nullptr) return why;
  why = InferReader(ctx, node, *cn, infos, log);
  if (!why.empty()) return why;
  *log += " as CONV_2D (" + contract->Describe() + ")";
  return "";
}

// What runs a node that reads a folded tensor but is no claimed reader of it, for logs: a
// difflite op is the op registry's (it reads the float32 tensor TFLite computes), any other TFLite's.
std::string UnclaimedReader(Context* ctx, int node_index) {
  Node* node = nullptr;
  Registration* reg = nullptr;
  if (ctx->GetNodeAndRegistration(ctx, node_index, &node, &reg) == tfl::kOk && reg != nullptr &&
      reg->builtin_code == tfl::kBuiltinCustom && OpRegistry<OpDef>::Find(reg->custom_name) != nullptr) {
    return "a difflite op reading it as float32";
  }
  return "left to TFLite";
}

}  // namespace

std::map<int, std::unique_ptr<CpuBuiltinNode>> ClaimQuantizedBuiltins(Context* ctx,
                                                                      const std::vector<int>& plan,
                                                                      const PlanOrder& order,
                                                                      bool verbose) {
  std::map<int, std::unique_ptr<CpuBuiltinNode>> claimed;
  std::map<int, Folded> folded;  // tensor -> its value, for foldable nodes' outputs
  std::map<int, int> folder;     // foldable node -> its output tensor
  std::map<int, std::vector<std::pair<int, int>>> readers;  // tensor -> (node, input position)
  std::map<int, std::string> claim_logs;
  for (int node_index : plan) {
    Node* node = nullptr;
    Registration* reg = nullptr;
    if (ctx->GetNodeAndRegistration(ctx, node_index, &node, &reg) != tfl::kOk || node == nullptr ||
        reg == nullptr) {
      continue;
    }
    const std::vector<int> ins = ToVector(node->inputs);
    for (size_t pos = 0; pos < ins.size(); ++pos) {
      if (ins[pos] >= 0) readers[ins[pos]].push_back({node_index, static_cast<int>(pos)});
    }
    const int32_t code = reg->builtin_code;
    const bool winograd = IsWinograd(reg);
    const cpu::QuantizedOpDef* reader = winograd ? nullptr : QuantizedReader(code);
    if (!winograd && code != kDequantize && code != kMul && code != kReshape && reader == nullptr) {
      continue;
    }
    const char* name = winograd ? winograd::kOpName : BuiltinName(code);
    const std::string wiring = order.Check(ctx, node_index, node);
    if (winograd || reader != nullptr) {
      if (ins.size() < 2) continue;
      auto w = folded.find(ins[winograd ? 1 : reader->weight_input]);
      if (w == folded.end() || !w->second.quantized) continue;  // a float weight: TFLite's
      auto cn = std::make_unique<CpuBuiltinNode>();
      cn->name = name;
      std::string log;
      std::string why = !wiring.empty() ? wiring
                        : winograd      ? ClaimWinograd(ctx, node, w->second, cn.get(), &log)
                                        : ClaimReader(ctx, *reader, node, w->second, cn.get(), &log);
      if (!why.empty()) {
        if (winograd) {  // still the op registry's (cpu/claim.cc), if it takes it
          Log("node " + std::to_string(node_index) + " (" + name + ") does not read its quantized "
              "filter as stored: " + why + "; the custom op reads TFLite's float32 DEQUANTIZE of it");
        } else {
          Log("not delegating node " + std::to_string(node_index) + " (" + name +
              " with quantized weights): " + why);
        }
        continue;
      }
      claim_logs[node_index] = log;
      claimed[node_index] = std::move(cn);
      continue;
    }
    Folded value;
    bool candidate = false;
    const std::string why = wiring.empty() ? FoldNode(ctx, code, node, folded, &value, &candidate) : wiring;
    if (!why.empty()) {
      if (verbose && candidate) {
        Log("not folding node " + std::to_string(node_index) + " (" + name + "): " + why);
      }
      continue;
    }
    const int out = ToVector(node->outputs)[0];
    folded[out] = value;
    folder[node_index] = out;
  }
  // A foldable node is claimed where only claimed nodes read its output: backwards, so that a
  // node's readers are decided before it.
  std::set<int> graph_outputs;
  const bool previewed = !folder.empty() && GraphOutputs(ctx, plan, &graph_outputs);
  if (!folder.empty() && !previewed) {
    Log("cannot preview the partitioning (no graph outputs known): quantized weights are "
        "dequantized by TFLite");
  }
  for (auto it = plan.rbegin(); previewed && it != plan.rend(); ++it) {
    auto f = folder.find(*it);
    if (f == folder.end()) continue;
    const int out = f->second;
    std::string why = graph_outputs.count(out) ? "its output is a graph output" : "";
    for (const auto& reader : readers[out]) {
      if (!why.empty()) break;
      auto c = claimed.find(reader.first);
      if (c == claimed.end()) {
        why = "node " + std::to_string(reader.first) + ", " + UnclaimedReader(ctx, reader.first) +
              ", reads its output";
      } else if (!c->second->folded && reader.second != c->second->weight_input) {
        why = "node " + std::to_string(reader.first) + " reads its output as input " +
              std::to_string(reader.second);
      }
    }
    if (!why.empty()) {
      if (verbose && folded[out].quantized) Log("not folding node " + std::to_string(*it) + ": " + why);
      continue;
    }
    auto cn = std::make_unique<CpuBuiltinNode>();
    Node* node = nullptr;
    Registration* reg = nullptr;
    ctx->GetNodeAndRegistration(ctx, *it, &node, &reg);
    cn->name = BuiltinName(reg->builtin_code);
    cn->folded = true;
    const Folded& v = folded[out];
    claim_logs[*it] = "output=float32" + ShapeToString(v.shape) + " as " +
                      (v.quantized ? std::string(v.q.bits == 8 ? "int8" : "int4") + ", " +
                                         std::to_string(v.q.scale_count) + " scales of " +
                                         std::to_string(v.q.group)
                                   : std::string("float16 block scales")) +
                      " folded";
    claimed[*it] = std::move(cn);
  }
  if (verbose) {
    for (const auto& kv : claimed) {
      Log("claim node " + std::to_string(kv.first) + " " + kv.second->name + " " + claim_logs[kv.first]);
    }
  }
  return claimed;
}

}  // namespace difflite
