// Helpers shared by the delegate's entry points (delegate.cc) and its backends (cpu/,
// opencl/): options, one-line logging, reading TFLite tensors and nodes through tflite_abi.h.
#ifndef DIFFLITE_DELEGATE_UTIL_H_
#define DIFFLITE_DELEGATE_UTIL_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "difflite/op_api.h"
#include "difflite/tflite_abi.h"

namespace difflite {

namespace gpu {
class Backend;
}
struct CpuBuiltinNode;
class LoraSlots;

// The delegate's options (load_delegate's dict).
struct Options {
  std::string backend = "cpu";    // cpu | opencl
  std::string precision = "fp32"; // fp32 | fp16
  bool verbose = false;
  int num_threads = 0;  // cpu: 0 = the interpreter's recommendation, else cores
  int device = -1;      // opencl: index into all devices; -1 = first GPU, else first device
  int profile = 0;  // opencl: kernel times (profiling queue) per op type (1), per node and kernel (2)
  std::string stats_path;  // opencl: JSON memory report written after Prepare
  std::string kernels = "auto";  // opencl: auto | tiled | flat (kernel style)
  // opencl: auto (half multiply-adds in GEMMs and attention at precision=fp16 where the device
  // has cl_khr_fp16) | fp32 (float arithmetic always)
  std::string math = "auto";
  // opencl: where compiled programs are cached on disk; "" = the default
  // ($XDG_CACHE_HOME or ~/.cache, difflite/opencl; none on Android), "off" = no cache.
  std::string cache_dir;
  // opencl: auto (on devices sharing memory with the host, weights whose model
  // bytes need no conversion become buffers over the model file's pages) | off.
  std::string zero_copy = "auto";
  // opencl: auto (weights that are not zero-copy and whose readers take an offset share a few
  // large buffers, the weight slabs) | off (a buffer each); DIFFLITE_WEIGHT_SLABS sets it too.
  std::string weight_slabs = "auto";
  // opencl: auto (op scratch that an op declares, GpuOp::ScratchSlotBytes, is planned with the
  // intermediates and lent a buffer no tensor holds at the op's step) | off (the context's own
  // scratch buffers, one per slot); DIFFLITE_LEND_SCRATCH sets it too.
  std::string lend_scratch = "auto";
  // opencl: auto (GEMMs on tensor cores where GpuContext::TensorCores() allows) | off; on and
  // emulate through DIFFLITE_TENSOR_CORES only: on = without the device's compute-capability
  // answer (PoCL's CUDA driver), emulate = the instruction in OpenCL C (tests).
  std::string tensor_cores = "auto";
};

// What Delegate::data_ points at.
struct DelegateState {
  tfl::Delegate delegate;
  Options options;
  std::unique_ptr<gpu::Backend> opencl;  // set for backend=opencl
  // backend=cpu: the builtin nodes Delegate::Prepare claimed (cpu/quantized_claim.h), by node
  // index, until the partition kernels that run them take them (cpu/partition.cc: Init, inside
  // ReplaceNodeSubsetsWithDelegateKernels).
  std::map<int, std::unique_ptr<CpuBuiltinNode>> cpu_builtins;
  // The run-time LoRA factors of difflite.LoRA ops, per slot (lora_slots.h; difflite_lora_set).
  // Shared with the ops that hold a slot, which may outlive the delegate.
  std::shared_ptr<LoraSlots> lora;
  DelegateState();
  ~DelegateState();  // in delegate.cc, where gpu::Backend is complete
};

inline DelegateState* StateOf(tfl::Delegate* d) {
  return static_cast<DelegateState*>(d->data_);
}

// One line of printable ASCII (model strings are quoted in messages; the
// Python wrappers decode reports as UTF-8 and would raise on stray bytes).
std::string Printable(const std::string& s);
// "difflite: <line>" on stderr.
void Log(const std::string& line);
// Log, and report through the interpreter's error reporter.
void LogError(tfl::Context* ctx, const std::string& line);

tfl::Tensor* TensorAt(tfl::Context* ctx, int index);
// ABI self-check: Context::GetTensor must agree with indexing `tensors` with
// our sizeof(Tensor); otherwise tflite_abi.h no longer describes the runtime
// and nothing may be touched. false (and the reason reported) on a mismatch.
bool TensorAbiMatches(tfl::Context* ctx);
std::vector<int> ToVector(const tfl::IntArray* a);
// malloc'ed, as Context::ResizeTensor frees it.
tfl::IntArray* NewIntArray(const std::vector<int>& v);
DType ToDType(tfl::Type t);
// dtype, dims and (for read-only model constants) the data pointer.
TensorInfo InfoOf(const tfl::Tensor* t);
bool IsConstantTensor(const tfl::Tensor* t);
std::string InfoString(const TensorInfo& t);
const char* TfLiteTypeName(tfl::Type t);
// The TFLite builtin name of a builtin code ("CONV_2D"), nullptr for a code neither backend
// runs.
const char* BuiltinName(int32_t code);

// Creates the op of a difflite custom node from its custom_code and
// FlexBuffer options; nullptr with *why when unknown or invalid.
std::unique_ptr<OpInstance> ParseCustomNode(const tfl::Node* node,
                                            const char* custom_name,
                                            std::string* why);

// Where each tensor is written in the execution plan. A model may wire any graph; a node the
// delegate claims must not read a tensor that it or a later node writes (a cycle: the value
// would be stale, of another shape than its check saw), nor write a tensor that another node
// writes too or that is a constant of the model. Both backends refuse such nodes.
class PlanOrder {
 public:
  PlanOrder(tfl::Context* ctx, const std::vector<int>& plan);
  // "" or why `node` (node_index of the plan) cannot be delegated for its wiring.
  std::string Check(tfl::Context* ctx, int node_index, const tfl::Node* node) const;

 private:
  std::vector<int> position_;              // node index -> plan position (-1: not in the plan)
  std::vector<std::vector<int>> writers_;  // tensor index -> the nodes that write it
};

// "" if `info`'s shape has no negative dimension and at most 2^31 - 1 elements (the most any
// kernel of the library indexes), else a reason naming `what` (e.g. "input 2").
std::string CheckElementCount(const TensorInfo& info, const std::string& what);

// The text of the exception being handled (inside a catch block).
std::string ExceptionText();

// Runs `body` where the runtime, which is C, calls in: no exception may leave. One thrown is
// reported ("<what> failed: <its text>") and `on_exception` returned instead.
template <typename Result, typename Body>
Result NoThrow(tfl::Context* ctx, const char* what, Result on_exception, Body body) {
  try {
    return body();
  } catch (...) {
    LogError(ctx, std::string(what) + " failed: " + ExceptionText());
    return on_exception;
  }
}

// The registration of a delegate kernel (a partition TFLite hands to the
// delegate): builtin_code kBuiltinDelegate, version 1, everything else null.
tfl::Registration DelegateKernelRegistration(
    const char* name, void* (*init)(tfl::Context*, const char*, size_t),
    void (*free)(tfl::Context*, void*), tfl::Status (*prepare)(tfl::Context*, tfl::Node*),
    tfl::Status (*invoke)(tfl::Context*, tfl::Node*));

}  // namespace difflite

#endif  // DIFFLITE_DELEGATE_UTIL_H_
