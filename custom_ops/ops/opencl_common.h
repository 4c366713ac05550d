// Small helpers shared by the GPU sides of the difflite ops
// (custom_ops/ops/<op>/<op>_opencl.cc). Built only on difflite/gpu_api.h:
// OpenCL is reached through the backend's ClApi table, never linked.
#ifndef DIFFLITE_OPS_OPENCL_COMMON_H_
#define DIFFLITE_OPS_OPENCL_COMMON_H_

#include <cstdint>
#include <initializer_list>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "difflite/gpu_api.h"
#include "difflite/op_api.h"

namespace difflite {
namespace gpu {
namespace opsupport {

// Largest element count a kernel indexes with 32-bit ints.
constexpr int64_t kMaxIndex = std::numeric_limits<int32_t>::max();

inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// Sets the kernel's arguments in order: {sizeof(value), &value}.
inline std::string SetKernelArgs(
    const ClApi& cl, cl_kernel kernel,
    std::initializer_list<std::pair<size_t, const void*>> args) {
  cl_uint index = 0;
  for (const auto& a : args) {
    const cl_int err = cl.SetKernelArg(kernel, index, a.first, a.second);
    if (err != CL_SUCCESS) {
      return "clSetKernelArg(" + std::to_string(index) + ") failed: " +
             std::to_string(err);
    }
    ++index;
  }
  return "";
}

template <typename T>
std::pair<size_t, const void*> Arg(const T& value) {
  return {sizeof(T), &value};
}

// "" when the model tensor is float32 or float16 (the GPU kernels store
// either, as the backend's storage type).
inline std::string ExpectFloatTensor(const TensorInfo& t, const char* what) {
  if (t.dtype == DType::kFloat32 || t.dtype == DType::kFloat16) return "";
  return std::string(what) + " must be float32 or float16, got " +
         DTypeName(t.dtype);
}

// Runs the op's own shape check (OpInstance::Infer, the CPU side's single
// definition of the op's shape rules) with float16 tensors presented as
// float32, since the GPU kernels take either. Fills `outputs`.
inline std::string InferAsFloat(const OpInstance& op,
                                const std::vector<TensorInfo>& inputs,
                                std::vector<TensorInfo>* outputs) {
  std::vector<TensorInfo> as_float = inputs;
  for (size_t i = 0; i < as_float.size(); ++i) {
    std::string e = ExpectFloatTensor(as_float[i], ("input " + std::to_string(i)).c_str());
    if (!e.empty()) return e;
    as_float[i].dtype = DType::kFloat32;
  }
  return op.Infer(as_float, outputs);
}

// Checks what Run receives: the expected counts, a buffer for each tensor,
// and the backend's storage type everywhere (kernels are built for it), except
// for input `quantized` (if >= 0), which may also come as int8 / int4 with its
// scales (an op that ReadsQuantized it).
inline std::string CheckRunTensors(const GpuContext& ctx,
                                   const std::vector<GpuTensor>& inputs,
                                   const std::vector<GpuTensor>& outputs,
                                   size_t n_in, size_t n_out, int quantized = -1) {
  if (inputs.size() != n_in || outputs.size() != n_out) {
    return "expects " + std::to_string(n_in) + " inputs and " +
           std::to_string(n_out) + " outputs, got " +
           std::to_string(inputs.size()) + " and " +
           std::to_string(outputs.size());
  }
  const DType storage = ctx.storage();
  for (size_t i = 0; i < inputs.size() + outputs.size(); ++i) {
    const bool is_in = i < inputs.size();
    const GpuTensor& t = is_in ? inputs[i] : outputs[i - inputs.size()];
    const std::string what = (is_in ? "input " : "output ") +
                             std::to_string(is_in ? i : i - inputs.size());
    if (t.mem == nullptr) return what + " has no device buffer";
    if (static_cast<int>(i) == quantized &&
        (t.dtype == DType::kInt8 || t.dtype == DType::kInt4)) {
      if (t.scales == nullptr) return what + " is quantized without scales";
      continue;
    }
    if (t.dtype != storage) {
      return what + " is stored as " + DTypeName(t.dtype) +
             " but the kernels were built for " + DTypeName(storage);
    }
  }
  return "";
}

// A kernel from the backend's program cache; "" or the reason.
inline std::string GetKernel(GpuContext& ctx, const char* program,
                             const char* name, const std::string& options,
                             cl_kernel* out) {
  std::string e;
  *out = ctx.Kernel(program, name, options, &e);
  if (*out == nullptr) {
    return std::string("building ") + program + ":" + name + " failed" +
           (e.empty() ? "" : ": " + e);
  }
  return "";
}

// CL_KERNEL_WORK_GROUP_SIZE of a built kernel (0 if the query fails).
inline size_t KernelMaxWorkGroup(const GpuContext& ctx, cl_kernel kernel) {
  const ClApi& cl = ctx.cl();
  if (cl.GetKernelWorkGroupInfo == nullptr) return 0;
  size_t wg = 0;
  // device = nullptr: valid while the program is built for one device (the
  // backend's context holds one).
  if (cl.GetKernelWorkGroupInfo(kernel, nullptr, CL_KERNEL_WORK_GROUP_SIZE,
                                sizeof(wg), &wg, nullptr) != CL_SUCCESS) {
    return 0;
  }
  return wg;
}

}  // namespace opsupport
}  // namespace gpu
}  // namespace difflite

#endif  // DIFFLITE_OPS_OPENCL_COMMON_H_
