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
// nothing (it is claimed only when a claimed node consumes the output).
// A refused node gets a one-line reason on stderr and stays with TFLite.
// Factories run on several threads (ClaimAll): they compile programs.
#include <algorithm>
#include <atomic>
#include <chrono>
#include <climits>
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
      cn->consts[idx] = h;
    } else {
      info.dtype = ToDType(t->type);
      info.shape = t->dims ? ToVector(t->dims) : Shape{};
      if (info.dtype != DType::kFloat32 && info.dtype != DType::kInt32) {
        return "input " + std::to_string(i) + " is " + TfLiteTypeName(t->type) +
               " (the OpenCL backend exchanges float32 and int32 tensors)";
      }
    }
    if (NumElements(info.shape) > INT32_MAX) {
      return "input " + std::to_string(i) + " has more than 2^31 elements";
    }
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
    info.dtype = ToDType(t->type);
    info.shape = t->dims ? ToVector(t->dims) : Shape{};
    if (HasDynamicDims(t)) return "output " + std::to_string(o) + " has a dynamic shape";
    if (info.dtype != DType::kFloat32 && info.dtype != DType::kInt32) {
      return "output " + std::to_string(o) + " is " + TfLiteTypeName(t->type);
    }
    if (NumElements(info.shape) > INT32_MAX || NumElements(info.shape) <= 0) {
      return "output " + std::to_string(o) + " has " + std::to_string(NumElements(info.shape)) +
             " elements";
    }
    cn->out_info.push_back(info);
  }
  return "";
}

// A DEQUANTIZE of a float constant: its output is that constant ("" or why not).
static std::string FoldDequantize(Context* ctx, ClaimedNode* cn) {
  if (cn->inputs.size() != 1 || cn->outputs.size() != 1 || cn->inputs[0] < 0 ||
      cn->consts.count(cn->inputs[0]) == 0) {
    return "only DEQUANTIZE of a constant is supported (folded at prepare)";
  }
  const Tensor* src = TensorAt(ctx, cn->inputs[0]);
  if (src->type != tfl::kFloat16 && src->type != tfl::kFloat32) {
    return std::string("DEQUANTIZE of ") + TfLiteTypeName(src->type) +
           " (quantized integers) is not supported";
  }
  const auto& h = cn->consts.at(cn->inputs[0]);
  if (cn->out_info[0].dtype != DType::kFloat32 || cn->out_info[0].shape != h->shape) {
    return "DEQUANTIZE output must be float32 of the input's shape";
  }
  cn->folded = true;
  cn->folded_value = h;
  return "";
}

std::string BackendImpl::CreateOp(Node* node, Registration* reg, bool is_custom,
                                  ClaimedNode* cn) {
  std::string why;
  if (is_custom) {
    cn->custom = ParseCustomNode(node, reg->custom_name, &why);
    if (cn->custom == nullptr) return why;
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
  const GpuOpDef* def = FindGpuOp(cn->name.c_str());
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
  *why = ClaimInputs(ctx, cn.get());
  if (why->empty()) *why = ClaimOutputs(ctx, cn.get());
  if (!why->empty()) return nullptr;
  if (!is_custom && reg->builtin_code == static_cast<int32_t>(tfl::BuiltinOp::kDequantize)) {
    *why = FoldDequantize(ctx, cn.get());
    if (!why->empty()) return nullptr;
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

// DEQUANTIZE nodes first, in order (cheap: they fold): a consumer must see its weight as a
// constant. Then every other node's op factory on a pool of threads, so that the distinct
// OpenCL programs the factories ask for compile (or load from the disk cache) at once.
void BackendImpl::ClaimAll(Context* ctx, std::vector<Candidate>* candidates) {
  std::vector<Candidate*> rest;
  for (Candidate& c : *candidates) {
    if (c.is_dequantize()) {
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
  std::unique_lock<std::mutex> lock(rt->exec_mutex());
  ClaimAll(ctx, &candidates);
  std::vector<int> claimed;
  std::map<int, std::vector<int>> consumers;  // tensor -> claimed consumer nodes
  for (Candidate& c : candidates) {
    if (c.claimed == nullptr) {
      Log("not delegating node " + std::to_string(c.node_index) + " (" + c.name + "): " + c.why);
      continue;
    }
    const ClaimedNode& cn = *c.claimed;
    if (options.verbose) {
      std::string in_s, out_s;
      for (size_t i = 0; i < cn.in_info.size(); ++i) {
        in_s += (i ? ", " : "") + (cn.inputs[i] < 0 ? std::string("none")
                                                   : InfoString(cn.in_info[i]));
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
  // A folded DEQUANTIZE is only worth claiming for a claimed consumer.
  std::vector<int> kept;
  for (int node_index : claimed) {
    ClaimedNode& cn = *pending[node_index];
    if (cn.folded && consumers[cn.outputs[0]].empty()) {
      pending.erase(node_index);
      continue;
    }
    kept.push_back(node_index);
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

const char* BuiltinName(int32_t code) {
  for (const NameEntry& e : kBuiltinNames) {
    if (static_cast<int32_t>(e.code) == code) return e.name;
  }
  return nullptr;
}

}  // namespace difflite::gpu
