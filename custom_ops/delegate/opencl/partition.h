// One partition kernel of the OpenCL backend: the claimed nodes TFLite
// replaced by one delegate node. Prepare reads as plan -> upload:
//   partition_plan.cc  classify tensors, lifetimes in node steps, RESHAPE-style
//                      aliases, intermediates placed into buffers shared by
//                      lifetime (no sub-buffers), boundary staging, op tensors
//   weights.cc         constants uploaded one at a time in the storage type,
//                      each op's device-side weight packing, model pages released
// and Invoke (partition.cc) writes the inputs, runs the ops in order on the
// in-order queue, reads the outputs and waits once.
#ifndef DIFFLITE_OPENCL_PARTITION_H_
#define DIFFLITE_OPENCL_PARTITION_H_

#include <climits>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "opencl/backend.h"
#include "opencl/memory_plan.h"

namespace difflite::gpu {

class WeightUploader;

struct Slot {
  enum Kind { kConst, kInput, kInternal };
  Kind kind = kInternal;
  DType model = DType::kFloat32;    // the TFLite tensor's type
  DType storage = DType::kFloat32;  // on the device
  Shape shape;
  size_t bytes = 0;
  std::shared_ptr<HostConst> host;  // constants
  bool used = false;                // some op reads it on the device at Run
  bool packed = false;              // some op packs its own copy of it (constants)
  bool is_output = false;           // read back after Invoke
  int first = INT_MAX;
  int last = -1;
  int root = -1;                    // tensor index whose buffer it uses
  cl_mem mem = nullptr;
  bool owns_mem = false;
  bool zero_copy = false;           // mem is a buffer over the model file's pages
  cl_mem staging = nullptr;         // twin in the model's type where storage differs
  // Constants read quantized (every reader ReadsQuantized it): storage kInt8 / kInt4, the
  // model's integers, and their float32 scales in `scales`.
  int readers = 0;
  bool quantized = false;           // held so on the device
  cl_mem scales = nullptr;
  size_t scale_bytes = 0;
  // Constants: every reader takes it at an offset (GpuOp::ReadsAtOffset) and none packs it. Such
  // a constant may live in a weight slab: mem and scales are then the slab, not its own.
  bool at_offset = true;
  bool in_slab = false;
  size_t offset = 0;         // bytes into mem
  size_t scales_offset = 0;  // bytes into scales
};

// Boundary conversions: a float slot whose interpreter type (model) is not its storage type goes
// through its staging twin and these convert.cl kernels.
bool NeedsStaging(const Slot& s);
const char* ToStorageKernel(const Slot& s);
const char* FromStorageKernel(const Slot& s);

// What the weight upload did (stats and the verbose log).
struct UploadReport {
  size_t held_bytes = 0;       // constants kept on the device
  // int8 / int4 weights on the device (uploads and the ops' packed copies): held quantized
  // with their scales, or dequantized in the storage type
  size_t quantized_bytes = 0;
  size_t dequantized_bytes = 0;
  size_t zero_copy_bytes = 0;  // of those, buffers over the model file's pages
  size_t released_bytes = 0;   // model pages dropped from this process after upload
  size_t staging_bytes = 0;    // the largest host staging buffer used for conversions
  size_t slabs = 0;            // weight slabs made
  size_t slab_bytes = 0;       // their size in all
  double seconds = 0;
};

class Partition {
 public:
  explicit Partition(std::shared_ptr<BackendImpl> be) : be_(std::move(be)) {}
  ~Partition();

  std::string Init(tfl::Context* ctx, const tfl::DelegateParams* params);
  tfl::Status Prepare(tfl::Context* ctx);
  tfl::Status Invoke(tfl::Context* ctx);

  size_t arena_bytes = 0;    // the intermediates' buffers, with the op scratch lent in them
  size_t tensors_arena_bytes = 0;  // what they would be without the lent scratch
  size_t weights_bytes = 0;
  size_t scratch_bytes = 0;         // the most op scratch one step asks (GpuOp::ScratchSlotBytes)
  size_t lent_scratch_bytes = 0;    // of which lent in the arena at most (within arena_bytes)
  std::string largest_scratch_op;   // DetailLabel of the step that asks the most
  std::vector<size_t> own_scratch;  // per slot: the largest need not lent (the context's buffers)
  size_t staging_bytes = 0;
  UploadReport upload;
  int nodes() const { return static_cast<int>(nodes_.size()); }
  const std::map<std::string, std::pair<double, long>>& profile() const { return prof_; }
  long invokes() const { return invokes_; }

 private:
  // partition_plan.cc
  std::string ClassifyTensors(tfl::Context* ctx);
  std::string AddConstReader(const ClaimedNode& n, size_t i, Slot* s);
  void JoinAliases();
  bool WritableInPlace(const ClaimedNode& n, size_t a, int step);
  // One op's declared need of one scratch slot, planned as items[item].
  struct ScratchNeed {
    int step = 0;
    int slot = 0;
    size_t item = 0;
  };
  std::string AllocateIntermediates();
  std::string PlanScratch(std::vector<PlanItem>* items, ObjectPlan* plan,
                          std::vector<ScratchNeed>* needs);
  std::string AllocateStaging();
  void BindRunTensors();
  std::string ResizeOutputs(tfl::Context* ctx);
  // weights.cc
  std::string UploadConstants();
  std::map<int, int> CountPackers() const;
  // weight_slabs.cc
  std::string AllocateWeightSlabs(const std::function<bool(const Slot&)>& zero_copy);
  void DropPackedOnly(int idx, WeightUploader* uploader);
  void DropHostConstants();
  // partition.cc
  std::string PlanAndUpload(tfl::Context* ctx);
  std::string WriteInputs(tfl::Context* ctx);
  std::string RunNodes();
  std::string ReadOutputs(tfl::Context* ctx);
  void CollectProfile();
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
  std::vector<std::vector<LentScratch>> lent_;  // per step: the objects lent to its op as scratch
  std::vector<cl_mem> slabs_;    // the weight slabs, each holding several constants
  std::vector<std::vector<GpuTensor>> run_in_, run_out_;
  bool prepared_ = false;
  std::map<std::string, std::pair<double, long>> prof_;  // name -> (ms, kernels)
  long invokes_ = 0;
};

}  // namespace difflite::gpu

#endif  // DIFFLITE_OPENCL_PARTITION_H_
