// A partition kernel (see partition.h): Init takes the claimed nodes, Prepare
// plans and uploads once, Invoke runs.
#include "opencl/partition.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <sstream>

#include "opencl/cl_loader.h"

namespace difflite::gpu {

Partition::~Partition() {
  const ClApi& cl = be_->rt->cl();
  if (be_->options.profile && invokes_ > 0) {
    std::vector<std::pair<double, std::string>> rows;
    double total = 0;
    for (const auto& kv : prof_) {
      rows.emplace_back(kv.second.first / invokes_, kv.first);
      total += kv.second.first / invokes_;
    }
    std::sort(rows.rbegin(), rows.rend());
    std::ostringstream os;
    os.precision(3);
    os << std::fixed << "profile: " << invokes_ << " invokes, " << total
       << " ms of kernels per invoke:";
    for (const auto& r : rows) os << " " << r.second << "=" << r.first;
    Log(os.str());
  }
  nodes_.clear();  // ops release their own buffers first
  for (auto& kv : slots_) {
    Slot& s = kv.second;
    if (s.owns_mem && s.mem != nullptr) cl.ReleaseMemObject(s.mem);
    if (s.staging != nullptr) cl.ReleaseMemObject(s.staging);
    if (s.scales != nullptr && !s.in_slab) cl.ReleaseMemObject(s.scales);
  }
  for (cl_mem object : objects_) cl.ReleaseMemObject(object);
  for (cl_mem slab : slabs_) cl.ReleaseMemObject(slab);
  auto& ps = be_->partitions;
  ps.erase(std::remove(ps.begin(), ps.end(), this), ps.end());
}

std::string Partition::Init(tfl::Context* /*ctx*/, const tfl::DelegateParams* params) {
  inputs_ = ToVector(params->input_tensors);
  outputs_ = ToVector(params->output_tensors);
  for (int node_index : ToVector(params->nodes_to_replace)) {
    auto it = be_->pending.find(node_index);
    if (it == be_->pending.end() || it->second == nullptr) {
      return "node " + std::to_string(node_index) + " was not prepared by this delegate";
    }
    nodes_.push_back(std::move(it->second));
    be_->pending.erase(it);
  }
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (!nodes_[i]->folded) exec_.push_back(i);
  }
  return "";
}

std::string Partition::Convert(const char* kernel_name, cl_mem src, cl_mem dst, size_t n) {
  std::string e;
  cl_kernel k = be_->gctx->Kernel("convert", kernel_name, "", &e);
  if (k == nullptr) return e;
  const cl_int count = static_cast<cl_int>(n);
  e = SetArgs(be_->gctx->cl(), k,
              {{sizeof(cl_mem), &src}, {sizeof(cl_mem), &dst}, {sizeof(cl_int), &count}});
  if (!e.empty()) return e;
  const size_t local = std::min<size_t>(64, be_->gctx->KernelWorkGroupSize(k));
  const size_t global = RoundUp(n, local);
  return be_->gctx->Enqueue(k, 1, &global, &local, kernel_name);
}

std::string Partition::PlanAndUpload(tfl::Context* ctx) {
  std::string e = ClassifyTensors(ctx);
  if (!e.empty()) return e;
  JoinAliases();
  e = AllocateIntermediates();
  if (e.empty()) e = UploadConstants();
  if (e.empty()) e = AllocateStaging();
  if (!e.empty()) return e;
  BindRunTensors();
  e = ResizeOutputs(ctx);
  if (!e.empty()) return e;
  const cl_int err = be_->rt->cl().Finish(be_->rt->queue());
  return err == CL_SUCCESS ? "" : "clFinish after upload: " + ClErrorName(err);
}

tfl::Status Partition::Prepare(tfl::Context* ctx) {
  if (prepared_) {
    // Static plan: the inputs must keep the shapes it was made for.
    for (auto& kv : slots_) {
      if (kv.second.kind != Slot::kInput) continue;
      const tfl::Tensor* t = TensorAt(ctx, kv.first);
      if (t->dims == nullptr || ToVector(t->dims) != kv.second.shape) {
        LogError(ctx, "OpenCL partition: input tensor " + std::to_string(kv.first) +
                          " changed shape from " + ShapeToString(kv.second.shape) + " to " +
                          ShapeToString(ToVector(t->dims)) +
                          "; the OpenCL backend plans static shapes (create a new "
                          "interpreter for new input sizes)");
        return tfl::kError;
      }
    }
    return tfl::kOk;
  }
  std::lock_guard<std::mutex> lock(be_->rt->exec_mutex());
  const auto t0 = std::chrono::steady_clock::now();
  const std::string e = PlanAndUpload(ctx);
  if (!e.empty()) {
    LogError(ctx, "OpenCL partition prepare: " + e);
    return tfl::kError;
  }
  prepared_ = true;
  if (be_->options.verbose) {
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    size_t sum = 0, n = 0;
    for (const auto& kv : slots_) {
      if (kv.second.kind != Slot::kConst) {
        sum += kv.second.bytes;
        ++n;
      }
    }
    Log("opencl partition prepared: " + std::to_string(nodes_.size()) + " nodes (" +
        std::to_string(exec_.size()) + " run), " + std::to_string(n) + " device tensors of " +
        std::to_string(sum) + " bytes in an arena of " + std::to_string(arena_bytes) +
        " bytes, weights " + std::to_string(weights_bytes) + " bytes (" +
        std::to_string(upload.zero_copy_bytes) + " zero-copy, " +
        std::to_string(upload.slab_bytes) + " in " + std::to_string(upload.slabs) + " slabs, " +
        std::to_string(upload.released_bytes) + " bytes of model pages released), op scratch " +
        std::to_string(scratch_bytes) + " bytes at most (" + std::to_string(lent_scratch_bytes) +
        " lent in the arena), " + std::to_string(static_cast<long>(ms)) +
        " ms");
  }
  be_->WriteStats();
  return tfl::kOk;
}

std::string Partition::WriteInputs(tfl::Context* ctx) {
  const ClApi& cl = be_->rt->cl();
  cl_command_queue q = be_->rt->queue();
  be_->gctx->set_label("(write inputs)");
  for (auto& kv : slots_) {
    Slot& s = kv.second;
    if (s.kind != Slot::kInput) continue;
    const tfl::Tensor* t = TensorAt(ctx, kv.first);
    const size_t host_bytes = static_cast<size_t>(NumElements(s.shape)) * DTypeSize(s.model);
    if (t->data.data == nullptr || t->bytes < host_bytes) {
      return "input tensor " + std::to_string(kv.first) + " has no data";
    }
    std::string e;
    cl_int err = cl.EnqueueWriteBuffer(q, s.staging != nullptr ? s.staging : s.mem, CL_FALSE, 0,
                                       host_bytes, t->data.data, 0, nullptr, nullptr);
    if (err == CL_SUCCESS && s.staging != nullptr) {
      e = Convert(ToStorageKernel(s), s.staging, s.mem, NumElements(s.shape));
    }
    if (err != CL_SUCCESS || !e.empty()) {
      return "writing input tensor " + std::to_string(kv.first) + ": " +
             (e.empty() ? ClErrorName(err) : e);
    }
  }
  return "";
}

std::string Partition::RunNodes() {
  ContextImpl& gctx = *be_->gctx;
  for (size_t step = 0; step < exec_.size(); ++step) {
    ClaimedNode& n = *nodes_[exec_[step]];
    gctx.set_label(be_->options.profile >= 2 ? DetailLabel(n) : n.name);
    gctx.Lend(&lent_[step]);
    const std::string e = n.op->Run(gctx, run_in_[step], run_out_[step]);
    gctx.Lend(nullptr);
    if (!e.empty()) return "node " + std::to_string(n.node_index) + " (" + n.name + "): " + e;
  }
  return "";
}

std::string Partition::ReadOutputs(tfl::Context* ctx) {
  const ClApi& cl = be_->rt->cl();
  cl_command_queue q = be_->rt->queue();
  be_->gctx->set_label("(read outputs)");
  for (int idx : outputs_) {
    Slot& s = slots_.at(idx);
    tfl::Tensor* t = TensorAt(ctx, idx);
    const size_t n = static_cast<size_t>(NumElements(s.shape));
    const size_t host_bytes = n * DTypeSize(s.model);
    if (t->data.data == nullptr || t->bytes < host_bytes) {
      return "output tensor " + std::to_string(idx) + " is not allocated (" +
             std::to_string(t->bytes) + " bytes, need " + std::to_string(host_bytes) + ")";
    }
    if (s.kind == Slot::kConst) {
      if (s.model != DType::kFloat32) return "output tensor " + std::to_string(idx) + " is a folded constant of another type";
      WidenTo(*s.host, 0, n, static_cast<float*>(t->data.data));
      continue;
    }
    std::string e;
    if (s.staging != nullptr) e = Convert(FromStorageKernel(s), s.mem, s.staging, n);
    const cl_int err =
        e.empty() ? cl.EnqueueReadBuffer(q, s.staging != nullptr ? s.staging : s.mem, CL_FALSE,
                                         0, host_bytes, t->data.data, 0, nullptr, nullptr)
                  : CL_SUCCESS;
    if (err != CL_SUCCESS || !e.empty()) {
      return "reading output tensor " + std::to_string(idx) + ": " +
             (e.empty() ? ClErrorName(err) : e);
    }
  }
  const cl_int err = cl.Finish(q);
  return err == CL_SUCCESS ? "" : "clFinish: " + ClErrorName(err);
}

void Partition::CollectProfile() {
  const ClApi& cl = be_->rt->cl();
  for (auto& ev : be_->gctx->TakeEvents()) {
    cl_ulong start = 0, end = 0;
    if (cl.GetEventProfilingInfo(ev.second, CL_PROFILING_COMMAND_START, sizeof(start), &start,
                                 nullptr) == CL_SUCCESS &&
        cl.GetEventProfilingInfo(ev.second, CL_PROFILING_COMMAND_END, sizeof(end), &end,
                                 nullptr) == CL_SUCCESS &&
        end >= start) {
      auto& p = prof_[ev.first];
      p.first += (end - start) * 1e-6;
      p.second += 1;
    }
    cl.ReleaseEvent(ev.second);
  }
  be_->WriteStats();
}

tfl::Status Partition::Invoke(tfl::Context* ctx) {
  if (!prepared_) {
    LogError(ctx, "OpenCL partition invoked before Prepare");
    return tfl::kError;
  }
  std::lock_guard<std::mutex> lock(be_->rt->exec_mutex());
  std::string e = WriteInputs(ctx);
  if (e.empty()) e = RunNodes();
  if (e.empty()) e = ReadOutputs(ctx);
  if (!e.empty()) {
    LogError(ctx, "OpenCL partition: " + e);
    be_->rt->cl().Finish(be_->rt->queue());
    return tfl::kError;
  }
  ++invokes_;
  if (be_->rt->profiling()) CollectProfile();
  return tfl::kOk;
}

// ---------------------------------------------------------------------------
// The partition kernel's registration.

namespace {

constexpr const char* kKernelName = "DiffliteDelegateOpenCl";

std::string Brief(const std::vector<int>& v) {
  if (v.size() <= 16) return ShapeToString(v);
  return ShapeToString(std::vector<int>(v.begin(), v.begin() + 16)) + "+" +
         std::to_string(v.size() - 16) + " more";
}

Partition* NewPartition(tfl::Context* ctx, const char* buffer) {
  const auto* params = reinterpret_cast<const tfl::DelegateParams*>(buffer);
  BackendImpl* be = params ? FindImpl(params->delegate) : nullptr;
  if (be == nullptr) {
    LogError(ctx, "OpenCL partition created without its delegate");
    return nullptr;
  }
  auto p = std::make_unique<Partition>(be->shared_from_this());
  const std::string e = p->Init(ctx, params);
  if (!e.empty()) {
    LogError(ctx, "OpenCL partition: " + e);
    return nullptr;
  }
  be->partitions.push_back(p.get());
  if (be->options.verbose) {
    Log("opencl partition: " + std::to_string(p->nodes()) + " nodes, inputs=" +
        Brief(ToVector(params->input_tensors)) + " outputs=" +
        Brief(ToVector(params->output_tensors)));
  }
  return p.release();
}

void* PartitionInit(tfl::Context* ctx, const char* buffer, size_t /*length*/) {
  return NoThrow<void*>(ctx, "OpenCL partition init", nullptr,
                        [&] { return NewPartition(ctx, buffer); });
}

void PartitionFree(tfl::Context* /*ctx*/, void* buffer) { delete static_cast<Partition*>(buffer); }

tfl::Status PartitionPrepare(tfl::Context* ctx, tfl::Node* node) {
  auto* p = static_cast<Partition*>(node->user_data);
  if (p == nullptr) {
    LogError(ctx, "OpenCL partition has no state (its init failed)");
    return tfl::kError;
  }
  return NoThrow(ctx, "OpenCL partition prepare", tfl::kError, [&] { return p->Prepare(ctx); });
}

tfl::Status PartitionInvoke(tfl::Context* ctx, tfl::Node* node) {
  auto* p = static_cast<Partition*>(node->user_data);
  if (p == nullptr) return tfl::kError;
  return NoThrow(ctx, "OpenCL partition invoke", tfl::kError, [&] { return p->Invoke(ctx); });
}

}  // namespace

tfl::Registration PartitionRegistration() {
  return DelegateKernelRegistration(kKernelName, &PartitionInit, &PartitionFree,
                                    &PartitionPrepare, &PartitionInvoke);
}

}  // namespace difflite::gpu
