// The memory plan of a partition (see partition.h).
#include <algorithm>
#include <climits>
#include <set>

#include "opencl/cl_loader.h"
#include "opencl/memory_plan.h"
#include "opencl/partition.h"

namespace difflite::gpu {

namespace {

Slot MakeSlot(int idx, Slot::Kind kind, DType model, DType storage, const Shape& shape) {
  Slot s;
  s.kind = kind;
  s.model = model;
  s.storage = model == DType::kInt32 ? DType::kInt32 : storage;
  s.shape = shape;
  s.bytes = static_cast<size_t>(NumElements(shape)) * DTypeSize(s.storage);
  s.root = idx;
  return s;
}

// The interpreter's type of a runtime tensor the ops see as `seen`: a float16 tensor is a float
// to the ops (claim.cc's RuntimeDType) and converted where it crosses the partition's boundary.
DType ModelType(tfl::Context* ctx, int idx, DType seen) {
  return seen == DType::kFloat32 && TensorAt(ctx, idx)->type == tfl::kFloat16 ? DType::kFloat16 : seen;
}

}  // namespace

// Constants, partition inputs and produced tensors, with lifetimes in steps
// (positions in exec_).
std::string Partition::ClassifyTensors(tfl::Context* ctx) {
  const DType storage = be_->storage;
  for (const auto& n : nodes_) {
    if (!n->folded) continue;
    const int out = n->outputs[0];
    Slot s = MakeSlot(out, Slot::kConst, DType::kFloat32, storage, n->folded_value->shape);
    s.host = n->folded_value;
    slots_[out] = s;
  }
  const int steps = static_cast<int>(exec_.size());
  for (int step = 0; step < steps; ++step) {
    ClaimedNode& n = *nodes_[exec_[step]];
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const int idx = n.inputs[i];
      if (idx < 0) continue;
      auto it = slots_.find(idx);
      if (it == slots_.end()) {
        auto c = n.consts.find(idx);
        if (c != n.consts.end()) {
          Slot s = MakeSlot(idx, Slot::kConst, c->second->dtype, storage, c->second->shape);
          s.host = c->second;
          it = slots_.emplace(idx, s).first;
        } else {
          const TensorInfo& info = n.in_info[i];
          Slot s = MakeSlot(idx, Slot::kInput, ModelType(ctx, idx, info.dtype), storage, info.shape);
          s.first = 0;
          it = slots_.emplace(idx, s).first;
        }
      }
      Slot& s = it->second;
      if (s.kind == Slot::kConst) {
        const std::string e = AddConstReader(n, i, &s);
        if (!e.empty()) return e;
      } else {
        s.used = true;
        s.last = std::max(s.last, step);
      }
    }
    for (size_t o = 0; o < n.outputs.size(); ++o) {
      const int idx = n.outputs[o];
      if (slots_.count(idx)) {
        return "tensor " + std::to_string(idx) + " is written by two nodes";
      }
      Slot s = MakeSlot(idx, Slot::kInternal, ModelType(ctx, idx, n.out_info[o].dtype), storage,
                        n.out_info[o].shape);
      s.first = step;
      s.last = step;
      s.used = true;
      slots_.emplace(idx, s);
    }
  }
  for (auto& kv : slots_) {
    Slot& s = kv.second;
    if (s.kind != Slot::kConst || !s.quantized) continue;
    const size_t elements = s.host->elements();
    s.bytes = s.host->model_type == tfl::kInt4 ? (elements + 1) / 2 : elements;
    s.storage = s.host->model_type == tfl::kInt4 ? DType::kInt4 : DType::kInt8;
    s.scale_bytes = s.host->ScaleBytes();
  }
  for (int idx : outputs_) {
    auto it = slots_.find(idx);
    if (it == slots_.end()) {
      return "partition output " + std::to_string(idx) + " is produced by no node";
    }
    it->second.is_output = true;
    if (it->second.kind != Slot::kConst) it->second.last = steps;
  }
  return "";
}

// Node `n` reads constant `s` as its input `i` (at Run, or once to pack its own copy). The
// constant stays quantized on the device (its storage and bytes set by ClassifyTensors) when
// every reader reads it so; readers that disagree are refused, since the
// ops chose their kernels for one form at creation.
std::string Partition::AddConstReader(const ClaimedNode& n, size_t i, Slot* s) {
  const bool uses = n.op->UsesInput(i), packs = n.op->PacksInput(i);
  s->used = s->used || uses;
  s->packed = s->packed || packs;
  if (!uses && !packs) return "";
  s->at_offset = s->at_offset && !packs && n.op->ReadsAtOffset(i);
  const bool quantized = n.in_info[i].quant_bits != 0 && n.op->ReadsQuantized(i);
  if (s->readers > 0 && quantized != s->quantized) {
    return "constant tensor " + std::to_string(n.inputs[i]) +
           " is read quantized by one node and dequantized by another (node " +
           std::to_string(n.node_index) + ", " + n.name + ")";
  }
  s->quantized = quantized;
  ++s->readers;
  return "";
}

// Whether node `n` (at `step`) may write its input `a`'s buffer in place: no tensor sharing that
// buffer (aliases joined so far: views made before this step) is read after this step or read
// back as a partition output, and the node reads the buffer through no other input.
bool Partition::WritableInPlace(const ClaimedNode& n, size_t a, int step) {
  const int root = Root(n.inputs[a]);
  for (size_t i = 0; i < n.inputs.size(); ++i) {
    if (i != a && n.inputs[i] >= 0 && slots_.at(n.inputs[i]).kind != Slot::kConst &&
        Root(n.inputs[i]) == root) {
      return false;
    }
  }
  for (const auto& kv : slots_) {
    const Slot& s = kv.second;
    if (s.kind == Slot::kConst || Root(kv.first) != root) continue;
    if (s.is_output || s.last > step) return false;
  }
  return true;
}

// An output sharing its input's buffer (same bytes); roots' lifetimes cover
// their aliases. An op that writes the shared buffer (WritesAliasInPlace) gets it only where
// that changes no value another reader sees (WritableInPlace).
void Partition::JoinAliases() {
  for (size_t step = 0; step < exec_.size(); ++step) {
    ClaimedNode& n = *nodes_[exec_[step]];
    for (size_t o = 0; o < n.outputs.size(); ++o) {
      const int a = n.op->AliasInput(o);
      if (a < 0 || static_cast<size_t>(a) >= n.inputs.size() || n.inputs[a] < 0) continue;
      Slot& in = slots_.at(n.inputs[a]);
      Slot& out = slots_.at(n.outputs[o]);
      if (in.kind == Slot::kConst || in.bytes != out.bytes || in.storage != out.storage) {
        continue;
      }
      if (n.op->WritesAliasInPlace(o) && !WritableInPlace(n, static_cast<size_t>(a), static_cast<int>(step))) {
        continue;
      }
      out.root = Root(n.inputs[a]);
    }
  }
  for (auto& kv : slots_) {
    Slot& s = kv.second;
    if (s.kind == Slot::kConst || s.root == kv.first) continue;
    Slot& r = slots_.at(Root(kv.first));
    r.first = std::min(r.first, s.first);
    r.last = std::max(r.last, s.last);
  }
}

// Whole buffers shared by tensors with disjoint lifetimes, not sub-buffers of one arena:
// NVIDIA's driver crashes releasing some arena sub-buffers (an H100 in 2026-11;
// cause unknown, found with DIFFLITE_CL_TRACE=1), and
// mobile drivers align sub-buffer origins coarsely.
std::string Partition::AllocateIntermediates() {
  const ClApi& cl = be_->rt->cl();
  std::vector<int> roots;
  std::vector<PlanItem> items;
  for (auto& kv : slots_) {
    Slot& s = kv.second;
    if (s.kind == Slot::kConst || s.root != kv.first) continue;
    roots.push_back(kv.first);
    PlanItem it;
    it.bytes = s.bytes;
    it.first = std::max(0, s.first == INT_MAX ? 0 : s.first);
    it.last = std::max(it.first, s.last);
    items.push_back(it);
  }
  ObjectPlan plan = PlanSharedObjects(items);
  tensors_arena_bytes = plan.total_bytes;
  std::vector<ScratchNeed> needs;
  const std::string e = PlanScratch(&items, &plan, &needs);
  if (!e.empty()) return e;
  // Poison: a read before any write shows up as NaN.
  const cl_uint nan_bits = be_->storage == DType::kFloat16 ? 0x7e007e00u : 0x7fc00000u;
  cl_int err = CL_SUCCESS;
  for (size_t bytes : plan.object_bytes) {
    cl_mem object = cl.CreateBuffer(be_->rt->context(), CL_MEM_READ_WRITE, bytes, nullptr, &err);
    if (object == nullptr || err != CL_SUCCESS) {
      return "cannot allocate a " + std::to_string(bytes) + "-byte intermediate buffer (" +
             std::to_string(plan.total_bytes) + " bytes in all): " + ClErrorName(err);
    }
    objects_.push_back(object);
    err = cl.EnqueueFillBuffer(be_->rt->queue(), object, &nan_bits, sizeof(nan_bits), 0,
                               bytes / 4 * 4, 0, nullptr, nullptr);
    if (err != CL_SUCCESS) return "clEnqueueFillBuffer(intermediates): " + ClErrorName(err);
  }
  arena_bytes = plan.total_bytes;
  for (size_t i = 0; i < roots.size(); ++i) {
    slots_.at(roots[i]).mem = objects_[plan.object_of[i]];
  }
  for (auto& kv : slots_) {
    Slot& s = kv.second;
    if (s.kind != Slot::kConst && s.root != kv.first) s.mem = slots_.at(Root(kv.first)).mem;
  }
  lent_.assign(exec_.size(), {});
  for (const ScratchNeed& need : needs) {
    const size_t object = plan.object_of[need.item];
    lent_[need.step].push_back({need.slot, objects_[object], plan.object_bytes[object]});
  }
  return "";
}

// The scratch each op declares (GpuOp::ScratchSlotBytes). With lend_scratch: each op first sees
// the sizes of the buffers idle at its step in the tensors' plan (GpuOp::FitScratch: Winograd's
// bands shrink to fit them), then each need becomes one more item, live at the op's step only,
// and `plan` is made again with the tensors and these items together (greedy by size: placing
// the needs after the tensors, each in an idle buffer or a new one, came out 5 MiB larger on
// SDXL's UNet). Else the context's own buffer per slot, as large as the slot's largest need.
std::string Partition::PlanScratch(std::vector<PlanItem>* items, ObjectPlan* plan,
                                   std::vector<ScratchNeed>* needs) {
  const bool lend = be_->options.lend_scratch != "off";
  own_scratch.assign(kScratchSlots, 0);
  scratch_bytes = 0;
  lent_scratch_bytes = 0;
  largest_scratch_op.clear();
  Occupancy occupancy(*items, *plan);
  for (size_t step = 0; step < exec_.size(); ++step) {
    const ClaimedNode& n = *nodes_[exec_[step]];
    if (ScratchBytes(*n.op) == 0) continue;
    if (lend) {
      const std::string e = n.op->FitScratch(*be_->gctx, occupancy.IdleBytes(*plan, static_cast<int>(step)));
      if (!e.empty()) return "node " + std::to_string(n.node_index) + " (" + n.name + "): " + e;
    }
    if (ScratchBytes(*n.op) > scratch_bytes) largest_scratch_op = DetailLabel(n);
    scratch_bytes = std::max(scratch_bytes, ScratchBytes(*n.op));
    size_t lent_here = 0;
    for (int slot = 0; slot < kScratchSlots; ++slot) {
      const size_t bytes = n.op->ScratchSlotBytes(slot);
      if (bytes == 0) continue;
      if (!lend) {
        own_scratch[slot] = std::max(own_scratch[slot], bytes);
        continue;
      }
      needs->push_back({static_cast<int>(step), slot, items->size()});
      items->push_back({bytes, static_cast<int>(step), static_cast<int>(step)});
      lent_here += bytes;
    }
    lent_scratch_bytes = std::max(lent_scratch_bytes, lent_here);
  }
  if (lend) *plan = PlanSharedObjects(*items);
  return "";
}

// Twins in the interpreter's type for float tensors crossing the boundary in another storage type
// (float32 tensors in half storage, float16 ones in float storage).
std::string Partition::AllocateStaging() {
  staging_bytes = 0;
  const ClApi& cl = be_->rt->cl();
  std::set<std::string> kernels;
  for (auto& kv : slots_) {
    Slot& s = kv.second;
    const bool boundary = s.kind == Slot::kInput || (s.kind == Slot::kInternal && s.is_output);
    if (!boundary || !NeedsStaging(s)) continue;
    const size_t bytes = std::max<size_t>(static_cast<size_t>(NumElements(s.shape)) * DTypeSize(s.model), 4);
    cl_int err = CL_SUCCESS;
    s.staging = cl.CreateBuffer(be_->rt->context(), CL_MEM_READ_WRITE, bytes, nullptr, &err);
    if (s.staging == nullptr || err != CL_SUCCESS) {
      return "cannot allocate a staging buffer: " + ClErrorName(err);
    }
    staging_bytes += bytes;
    kernels.insert(ToStorageKernel(s));
    kernels.insert(FromStorageKernel(s));
  }
  // Built now, not at the first Invoke: every program a partition runs is ready after Prepare.
  std::string e;
  for (const std::string& kernel : kernels) {
    if (be_->gctx->Kernel("convert", kernel, "", &e) == nullptr) return e;
  }
  return "";
}

bool NeedsStaging(const Slot& s) {
  return (s.model == DType::kFloat32 || s.model == DType::kFloat16) && s.model != s.storage;
}

const char* ToStorageKernel(const Slot& s) {
  return s.model == DType::kFloat16 ? "f16_to_storage" : "f32_to_storage";
}

const char* FromStorageKernel(const Slot& s) {
  return s.model == DType::kFloat16 ? "storage_to_f16" : "storage_to_f32";
}

// The tensors each op sees at Run.
void Partition::BindRunTensors() {
  run_in_.assign(exec_.size(), {});
  run_out_.assign(exec_.size(), {});
  for (size_t step = 0; step < exec_.size(); ++step) {
    ClaimedNode& n = *nodes_[exec_[step]];
    for (int idx : n.inputs) {
      GpuTensor t;
      if (idx >= 0) {
        const Slot& s = slots_.at(idx);
        t.mem = s.mem;
        t.dtype = s.storage;
        t.shape = s.shape;
        t.scales = s.scales;
        t.offset = s.offset;
        t.scales_offset = s.scales_offset;
      } else {
        t.dtype = DType::kOther;
      }
      run_in_[step].push_back(t);
    }
    for (int idx : n.outputs) {
      const Slot& s = slots_.at(idx);
      run_out_[step].push_back({s.mem, s.storage, s.shape});
    }
  }
}

// Interpreter-visible outputs get the planned shapes.
std::string Partition::ResizeOutputs(tfl::Context* ctx) {
  for (int idx : outputs_) {
    const Slot& s = slots_.at(idx);
    tfl::Tensor* t = TensorAt(ctx, idx);
    if (t->dims == nullptr || ToVector(t->dims) != s.shape) {
      tfl::IntArray* dims = NewIntArray(s.shape);
      if (dims == nullptr || ctx->ResizeTensor(ctx, t, dims) != tfl::kOk) {
        return "cannot resize output tensor " + std::to_string(idx) + " to " +
               ShapeToString(s.shape);
      }
    }
  }
  return "";
}

}  // namespace difflite::gpu
