// A CPU partition kernel (backend.h): Init takes its nodes (the ops claim.cc and
// quantized_claim.cc made), Prepare is partition_plan.cc, Invoke runs the ops in order on exactly
// the shapes Prepare checked, every buffer's size checked again.
#include <algorithm>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cpu/backend.h"
#include "cpu/quantized_claim.h"

namespace difflite::cpu {
namespace {

using tfl::Context;
using tfl::Node;
using tfl::Registration;
using tfl::Tensor;

constexpr const char* kKernelName = "DiffliteDelegateCpu";

int ThreadCount(const Options& o, const Context* ctx) {
  if (o.num_threads > 0) return o.num_threads;
  if (ctx != nullptr && ctx->recommended_num_threads > 0) {
    return ctx->recommended_num_threads;
  }
  const unsigned hw = std::thread::hardware_concurrency();
  return static_cast<int>(std::min(8u, std::max(1u, hw)));
}

void* KernelInitImpl(Context* ctx, const char* buffer) {
  const auto* params = reinterpret_cast<const tfl::DelegateParams*>(buffer);
  auto* p = new Partition();
  if (params == nullptr || params->delegate == nullptr) {
    p->init_error = "delegate kernel created without parameters";
    return p;
  }
  p->state = StateOf(params->delegate);
  p->lora = p->state->lora;
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
    if (builtin != p->state->cpu_builtins.end()) {  // claimed by quantized_claim.cc just before
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
      pn.op = ParseCustomNode(node, reg->custom_name, &why);
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
    Log("partition nodes=" + ShapeToString(node_ids) +
        " inputs=" + ShapeToString(ToVector(params->input_tensors)) +
        " outputs=" + ShapeToString(ToVector(params->output_tensors)) +
        " delegate_owned=" + ShapeToString(owned_ids) + " unallocated=" +
        ShapeToString(std::vector<int>(p->unallocated.begin(), p->unallocated.end())));
  }
  return p;
}

void KernelFree(Context* /*ctx*/, void* buffer) {
  delete static_cast<Partition*>(buffer);
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

void* KernelInit(Context* ctx, const char* buffer, size_t /*length*/) {
  return NoThrow<void*>(ctx, "delegate kernel init", nullptr,
                        [&] { return KernelInitImpl(ctx, buffer); });
}

tfl::Status KernelPrepare(Context* ctx, Node* node) {
  return NoThrow(ctx, "delegate kernel prepare", tfl::kError, [&] {
    return PlanPartition(ctx, node, static_cast<Partition*>(node->user_data));
  });
}

tfl::Status KernelInvoke(Context* ctx, Node* node) {
  return NoThrow(ctx, "delegate kernel invoke", tfl::kError,
                 [&] { return KernelInvokeImpl(ctx, node); });
}

}  // namespace

Registration PartitionRegistration() {
  return DelegateKernelRegistration(kKernelName, &KernelInit, &KernelFree, &KernelPrepare,
                                    &KernelInvoke);
}

}  // namespace difflite::cpu
