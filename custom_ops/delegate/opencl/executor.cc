// backend=opencl (see executor.h).
//
// Delegate::Prepare (BackendImpl::PrepareDelegate)
//   Walks the execution plan. A node is claimed when a GPU op is registered
//   under its name (the builtin's name, e.g. "CONV_2D", or the custom_code)
//   and that op's factory accepts the node's types, shapes and parameters.
//   Factories run here, once, with model shapes (the writer emits static
//   shapes); the ops are kept until a partition kernel takes them.
//   Constants: read-only model tensors. float16 constants are widened to
//   float32 on the host; bool constants become int32 0/1. DEQUANTIZE of a
//   constant is folded: its output becomes a constant too and the node runs
//   nothing (it is claimed only when a claimed node consumes the output).
//   A refused node gets a one-line reason on stderr and stays with TFLite.
//
// Partition kernel
//   Init takes the prepared ops of its nodes. Prepare classifies every tensor
//   (constant, partition input, produced inside), honours alias requests
//   (RESHAPE shares its input's buffer), computes lifetimes in node steps and
//   places all non-constant tensors into shared buffers with a greedy-by-size
//   plan (tensors sharing a cl_mem have disjoint lifetimes; no sub-buffers),
//   uploads every constant once (in the storage
//   type), and writes the stats JSON. Invoke writes the partition inputs,
//   runs the ops in order on the in-order queue, reads the partition outputs
//   and waits once.
#include "opencl/executor.h"

#include <algorithm>
#include <chrono>
#include <climits>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "difflite/gpu_api.h"
#include "opencl/cl_loader.h"
#include "opencl/half.h"
#include "opencl/memory_plan.h"
#include "opencl/runtime.h"

namespace difflite::gpu {

namespace {

using tfl::Context;
using tfl::Delegate;
using tfl::IntArray;
using tfl::Node;
using tfl::Registration;
using tfl::Tensor;

constexpr const char* kKernelName = "DiffliteDelegateOpenCl";
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

// ---------------------------------------------------------------------------
// Host-side helpers.

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c < 0x20 || c >= 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out + "\"";
}

bool HasDynamicDims(const Tensor* t) {
  if (t->dims_signature == nullptr) return false;
  for (int i = 0; i < t->dims_signature->size; ++i) {
    if (t->dims_signature->data[i] < 0) return true;
  }
  return false;
}

// A model constant as the GPU ops see it: float32 or int32 on the host.
struct HostConst {
  DType dtype = DType::kFloat32;
  Shape shape;
  const void* data = nullptr;  // into the model, or into `owned`
  std::vector<uint8_t> owned;
  size_t elements() const { return static_cast<size_t>(NumElements(shape)); }
};

// One node the backend claimed.
struct ClaimedNode {
  int node_index = -1;
  std::string name;
  bool folded = false;  // DEQUANTIZE of a constant: runs nothing
  std::unique_ptr<OpInstance> custom;  // outlives `op` (NodeView::custom)
  std::unique_ptr<GpuOp> op;
  std::vector<int> inputs;
  std::vector<int> outputs;
  std::vector<TensorInfo> in_info;
  std::vector<TensorInfo> out_info;
  std::map<int, std::shared_ptr<HostConst>> consts;  // constant inputs
  std::shared_ptr<HostConst> folded_value;          // output of a folded node

  ~ClaimedNode() {
    op.reset();  // before `custom`
  }
};

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

// ---------------------------------------------------------------------------
// What the ops see of the backend.

class ContextImpl final : public GpuContext {
 public:
  ContextImpl(std::shared_ptr<Runtime> rt, DType storage, bool flat, bool half_math)
      : rt_(std::move(rt)), storage_(storage), flat_(flat), half_math_(half_math) {}
  ~ContextImpl() override {
    for (auto& kv : scratch_) {
      if (kv.second.first != nullptr) rt_->cl().ReleaseMemObject(kv.second.first);
    }
    for (auto& e : events_) rt_->cl().ReleaseEvent(e.second);
  }

  const ClApi& cl() const override { return rt_->cl(); }
  const DeviceInfo& device() const override { return rt_->info(); }
  cl_context context() const override { return rt_->context(); }
  cl_command_queue queue() const override { return rt_->queue(); }
  DType storage() const override { return storage_; }
  cl_device_id device_id() const override { return rt_->device(); }
  size_t KernelWorkGroupSize(cl_kernel kernel) const override {
    return rt_->KernelWorkGroupSize(kernel);
  }
  bool PreferFlatKernels() const override { return flat_; }

  cl_kernel Kernel(const std::string& program, const std::string& kernel_name,
                   const std::string& options, std::string* error) override {
    std::string e;
    cl_kernel k = rt_->Kernel(program, kernel_name, options, storage_, half_math_, &e);
    if (k == nullptr && error != nullptr) *error = e;
    return k;
  }

  std::string Enqueue(cl_kernel kernel, cl_uint dims, const size_t* global,
                      const size_t* local, const char* label) override {
    if (kernel == nullptr) return std::string("no kernel for ") + (label ? label : "?");
    for (cl_uint i = 0; i < dims; ++i) {
      if (global[i] == 0) return "";  // nothing to do
    }
    cl_event ev = nullptr;
    const cl_int err = cl().EnqueueNDRangeKernel(
        queue(), kernel, dims, nullptr, global, local, 0, nullptr,
        rt_->profiling() ? &ev : nullptr);
    if (err != CL_SUCCESS) {
      std::string g, l;
      for (cl_uint i = 0; i < dims; ++i) {
        g += (i ? "x" : "") + std::to_string(global[i]);
        if (local) l += (i ? "x" : "") + std::to_string(local[i]);
      }
      return std::string("clEnqueueNDRangeKernel(") + (label ? label : "?") +
             ", global " + g + (local ? ", local " + l : "") +
             "): " + ClErrorName(err);
    }
    if (ev != nullptr) {
      events_.emplace_back(detail_ ? label_ + " " + (label ? label : "?") : label_, ev);
    }
    return "";
  }

  cl_mem Scratch(size_t bytes, int slot, std::string* error) override {
    auto& s = scratch_[slot];
    if (s.first != nullptr && s.second >= bytes) return s.first;
    if (s.first != nullptr) {
      // Deferred by OpenCL until enqueued commands using it complete.
      cl().ReleaseMemObject(s.first);
      s.first = nullptr;
      s.second = 0;
    }
    cl_int err = CL_SUCCESS;
    cl_mem m = cl().CreateBuffer(context(), CL_MEM_READ_WRITE,
                                 std::max<size_t>(bytes, 4), nullptr, &err);
    if (m == nullptr || err != CL_SUCCESS) {
      if (error) *error = "scratch of " + std::to_string(bytes) + " bytes: " + ClErrorName(err);
      return nullptr;
    }
    s.first = m;
    s.second = bytes;
    return m;
  }

  void set_label(const std::string& l) { label_ = l; }
  // profile=2: events keyed by node label and kernel label, not by op type alone.
  void set_detail(bool on) { detail_ = on; }
  std::vector<std::pair<std::string, cl_event>> TakeEvents() {
    std::vector<std::pair<std::string, cl_event>> out;
    out.swap(events_);
    return out;
  }
  size_t scratch_bytes() const {
    size_t n = 0;
    for (const auto& kv : scratch_) n += kv.second.second;
    return n;
  }
  Runtime& runtime() { return *rt_; }

 private:
  std::shared_ptr<Runtime> rt_;
  DType storage_;
  bool half_math_;  // -DDL_FP16_MATH: half multiply-adds in the GEMM tiles and attention
  bool flat_;
  std::map<int, std::pair<cl_mem, size_t>> scratch_;
  std::vector<std::pair<std::string, cl_event>> events_;
  std::string label_;
  bool detail_ = false;
};

class Partition;

}  // namespace

// ---------------------------------------------------------------------------

// Shared with every partition it created: TFLite may free the partitions after the delegate
// (Python drops the delegate first in some teardown orders), and a partition's destructor must
// still reach the OpenCL runtime and the ops' context.
struct BackendImpl : std::enable_shared_from_this<BackendImpl> {
  Options options;
  std::shared_ptr<Runtime> rt;
  std::unique_ptr<ContextImpl> gctx;
  DType storage = DType::kFloat32;
  bool half_math = false;  // see Runtime::BaseOptions
  std::map<int, std::unique_ptr<ClaimedNode>> pending;
  std::map<int, std::shared_ptr<HostConst>> host_consts;  // during claiming
  int nodes_claimed = 0;
  int nodes_total = 0;
  std::vector<Partition*> partitions;

  tfl::Status PrepareDelegate(Context* ctx, Delegate* delegate);
  std::unique_ptr<ClaimedNode> Claim(Context* ctx, int node_index, Node* node,
                                     Registration* reg, std::string* name,
                                     std::string* why);
  std::shared_ptr<HostConst> ConstantOf(Context* ctx, int idx, std::string* why);
  void WriteStats();
  std::string Describe() const;
};

namespace {

// ---------------------------------------------------------------------------
// Partition kernel.

struct Slot {
  enum Kind { kConst, kInput, kInternal };
  Kind kind = kInternal;
  DType model = DType::kFloat32;    // the TFLite tensor's type
  DType storage = DType::kFloat32;  // on the device
  Shape shape;
  size_t bytes = 0;
  std::shared_ptr<HostConst> host;  // constants
  bool used = false;                // some op reads it on the device
  bool is_output = false;           // read back after Invoke
  int first = INT_MAX;
  int last = -1;
  int root = -1;                    // tensor index whose buffer it uses
  cl_mem mem = nullptr;
  bool owns_mem = false;
  cl_mem staging = nullptr;         // float32 twin for half storage
};

class Partition {
 public:
  explicit Partition(std::shared_ptr<BackendImpl> be) : be_(std::move(be)) {}
  ~Partition();

  std::string Init(Context* ctx, const tfl::DelegateParams* params);
  tfl::Status Prepare(Context* ctx);
  tfl::Status Invoke(Context* ctx);

  size_t arena_bytes = 0;
  size_t weights_bytes = 0;
  size_t scratch_bytes = 0;
  size_t staging_bytes = 0;
  int nodes() const { return static_cast<int>(nodes_.size()); }
  const std::map<std::string, std::pair<double, long>>& profile() const { return prof_; }
  long invokes() const { return invokes_; }

 private:
  std::string PlanAndUpload(Context* ctx);
  std::string Convert(const char* kernel, cl_mem src, cl_mem dst, size_t n);
  int Root(int idx) {
    int r = idx;
    while (slots_.at(r).root != r) r = slots_.at(r).root;
    return r;
  }

  std::shared_ptr<BackendImpl> be_;
  std::vector<std::unique_ptr<ClaimedNode>> nodes_;
  std::vector<size_t> exec_;  // indices into nodes_ of the nodes that run
  std::vector<int> inputs_;   // partition input tensors (from TFLite)
  std::vector<int> outputs_;
  std::map<int, Slot> slots_;
  std::vector<cl_mem> objects_;  // the intermediate buffers, each shared by several tensors
  std::vector<std::vector<GpuTensor>> run_in_, run_out_;
  bool prepared_ = false;
  std::map<std::string, std::pair<double, long>> prof_;  // name -> (ms, kernels)
  long invokes_ = 0;
};

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
  }
  for (cl_mem object : objects_) cl.ReleaseMemObject(object);
  auto& ps = be_->partitions;
  ps.erase(std::remove(ps.begin(), ps.end(), this), ps.end());
}

std::string Partition::Init(Context* ctx, const tfl::DelegateParams* params) {
  inputs_ = ToVector(params->input_tensors);
  outputs_ = ToVector(params->output_tensors);
  for (int node_index : ToVector(params->nodes_to_replace)) {
    auto it = be_->pending.find(node_index);
    if (it == be_->pending.end() || it->second == nullptr) {
      return "node " + std::to_string(node_index) +
             " was not prepared by this delegate";
    }
    nodes_.push_back(std::move(it->second));
    be_->pending.erase(it);
  }
  for (size_t i = 0; i < nodes_.size(); ++i) {
    if (!nodes_[i]->folded) exec_.push_back(i);
  }
  (void)ctx;
  return "";
}

std::string Partition::Convert(const char* kernel_name, cl_mem src, cl_mem dst,
                               size_t n) {
  std::string e;
  cl_kernel k = be_->gctx->Kernel("convert", kernel_name, "", &e);
  if (k == nullptr) return e;
  const cl_int count = static_cast<cl_int>(n);
  e = SetArgs(be_->gctx->cl(), k, {{sizeof(cl_mem), &src}, {sizeof(cl_mem), &dst},
                                  {sizeof(cl_int), &count}});
  if (!e.empty()) return e;
  const size_t local = std::min<size_t>(64, be_->gctx->KernelWorkGroupSize(k));
  const size_t global = RoundUp(n, local);
  return be_->gctx->Enqueue(k, 1, &global, &local, kernel_name);
}

std::string Partition::PlanAndUpload(Context* ctx) {
  const ClApi& cl = be_->rt->cl();
  const DType storage = be_->storage;
  auto storage_of = [storage](DType model) {
    return model == DType::kInt32 ? DType::kInt32 : storage;
  };
  auto make_slot = [&](int idx, Slot::Kind kind, DType model, const Shape& shape) {
    Slot s;
    s.kind = kind;
    s.model = model;
    s.storage = storage_of(model);
    s.shape = shape;
    s.bytes = static_cast<size_t>(NumElements(shape)) * DTypeSize(s.storage);
    s.root = idx;
    return s;
  };

  // 1. Classify tensors and compute lifetimes (step = position in exec_).
  for (const auto& n : nodes_) {
    if (!n->folded) continue;
    const int out = n->outputs[0];
    Slot s = make_slot(out, Slot::kConst, DType::kFloat32, n->folded_value->shape);
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
          Slot s = make_slot(idx, Slot::kConst, c->second->dtype, c->second->shape);
          s.host = c->second;
          it = slots_.emplace(idx, s).first;
        } else {
          const TensorInfo& info = n.in_info[i];
          Slot s = make_slot(idx, Slot::kInput, info.dtype, info.shape);
          s.first = 0;
          it = slots_.emplace(idx, s).first;
        }
      }
      Slot& s = it->second;
      if (s.kind == Slot::kConst) {
        if (n.op->UsesInput(i)) s.used = true;
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
      Slot s = make_slot(idx, Slot::kInternal, n.out_info[o].dtype,
                         n.out_info[o].shape);
      s.first = step;
      s.last = step;
      s.used = true;
      slots_.emplace(idx, s);
    }
  }
  for (int idx : outputs_) {
    auto it = slots_.find(idx);
    if (it == slots_.end()) {
      return "partition output " + std::to_string(idx) + " is produced by no node";
    }
    it->second.is_output = true;
    if (it->second.kind != Slot::kConst) it->second.last = steps;
  }

  // 2. Aliases: an output sharing its input's buffer (same bytes).
  for (int step = 0; step < steps; ++step) {
    ClaimedNode& n = *nodes_[exec_[step]];
    for (size_t o = 0; o < n.outputs.size(); ++o) {
      const int a = n.op->AliasInput(o);
      if (a < 0 || static_cast<size_t>(a) >= n.inputs.size() || n.inputs[a] < 0) continue;
      Slot& in = slots_.at(n.inputs[a]);
      Slot& out = slots_.at(n.outputs[o]);
      if (in.kind == Slot::kConst || in.bytes != out.bytes || in.storage != out.storage) {
        continue;
      }
      out.root = Root(n.inputs[a]);
    }
  }
  // Lifetimes of roots cover their aliases.
  for (auto& kv : slots_) {
    Slot& s = kv.second;
    if (s.kind == Slot::kConst || s.root == kv.first) continue;
    Slot& r = slots_.at(Root(kv.first));
    r.first = std::min(r.first, s.first);
    r.last = std::max(r.last, s.last);
  }

  // 3. Arena plan over the roots.
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
  // Whole buffers shared by tensors with disjoint lifetimes, not sub-buffers of one arena:
  // NVIDIA's driver crashes releasing some arena sub-buffers (benchmarks/NOTES.md §4), and
  // mobile drivers align sub-buffer origins coarsely.
  const ObjectPlan plan = PlanSharedObjects(items);
  cl_int err = CL_SUCCESS;
  // Poison: a read before any write shows up as NaN.
  const cl_uint nan_bits = storage == DType::kFloat16 ? 0x7e007e00u : 0x7fc00000u;
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

  // 4. Constants, once, in the storage type.
  weights_bytes = 0;
  for (auto& kv : slots_) {
    Slot& s = kv.second;
    if (s.kind != Slot::kConst || !s.used) continue;
    const HostConst& h = *s.host;
    const size_t n = h.elements();
    std::vector<uint8_t> converted;
    const void* src = h.data;
    if (s.storage == DType::kFloat16) {
      converted.resize(n * 2);
      const float* f = static_cast<const float*>(h.data);
      auto* d = reinterpret_cast<uint16_t*>(converted.data());
      for (size_t i = 0; i < n; ++i) d[i] = FloatToHalf(f[i]);
      src = converted.data();
    }
    const size_t bytes = std::max<size_t>(s.bytes, 4);
    if (bytes != s.bytes) {  // a tiny constant: pad to 4 bytes
      if (converted.empty()) {
        converted.assign(static_cast<const uint8_t*>(h.data),
                         static_cast<const uint8_t*>(h.data) + s.bytes);
      }
      converted.resize(bytes, 0);
      src = converted.data();
    }
    s.mem = cl.CreateBuffer(be_->rt->context(), CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                            bytes, const_cast<void*>(src), &err);
    if (s.mem == nullptr || err != CL_SUCCESS) {
      return "cannot upload constant tensor " + std::to_string(kv.first) + " (" +
             std::to_string(bytes) + " bytes): " + ClErrorName(err);
    }
    s.owns_mem = true;
    weights_bytes += bytes;
  }
  // Host copies are no longer needed, except folded outputs read by TFLite.
  for (auto& kv : slots_) {
    if (kv.second.kind == Slot::kConst && !kv.second.is_output) kv.second.host.reset();
  }
  for (auto& n : nodes_) {
    n->consts.clear();
    if (n->folded && !slots_.at(n->outputs[0]).is_output) n->folded_value.reset();
    for (TensorInfo& t : n->in_info) t.const_data = nullptr;
  }

  // 5. Staging twins for float tensors crossing the boundary in half storage.
  staging_bytes = 0;
  if (storage == DType::kFloat16) {
    for (auto& kv : slots_) {
      Slot& s = kv.second;
      const bool boundary = s.kind == Slot::kInput || (s.kind == Slot::kInternal && s.is_output);
      if (!boundary || s.model != DType::kFloat32) continue;
      const size_t bytes = std::max<size_t>(static_cast<size_t>(NumElements(s.shape)) * 4, 4);
      s.staging = cl.CreateBuffer(be_->rt->context(), CL_MEM_READ_WRITE, bytes, nullptr, &err);
      if (s.staging == nullptr || err != CL_SUCCESS) {
        return "cannot allocate a staging buffer: " + ClErrorName(err);
      }
      staging_bytes += bytes;
    }
  }

  // 6. The tensors each op sees.
  run_in_.assign(exec_.size(), {});
  run_out_.assign(exec_.size(), {});
  scratch_bytes = 0;
  for (size_t step = 0; step < exec_.size(); ++step) {
    ClaimedNode& n = *nodes_[exec_[step]];
    for (int idx : n.inputs) {
      GpuTensor t;
      if (idx >= 0) {
        const Slot& s = slots_.at(idx);
        t.mem = s.mem;
        t.dtype = s.storage;
        t.shape = s.shape;
      } else {
        t.dtype = DType::kOther;
      }
      run_in_[step].push_back(t);
    }
    for (int idx : n.outputs) {
      const Slot& s = slots_.at(idx);
      run_out_[step].push_back({s.mem, s.storage, s.shape});
    }
    scratch_bytes = std::max(scratch_bytes, n.op->ScratchBytes());
    weights_bytes += n.op->WeightBytes();
  }

  // 7. Interpreter-visible outputs get the planned shapes.
  for (int idx : outputs_) {
    const Slot& s = slots_.at(idx);
    Tensor* t = TensorAt(ctx, idx);
    if (t->dims == nullptr || ToVector(t->dims) != s.shape) {
      IntArray* dims = NewIntArray(s.shape);
      if (dims == nullptr || ctx->ResizeTensor(ctx, t, dims) != tfl::kOk) {
        return "cannot resize output tensor " + std::to_string(idx) + " to " +
               ShapeToString(s.shape);
      }
    }
  }
  err = cl.Finish(be_->rt->queue());
  if (err != CL_SUCCESS) return "clFinish after upload: " + ClErrorName(err);
  return "";
}

tfl::Status Partition::Prepare(Context* ctx) {
  if (prepared_) {
    // Static plan: the inputs must keep the shapes it was made for.
    for (auto& kv : slots_) {
      if (kv.second.kind != Slot::kInput) continue;
      const Tensor* t = TensorAt(ctx, kv.first);
      if (t->dims == nullptr || ToVector(t->dims) != kv.second.shape) {
        LogError(ctx, "OpenCL partition: input tensor " + std::to_string(kv.first) +
                          " changed shape from " + ShapeToString(kv.second.shape) +
                          " to " + ShapeToString(ToVector(t->dims)) +
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
    const double ms = std::chrono::duration<double, std::milli>(
                          std::chrono::steady_clock::now() - t0).count();
    size_t sum = 0, n = 0;
    for (const auto& kv : slots_) {
      if (kv.second.kind != Slot::kConst) {
        sum += kv.second.bytes;
        ++n;
      }
    }
    Log("opencl partition prepared: " + std::to_string(nodes_.size()) + " nodes (" +
        std::to_string(exec_.size()) + " run), " + std::to_string(n) +
        " device tensors of " + std::to_string(sum) + " bytes in an arena of " +
        std::to_string(arena_bytes) + " bytes, weights " + std::to_string(weights_bytes) +
        " bytes, scratch " + std::to_string(scratch_bytes) + " bytes, " +
        std::to_string(static_cast<long>(ms)) + " ms");
  }
  be_->WriteStats();
  return tfl::kOk;
}

tfl::Status Partition::Invoke(Context* ctx) {
  if (!prepared_) {
    LogError(ctx, "OpenCL partition invoked before Prepare");
    return tfl::kError;
  }
  std::lock_guard<std::mutex> lock(be_->rt->exec_mutex());
  const ClApi& cl = be_->rt->cl();
  cl_command_queue q = be_->rt->queue();
  ContextImpl& gctx = *be_->gctx;
  std::string e;
  cl_int err = CL_SUCCESS;
  gctx.set_label("(write inputs)");
  for (auto& kv : slots_) {
    Slot& s = kv.second;
    if (s.kind != Slot::kInput) continue;
    const Tensor* t = TensorAt(ctx, kv.first);
    const size_t host_bytes = static_cast<size_t>(NumElements(s.shape)) * DTypeSize(s.model);
    if (t->data.data == nullptr || t->bytes < host_bytes) {
      LogError(ctx, "OpenCL partition: input tensor " + std::to_string(kv.first) +
                        " has no data");
      return tfl::kError;
    }
    if (s.staging != nullptr) {
      err = cl.EnqueueWriteBuffer(q, s.staging, CL_FALSE, 0, host_bytes, t->data.data, 0,
                                  nullptr, nullptr);
      if (err == CL_SUCCESS) {
        e = Convert("f32_to_storage", s.staging, s.mem, NumElements(s.shape));
      }
    } else {
      err = cl.EnqueueWriteBuffer(q, s.mem, CL_FALSE, 0, host_bytes, t->data.data, 0,
                                  nullptr, nullptr);
    }
    if (err != CL_SUCCESS || !e.empty()) {
      LogError(ctx, "OpenCL partition: writing input tensor " + std::to_string(kv.first) +
                        ": " + (e.empty() ? ClErrorName(err) : e));
      cl.Finish(q);
      return tfl::kError;
    }
  }
  for (size_t step = 0; step < exec_.size(); ++step) {
    ClaimedNode& n = *nodes_[exec_[step]];
    gctx.set_label(be_->options.profile >= 2 ? DetailLabel(n) : n.name);
    e = n.op->Run(gctx, run_in_[step], run_out_[step]);
    if (!e.empty()) {
      LogError(ctx, "node " + std::to_string(n.node_index) + " (" + n.name + "): " + e);
      cl.Finish(q);
      return tfl::kError;
    }
  }
  gctx.set_label("(read outputs)");
  for (int idx : outputs_) {
    Slot& s = slots_.at(idx);
    Tensor* t = TensorAt(ctx, idx);
    const size_t host_bytes = static_cast<size_t>(NumElements(s.shape)) * DTypeSize(s.model);
    if (t->data.data == nullptr || t->bytes < host_bytes) {
      LogError(ctx, "OpenCL partition: output tensor " + std::to_string(idx) +
                        " is not allocated (" + std::to_string(t->bytes) + " bytes, need " +
                        std::to_string(host_bytes) + ")");
      cl.Finish(q);
      return tfl::kError;
    }
    if (s.kind == Slot::kConst) {
      std::memcpy(t->data.data, s.host->data, host_bytes);
      continue;
    }
    if (s.staging != nullptr) {
      e = Convert("storage_to_f32", s.mem, s.staging, NumElements(s.shape));
      if (e.empty()) {
        err = cl.EnqueueReadBuffer(q, s.staging, CL_FALSE, 0, host_bytes, t->data.data, 0,
                                   nullptr, nullptr);
      }
    } else {
      err = cl.EnqueueReadBuffer(q, s.mem, CL_FALSE, 0, host_bytes, t->data.data, 0,
                                 nullptr, nullptr);
    }
    if (err != CL_SUCCESS || !e.empty()) {
      LogError(ctx, "OpenCL partition: reading output tensor " + std::to_string(idx) +
                        ": " + (e.empty() ? ClErrorName(err) : e));
      cl.Finish(q);
      return tfl::kError;
    }
  }
  err = cl.Finish(q);
  if (err != CL_SUCCESS) {
    LogError(ctx, "OpenCL partition: clFinish: " + ClErrorName(err));
    return tfl::kError;
  }
  ++invokes_;
  if (be_->rt->profiling()) {
    for (auto& ev : gctx.TakeEvents()) {
      cl_ulong start = 0, end = 0;
      if (cl.GetEventProfilingInfo(ev.second, CL_PROFILING_COMMAND_START, sizeof(start),
                                   &start, nullptr) == CL_SUCCESS &&
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
  return tfl::kOk;
}

}  // namespace

// The backend reaches its BackendImpl from a DelegateParams through this
// table (Delegate* -> impl), filled by Backend::Create.
namespace {
std::mutex& ImplMutex() {
  static auto* m = new std::mutex();
  return *m;
}
std::map<const Delegate*, BackendImpl*>& ImplOf() {
  static auto* m = new std::map<const Delegate*, BackendImpl*>();
  return *m;
}
BackendImpl* FindImpl(const Delegate* d) {
  std::lock_guard<std::mutex> lock(ImplMutex());
  auto it = ImplOf().find(d);
  return it == ImplOf().end() ? nullptr : it->second;
}

void* PartitionInit(Context* ctx, const char* buffer, size_t /*length*/) {
  try {
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
      auto brief = [](const std::vector<int>& v) {
        if (v.size() <= 16) return ListString(v);
        return ListString(std::vector<int>(v.begin(), v.begin() + 16)) + "+" +
               std::to_string(v.size() - 16) + " more";
      };
      Log("opencl partition: " + std::to_string(p->nodes()) + " nodes, inputs=" +
          brief(ToVector(params->input_tensors)) + " outputs=" +
          brief(ToVector(params->output_tensors)));
    }
    return p.release();
  } catch (...) {
    LogError(ctx, "OpenCL partition init failed: " + ExceptionText());
    return nullptr;
  }
}

void PartitionFree(Context* /*ctx*/, void* buffer) {
  delete static_cast<Partition*>(buffer);
}

tfl::Status PartitionPrepare(Context* ctx, Node* node) {
  auto* p = static_cast<Partition*>(node->user_data);
  if (p == nullptr) {
    LogError(ctx, "OpenCL partition has no state (its init failed)");
    return tfl::kError;
  }
  try {
    return p->Prepare(ctx);
  } catch (...) {
    LogError(ctx, "OpenCL partition prepare failed: " + ExceptionText());
    return tfl::kError;
  }
}

tfl::Status PartitionInvoke(Context* ctx, Node* node) {
  auto* p = static_cast<Partition*>(node->user_data);
  if (p == nullptr) return tfl::kError;
  try {
    return p->Invoke(ctx);
  } catch (...) {
    LogError(ctx, "OpenCL partition invoke failed: " + ExceptionText());
    return tfl::kError;
  }
}

Registration PartitionRegistration() {
  return DelegateKernelRegistration(kKernelName, &PartitionInit, &PartitionFree, &PartitionPrepare,
                                    &PartitionInvoke);
}

}  // namespace

// ---------------------------------------------------------------------------
// Claiming.

std::shared_ptr<HostConst> BackendImpl::ConstantOf(Context* ctx, int idx, std::string* why) {
  auto it = host_consts.find(idx);
  if (it != host_consts.end()) return it->second;
  const Tensor* t = TensorAt(ctx, idx);
  if (!IsConstantTensor(t) || t->data.data == nullptr) return nullptr;
  auto h = std::make_shared<HostConst>();
  h->shape = t->dims ? ToVector(t->dims) : Shape{};
  const size_t n = static_cast<size_t>(NumElements(h->shape));
  switch (t->type) {
    case tfl::kFloat32:
      h->dtype = DType::kFloat32;
      h->data = t->data.data;
      break;
    case tfl::kInt32:
      h->dtype = DType::kInt32;
      h->data = t->data.data;
      break;
    case tfl::kFloat16: {
      h->dtype = DType::kFloat32;
      h->owned.resize(n * 4);
      auto* d = reinterpret_cast<float*>(h->owned.data());
      const uint16_t* s = t->data.f16;
      for (size_t i = 0; i < n; ++i) d[i] = HalfToFloat(s[i]);
      h->data = h->owned.data();
      break;
    }
    case tfl::kBool: {
      h->dtype = DType::kInt32;
      h->owned.resize(n * 4);
      auto* d = reinterpret_cast<int32_t*>(h->owned.data());
      const auto* s = static_cast<const uint8_t*>(t->data.data);
      for (size_t i = 0; i < n; ++i) d[i] = s[i] ? 1 : 0;
      h->data = h->owned.data();
      break;
    }
    case tfl::kInt64: {
      h->dtype = DType::kInt32;
      h->owned.resize(n * 4);
      auto* d = reinterpret_cast<int32_t*>(h->owned.data());
      const auto* s = static_cast<const int64_t*>(t->data.data);
      for (size_t i = 0; i < n; ++i) {
        if (s[i] < INT32_MIN || s[i] > INT32_MAX) {
          *why = "int64 constant tensor " + std::to_string(idx) + " does not fit int32";
          return nullptr;
        }
        d[i] = static_cast<int32_t>(s[i]);
      }
      h->data = h->owned.data();
      break;
    }
    default:
      *why = std::string("constant tensor ") + std::to_string(idx) + " is " +
             TfLiteTypeName(t->type);
      return nullptr;
  }
  host_consts[idx] = h;
  return h;
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
  for (size_t i = 0; i < cn->inputs.size(); ++i) {
    const int idx = cn->inputs[i];
    TensorInfo info;
    if (idx < 0) {  // omitted optional input
      info.dtype = DType::kOther;
      cn->in_info.push_back(info);
      continue;
    }
    if (static_cast<size_t>(idx) >= ctx->tensors_size) {
      *why = "input tensor index " + std::to_string(idx) + " is out of range";
      return nullptr;
    }
    const Tensor* t = TensorAt(ctx, idx);
    if (HasDynamicDims(t)) {
      *why = "input " + std::to_string(i) + " has a dynamic shape";
      return nullptr;
    }
    std::string e;
    std::shared_ptr<HostConst> h = ConstantOf(ctx, idx, &e);
    if (!e.empty()) {
      *why = e;
      return nullptr;
    }
    if (h != nullptr) {
      info.dtype = h->dtype;
      info.shape = h->shape;
      info.const_data = h->data;
      cn->consts[idx] = h;
    } else {
      info.dtype = ToDType(t->type);
      info.shape = t->dims ? ToVector(t->dims) : Shape{};
      if (info.dtype != DType::kFloat32 && info.dtype != DType::kInt32) {
        *why = "input " + std::to_string(i) + " is " + TfLiteTypeName(t->type) +
               " (the OpenCL backend exchanges float32 and int32 tensors)";
        return nullptr;
      }
    }
    if (NumElements(info.shape) > INT32_MAX) {
      *why = "input " + std::to_string(i) + " has more than 2^31 elements";
      return nullptr;
    }
    cn->in_info.push_back(info);
  }
  for (size_t o = 0; o < cn->outputs.size(); ++o) {
    const int idx = cn->outputs[o];
    if (idx < 0 || static_cast<size_t>(idx) >= ctx->tensors_size) {
      *why = "output tensor index " + std::to_string(idx) + " is out of range";
      return nullptr;
    }
    const Tensor* t = TensorAt(ctx, idx);
    TensorInfo info;
    info.dtype = ToDType(t->type);
    info.shape = t->dims ? ToVector(t->dims) : Shape{};
    if (HasDynamicDims(t)) {
      *why = "output " + std::to_string(o) + " has a dynamic shape";
      return nullptr;
    }
    if (info.dtype != DType::kFloat32 && info.dtype != DType::kInt32) {
      *why = "output " + std::to_string(o) + " is " + TfLiteTypeName(t->type);
      return nullptr;
    }
    if (NumElements(info.shape) > INT32_MAX || NumElements(info.shape) <= 0) {
      *why = "output " + std::to_string(o) + " has " +
             std::to_string(NumElements(info.shape)) + " elements";
      return nullptr;
    }
    cn->out_info.push_back(info);
  }

  if (!is_custom && reg->builtin_code == static_cast<int32_t>(tfl::BuiltinOp::kDequantize)) {
    if (cn->inputs.size() != 1 || cn->outputs.size() != 1 || cn->inputs[0] < 0 ||
        cn->consts.count(cn->inputs[0]) == 0) {
      *why = "only DEQUANTIZE of a constant is supported (folded at prepare)";
      return nullptr;
    }
    const Tensor* src = TensorAt(ctx, cn->inputs[0]);
    if (src->type != tfl::kFloat16 && src->type != tfl::kFloat32) {
      *why = std::string("DEQUANTIZE of ") + TfLiteTypeName(src->type) +
             " (quantized integers) is not supported";
      return nullptr;
    }
    const auto& h = cn->consts.at(cn->inputs[0]);
    if (cn->out_info[0].dtype != DType::kFloat32 || cn->out_info[0].shape != h->shape) {
      *why = "DEQUANTIZE output must be float32 of the input's shape";
      return nullptr;
    }
    cn->folded = true;
    cn->folded_value = h;
    host_consts[cn->outputs[0]] = h;
    return cn;
  }

  if (is_custom) {
    cn->custom = ParseCustomNode(node, reg->custom_name, why);
    if (cn->custom == nullptr) return nullptr;
    std::vector<TensorInfo> inferred;
    const std::string e = cn->custom->Infer(cn->in_info, &inferred);
    if (!e.empty()) {
      *why = e;
      return nullptr;
    }
    if (inferred.size() != cn->out_info.size()) {
      *why = "expects " + std::to_string(inferred.size()) + " outputs, got " +
             std::to_string(cn->out_info.size());
      return nullptr;
    }
    for (size_t o = 0; o < inferred.size(); ++o) {
      if (inferred[o].dtype != cn->out_info[o].dtype ||
          inferred[o].shape != cn->out_info[o].shape) {
        *why = "output " + std::to_string(o) + " is declared " +
               InfoString(cn->out_info[o]) + ", the op produces " + InfoString(inferred[o]);
        return nullptr;
      }
    }
  }
  const GpuOpDef* def = FindGpuOp(name->c_str());
  if (def == nullptr) {
    *why = "no OpenCL kernel for " + *name;
    return nullptr;
  }
  NodeView view;
  view.op_name = cn->name.c_str();
  view.builtin_data = is_custom ? nullptr : node->builtin_data;
  view.custom = cn->custom.get();
  view.inputs = cn->in_info;
  view.outputs = cn->out_info;
  std::string e;
  cn->op = def->create(view, *gctx, &e);
  if (cn->op == nullptr) {
    *why = e.empty() ? "refused by its OpenCL op" : e;
    return nullptr;
  }
  return cn;
}

tfl::Status BackendImpl::PrepareDelegate(Context* ctx, Delegate* delegate) {
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
  const std::vector<int> plan_nodes = ToVector(plan);
  nodes_total = static_cast<int>(plan_nodes.size());
  std::vector<int> claimed;
  std::map<int, std::vector<int>> consumers;  // tensor -> claimed consumer nodes
  std::unique_lock<std::mutex> lock(rt->exec_mutex());
  for (int node_index : plan_nodes) {
    Node* node = nullptr;
    Registration* reg = nullptr;
    if (ctx->GetNodeAndRegistration(ctx, node_index, &node, &reg) != tfl::kOk ||
        node == nullptr || reg == nullptr) {
      continue;
    }
    std::string name, why;
    std::unique_ptr<ClaimedNode> cn;
    try {
      cn = Claim(ctx, node_index, node, reg, &name, &why);
    } catch (...) {
      why = "exception: " + ExceptionText();
      cn.reset();
    }
    if (cn == nullptr) {
      Log("not delegating node " + std::to_string(node_index) + " (" + name + "): " + why);
      continue;
    }
    if (options.verbose) {
      std::string in_s, out_s;
      for (size_t i = 0; i < cn->in_info.size(); ++i) {
        in_s += (i ? ", " : "") + (cn->inputs[i] < 0 ? std::string("none")
                                                    : InfoString(cn->in_info[i]));
      }
      for (size_t i = 0; i < cn->out_info.size(); ++i) {
        out_s += (i ? ", " : "") + InfoString(cn->out_info[i]);
      }
      Log("claim node " + std::to_string(node_index) + " " + name + " inputs=(" + in_s +
          ") outputs=(" + out_s + ")" + (cn->folded ? " folded" : ""));
    }
    if (!cn->folded) {
      for (int idx : cn->inputs) {
        if (idx >= 0) consumers[idx].push_back(node_index);
      }
    }
    claimed.push_back(node_index);
    pending[node_index] = std::move(cn);
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
  nodes_claimed = static_cast<int>(kept.size());
  if (options.verbose) {
    Log("opencl: claimed " + std::to_string(kept.size()) + " of " +
        std::to_string(plan_nodes.size()) + " nodes; " +
        std::to_string(rt->programs_built()) + " programs built so far");
  }
  if (kept.empty()) {
    WriteStats();
    return tfl::kOk;
  }
  IntArray* list = NewIntArray(kept);
  if (list == nullptr) return tfl::kDelegateError;
  Registration r = PartitionRegistration();
  const tfl::Status s = ctx->ReplaceNodeSubsetsWithDelegateKernels(ctx, r, list, delegate);
  std::free(list);
  pending.clear();
  if (options.verbose) {
    Log("opencl: " + std::to_string(partitions.size()) + " partition(s)");
  }
  return s;
}

void BackendImpl::WriteStats() {
  if (options.stats_path.empty()) return;
  size_t arena = 0, weights = 0, scratch = 0, staging = 0;
  std::map<std::string, std::pair<double, long>> prof;
  long invokes = 0;
  for (const Partition* p : partitions) {
    arena += p->arena_bytes;
    weights += p->weights_bytes;
    scratch = std::max(scratch, p->scratch_bytes);
    staging += p->staging_bytes;
    for (const auto& kv : p->profile()) {
      prof[kv.first].first += kv.second.first;
      prof[kv.first].second += kv.second.second;
    }
    invokes = std::max(invokes, p->invokes());
  }
  std::ostringstream os;
  os << "{\"arena_bytes\": " << arena << ", \"weights_bytes\": " << weights
     << ", \"scratch_bytes\": " << scratch + staging << ", \"nodes_claimed\": " << nodes_claimed
     << ", \"nodes_total\": " << nodes_total << ", \"partitions\": " << partitions.size()
     << ", \"device\": " << JsonString(rt->info().name)
     << ", \"platform\": " << JsonString(rt->info().platform)
     << ", \"storage\": " << JsonString(DTypeName(storage))
     << ", \"arithmetic\": " << JsonString(half_math ? "float16" : "float32")
     << ", \"kernels\": " << JsonString(gctx->PreferFlatKernels() ? "flat" : "tiled")
     << ", \"programs_built\": " << rt->programs_built()
     << ", \"build_seconds\": " << rt->build_seconds();
  if (options.profile) {
    os << ", \"invokes\": " << invokes << ", \"profile_ms_per_invoke\": {";
    bool first = true;
    for (const auto& kv : prof) {
      os << (first ? "" : ", ") << JsonString(kv.first) << ": "
         << (invokes > 0 ? kv.second.first / invokes : 0.0);
      first = false;
    }
    os << "}";
  }
  os << "}\n";
  const std::string tmp = options.stats_path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) {
      Log("cannot write stats_path " + options.stats_path);
      return;
    }
    f << os.str();
  }
  if (std::rename(tmp.c_str(), options.stats_path.c_str()) != 0) {
    Log("cannot write stats_path " + options.stats_path);
  }
}

std::string BackendImpl::Describe() const {
  const DeviceInfo& d = rt->info();
  std::ostringstream os;
  os << "device=" << rt->device_index() << " '" << d.name << "' (" << d.platform << ", "
     << d.version << ", " << (d.is_gpu ? "GPU" : "not a GPU") << ", " << d.compute_units
     << " compute units, " << d.local_mem_bytes / 1024 << " KiB local memory, work-group <= "
     << d.max_work_group_size << (d.has_fp16 ? ", cl_khr_fp16" : "") << ") storage="
     << DTypeName(storage)
     << (storage != DType::kFloat16 ? ""
         : !d.has_fp16               ? " (vload_half, float arithmetic)"
         : half_math                 ? " (half multiply-adds in GEMMs and attention)"
                                     : " (float arithmetic: math=fp32)")
     << " kernels=" << (gctx->PreferFlatKernels() ? "flat" : "tiled")
     << (rt->profiling() ? " profile=1" : "");
  return os.str();
}

// ---------------------------------------------------------------------------

const char* BuiltinName(int32_t code) {
  for (const NameEntry& e : kBuiltinNames) {
    if (static_cast<int32_t>(e.code) == code) return e.name;
  }
  return nullptr;
}

std::unique_ptr<Backend> Backend::Create(const Options& options, std::string* error) {
  std::shared_ptr<Runtime> rt = Runtime::Get(options.device, options.profile > 0, error);
  if (rt == nullptr) return nullptr;
  std::unique_ptr<Backend> b(new Backend());
  b->impl_ = std::make_shared<BackendImpl>();
  BackendImpl& impl = *b->impl_;
  impl.options = options;
  impl.rt = rt;
  impl.storage = options.precision == "fp16" ? DType::kFloat16 : DType::kFloat32;
  impl.half_math = impl.storage == DType::kFloat16 && rt->info().has_fp16 && options.math == "auto";
  const bool flat = options.kernels == "flat" || (options.kernels == "auto" && !rt->info().is_gpu);
  impl.gctx = std::make_unique<ContextImpl>(rt, impl.storage, flat, impl.half_math);
  impl.gctx->set_detail(options.profile >= 2);
  return b;
}

Backend::~Backend() {
  std::lock_guard<std::mutex> lock(ImplMutex());
  for (auto it = ImplOf().begin(); it != ImplOf().end();) {
    if (it->second == impl_.get()) {
      it = ImplOf().erase(it);
    } else {
      ++it;
    }
  }
}

tfl::Status Backend::PrepareDelegate(tfl::Context* ctx, tfl::Delegate* delegate) {
  {
    std::lock_guard<std::mutex> lock(ImplMutex());
    ImplOf()[delegate] = impl_.get();
  }
  try {
    return impl_->PrepareDelegate(ctx, delegate);
  } catch (...) {
    LogError(ctx, "OpenCL delegate prepare failed: " + ExceptionText());
    return tfl::kDelegateError;
  }
}

std::string Backend::Describe() const { return impl_->Describe(); }

}  // namespace difflite::gpu
