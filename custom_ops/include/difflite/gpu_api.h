// The interface between the OpenCL backend (delegate/opencl/) and the OpenCL
// kernels of each op (builtins/<op>/ and ops/<op>/).
//
// The backend owns the OpenCL context, queue, program cache and all device
// memory; an op's GPU side only validates shapes, picks kernels and enqueues
// them. OpenCL is reached through the function table `ClApi` that the backend
// fills with dlopen/dlsym at run time, so no op links against libOpenCL and the
// library still loads where there is none. Types come from the system's
// <CL/cl.h> (opencl-headers); only the symbols are late-bound.
//
// Tensors on the GPU are dense, row-major, in TFLite's order (NHWC for 4-D
// activations), float32 or (where the device has cl_khr_fp16 and the delegate
// runs at precision=fp16) float16 storage. Kernels receive the storage type as
// the macro DL_T (float or half) and DL_T4 (float4/half4) in their build
// options, and accumulate in float (with -DDL_FP16_MATH=1 the tiled GEMMs
// multiply-add in half within a K slice: ops/common/dl_storage.cl's DL_C).
//
// Program sources: every custom_ops/**/*.cl file is embedded into the library
// at build time; its program name is the file's base name ("group_norm" for
// ops/group_norm/group_norm.cl), so base names are unique. The backend builds
// a program with "-cl-std=CL1.2 -DDL_T=<float|half> -DDL_T4=<float4|half4>"
// (plus -DDL_FP16=1 for half, and the op's own options; never
// -cl-fast-relaxed-math) and puts
//     #ifdef DL_FP16
//     #pragma OPENCL EXTENSION cl_khr_fp16 : enable
//     #endif
// in front of the file's text, so a kernel may declare DL_T (half) buffers
// without its own pragma.
//
// Additions by the backend (delegate/opencl/), all backward compatible: ClApi
// members CreateSubBuffer, GetPlatformInfo, GetKernelInfo, RetainMemObject,
// CreateProgramWithBinary, GetProgramInfo;
// DeviceInfo fields after has_fp16; GpuContext::device_id(),
// KernelWorkGroupSize(), PreferFlatKernels(), lora_slots(), TensorCores() and
// TensorCoresEmulated(); GpuOp::AliasInput(), UsesInput(),
// WeightBytes(), PacksInput(), PackWeights(), ReadsQuantized(), WritesAliasInPlace();
// TensorInfo::is_constant, quant_bits,
// quant_group; GpuTensor::scales; DType kInt8 / kInt4;
// the meaning of an omitted optional input in NodeView/Run.
#ifndef DIFFLITE_GPU_API_H_
#define DIFFLITE_GPU_API_H_

#define CL_TARGET_OPENCL_VERSION 120
#include <CL/cl.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "difflite/op_api.h"
#include "difflite/registry.h"

namespace difflite::gpu {

// "CL_OUT_OF_RESOURCES (-5)" etc., for messages.
std::string ClErrorName(cl_int code);

// The OpenCL entry points the backend and the ops use (filled by dlsym).
struct ClApi {
  decltype(&::clGetPlatformIDs) GetPlatformIDs = nullptr;
  decltype(&::clGetDeviceIDs) GetDeviceIDs = nullptr;
  decltype(&::clGetDeviceInfo) GetDeviceInfo = nullptr;
  decltype(&::clCreateContext) CreateContext = nullptr;
  decltype(&::clReleaseContext) ReleaseContext = nullptr;
  decltype(&::clCreateCommandQueue) CreateCommandQueue = nullptr;
  decltype(&::clReleaseCommandQueue) ReleaseCommandQueue = nullptr;
  decltype(&::clCreateBuffer) CreateBuffer = nullptr;
  decltype(&::clReleaseMemObject) ReleaseMemObject = nullptr;
  decltype(&::clEnqueueWriteBuffer) EnqueueWriteBuffer = nullptr;
  decltype(&::clEnqueueReadBuffer) EnqueueReadBuffer = nullptr;
  decltype(&::clEnqueueCopyBuffer) EnqueueCopyBuffer = nullptr;
  decltype(&::clEnqueueFillBuffer) EnqueueFillBuffer = nullptr;
  decltype(&::clCreateProgramWithSource) CreateProgramWithSource = nullptr;
  decltype(&::clBuildProgram) BuildProgram = nullptr;
  decltype(&::clGetProgramBuildInfo) GetProgramBuildInfo = nullptr;
  decltype(&::clReleaseProgram) ReleaseProgram = nullptr;
  decltype(&::clCreateKernel) CreateKernel = nullptr;
  decltype(&::clReleaseKernel) ReleaseKernel = nullptr;
  decltype(&::clSetKernelArg) SetKernelArg = nullptr;
  decltype(&::clGetKernelWorkGroupInfo) GetKernelWorkGroupInfo = nullptr;
  decltype(&::clEnqueueNDRangeKernel) EnqueueNDRangeKernel = nullptr;
  decltype(&::clFinish) Finish = nullptr;
  decltype(&::clFlush) Flush = nullptr;
  decltype(&::clWaitForEvents) WaitForEvents = nullptr;
  decltype(&::clGetEventProfilingInfo) GetEventProfilingInfo = nullptr;
  decltype(&::clReleaseEvent) ReleaseEvent = nullptr;
  // Added by the backend (OpenCL 1.1 / 1.0 entry points, always present).
  decltype(&::clCreateSubBuffer) CreateSubBuffer = nullptr;
  decltype(&::clGetPlatformInfo) GetPlatformInfo = nullptr;
  decltype(&::clGetKernelInfo) GetKernelInfo = nullptr;
  decltype(&::clRetainMemObject) RetainMemObject = nullptr;
  decltype(&::clCreateProgramWithBinary) CreateProgramWithBinary = nullptr;
  decltype(&::clGetProgramInfo) GetProgramInfo = nullptr;
};

struct DeviceInfo {
  std::string name;
  std::string vendor;
  size_t local_mem_bytes = 0;      // CL_DEVICE_LOCAL_MEM_SIZE
  size_t max_work_group_size = 0;  // CL_DEVICE_MAX_WORK_GROUP_SIZE
  uint32_t compute_units = 0;
  bool has_fp16 = false;           // cl_khr_fp16
  // Added by the backend.
  std::string platform;            // CL_PLATFORM_NAME
  std::string version;             // CL_DEVICE_VERSION
  bool is_gpu = false;             // CL_DEVICE_TYPE_GPU
  size_t max_work_item_sizes[3] = {1, 1, 1};  // CL_DEVICE_MAX_WORK_ITEM_SIZES
  uint64_t global_mem_bytes = 0;   // CL_DEVICE_GLOBAL_MEM_SIZE
  uint64_t max_alloc_bytes = 0;    // CL_DEVICE_MAX_MEM_ALLOC_SIZE
  size_t base_align_bytes = 0;     // CL_DEVICE_MEM_BASE_ADDR_ALIGN, in bytes
  bool host_unified_memory = false;  // CL_DEVICE_HOST_UNIFIED_MEMORY (phones, CPUs, iGPUs)
  std::string driver_version;      // CL_DRIVER_VERSION
  // NVIDIA's compute capability as 10 * major + minor (cl_nv_device_attribute_query; 90 on
  // an H100 or H200); 0 on every other device.
  int nv_compute_capability = 0;
};

// One device tensor: its own cl_mem (possibly a sub-buffer of the planned
// arena, aligned to the device's base-address alignment) plus its TFLite shape
// and storage type. Float tensors are stored as storage() (kFloat32 or
// kFloat16); int32 tensors as kInt32 (bool constants arrive as int32 0/1).
// An omitted optional input (TFLite index -1, e.g. FULLY_CONNECTED without a
// bias) arrives with mem == nullptr, dtype kOther and an empty shape.
// A quantized weight (an op that ReadsQuantized it) arrives as dtype kInt8 or kInt4 with its
// float32 scales in `scales`, one per TensorInfo::quant_group consecutive elements.
struct GpuTensor {
  cl_mem mem = nullptr;
  DType dtype = DType::kFloat32;  // storage type: kFloat32 or kFloat16 (kInt8 / kInt4 weights)
  Shape shape;
  cl_mem scales = nullptr;        // quantized weights only
  // Where the tensor and its scales start in `mem` and `scales`, in bytes: nonzero only for a
  // constant the backend placed in one of a partition's weight slabs, which it does only where
  // every op that reads it says GpuOp::ReadsAtOffset (else 0: the buffer is the tensor's own).
  size_t offset = 0;
  size_t scales_offset = 0;
};

// What an op's GPU side sees of the backend while it enqueues work.
class GpuContext {
 public:
  virtual ~GpuContext() = default;
  virtual const ClApi& cl() const = 0;
  virtual const DeviceInfo& device() const = 0;
  // For ops that upload their own (repacked) weights at creation; such an op
  // releases its buffers in its destructor through cl().
  virtual cl_context context() const = 0;
  virtual cl_command_queue queue() const = 0;
  // The storage type of activations ("float" or "half"), for build options.
  virtual DType storage() const = 0;
  // A kernel from the embedded program `program` (the .cl file's base name,
  // e.g. "group_norm"), built once per process with `options` appended to the
  // backend's own (-DDL_T=float ...), then cached. nullptr + *error on failure.
  virtual cl_kernel Kernel(const std::string& program, const std::string& kernel_name,
                           const std::string& options, std::string* error) = 0;
  // Enqueue on the backend's in-order queue. `local` may be nullptr (driver
  // chooses). Returns "" or a reason.
  // The same cl_kernel object may be handed to several ops (it is cached per
  // program, options and name): set every argument before each Enqueue.
  virtual std::string Enqueue(cl_kernel kernel, cl_uint dims, const size_t* global,
                              const size_t* local, const char* label) = 0;
  // Device scratch memory for this op in slot `slot` (0 <= slot < kScratchSlots), valid until
  // the op's Run returns: its contents do not outlive the Run (the backend reuses the memory
  // across ops, and may lend the op an intermediates' buffer no tensor holds at that step).
  // nullptr + *error when out of memory.
  virtual cl_mem Scratch(size_t bytes, int slot, std::string* error) = 0;

  // Added by the backend.
  virtual cl_device_id device_id() const = 0;
  // The largest work-group `kernel` may run with on this device:
  // min(CL_KERNEL_WORK_GROUP_SIZE, CL_DEVICE_MAX_WORK_GROUP_SIZE).
  virtual size_t KernelWorkGroupSize(cl_kernel kernel) const = 0;
  // Kernel style: true where kernels without local memory and barriers,
  // vectorised explicitly, are preferred (CPU-like devices such as PoCL; the
  // delegate option kernels=flat|tiled|auto overrides), false for tiled
  // local-memory kernels (GPUs).
  virtual bool PreferFlatKernels() const = 0;
  // The delegate's run-time LoRA factors (lora_slots.h; difflite.LoRA's GPU side holds its slot
  // there). nullptr where the backend has none.
  virtual LoraSlots* lora_slots() const { return nullptr; }
  // Whether the GEMMs may run on tensor cores (builtins/matmul/gemm_mma.cl): half storage on
  // NVIDIA's OpenCL with compute capability 8.0 or later (or DIFFLITE_TENSOR_CORES=on), unless
  // the delegate's tensor_cores=off.
  virtual bool TensorCores() const { return false; }
  // With the instruction emulated in OpenCL C (DIFFLITE_TENSOR_CORES=emulate; gemm_mma.cl's
  // -DMMA_EMULATE=1): how tests check the tensor-core tiles on any device.
  virtual bool TensorCoresEmulated() const { return false; }
  // The tile a GEMM took at Prepare (TileConfig::Name(), "skinny"): counted for the stats JSON's
  // gemm_tiles, which show whether tensor-core tiles ran (a tile that did not build falls back
  // to the float tiles with the same results).
  virtual void NoteGemmTile(const std::string& tile) { (void)tile; }
};

// CL_KERNEL_PRIVATE_MEM_SIZE of a built kernel: on NVIDIA the registers it
// spills to memory, per work-item; UINT64_MAX when the query fails.
inline uint64_t KernelPrivateBytes(const GpuContext& ctx, cl_kernel kernel) {
  const ClApi& cl = ctx.cl();
  cl_ulong bytes = 0;
  if (cl.GetKernelWorkGroupInfo == nullptr ||
      cl.GetKernelWorkGroupInfo(kernel, nullptr, CL_KERNEL_PRIVATE_MEM_SIZE, sizeof(bytes),
                                &bytes, nullptr) != CL_SUCCESS) {
    return UINT64_MAX;
  }
  return bytes;
}

// Scratch slots an op may ask GpuContext::Scratch for: 0 .. kScratchSlots - 1.
constexpr int kScratchSlots = 8;

// The GPU side of one node: created once at Prepare, run at every Invoke.
class GpuOp {
 public:
  virtual ~GpuOp() = default;
  // The most bytes Run will ask of scratch slot `slot` (0: none), given the shapes seen at
  // creation. The backend plans these with the intermediates: a need it knows may be met by an
  // intermediates' buffer that no tensor holds at the op's step (delegate option lend_scratch).
  // A need the op does not declare is still met, by a buffer of the slot's own.
  virtual size_t ScratchSlotBytes(int /*slot*/) const { return 0; }
  // Where the scratch is lent: `idle` lists the sizes of the intermediates' buffers that hold no
  // tensor at this op's step, largest first. An op that can work in smaller pieces may re-plan so
  // that its needs (ScratchSlotBytes, largest first) each fit one of them, rather than have the
  // backend grow a buffer for it. "" or the reason it cannot run.
  virtual std::string FitScratch(GpuContext& /*ctx*/, const std::vector<size_t>& /*idle*/) {
    return "";
  }
  virtual std::string Run(GpuContext& ctx, const std::vector<GpuTensor>& inputs,
                          const std::vector<GpuTensor>& outputs) = 0;

  // Added by the backend (defaults keep existing ops unchanged):
  // Output `output` may share the device buffer of input N (same bytes in the
  // same order, e.g. RESHAPE): return N, else -1. When the backend honours it,
  // Run gets the same cl_mem for both and must not copy; it may also decline
  // (then Run copies as usual), so Run checks `inputs[N].mem == outputs[i].mem`.
  virtual int AliasInput(size_t /*output*/) const { return -1; }
  // True when Run may write output `output` while it shares input AliasInput(output)'s buffer
  // (difflite.LoRA adds into it in place). The backend then honours the alias only where no other
  // tensor in that buffer is read after this node, or read back as a partition output, and the
  // node reads the buffer through no other input.
  virtual bool WritesAliasInPlace(size_t /*output*/) const { return false; }
  // False when the op never reads input `input` at Run (e.g. it keeps its own
  // repacked copy of that weight): the backend then does not upload it.
  virtual bool UsesInput(size_t /*input*/) const { return true; }
  // Bytes of device memory the op holds itself (repacked weights), for the
  // memory report.
  virtual size_t WeightBytes() const { return 0; }
  // True when the op keeps its own re-laid-out copy of constant input `input`,
  // made on the device by PackWeights from the uploaded constant. The backend
  // uploads such a constant, calls PackWeights once (before the first Run),
  // and releases the upload at once where no op UsesInput it: no weight is
  // re-laid-out on the host, and at most one weight is held twice at a time.
  virtual bool PacksInput(size_t /*input*/) const { return false; }
  // True when the op reads constant input `input` in its quantized form (TensorInfo::quant_bits
  // was set at creation): it then arrives, at Run and at PackWeights, as the model's integers
  // (GpuTensor dtype kInt8 / kInt4) and their scales, and the op dequantizes in its kernels.
  virtual bool ReadsQuantized(size_t /*input*/) const { return false; }
  // True when Run reads constant input `input` from GpuTensor::offset (and a quantized one's
  // scales from scales_offset), so that the backend may sub-allocate it from a weight slab: one
  // buffer holding many weights, since a driver may round every buffer up (NVIDIA's OpenCL: to
  // 2 MiB from 1 MiB up) and a UNet has hundreds. Only where no op packs the constant.
  virtual bool ReadsAtOffset(size_t /*input*/) const { return false; }
  virtual std::string PackWeights(GpuContext& /*ctx*/, const std::vector<GpuTensor>& /*inputs*/) {
    return "";
  }
};

// All of an op's declared scratch, for the memory report.
inline size_t ScratchBytes(const GpuOp& op) {
  size_t bytes = 0;
  for (int slot = 0; slot < kScratchSlots; ++slot) bytes += op.ScratchSlotBytes(slot);
  return bytes;
}

// What the backend hands a GPU op factory about one node.
struct NodeView {
  const char* op_name = nullptr;        // builtin name ("CONV_2D") or custom_code ("difflite.GroupNorm")
  const void* builtin_data = nullptr;   // the node's TfLite*Params (layouts in tflite_abi.h), builtins only
  const OpInstance* custom = nullptr;   // the parsed difflite op (its attributes), custom ops only
  std::vector<TensorInfo> inputs;       // const_data set for model constants (weights)
  std::vector<TensorInfo> outputs;
};

// Creates the GPU side of a node, or returns nullptr with a one-line *error
// when this node (type, shape, options, device) is not supported; the backend
// then leaves the node to TFLite. Constant inputs are uploaded by the backend
// and arrive at Run like any input; an op may instead keep its own transformed
// copy of a weight, made on the device by PackWeights (e.g. a repacked filter).
// Factories see const_data for int32 constants and small float ones only:
// large float16 weights are never widened on the host (is_constant tells).
using GpuOpFactory = std::unique_ptr<GpuOp> (*)(const NodeView& node, GpuContext& ctx,
                                                std::string* error);

struct GpuOpDef {
  const char* name;  // same spelling as NodeView::op_name
  GpuOpFactory create;
};

// Every GPU op of the library, builtin or difflite op, registers its GpuOpDef with
// DIFFLITE_REGISTER_OPS (registry.h); the backend finds it with OpRegistry<GpuOpDef>::Find.

// Sets kernel arguments in order; returns "" or the first failing index.
std::string SetArgs(const ClApi& cl, cl_kernel kernel,
                    const std::vector<std::pair<size_t, const void*>>& args);

// Work-group helper: rounds `n` up to a multiple of `group`.
inline size_t RoundUp(size_t n, size_t group) { return (n + group - 1) / group * group; }

}  // namespace difflite::gpu

#endif  // DIFFLITE_GPU_API_H_
