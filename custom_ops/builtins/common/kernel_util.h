// The kernel helpers of every GPU op, builtin (builtins/<op>/) or difflite op
// (ops/<op>/<op>_opencl.cc): checking a node's tensors, reading constant int
// inputs, collapsing strided index spaces, setting kernel arguments, and
// launching 1-D kernels with device-derived work-group sizes. (The OpenCL C
// helpers are .cl files: common/*.cl here and ops/common/*.cl.)
#ifndef DIFFLITE_BUILTINS_COMMON_KERNEL_UTIL_H_
#define DIFFLITE_BUILTINS_COMMON_KERNEL_UTIL_H_

#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "difflite/gpu_api.h"
#include "difflite/tflite_abi.h"

namespace difflite::gpu::builtin {

// The most dimensions an index-space kernel takes (int8 vector arguments).
constexpr int kMaxRank = 8;

// Largest element count a kernel indexes with 32-bit ints.
constexpr int64_t kMaxIndex = std::numeric_limits<int32_t>::max();

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

template <typename T>
const T* Params(const NodeView& node) {
  return static_cast<const T*>(node.builtin_data);
}

// A factory's refusal: *error = why, and no op.
std::unique_ptr<GpuOp> Refuse(std::string* error, const std::string& why);

// "" or the reason, naming the op.
std::string ExpectCounts(const NodeView& node, size_t min_in, size_t max_in,
                         size_t outputs);
// A present float tensor (float32 at the model boundary; float16 constants
// are widened by the backend before ops see them).
std::string ExpectFloat(const NodeView& node, const TensorInfo& t, const char* what);
std::string ExpectShape(const TensorInfo& t, const Shape& want, const char* what);
bool Present(const TensorInfo& t);  // not an omitted optional input
// The values of a constant int32 tensor; false when not constant int32.
bool ConstInts(const TensorInfo& t, std::vector<int>* out);
// A constant float32 scalar (any shape with one element).
bool ConstScalar(const TensorInfo& t, float* out);
std::string ActivationNone(int activation, const char* op);

// Row-major element strides of a shape.
std::vector<int> Strides(const Shape& shape);

// An index space of `dims` (outermost first) walked with one stride per
// operand. Collapse() drops size-1 dims and merges neighbours that every
// operand walks contiguously (stride[i] == stride[i+1] * dims[i+1]);
// broadcast operands have stride 0, which merges too.
struct IndexSpace {
  std::vector<int> dims;
  std::vector<std::vector<int>> strides;  // [operand][dim]
  void Collapse();
  int rank() const { return static_cast<int>(dims.size()); }
};

// One by-value kernel argument for SetArgs (gpu_api.h): {sizeof(value), &value}.
template <typename T>
std::pair<size_t, const void*> Arg(const T& value) {
  return {sizeof(T), &value};
}

// Kernel arguments, in order, held by value.
class Args {
 public:
  Args& Mem(cl_mem m);
  Args& Int(int v);
  Args& Float(float v);
  Args& Int8(const std::vector<int>& v, int fill = 0);  // padded to 8 with `fill`
  Args& Int4(const std::vector<int>& v, int fill = 0);  // padded to 4
  std::string Set(const ClApi& cl, cl_kernel kernel) const;

 private:
  Args& Value(const void* data, size_t size);  // a by-value argument of `size` bytes
  std::vector<std::vector<unsigned char>> args_;  // each argument's bytes
};

// A byte bound from the environment variable `name`: `fallback` when unset or empty, else its
// value, which must be a positive integer (otherwise 0 and `error` says "NAME=VALUE: expected a
// positive integer").
size_t EnvBytes(const char* name, size_t fallback, std::string* error);

// A kernel of the backend's program cache; "" or the reason.
std::string GetKernel(GpuContext& ctx, const char* program, const char* name,
                      const std::string& options, cl_kernel* out);
// The work-group for a 1-D kernel: `preferred`, capped by the kernel's and the
// device's limits.
size_t Local1D(GpuContext& ctx, cl_kernel kernel, size_t preferred = 64);
// n work-items in groups of `local` (global rounded up; the kernel bounds-checks).
std::string Launch1D(GpuContext& ctx, cl_kernel kernel, size_t n, size_t local,
                     const char* label);

// `groups` work-groups of `group` items each, in one dimension.
std::string LaunchGroups(GpuContext& ctx, cl_kernel kernel, size_t groups, size_t group,
                         const char* label);

// The copy/fill element type for a storage type ("uint" or "ushort").
const char* CopyType(DType storage);

// Elementwise strided copy over an index space of up to kMaxRank dims:
// dst[dst_off + sum i_k * dst_str_k] = src[src_off + sum i_k * src_str_k].
// Built on the "copy_nd" program; `storage` is the element type.
class StridedCopy {
 public:
  // "" or a reason (too many dims after collapsing).
  std::string Init(GpuContext& ctx, DType storage, IndexSpace space, int src_off,
                   int dst_off);
  std::string Run(GpuContext& ctx, cl_mem src, cl_mem dst, const char* label) const;
  bool empty() const { return count_ == 0; }

 private:
  cl_kernel kernel_ = nullptr;
  size_t local_ = 64;
  int count_ = 0;
  int src_off_ = 0;
  int dst_off_ = 0;
  std::vector<int> dims_, src_str_, dst_str_;
  bool plain_ = false;  // one contiguous run: clEnqueueCopyBuffer
  bool rows_ = false;   // copy_rows: contiguous innermost dim, 16 per item
  size_t elem_bytes_ = 4;
};

// A device buffer an op owns (e.g. a repacked weight), released with it.
class OwnedBuffer {
 public:
  OwnedBuffer() = default;
  OwnedBuffer(const OwnedBuffer&) = delete;
  OwnedBuffer& operator=(const OwnedBuffer&) = delete;
  OwnedBuffer(OwnedBuffer&& o) noexcept { *this = std::move(o); }
  OwnedBuffer& operator=(OwnedBuffer&& o) noexcept;
  ~OwnedBuffer();
  // A new read-write buffer of `bytes` (contents undefined). "" or a reason.
  std::string Allocate(GpuContext& ctx, size_t bytes);
  cl_mem mem() const { return mem_; }
  size_t bytes() const { return bytes_; }

 private:
  const ClApi* cl_ = nullptr;
  cl_mem mem_ = nullptr;
  size_t bytes_ = 0;
};

// A difflite op's GPU side (ops/<op>/<op>_opencl.cc):
// "" when the model tensor is float32 or float16 (the GPU kernels store
// either, as the backend's storage type).
std::string ExpectFloatTensor(const TensorInfo& t, const char* what);
// Runs the op's own shape check (OpInstance::Infer, the CPU side's single
// definition of the op's shape rules) with float16 tensors presented as
// float32, since the GPU kernels take either. Fills `outputs`.
std::string InferAsFloat(const OpInstance& op, const std::vector<TensorInfo>& inputs,
                         std::vector<TensorInfo>* outputs);
// What every difflite op's GPU factory checks first: the node's parsed op is a `Parsed`, and
// its tensors pass InferAsFloat. The parsed op, or nullptr and *error.
template <typename Parsed>
const Parsed* CheckedCustomNode(const NodeView& node, std::string* error) {
  const auto* parsed = dynamic_cast<const Parsed*>(node.custom);
  if (parsed == nullptr) {
    *error = std::string("not a parsed ") + node.op_name + " node";
    return nullptr;
  }
  std::vector<TensorInfo> outputs;
  *error = InferAsFloat(*parsed, node.inputs, &outputs);
  return error->empty() ? parsed : nullptr;
}
// Checks what Run receives: the expected counts, a buffer for each tensor,
// and the backend's storage type everywhere (kernels are built for it), except
// for input `quantized` (if >= 0), which may also come as int8 / int4 with its
// scales (an op that ReadsQuantized it).
std::string CheckRunTensors(const GpuContext& ctx, const std::vector<GpuTensor>& inputs,
                            const std::vector<GpuTensor>& outputs, size_t n_in, size_t n_out,
                            int quantized = -1);

// Fills `count` elements at `offset` with the bit pattern of `value` in the
// storage type (float32 / half / int32).
std::string FillValue(GpuContext& ctx, cl_mem mem, DType storage, float value,
                      size_t offset_elems, size_t count);

}  // namespace difflite::gpu::builtin

#endif  // DIFFLITE_BUILTINS_COMMON_KERNEL_UTIL_H_
