// Delegate::Prepare of the CPU backend (backend.h): the builtins of quantized weights first
// (quantized_claim.cc), then every difflite custom op the op registry runs, checked by its own
// parser and Infer; the claimed nodes become partitions (partition.cc).
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "cpu/backend.h"
#include "cpu/quantized_claim.h"

namespace difflite::cpu {
namespace {

using tfl::Context;
using tfl::Delegate;
using tfl::IntArray;
using tfl::Node;
using tfl::Registration;
using tfl::Tensor;

constexpr const char* kOpPrefix = "difflite.";

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
  std::unique_ptr<OpInstance> op = ParseCustomNode(node, custom_name, why);
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

}  // namespace

tfl::Status PrepareDelegate(Context* ctx, Delegate* delegate) {
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
      ctx, PartitionRegistration(), list, delegate);
  std::free(list);
  st->cpu_builtins.clear();  // every one was taken by its partition's KernelInit
  return s;
}

}  // namespace difflite::cpu
