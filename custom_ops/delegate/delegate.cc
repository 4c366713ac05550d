// The TFLite external delegate of the op library: plugin entry points,
// options, and the CPU backend. backend=opencl is opencl/executor.cc (this
// file creates it and hands it Delegate::Prepare).
//
// Flow (CPU backend):
//  1. tflite_plugin_create_delegate parses the options and returns a
//     tfl::Delegate with kDelegateFlagsAllowDynamicTensors set.
//  2. DelegatePrepare walks the execution plan and claims every CUSTOM node
//     whose custom_code names a difflite op, whose attributes parse and whose
//     tensors pass the op's shape/type check. A refused node gets a one-line
//     reason (stderr and context->ReportError) and stays with TFLite. First,
//     it claims the FULLY_CONNECTED and CONV_2D nodes whose weight is a quantized
//     constant, with that weight's folded chain (cpu_claim.h: the integers are
//     read as stored, no float copy of the weight exists); a WinogradConv3x3
//     whose w is a quantized 3x3 filter is among them (run as that CONV_2D),
//     and the custom-op walk skips it.
//     Claimed nodes go to ReplaceNodeSubsetsWithDelegateKernels, which groups
//     connected claimed nodes into partitions (one macro-node each).
//  3. Each partition is a Partition (KernelInit): its nodes in plan order.
//     KernelPrepare infers every shape in order, resizes the partition's
//     output tensors, and sizes the buffers of the tensors that flow between
//     two nodes of the partition: the interpreter does not allocate those as
//     such, so the delegate makes them the partition node's temporaries (TFLite's
//     arena holds them during its Invoke only; a runtime that gives them no
//     buffer gets the delegate's own, shared by lifetime). The output of a folded node has no storage at all:
//     inside a partition nothing is sized for it, and as a partition output it
//     is given 0 bytes and no data (cpu_claim.cc says why that is safe).
//     KernelInvoke runs the nodes in order (folded ones run nothing).
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

#include "cpu_claim.h"
#include "delegate_util.h"
#include "difflite/attrs.h"
#include "difflite/op_api.h"
#include "difflite/tflite_abi.h"
#include "opencl/executor.h"

#if defined(_WIN32)
#define DIFFLITE_EXPORT __declspec(dllexport)
#else
#define DIFFLITE_EXPORT __attribute__((visibility("default")))
#endif

namespace difflite {

DelegateState::DelegateState() = default;
DelegateState::~DelegateState() = default;

namespace {

using tfl::Context;
using tfl::Delegate;
using tfl::IntArray;
using tfl::Node;
using tfl::Registration;
using tfl::Tensor;

constexpr const char* kOpPrefix = "difflite.";
constexpr const char* kKernelName = "DiffliteDelegateCpu";

int ThreadCount(const Options& o, const Context* ctx) {
  if (o.num_threads > 0) return o.num_threads;
  if (ctx != nullptr && ctx->recommended_num_threads > 0) {
    return ctx->recommended_num_threads;
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return static_cast<int>(std::min(8u, std::max(1u, hw)));
}

std::unique_ptr<OpInstance> ParseNode(const Node* node, const char* custom_name,
                                      std::string* why) {
  return ParseCustomNode(node, custom_name, why);
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
  for (size_t i = 0; i < ins->size(); ++i) {
    e = CheckElementCount((*ins)[i], "input " + std::to_string(i));
    if (!e.empty()) {
      *why = e;
      return nullptr;
    }
  }
  e = op->Infer(*ins, outs);
  for (size_t i = 0; e.empty() && i < outs->size(); ++i) {
    e = CheckElementCount((*outs)[i], "output " + std::to_string(i));
  }
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
  // A folded node of a quantized weight's chain: runs nothing, its outputs have no storage.
  bool folded = false;
  // A builtin reading a quantized weight: the input (>= 0) it reads from the model's integers,
  // never from its tensor, and what Infer sees of it; builtins may omit optional inputs (-1).
  int fixed_input = -1;
  TensorInfo fixed_info;
  bool builtin = false;
  // What Infer checked at the last Prepare: Invoke runs the op on exactly these shapes.
  std::vector<TensorInfo> in_info;
  std::vector<TensorInfo> out_info;
};

struct OwnedTensor {
  TensorInfo info;
  size_t bytes = 0;
  size_t offset = 0;  // in 4-byte words, into Partition::storage
  // positions in Partition::nodes of its writer and of its last reader (set in Prepare)
  size_t first = 0;
  size_t last = 0;
};

struct Partition {
  DelegateState* state = nullptr;
  std::vector<PartitionNode> nodes;
  std::set<int> outputs;                 // interpreter-visible outputs
  std::map<int, TensorInfo> produced;    // inferred infos, set in Prepare
  std::map<int, OwnedTensor> owned;      // delegate-owned intermediates
  // Where the runtime gives them no buffer (TFLite does: they are the node's temporaries), one of
  // ours shared by lifetime (PlanOwned: `words`), made at the first such Invoke, NaN-poisoned.
  size_t words = 0;
  std::vector<uint32_t> storage;
  std::set<int> unallocated;             // outputs of folded nodes: no storage anywhere
  std::string init_error;
};

// A partition output no node outside reads as data (a folded weight: only claimed readers,
// which read the model's integers): no storage. The arena plans 0 bytes for it and Invoke
// accepts an input without data where it has 0 bytes. The tensor stays an arena tensor of
// static shape, so delegates that take static graphs only (XNNPACK) still apply after this one.
void LeaveUnallocated(Tensor* t) {
  t->bytes = 0;
  t->data.data = nullptr;
}

// Offsets of the delegate-owned tensors in one buffer: a tensor shares space with those whose
// lifetimes (writer .. last reader, both inclusive: a node's inputs and outputs never alias) do
// not overlap its own; largest first, each at the lowest offset that fits. Returns the words.
size_t PlanOwned(std::map<int, OwnedTensor>* owned) {
  constexpr size_t kAlign = 16;  // words: 64 bytes
  std::vector<OwnedTensor*> order;
  for (auto& kv : *owned) order.push_back(&kv.second);
  std::stable_sort(order.begin(), order.end(),
                   [](const OwnedTensor* a, const OwnedTensor* b) { return a->bytes > b->bytes; });
  std::vector<const OwnedTensor*> placed;
  size_t total = 0;
  for (OwnedTensor* t : order) {
    const size_t words = ((t->bytes + 3) / 4 + kAlign - 1) / kAlign * kAlign;
    std::vector<std::pair<size_t, size_t>> busy;  // [begin, end) of live overlapping tensors
    for (const OwnedTensor* o : placed) {
      if (o->first <= t->last && t->first <= o->last) {
        busy.push_back({o->offset, o->offset + ((o->bytes + 3) / 4 + kAlign - 1) / kAlign * kAlign});
      }
    }
    std::sort(busy.begin(), busy.end());
    size_t offset = 0;
    for (const auto& b : busy) {
      if (offset + words <= b.first) break;
      offset = std::max(offset, b.second);
    }
    t->offset = offset;
    total = std::max(total, offset + words);
    placed.push_back(t);
  }
  return total;
}

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
        node == nullptr || reg == nullptr) {
      p->init_error = "cannot read node " + std::to_string(node_index);
      return p;
    }
    PartitionNode pn;
    pn.node_index = node_index;
    pn.inputs = ToVector(node->inputs);
    pn.outputs = ToVector(node->outputs);
    auto builtin = p->state->cpu_builtins.find(node_index);
    if (builtin != p->state->cpu_builtins.end()) {  // claimed by cpu_claim.cc just before
      CpuBuiltinNode& cn = *builtin->second;
      pn.name = cn.name;
      pn.builtin = true;
      pn.folded = cn.folded;
      pn.op = std::move(cn.op);
      if (!pn.folded) {
        pn.fixed_input = cn.weight_input;
        pn.fixed_info = cn.weight_info;
      }
      p->state->cpu_builtins.erase(builtin);
      if (!pn.folded && (pn.op == nullptr || pn.fixed_input < 0 ||
                         static_cast<size_t>(pn.fixed_input) >= pn.inputs.size())) {
        p->init_error = "node " + std::to_string(node_index) + " (" + pn.name + ") has no op";
        return p;
      }
    } else {
      if (reg->custom_name == nullptr) {
        p->init_error = "node " + std::to_string(node_index) + " was not claimed";
        return p;
      }
      pn.name = reg->custom_name;
      std::string why;
      pn.op = ParseNode(node, reg->custom_name, &why);
      if (pn.op == nullptr) {
        p->init_error = "node " + std::to_string(node_index) + " (" + pn.name +
                        "): " + why;
        return p;
      }
    }
    // Outputs nobody outside the partition sees: the delegate owns them
    // (shapes and buffers are set in KernelPrepare); a folded node's have no storage.
    for (int idx : pn.outputs) {
      if (pn.folded) {
        p->unallocated.insert(idx);
      } else if (p->outputs.count(idx) == 0) {
        p->owned[idx];
      }
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
        " delegate_owned=" + ListString(owned_ids) + " unallocated=" +
        ListString(std::vector<int>(p->unallocated.begin(), p->unallocated.end())));
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
  size_t position = 0;  // of the node in p->nodes
  for (PartitionNode& pn : p->nodes) {
    if (pn.folded) {
      ++position;
      for (int idx : pn.outputs) {
        if (idx < 0 || static_cast<size_t>(idx) >= ctx->tensors_size) {
          LogError(ctx, "node " + std::to_string(pn.node_index) + ": output tensor index " +
                            std::to_string(idx) + " is out of range");
          return tfl::kError;
        }
        if (p->outputs.count(idx)) LeaveUnallocated(TensorAt(ctx, idx));
      }
      continue;
    }
    std::vector<TensorInfo> ins, outs;
    std::string e;
    for (size_t i = 0; e.empty() && i < pn.inputs.size(); ++i) {
      const int idx = pn.inputs[i];
      if (static_cast<int>(i) == pn.fixed_input) {
        ins.push_back(pn.fixed_info);
        continue;
      }
      if (idx == -1 && pn.builtin) {  // an omitted optional input; the op checks where
        ins.push_back(TensorInfo());
        continue;
      }
      if (idx < 0 || static_cast<size_t>(idx) >= ctx->tensors_size) {
        e = "input tensor index " + std::to_string(idx) + " is out of range";
        break;
      }
      if (p->unallocated.count(idx)) {
        e = "input tensor " + std::to_string(idx) + " has no storage (a folded weight)";
        break;
      }
      auto it = p->produced.find(idx);
      ins.push_back(it != p->produced.end() ? it->second
                                            : InfoOf(TensorAt(ctx, idx)));
      e = CheckElementCount(ins.back(), "input " + std::to_string(i));
    }
    if (e.empty()) e = pn.op->Infer(ins, &outs);
    for (size_t i = 0; e.empty() && i < outs.size(); ++i) {
      e = CheckElementCount(outs[i], "output " + std::to_string(i));
    }
    if (!e.empty() || outs.size() != pn.outputs.size()) {
      LogError(ctx, "node " + std::to_string(pn.node_index) + " (" + pn.name +
                        "): " + (e.empty() ? "output count changed" : e));
      return tfl::kError;
    }
    pn.in_info = ins;
    pn.out_info = outs;
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
        o.bytes = static_cast<size_t>(NumElements(outs[i].shape)) * DTypeSize(outs[i].dtype);
        o.first = o.last = position;
      }
    }
    for (int idx : pn.inputs) {
      auto own = p->owned.find(idx);
      if (own != p->owned.end()) own->second.last = position;
    }
    ++position;
  }
  // The tensors between two nodes of the partition are the partition node's temporaries: TFLite's
  // arena holds them during its Invoke only, in space every other node's tensors share (a buffer
  // of the delegate's own would be held for the process's life, one per partition).
  std::vector<int> temporaries;
  for (auto& kv : p->owned) {
    Tensor* t = TensorAt(ctx, kv.first);
    if (t->dims == nullptr || ToVector(t->dims) != kv.second.info.shape) {
      IntArray* dims = NewIntArray(kv.second.info.shape);
      if (dims == nullptr || ctx->ResizeTensor(ctx, t, dims) != tfl::kOk) {
        LogError(ctx, "cannot resize intermediate tensor " + std::to_string(kv.first) + " to " +
                          ShapeToString(kv.second.info.shape));
        return tfl::kError;
      }
    }
    temporaries.push_back(kv.first);
  }
  IntArray* list = NewIntArray(temporaries);
  if (list == nullptr) {
    LogError(ctx, "out of memory");
    return tfl::kError;
  }
  std::free(node->temporaries);  // the runtime's (malloc'ed, as it frees ours)
  node->temporaries = list;
  p->words = PlanOwned(&p->owned);
  if (p->storage.size() != p->words) p->storage.clear();
  return tfl::kOk;
}

// The buffer of a delegate-owned tensor: the runtime's (a temporary of the partition node) where
// it holds the bytes, else a slot of the partition's own storage.
void* OwnedData(Context* ctx, Partition* p, int idx, const OwnedTensor& o) {
  const Tensor* t = TensorAt(ctx, idx);
  if (t->data.data != nullptr && t->bytes >= o.bytes) return t->data.data;
  if (p->storage.size() != p->words) {
    p->storage.assign(p->words, 0x7fc00000u);  // poisoned: a read before a write shows as NaN
  }
  return p->storage.data() + o.offset;
}

tfl::Status KernelInvokeImpl(Context* ctx, Node* node) {
  auto* p = static_cast<Partition*>(node->user_data);
  if (p == nullptr || !p->init_error.empty()) return tfl::kError;
  ExecOptions exec;
  exec.num_threads = ThreadCount(p->state->options, ctx);
  for (PartitionNode& pn : p->nodes) {
    if (pn.folded) continue;
    std::vector<InTensor> ins;
    std::vector<OutTensor> outs;
    if (pn.in_info.size() != pn.inputs.size() || pn.out_info.size() != pn.outputs.size()) {
      LogError(ctx, "node " + std::to_string(pn.node_index) + " invoked before Prepare");
      return tfl::kError;
    }
    // Each buffer must hold the shape Infer checked: a tensor the interpreter resized since,
    // or a buffer smaller than that shape, is an error, never a read or write past its end.
    for (size_t i = 0; i < pn.inputs.size(); ++i) {
      const int idx = pn.inputs[i];
      const TensorInfo& info = pn.in_info[i];
      if (static_cast<int>(i) == pn.fixed_input || (idx == -1 && pn.builtin)) {
        ins.push_back({info.dtype, info.shape, nullptr});  // read by the op from the model
        continue;
      }
      const size_t need = static_cast<size_t>(NumElements(info.shape)) * DTypeSize(info.dtype);
      const void* data = nullptr;
      size_t have = 0;
      bool same_shape = true;
      auto own = p->owned.find(idx);
      if (own != p->owned.end()) {
        data = OwnedData(ctx, p, idx, own->second);
        have = own->second.bytes;
        same_shape = own->second.info.shape == info.shape && own->second.info.dtype == info.dtype;
      } else {
        const Tensor* t = TensorAt(ctx, idx);
        data = t->data.data;
        have = t->bytes;
        same_shape = ToDType(t->type) == info.dtype && t->dims != nullptr &&
                     ToVector(t->dims) == info.shape;
      }
      if (data == nullptr || have < need || !same_shape) {
        LogError(ctx, "node " + std::to_string(pn.node_index) + ": input tensor " +
                          std::to_string(idx) +
                          (data == nullptr ? std::string(" has no data")
                           : !same_shape  ? " is not the " + InfoString(info) + " it was prepared for"
                                          : " holds " + std::to_string(have) + " bytes, need " +
                                                std::to_string(need)));
        return tfl::kError;
      }
      ins.push_back({info.dtype, info.shape, data});
    }
    for (size_t i = 0; i < pn.outputs.size(); ++i) {
      const int idx = pn.outputs[i];
      const TensorInfo& info = pn.out_info[i];
      const size_t need = static_cast<size_t>(NumElements(info.shape)) * DTypeSize(info.dtype);
      void* data = nullptr;
      size_t have = 0;
      auto own = p->owned.find(idx);
      if (own != p->owned.end()) {
        data = OwnedData(ctx, p, idx, own->second);
        have = own->second.bytes;
      } else {
        Tensor* t = TensorAt(ctx, idx);
        data = t->data.data;
        have = t->bytes;
      }
      if (data == nullptr || have < need) {
        LogError(ctx, "node " + std::to_string(pn.node_index) +
                          ": output tensor " + std::to_string(idx) +
                          " is not allocated (" + std::to_string(have) +
                          " bytes, need " + std::to_string(need) + ")");
        return tfl::kError;
      }
      outs.push_back({info.dtype, info.shape, data});
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
  return DelegateKernelRegistration(kKernelName, &KernelInit, &KernelFree, &KernelPrepare,
                                    &KernelInvoke);
}

// ---------------------------------------------------------------------------
// Delegate::Prepare: choose the nodes.

tfl::Status DelegatePrepareImpl(Context* ctx, Delegate* delegate) {
  DelegateState* st = StateOf(delegate);
  if (!TensorAbiMatches(ctx)) return tfl::kDelegateError;
  IntArray* plan = nullptr;
  if (ctx->GetExecutionPlan(ctx, &plan) != tfl::kOk || plan == nullptr) {
    LogError(ctx, "cannot read the execution plan");
    return tfl::kDelegateError;
  }
  const std::vector<int> plan_nodes = ToVector(plan);  // copy: may change
  const PlanOrder order(ctx, plan_nodes);
  // The builtins of quantized weights first: a WinogradConv3x3 among them is not the registry's.
  st->cpu_builtins = ClaimQuantizedBuiltins(ctx, plan_nodes, order, st->options.verbose);
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
        std::strncmp(reg->custom_name, kOpPrefix, prefix_len) != 0 ||
        st->cpu_builtins.count(node_index)) {
      continue;
    }
    std::vector<TensorInfo> ins, outs;
    std::string why = order.Check(ctx, node_index, node);
    std::unique_ptr<OpInstance> op =
        why.empty() ? BuildNode(ctx, node, reg->custom_name, known, &ins, &outs, &why) : nullptr;
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
  if (!st->cpu_builtins.empty()) {
    std::set<int> custom(claimed.begin(), claimed.end());
    claimed.clear();
    for (int node_index : plan_nodes) {
      if (custom.count(node_index) || st->cpu_builtins.count(node_index)) claimed.push_back(node_index);
    }
  }
  if (st->options.verbose) {
    Log("claimed " + std::to_string(claimed.size()) + " of " +
        std::to_string(plan_nodes.size()) + " nodes (" + std::to_string(st->cpu_builtins.size()) +
        " builtins of quantized weights)");
  }
  if (claimed.empty()) return tfl::kOk;
  IntArray* list = NewIntArray(claimed);
  if (list == nullptr) return tfl::kDelegateError;
  const tfl::Status s = ctx->ReplaceNodeSubsetsWithDelegateKernels(
      ctx, KernelRegistration(), list, delegate);
  std::free(list);
  st->cpu_builtins.clear();  // every one was taken by its partition's KernelInit
  return s;
}

tfl::Status DelegatePrepare(Context* ctx, Delegate* delegate) {
  try {
    DelegateState* st = StateOf(delegate);
    if (st->opencl != nullptr) return st->opencl->PrepareDelegate(ctx, delegate);
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

bool ParseInt(const std::string& val, long lo, long hi, long* out) {
  char* end = nullptr;
  const long v = std::strtol(val.c_str(), &end, 10);
  if (val.empty() || end == nullptr || *end != '\0' || v < lo || v > hi) {
    return false;
  }
  *out = v;
  return true;
}

// `val` if it is one of `choices`, else false and "KEY must be A, B or C, got 'VAL'".
bool ParseChoice(const std::string& key, const std::string& val,
                 const std::vector<std::string>& choices, std::string* out,
                 std::string* error) {
  if (std::find(choices.begin(), choices.end(), val) != choices.end()) {
    *out = val;
    return true;
  }
  std::string listed;
  for (size_t i = 0; i < choices.size(); ++i) {
    listed += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
  }
  *error = key + " must be " + listed + ", got '" + val + "'";
  return false;
}

bool ParseOptions(char** keys, char** values, size_t n, Options* o,
                  std::string* error) {
  for (size_t i = 0; i < n; ++i) {
    const std::string key = keys && keys[i] ? keys[i] : "";
    const std::string val = values && values[i] ? values[i] : "";
    long v = 0;
    if (key == "backend") {
      if (!ParseChoice(key, val, {"cpu", "opencl"}, &o->backend, error)) return false;
    } else if (key == "precision") {
      if (!ParseChoice(key, val, {"fp32", "fp16"}, &o->precision, error)) return false;
    } else if (key == "verbose") {
      if (val != "0" && val != "1") {
        *error = "verbose must be 0 or 1, got '" + val + "'";
        return false;
      }
      o->verbose = val == "1";
    } else if (key == "num_threads") {
      if (!ParseInt(val, 0, 256, &v)) {
        *error = "num_threads must be an integer in [0, 256], got '" + val +
                 "'";
        return false;
      }
      o->num_threads = static_cast<int>(v);
    } else if (key == "device") {
      if (!ParseInt(val, -1, 1023, &v)) {
        *error = "device must be an integer >= 0 (an index into the OpenCL "
                 "devices; -1: first GPU), got '" + val + "'";
        return false;
      }
      o->device = static_cast<int>(v);
    } else if (key == "profile") {
      if (val != "0" && val != "1" && val != "2") {
        *error = "profile must be 0, 1 (per op type) or 2 (per node and kernel), got '" +
                 val + "'";
        return false;
      }
      o->profile = val[0] - '0';
    } else if (key == "kernels") {
      if (!ParseChoice(key, val, {"auto", "tiled", "flat"}, &o->kernels, error)) return false;
    } else if (key == "math") {
      if (!ParseChoice(key, val, {"auto", "fp32"}, &o->math, error)) return false;
    } else if (key == "stats_path") {
      if (val.empty()) {
        *error = "stats_path must name a file";
        return false;
      }
      o->stats_path = val;
    } else if (key == "cache_dir") {
      if (val.empty()) {
        *error = "cache_dir must name a folder, or be off";
        return false;
      }
      o->cache_dir = val;
    } else if (key == "zero_copy") {
      if (!ParseChoice(key, val, {"auto", "off"}, &o->zero_copy, error)) return false;
    } else {
      *error = "unknown option '" + key +
               "' (known: backend, precision, verbose, num_threads, device, "
               "profile, stats_path, kernels, math, cache_dir, zero_copy)";
      return false;
    }
  }
  if (o->backend == "cpu" && (o->device != -1 || o->profile || !o->stats_path.empty() ||
                              o->kernels != "auto" || o->math != "auto" ||
                              !o->cache_dir.empty() || o->zero_copy != "auto")) {
    *error = "device, profile, stats_path, kernels, math, cache_dir and zero_copy apply to "
             "backend=opencl only";
    return false;
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
  if (options.backend == "opencl") {
    try {
      st->opencl = gpu::Backend::Create(options, &error);
    } catch (...) {
      error = "OpenCL backend failed: " + ExceptionText();
    }
    if (st->opencl == nullptr) {
      delete st;
      Report(report_error, "backend=opencl unavailable: " + error);
      return nullptr;
    }
  }
  st->delegate.data_ = st;
  st->delegate.Prepare = &DelegatePrepare;
  st->delegate.flags = tfl::kDelegateFlagsAllowDynamicTensors;
  if (options.verbose) {
    if (st->opencl != nullptr) {
      Log("delegate created: backend=opencl " + st->opencl->Describe());
    } else {
      Log("delegate created: backend=" + options.backend +
          " precision=" + options.precision +
          " num_threads=" + std::to_string(options.num_threads) +
          (options.precision == "fp16"
               ? " (the CPU backend computes in float32 regardless)"
               : ""));
    }
  }
  return &st->delegate;
}

DIFFLITE_EXPORT void tflite_plugin_destroy_delegate(
    difflite::tfl::Delegate* delegate) {
  if (delegate == nullptr) return;
  delete static_cast<difflite::DelegateState*>(delegate->data_);
}

}  // extern "C"
