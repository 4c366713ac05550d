// The OpenCL backend's internals, shared by its parts:
//   claim.cc           Delegate::Prepare: which nodes run on the GPU, their ops
//   partition_plan.cc  a partition's tensors: lifetimes, aliases, shared buffers
//   weights.cc         a partition's constants: uploaded one at a time, held once
//   partition.cc       a partition kernel: Init, Prepare (plan -> upload), Invoke
//   executor.cc        the Backend facade, the stats report
#ifndef DIFFLITE_OPENCL_BACKEND_H_
#define DIFFLITE_OPENCL_BACKEND_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "delegate_util.h"
#include "difflite/gpu_api.h"
#include "difflite/tflite_abi.h"
#include "opencl/gpu_context.h"
#include "opencl/half.h"
#include "opencl/runtime.h"

namespace difflite::gpu {

// How the integers of a quantized constant (int8, or int4 packed two a byte)
// map to floats: element i is (q[i] - zero_point[c]) * scale[c] with
// c = (i / inner) % channels, i.e. c is the index along the quantized
// dimension and `inner` the number of elements after it in the shape (per
// tensor: channels = 1, one scale). The arrays are the runtime's own
// (Tensor::quantization), valid as long as the interpreter; claim.cc checked
// them (counts, finite scales, zero points in range).
// Block scales folded from int4's compact form (a per-tensor DEQUANTIZE of scale 1 times a
// [channels, 1] float constant: claim.cc) are that constant's elements instead, float16 or
// float32 in the model (`block_scales`, `scale` null), with zero points all 0 (`zero_point`
// null).
struct QuantScales {
  const float* scale = nullptr;
  const int* zero_point = nullptr;
  size_t channels = 1;
  size_t inner = 1;
  const void* block_scales = nullptr;
  tfl::Type block_scales_type = tfl::kFloat32;
  bool has_scales() const { return scale != nullptr || block_scales != nullptr; }
  float Scale(size_t c) const {
    if (scale != nullptr) return scale[c];
    if (block_scales_type == tfl::kFloat16) return HalfToFloat(static_cast<const uint16_t*>(block_scales)[c]);
    return static_cast<const float*>(block_scales)[c];
  }
  int Zero(size_t c) const { return zero_point != nullptr ? zero_point[c] : 0; }
  size_t block_scale_bytes() const {
    return block_scales == nullptr ? 0 : channels * (block_scales_type == tfl::kFloat16 ? 2 : 4);
  }
};

// A model constant: where its bytes are and how the ops see it. Nothing is
// copied for a float32, float16 or int32 constant: `bytes` points into the
// model; only bool / int64 constants (converted to int32) and small float16 or
// quantized ones (widened for the op factories) own a host copy, and only while
// claiming and uploading. A quantized weight (the folded DEQUANTIZE of an int8
// or int4 constant) is float32 to the ops: it is dequantized a chunk at a time
// while it is uploaded (weights.cc), never as a whole on the host.
struct HostConst {
  DType dtype = DType::kFloat32;         // as the ops see it: kFloat32 or kInt32
  // of `bytes`: kFloat32, kFloat16, kInt32, or kInt8 / kInt4 (with `quant`)
  tfl::Type model_type = tfl::kFloat32;
  Shape shape;
  const void* bytes = nullptr;           // into the model, or into `converted`
  // float32 / int32 values for the op factories (TensorInfo::const_data);
  // nullptr for a float16 or quantized weight of more than kWidenedElements.
  const void* values = nullptr;
  std::vector<uint8_t> converted;
  QuantScales quant;                     // kInt8 / kInt4 only
  size_t elements() const { return static_cast<size_t>(NumElements(shape)); }
  bool quantized() const { return model_type == tfl::kInt8 || model_type == tfl::kInt4; }
  // Elements per scale where the kernels can read it quantized (zero points all 0, each scale
  // covering that many consecutive elements: per tensor, or per axis with the axis outermost
  // once reshaped); 0 otherwise.
  size_t ScaleGroup() const;
  // An int4 weight whose block scales the model stores as float16: the device holds them as
  // stored (half the bytes of float32 scales; the kernels read them with vload_half).
  bool HalfScales() const {
    return model_type == tfl::kInt4 && quant.block_scales != nullptr &&
           quant.block_scales_type == tfl::kFloat16;
  }
  size_t ScaleBytes() const { return elements() / ScaleGroup() * (HalfScales() ? 2 : sizeof(float)); }
  size_t model_bytes() const {
    switch (model_type) {
      case tfl::kInt4: return (elements() + 1) / 2;
      case tfl::kInt8: return elements();
      case tfl::kFloat16: return elements() * 2;
      default: return elements() * 4;
    }
  }
};

// float16 constants up to this many elements are widened on the host for the
// op factories that read values (scalars, small vectors); larger ones (weights)
// never are.
constexpr size_t kWidenedElements = 256;

// Writes `count` elements of `c` from element `first` as float32 (a folded
// constant read back by TFLite; small constants for the op factories): float16
// widened, int8 / int4 dequantized.
void WidenTo(const HostConst& c, size_t first, size_t count, float* out);

// One node the backend claimed.
struct ClaimedNode {
  int node_index = -1;
  std::string name;
  // DEQUANTIZE of a constant, or RESHAPE of a float constant (a folded one included):
  // its output is a constant too (folded_value) and the node runs nothing
  bool folded = false;
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
std::string DetailLabel(const ClaimedNode& n);

class Partition;
struct Candidate;

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
  std::mutex host_consts_mutex;
  int nodes_claimed = 0;
  int nodes_total = 0;
  double claim_seconds = 0;
  std::vector<Partition*> partitions;

  // claim.cc
  tfl::Status PrepareDelegate(tfl::Context* ctx, tfl::Delegate* delegate);
  void ClaimAll(tfl::Context* ctx, std::vector<Candidate>* candidates);
  void ClaimOne(tfl::Context* ctx, Candidate* c);
  std::unique_ptr<ClaimedNode> Claim(tfl::Context* ctx, int node_index, tfl::Node* node,
                                     tfl::Registration* reg, std::string* name,
                                     std::string* why);
  std::string ClaimInputs(tfl::Context* ctx, ClaimedNode* cn);
  std::string ClaimOutputs(tfl::Context* ctx, ClaimedNode* cn);
  std::string CreateOp(tfl::Node* node, tfl::Registration* reg, bool is_custom, ClaimedNode* cn);
  std::string FoldDequantize(tfl::Context* ctx, ClaimedNode* cn);
  std::shared_ptr<HostConst> ConstantOf(tfl::Context* ctx, int idx, std::string* why);
  // executor.cc
  void WriteStats();
  std::string Describe() const;
};

// The table from a Delegate to its BackendImpl (a partition finds its backend
// through DelegateParams::delegate).
std::mutex& ImplMutex();
std::map<const tfl::Delegate*, BackendImpl*>& ImplOf();
BackendImpl* FindImpl(const tfl::Delegate* d);

// partition.cc: the registration of the partition kernel.
tfl::Registration PartitionRegistration();

}  // namespace difflite::gpu

#endif  // DIFFLITE_OPENCL_BACKEND_H_
