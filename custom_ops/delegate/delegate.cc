// The TFLite external delegate of the op library (CPU backend).
//
// Flow:
//  1. tflite_plugin_create_delegate parses the options and returns a
//     tfl::Delegate with kDelegateFlagsAllowDynamicTensors set.
//  2. DelegatePrepare walks the execution plan and claims every CUSTOM node
//     whose custom_code names a difflite op, whose attributes parse and whose
//     tensors pass the op's shape/type check. A refused node gets a one-line
//     reason (stderr and context->ReportError) and stays with TFLite.
//     Claimed nodes go to ReplaceNodeSubsetsWithDelegateKernels, which groups
//     connected claimed nodes into partitions (one macro-node each).
//  3. Each partition is a Partition (KernelInit): its nodes in plan order.
//     KernelPrepare infers every shape in order, resizes the partition's
//     output tensors, and sizes the buffers of the tensors that flow between
//     two nodes of the partition: the interpreter does not allocate those, so
//     the delegate owns them. KernelInvoke runs the nodes in order.
#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <new>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "difflite/attrs.h"
#include "difflite/op_api.h"
#include "difflite/tflite_abi.h"

#if defined(_WIN32)
#define DIFFLITE_EXPORT __declspec(dllexport)
#else
#define DIFFLITE_EXPORT __attribute__((visibility("default")))
#endif

namespace difflite {
namespace {

using tfl::Context;
using tfl::Delegate;
using tfl::IntArray;
using tfl::Node;
using tfl::Registration;
using tfl::Tensor;

constexpr const char* kOpPrefix = "difflite.";
constexpr const char* kKernelName = "DiffliteDelegateCpu";

struct Options {
  std::string backend = "cpu";
  std::string precision = "fp32";
  bool verbose = false;
  int num_threads = 0;  // 0: the interpreter's recommendation, else cores
};

struct DelegateState {
  Delegate delegate;
  Options options;
};

DelegateState* StateOf(Delegate* d) {
  return static_cast<DelegateState*>(d->data_);
}

// Messages quote names and strings from the model: keep them one line of
// printable ASCII (the Python wrappers decode reports as UTF-8 and would
// raise on stray bytes).
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

// One-line diagnostics: always to stderr; errors also to the interpreter's
// error reporter (the Python wrappers show those in the exception text).
void Log(const std::string& line) {
  std::fprintf(stderr, "difflite: %s\n", Printable(line).c_str());
  std::fflush(stderr);
}

void LogError(Context* ctx, const std::string& line) {
  Log(line);
  if (ctx != nullptr && ctx->ReportError != nullptr) {
    ctx->ReportError(ctx, "difflite: %s", Printable(line).c_str());
  }
}

Tensor* TensorAt(Context* ctx, int index) {
  if (ctx->GetTensor != nullptr) return ctx->GetTensor(ctx, index);
  return &ctx->tensors[index];
}

std::vector<int> ToVector(const IntArray* a) {
  if (a == nullptr) return {};
  return std::vector<int>(a->data, a->data + a->size);
}

// malloc'ed, as Context::ResizeTensor frees it.
IntArray* NewIntArray(const std::vector<int>& v) {
  auto* a = static_cast<IntArray*>(
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

TensorInfo InfoOf(const Tensor* t) {
  TensorInfo info;
  info.dtype = ToDType(t->type);
  if (t->dims != nullptr) info.shape = ToVector(t->dims);
  if (t->allocation_type == tfl::kMmapRo ||
      t->allocation_type == tfl::kPersistentRo) {
    info.const_data = t->data.data;
  }
  return info;
}

std::string InfoString(const TensorInfo& t) {
  return std::string(DTypeName(t.dtype)) + ShapeToString(t.shape);
}

std::string ListString(const std::vector<int>& v) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < v.size(); ++i) os << (i ? "," : "") << v[i];
  os << "]";
  return os.str();
}

int ThreadCount(const Options& o, const Context* ctx) {
  if (o.num_threads > 0) return o.num_threads;
  if (ctx != nullptr && ctx->recommended_num_threads > 0) {
    return ctx->recommended_num_threads;
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return static_cast<int>(std::min(8u, std::max(1u, hw)));
}

// Creates the op of a node from its custom_code and FlexBuffer options.
// Returns nullptr with *why set when the op is unknown or the options fail.
std::unique_ptr<OpInstance> ParseNode(const Node* node,
                                      const char* custom_name,
                                      std::string* why) {
  const OpDef* def = FindOp(custom_name);
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

// Parses and checks one node: options, then the op's type/shape check on
// the node's tensors. `known` holds the inferred infos of tensors produced
// by nodes already claimed (their interpreter dims may be stale). Returns
// the op instance, or nullptr with *why set.
std::unique_ptr<OpInstance> BuildNode(Context* ctx, const Node* node,
                                      const char* custom_name,
                                      const std::map<int, TensorInfo>& known,
                                      std::vector<TensorInfo>* ins,
                                      std::vector<TensorInfo>* outs,
                                      std::string* why) {
  std::unique_ptr<OpInstance> op = ParseNode(node, custom_name, why);
  if (op == nullptr) return nullptr;
  std::string e;
  ins->clear();
  for (int idx : ToVector(node->inputs)) {
    if (idx < 0 || static_cast<size_t>(idx) >= ctx->tensors_size) {
      *why = "optional or out-of-range input tensor " + std::to_string(idx);
      return nullptr;
    }
    auto it = known.find(idx);
    ins->push_back(it != known.end() ? it->second
                                     : InfoOf(TensorAt(ctx, idx)));
  }
  e = op->Infer(*ins, outs);
  if (!e.empty()) {
    *why = e;
    return nullptr;
  }
  const std::vector<int> out_idx = ToVector(node->outputs);
  if (out_idx.size() != outs->size()) {
    *why = "expects " + std::to_string(outs->size()) + " outputs, got " +
           std::to_string(out_idx.size());
    return nullptr;
  }
  for (size_t i = 0; i < out_idx.size(); ++i) {
    const int idx = out_idx[i];
    if (idx < 0 || static_cast<size_t>(idx) >= ctx->tensors_size) {
      *why = "out-of-range output tensor " + std::to_string(idx);
      return nullptr;
    }
    const Tensor* t = TensorAt(ctx, idx);
    if (ToDType(t->type) != (*outs)[i].dtype) {
      *why = "output " + std::to_string(i) + " is declared " +
             DTypeName(ToDType(t->type)) + ", the op produces " +
             DTypeName((*outs)[i].dtype);
      return nullptr;
    }
  }
  return op;
}

// ---------------------------------------------------------------------------
// Delegate kernel: one per partition.

struct PartitionNode {
  int node_index = -1;
  std::string name;
  std::unique_ptr<OpInstance> op;
  std::vector<int> inputs;
  std::vector<int> outputs;
};

struct OwnedTensor {
  TensorInfo info;
  std::vector<uint32_t> storage;  // 4-byte words, NaN-poisoned when sized
  size_t bytes = 0;
};

struct Partition {
  DelegateState* state = nullptr;
  std::vector<PartitionNode> nodes;
  std::set<int> outputs;                 // interpreter-visible outputs
  std::map<int, TensorInfo> produced;    // inferred infos, set in Prepare
  std::map<int, OwnedTensor> owned;      // delegate-owned intermediates
  std::string init_error;
};

void* KernelInitImpl(Context* ctx, const char* buffer) {
  const auto* params = reinterpret_cast<const tfl::DelegateParams*>(buffer);
  auto* p = new Partition();
  if (params == nullptr || params->delegate == nullptr) {
    p->init_error = "delegate kernel created without parameters";
    return p;
  }
  p->state = StateOf(params->delegate);
  for (int idx : ToVector(params->output_tensors)) p->outputs.insert(idx);
  for (int node_index : ToVector(params->nodes_to_replace)) {
    Node* node = nullptr;
    Registration* reg = nullptr;
    if (ctx->GetNodeAndRegistration(ctx, node_index, &node, &reg) !=
            tfl::kOk ||
        node == nullptr || reg == nullptr || reg->custom_name == nullptr) {
      p->init_error = "cannot read node " + std::to_string(node_index);
      return p;
    }
    PartitionNode pn;
    pn.node_index = node_index;
    pn.name = reg->custom_name;
    std::string why;
    pn.op = ParseNode(node, reg->custom_name, &why);
    if (pn.op == nullptr) {
      p->init_error = "node " + std::to_string(node_index) + " (" + pn.name +
                      "): " + why;
      return p;
    }
    pn.inputs = ToVector(node->inputs);
    pn.outputs = ToVector(node->outputs);
    // Outputs nobody outside the partition sees: the delegate owns them
    // (shapes and buffers are set in KernelPrepare).
    for (int idx : pn.outputs) {
      if (p->outputs.count(idx) == 0) p->owned[idx];
    }
    p->nodes.push_back(std::move(pn));
  }
  if (p->state->options.verbose) {
    std::vector<int> node_ids, owned_ids;
    for (const auto& n : p->nodes) node_ids.push_back(n.node_index);
    for (const auto& kv : p->owned) owned_ids.push_back(kv.first);
    Log("partition nodes=" + ListString(node_ids) +
        " inputs=" + ListString(ToVector(params->input_tensors)) +
        " outputs=" + ListString(ToVector(params->output_tensors)) +
        " delegate_owned=" + ListString(owned_ids));
  }
  return p;
}

void KernelFree(Context* /*ctx*/, void* buffer) {
  delete static_cast<Partition*>(buffer);
}

tfl::Status KernelPrepareImpl(Context* ctx, Node* node) {
  auto* p = static_cast<Partition*>(node->user_data);
  if (p == nullptr) {
    LogError(ctx, "delegate kernel has no state");
    return tfl::kError;
  }
  if (!p->init_error.empty()) {
    LogError(ctx, p->init_error);
    return tfl::kError;
  }
  p->produced.clear();
  for (PartitionNode& pn : p->nodes) {
    std::vector<TensorInfo> ins, outs;
    for (int idx : pn.inputs) {
      auto it = p->produced.find(idx);
      ins.push_back(it != p->produced.end() ? it->second
                                            : InfoOf(TensorAt(ctx, idx)));
    }
    const std::string e = pn.op->Infer(ins, &outs);
    if (!e.empty() || outs.size() != pn.outputs.size()) {
      LogError(ctx, "node " + std::to_string(pn.node_index) + " (" + pn.name +
                        "): " + (e.empty() ? "output count changed" : e));
      return tfl::kError;
    }
    for (size_t i = 0; i < outs.size(); ++i) {
      const int idx = pn.outputs[i];
      p->produced[idx] = outs[i];
      if (p->outputs.count(idx)) {
        Tensor* t = TensorAt(ctx, idx);
        if (t->dims == nullptr || ToVector(t->dims) != outs[i].shape) {
          IntArray* dims = NewIntArray(outs[i].shape);
          if (dims == nullptr ||
              ctx->ResizeTensor(ctx, t, dims) != tfl::kOk) {
            LogError(ctx, "cannot resize output tensor " +
                              std::to_string(idx) + " to " +
                              ShapeToString(outs[i].shape));
            return tfl::kError;
          }
        }
      } else {
        OwnedTensor& o = p->owned[idx];
        o.info = outs[i];
        const size_t bytes = static_cast<size_t>(NumElements(outs[i].shape)) *
                             DTypeSize(outs[i].dtype);
        if (bytes != o.bytes) {
          o.bytes = bytes;
          // Poisoned so that a read-before-write shows up as NaN.
          o.storage.assign((bytes + 3) / 4, 0x7fc00000u);
        }
      }
    }
  }
  return tfl::kOk;
}

tfl::Status KernelInvokeImpl(Context* ctx, Node* node) {
  auto* p = static_cast<Partition*>(node->user_data);
  if (p == nullptr || !p->init_error.empty()) return tfl::kError;
  ExecOptions exec;
  exec.num_threads = ThreadCount(p->state->options, ctx);
  for (PartitionNode& pn : p->nodes) {
    std::vector<InTensor> ins;
    std::vector<OutTensor> outs;
    for (int idx : pn.inputs) {
      auto own = p->owned.find(idx);
      if (own != p->owned.end()) {
        ins.push_back({own->second.info.dtype, own->second.info.shape,
                       own->second.storage.data()});
        continue;
      }
      const Tensor* t = TensorAt(ctx, idx);
      TensorInfo info = InfoOf(t);
      if (t->data.data == nullptr) {
        LogError(ctx, "node " + std::to_string(pn.node_index) +
                          ": input tensor " + std::to_string(idx) +
                          " has no data");
        return tfl::kError;
      }
      ins.push_back({info.dtype, info.shape, t->data.data});
    }
    for (int idx : pn.outputs) {
      auto own = p->owned.find(idx);
      if (own != p->owned.end()) {
        outs.push_back({own->second.info.dtype, own->second.info.shape,
                        own->second.storage.data()});
        continue;
      }
      Tensor* t = TensorAt(ctx, idx);
      const TensorInfo& info = p->produced[idx];
      const size_t need = static_cast<size_t>(NumElements(info.shape)) *
                          DTypeSize(info.dtype);
      if (t->data.data == nullptr || t->bytes < need) {
        LogError(ctx, "node " + std::to_string(pn.node_index) +
                          ": output tensor " + std::to_string(idx) +
                          " is not allocated (" + std::to_string(t->bytes) +
                          " bytes, need " + std::to_string(need) + ")");
        return tfl::kError;
      }
      outs.push_back({info.dtype, info.shape, t->data.data});
    }
    const std::string e = pn.op->Run(ins, outs, exec);
    if (!e.empty()) {
      LogError(ctx, "node " + std::to_string(pn.node_index) + " (" + pn.name +
                        "): " + e);
      return tfl::kError;
    }
  }
  return tfl::kOk;
}

// The runtime is C: no exception may leave these entry points.
std::string ExceptionText() {
  try {
    throw;
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "unknown exception";
  }
}

void* KernelInit(Context* ctx, const char* buffer, size_t /*length*/) {
  try {
    return KernelInitImpl(ctx, buffer);
  } catch (...) {
    LogError(ctx, "delegate kernel init failed: " + ExceptionText());
    return nullptr;
  }
}

tfl::Status KernelPrepare(Context* ctx, Node* node) {
  try {
    return KernelPrepareImpl(ctx, node);
  } catch (...) {
    LogError(ctx, "delegate kernel prepare failed: " + ExceptionText());
    return tfl::kError;
  }
}

tfl::Status KernelInvoke(Context* ctx, Node* node) {
  try {
    return KernelInvokeImpl(ctx, node);
  } catch (...) {
    LogError(ctx, "delegate kernel invoke failed: " + ExceptionText());
    return tfl::kError;
  }
}

Registration KernelRegistration() {
  Registration r;
  std::memset(&r, 0, sizeof(r));
  r.init = &KernelInit;
  r.free = &KernelFree;
  r.prepare = &KernelPrepare;
  r.invoke = &KernelInvoke;
  r.builtin_code = tfl::kBuiltinDelegate;
  r.custom_name = kKernelName;
  r.version = 1;
  return r;
}

// ---------------------------------------------------------------------------
// Delegate::Prepare: choose the nodes.

tfl::Status DelegatePrepareImpl(Context* ctx, Delegate* delegate) {
  DelegateState* st = StateOf(delegate);
  // ABI self-check: Context::GetTensor must agree with indexing `tensors`
  // with our sizeof(Tensor); otherwise this header no longer describes the
  // runtime and nothing may be touched.
  if (ctx->GetTensor != nullptr && ctx->tensors_size > 1 &&
      ctx->GetTensor(ctx, 1) != &ctx->tensors[1]) {
    LogError(ctx,
             "TFLite ABI mismatch: the runtime's TfLiteTensor is not the "
             "layout of difflite/tflite_abi.h; refusing to delegate");
    return tfl::kDelegateError;
  }
  IntArray* plan = nullptr;
  if (ctx->GetExecutionPlan(ctx, &plan) != tfl::kOk || plan == nullptr) {
    LogError(ctx, "cannot read the execution plan");
    return tfl::kDelegateError;
  }
  const std::vector<int> plan_nodes = ToVector(plan);  // copy: may change
  std::vector<int> claimed;
  std::map<int, TensorInfo> known;
  const size_t prefix_len = std::strlen(kOpPrefix);
  for (int node_index : plan_nodes) {
    Node* node = nullptr;
    Registration* reg = nullptr;
    if (ctx->GetNodeAndRegistration(ctx, node_index, &node, &reg) !=
            tfl::kOk ||
        node == nullptr || reg == nullptr) {
      continue;
    }
    if (reg->builtin_code != tfl::kBuiltinCustom ||
        reg->custom_name == nullptr ||
        std::strncmp(reg->custom_name, kOpPrefix, prefix_len) != 0) {
      continue;
    }
    std::vector<TensorInfo> ins, outs;
    std::string why;
    std::unique_ptr<OpInstance> op =
        BuildNode(ctx, node, reg->custom_name, known, &ins, &outs, &why);
    if (op == nullptr) {
      LogError(ctx, "not delegating node " + std::to_string(node_index) +
                        " (" + reg->custom_name + "): " + why);
      continue;
    }
    const std::vector<int> out_idx = ToVector(node->outputs);
    for (size_t i = 0; i < out_idx.size(); ++i) known[out_idx[i]] = outs[i];
    claimed.push_back(node_index);
    if (st->options.verbose) {
      std::string in_s, out_s;
      for (size_t i = 0; i < ins.size(); ++i) {
        in_s += (i ? ", " : "") + InfoString(ins[i]);
      }
      for (size_t i = 0; i < outs.size(); ++i) {
        out_s += (i ? ", " : "") + InfoString(outs[i]);
      }
      Log("claim node " + std::to_string(node_index) + " " +
          reg->custom_name + " inputs=(" + in_s + ") outputs=(" + out_s +
          ") attrs={" + op->Describe() + "}");
    }
  }
  if (st->options.verbose) {
    Log("claimed " + std::to_string(claimed.size()) + " of " +
        std::to_string(plan_nodes.size()) + " nodes");
  }
  if (claimed.empty()) return tfl::kOk;
  IntArray* list = NewIntArray(claimed);
  if (list == nullptr) return tfl::kDelegateError;
  const tfl::Status s = ctx->ReplaceNodeSubsetsWithDelegateKernels(
      ctx, KernelRegistration(), list, delegate);
  std::free(list);
  return s;
}

tfl::Status DelegatePrepare(Context* ctx, Delegate* delegate) {
  try {
    return DelegatePrepareImpl(ctx, delegate);
  } catch (...) {
    LogError(ctx, "delegate prepare failed: " + ExceptionText());
    return tfl::kDelegateError;
  }
}

// ---------------------------------------------------------------------------
// Plugin entry points.

void Report(void (*report_error)(const char*), const std::string& msg) {
  const std::string line = "difflite: " + Printable(msg);
  if (report_error != nullptr) {
    report_error(line.c_str());
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

bool ParseOptions(char** keys, char** values, size_t n, Options* o,
                  std::string* error) {
  for (size_t i = 0; i < n; ++i) {
    const std::string key = keys && keys[i] ? keys[i] : "";
    const std::string val = values && values[i] ? values[i] : "";
    if (key == "backend") {
      if (val == "opencl") {
        *error =
            "backend=opencl is not available yet (the OpenCL backend is not "
            "built into this library); use backend=cpu";
        return false;
      }
      if (val != "cpu") {
        *error = "backend must be cpu or opencl, got '" + val + "'";
        return false;
      }
      o->backend = val;
    } else if (key == "precision") {
      if (val != "fp32" && val != "fp16") {
        *error = "precision must be fp32 or fp16, got '" + val + "'";
        return false;
      }
      o->precision = val;
    } else if (key == "verbose") {
      if (val != "0" && val != "1") {
        *error = "verbose must be 0 or 1, got '" + val + "'";
        return false;
      }
      o->verbose = val == "1";
    } else if (key == "num_threads") {
      char* end = nullptr;
      const long v = std::strtol(val.c_str(), &end, 10);
      if (val.empty() || end == nullptr || *end != '\0' || v < 0 || v > 256) {
        *error = "num_threads must be an integer in [0, 256], got '" + val +
                 "'";
        return false;
      }
      o->num_threads = static_cast<int>(v);
    } else {
      *error = "unknown option '" + key +
               "' (known: backend, precision, verbose, num_threads)";
      return false;
    }
  }
  return true;
}

}  // namespace
}  // namespace difflite

extern "C" {

DIFFLITE_EXPORT difflite::tfl::Delegate* tflite_plugin_create_delegate(
    char** options_keys, char** options_values, size_t num_options,
    void (*report_error)(const char*)) {
  using namespace difflite;
  Options options;
  std::string error;
  if (!ParseOptions(options_keys, options_values, num_options, &options,
                    &error)) {
    Report(report_error, error);
    return nullptr;
  }
  auto* st = new (std::nothrow) DelegateState();
  if (st == nullptr) {
    Report(report_error, "out of memory");
    return nullptr;
  }
  std::memset(&st->delegate, 0, sizeof(st->delegate));
  st->options = options;
  st->delegate.data_ = st;
  st->delegate.Prepare = &DelegatePrepare;
  st->delegate.flags = tfl::kDelegateFlagsAllowDynamicTensors;
  if (options.verbose) {
    Log("delegate created: backend=" + options.backend +
        " precision=" + options.precision +
        " num_threads=" + std::to_string(options.num_threads) +
        (options.precision == "fp16"
             ? " (the CPU backend computes in float32 regardless)"
             : ""));
  }
  return &st->delegate;
}

DIFFLITE_EXPORT void tflite_plugin_destroy_delegate(
    difflite::tfl::Delegate* delegate) {
  if (delegate == nullptr) return;
  delete static_cast<difflite::DelegateState*>(delegate->data_);
}

}  // extern "C"
