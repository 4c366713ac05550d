// A CPU partition's Prepare (backend.h): every op's Infer in order on the shapes it will run,
// the partition's outputs resized, its intermediates made the partition node's temporaries and
// placed in one buffer by lifetime (used where the runtime gives them none).
#include <algorithm>
#include <cstdlib>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "cpu/backend.h"

namespace difflite::cpu {
namespace {

using tfl::Context;
using tfl::IntArray;
using tfl::Node;
using tfl::Tensor;

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

}  // namespace

tfl::Status PlanPartition(Context* ctx, Node* node, Partition* p) {
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
    if (e.empty()) {
      DelegateServices services;
      services.lora = p->lora.get();
      e = pn.op->BindDelegate(ins, services);
    }
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

}  // namespace difflite::cpu
