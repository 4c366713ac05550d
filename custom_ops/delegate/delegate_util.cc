#include "delegate_util.h"

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "difflite/attrs.h"

namespace difflite {

std::string Printable(const std::string& s) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  out.reserve(s.size());
  for (unsigned char c : s) {
    if (c >= 0x20 && c < 0x7f) {
      out.push_back(static_cast<char>(c));
    } else {
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

void Log(const std::string& line) {
  std::fprintf(stderr, "difflite: %s\n", Printable(line).c_str());
  std::fflush(stderr);
}

void LogError(tfl::Context* ctx, const std::string& line) {
  Log(line);
  if (ctx != nullptr && ctx->ReportError != nullptr) {
    ctx->ReportError(ctx, "difflite: %s", Printable(line).c_str());
  }
}

tfl::Tensor* TensorAt(tfl::Context* ctx, int index) {
  if (ctx->GetTensor != nullptr) return ctx->GetTensor(ctx, index);
  return &ctx->tensors[index];
}

std::vector<int> ToVector(const tfl::IntArray* a) {
  if (a == nullptr) return {};
  return std::vector<int>(a->data, a->data + a->size);
}

tfl::IntArray* NewIntArray(const std::vector<int>& v) {
  auto* a = static_cast<tfl::IntArray*>(
      std::malloc(sizeof(int) * (1 + std::max<size_t>(v.size(), 1))));
  if (a == nullptr) return nullptr;
  a->size = static_cast<int>(v.size());
  for (size_t i = 0; i < v.size(); ++i) a->data[i] = v[i];
  return a;
}

DType ToDType(tfl::Type t) {
  switch (t) {
    case tfl::kFloat32: return DType::kFloat32;
    case tfl::kFloat16: return DType::kFloat16;
    case tfl::kInt32: return DType::kInt32;
    default: return DType::kOther;
  }
}

bool TensorAbiMatches(tfl::Context* ctx) {
  if (ctx->GetTensor == nullptr || ctx->tensors_size <= 1 ||
      ctx->GetTensor(ctx, 1) == &ctx->tensors[1]) {
    return true;
  }
  LogError(ctx,
           "TFLite ABI mismatch: the runtime's TfLiteTensor is not the "
           "layout of difflite/tflite_abi.h; refusing to delegate");
  return false;
}

bool IsConstantTensor(const tfl::Tensor* t) {
  return t->allocation_type == tfl::kMmapRo ||
         t->allocation_type == tfl::kPersistentRo;
}

TensorInfo InfoOf(const tfl::Tensor* t) {
  TensorInfo info;
  info.dtype = ToDType(t->type);
  if (t->dims != nullptr) info.shape = ToVector(t->dims);
  if (IsConstantTensor(t)) info.const_data = t->data.data;
  return info;
}

std::string InfoString(const TensorInfo& t) {
  return std::string(DTypeName(t.dtype)) + ShapeToString(t.shape);
}

const char* TfLiteTypeName(tfl::Type t) {
  switch (t) {
    case tfl::kNoType: return "notype";
    case tfl::kFloat32: return "float32";
    case tfl::kInt32: return "int32";
    case tfl::kUInt8: return "uint8";
    case tfl::kInt64: return "int64";
    case tfl::kString: return "string";
    case tfl::kBool: return "bool";
    case tfl::kInt16: return "int16";
    case tfl::kComplex64: return "complex64";
    case tfl::kInt8: return "int8";
    case tfl::kFloat16: return "float16";
    case tfl::kFloat64: return "float64";
    case tfl::kComplex128: return "complex128";
    case tfl::kUInt64: return "uint64";
    case tfl::kResource: return "resource";
    case tfl::kVariant: return "variant";
    case tfl::kUInt32: return "uint32";
    case tfl::kUInt16: return "uint16";
    case tfl::kInt4: return "int4";
    case tfl::kBFloat16: return "bfloat16";
    default: return "other";
  }
}

std::unique_ptr<OpInstance> ParseCustomNode(const tfl::Node* node,
                                            const char* custom_name,
                                            std::string* why) {
  const OpDef* def = OpRegistry<OpDef>::Find(custom_name);
  if (def == nullptr) {
    *why = "unknown difflite op";
    return nullptr;
  }
  AttrMap attrs;
  const size_t size = node->custom_initial_data_size < 0
                          ? 0
                          : static_cast<size_t>(node->custom_initial_data_size);
  std::string e = AttrMap::Parse(node->custom_initial_data, size, &attrs);
  if (!e.empty()) {
    *why = e;
    return nullptr;
  }
  std::unique_ptr<OpInstance> op = def->create(attrs, &e);
  if (op == nullptr) *why = e.empty() ? "invalid attributes" : e;
  return op;
}

PlanOrder::PlanOrder(tfl::Context* ctx, const std::vector<int>& plan) {
  writers_.resize(ctx->tensors_size);
  int highest = -1;
  for (int node_index : plan) highest = std::max(highest, node_index);
  position_.assign(static_cast<size_t>(highest + 1), -1);
  for (size_t pos = 0; pos < plan.size(); ++pos) {
    const int node_index = plan[pos];
    if (node_index < 0) continue;
    position_[node_index] = static_cast<int>(pos);
    tfl::Node* node = nullptr;
    tfl::Registration* reg = nullptr;
    if (ctx->GetNodeAndRegistration(ctx, node_index, &node, &reg) != tfl::kOk || node == nullptr) {
      continue;
    }
    for (int idx : ToVector(node->outputs)) {
      if (idx >= 0 && static_cast<size_t>(idx) < writers_.size()) writers_[idx].push_back(node_index);
    }
  }
}

std::string PlanOrder::Check(tfl::Context* ctx, int node_index, const tfl::Node* node) const {
  if (node_index < 0 || static_cast<size_t>(node_index) >= position_.size() ||
      position_[node_index] < 0) {
    return "node " + std::to_string(node_index) + " is not in the execution plan";
  }
  const int here = position_[node_index];
  for (int idx : ToVector(node->inputs)) {
    if (idx < 0) continue;  // an omitted optional input: the op decides
    if (static_cast<size_t>(idx) >= writers_.size()) {
      return "input tensor index " + std::to_string(idx) + " is out of range";
    }
    for (int writer : writers_[idx]) {
      if (position_[writer] >= here) {
        return "input tensor " + std::to_string(idx) + " is written by " +
               (writer == node_index ? std::string("this node itself")
                                     : "node " + std::to_string(writer) + ", which runs after it") +
               " (a cycle)";
      }
    }
  }
  for (int idx : ToVector(node->outputs)) {
    if (idx < 0 || static_cast<size_t>(idx) >= writers_.size()) {
      return "output tensor index " + std::to_string(idx) + " is out of range";
    }
    if (writers_[idx].size() > 1) {
      return "output tensor " + std::to_string(idx) + " is written " +
             std::to_string(writers_[idx].size()) + " times (nodes " + ShapeToString(writers_[idx]) + ")";
    }
    const tfl::Tensor* t = TensorAt(ctx, idx);
    if (IsConstantTensor(t)) {
      return "output tensor " + std::to_string(idx) + " is a constant of the model";
    }
  }
  return "";
}

std::string CheckElementCount(const TensorInfo& info, const std::string& what) {
  const int64_t n = NumElements(info.shape);
  if (n < 0) {
    return what + " has a negative dimension or more elements than int64 counts: " +
           ShapeToString(info.shape);
  }
  if (n > INT32_MAX) {
    return what + " has more than 2^31 - 1 elements: " + ShapeToString(info.shape);
  }
  return "";
}

std::string ExceptionText() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

tfl::Registration DelegateKernelRegistration(
    const char* name, void* (*init)(tfl::Context*, const char*, size_t),
    void (*free)(tfl::Context*, void*), tfl::Status (*prepare)(tfl::Context*, tfl::Node*),
    tfl::Status (*invoke)(tfl::Context*, tfl::Node*)) {
  tfl::Registration r;
  std::memset(&r, 0, sizeof(r));
  r.init = init;
  r.free = free;
  r.prepare = prepare;
  r.invoke = invoke;
  r.builtin_code = tfl::kBuiltinDelegate;
  r.custom_name = name;
  r.version = 1;
  return r;
}

namespace {

struct NameEntry {
  tfl::BuiltinOp code;
  const char* name;
};

const NameEntry kBuiltinNames[] = {
    {tfl::BuiltinOp::kAdd, "ADD"},
    {tfl::BuiltinOp::kConcatenation, "CONCATENATION"},
    {tfl::BuiltinOp::kConv2d, "CONV_2D"},
    {tfl::BuiltinOp::kDepthwiseConv2d, "DEPTHWISE_CONV_2D"},
    {tfl::BuiltinOp::kDequantize, "DEQUANTIZE"},
    {tfl::BuiltinOp::kFloor, "FLOOR"},
    {tfl::BuiltinOp::kFullyConnected, "FULLY_CONNECTED"},
    {tfl::BuiltinOp::kLogistic, "LOGISTIC"},
    {tfl::BuiltinOp::kMul, "MUL"},
    {tfl::BuiltinOp::kRelu, "RELU"},
    {tfl::BuiltinOp::kRelu6, "RELU6"},
    {tfl::BuiltinOp::kReshape, "RESHAPE"},
    {tfl::BuiltinOp::kResizeBilinear, "RESIZE_BILINEAR"},
    {tfl::BuiltinOp::kSoftmax, "SOFTMAX"},
    {tfl::BuiltinOp::kTanh, "TANH"},
    {tfl::BuiltinOp::kPad, "PAD"},
    {tfl::BuiltinOp::kGather, "GATHER"},
    {tfl::BuiltinOp::kTranspose, "TRANSPOSE"},
    {tfl::BuiltinOp::kMean, "MEAN"},
    {tfl::BuiltinOp::kSub, "SUB"},
    {tfl::BuiltinOp::kDiv, "DIV"},
    {tfl::BuiltinOp::kSqueeze, "SQUEEZE"},
    {tfl::BuiltinOp::kStridedSlice, "STRIDED_SLICE"},
    {tfl::BuiltinOp::kExp, "EXP"},
    {tfl::BuiltinOp::kSplit, "SPLIT"},
    {tfl::BuiltinOp::kCast, "CAST"},
    {tfl::BuiltinOp::kMaximum, "MAXIMUM"},
    {tfl::BuiltinOp::kMinimum, "MINIMUM"},
    {tfl::BuiltinOp::kNeg, "NEG"},
    {tfl::BuiltinOp::kPadV2, "PADV2"},
    {tfl::BuiltinOp::kSelect, "SELECT"},
    {tfl::BuiltinOp::kSin, "SIN"},
    {tfl::BuiltinOp::kTile, "TILE"},
    {tfl::BuiltinOp::kExpandDims, "EXPAND_DIMS"},
    {tfl::BuiltinOp::kLog, "LOG"},
    {tfl::BuiltinOp::kSum, "SUM"},
    {tfl::BuiltinOp::kSqrt, "SQRT"},
    {tfl::BuiltinOp::kRsqrt, "RSQRT"},
    {tfl::BuiltinOp::kPow, "POW"},
    {tfl::BuiltinOp::kReduceProd, "REDUCE_PROD"},
    {tfl::BuiltinOp::kReduceMax, "REDUCE_MAX"},
    {tfl::BuiltinOp::kReduceMin, "REDUCE_MIN"},
    {tfl::BuiltinOp::kSquare, "SQUARE"},
    {tfl::BuiltinOp::kResizeNearestNeighbor, "RESIZE_NEAREST_NEIGHBOR"},
    {tfl::BuiltinOp::kSquaredDifference, "SQUARED_DIFFERENCE"},
    {tfl::BuiltinOp::kAbs, "ABS"},
    {tfl::BuiltinOp::kSplitV, "SPLIT_V"},
    {tfl::BuiltinOp::kCeil, "CEIL"},
    {tfl::BuiltinOp::kCos, "COS"},
    {tfl::BuiltinOp::kSelectV2, "SELECT_V2"},
    {tfl::BuiltinOp::kBatchMatmul, "BATCH_MATMUL"},
    {tfl::BuiltinOp::kBroadcastTo, "BROADCAST_TO"},
    {tfl::BuiltinOp::kGelu, "GELU"},
    {tfl::BuiltinOp::kSign, "SIGN"},
};

}  // namespace

const char* BuiltinName(int32_t code) {
  for (const NameEntry& e : kBuiltinNames) {
    if (static_cast<int32_t>(e.code) == code) return e.name;
  }
  return nullptr;
}

}  // namespace difflite
