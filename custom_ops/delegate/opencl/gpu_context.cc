#include "opencl/gpu_context.h"

#include <algorithm>

#include "opencl/cl_loader.h"

namespace difflite::gpu {

ContextImpl::~ContextImpl() {
  for (auto& kv : scratch_) {
    if (kv.second.first != nullptr) rt_->cl().ReleaseMemObject(kv.second.first);
  }
  for (auto& e : events_) rt_->cl().ReleaseEvent(e.second);
}

cl_kernel ContextImpl::Kernel(const std::string& program, const std::string& kernel_name,
                              const std::string& options, std::string* error) {
  std::string e;
  cl_kernel k = rt_->Kernel(program, kernel_name, options, storage_, half_math_, disk_, &e);
  if (k == nullptr && error != nullptr) *error = e;
  return k;
}

std::string ContextImpl::Enqueue(cl_kernel kernel, cl_uint dims, const size_t* global,
                                 const size_t* local, const char* label) {
  if (kernel == nullptr) return std::string("no kernel for ") + (label ? label : "?");
  for (cl_uint i = 0; i < dims; ++i) {
    if (global[i] == 0) return "";  // nothing to do
  }
  cl_event ev = nullptr;
  const cl_int err = cl().EnqueueNDRangeKernel(queue(), kernel, dims, nullptr, global, local, 0,
                                               nullptr, rt_->profiling() ? &ev : nullptr);
  if (err != CL_SUCCESS) {
    std::string g, l;
    for (cl_uint i = 0; i < dims; ++i) {
      g += (i ? "x" : "") + std::to_string(global[i]);
      if (local) l += (i ? "x" : "") + std::to_string(local[i]);
    }
    return std::string("clEnqueueNDRangeKernel(") + (label ? label : "?") + ", global " + g +
           (local ? ", local " + l : "") + "): " + ClErrorName(err);
  }
  if (ev != nullptr) {
    events_.emplace_back(detail_ ? label_ + " " + (label ? label : "?") : label_, ev);
  }
  return "";
}

cl_mem ContextImpl::Scratch(size_t bytes, int slot, std::string* error) {
  if (slot < 0 || slot >= kScratchSlots) {
    if (error) *error = "scratch slot " + std::to_string(slot) + " is not one of 0.." +
                        std::to_string(kScratchSlots - 1);
    return nullptr;
  }
  if (lent_ != nullptr) {
    for (const LentScratch& l : *lent_) {
      if (l.slot == slot && l.bytes >= bytes) return l.mem;
    }
  }
  auto& s = scratch_[slot];
  if (s.first != nullptr && s.second >= bytes) return s.first;
  if (s.first != nullptr) {
    // Deferred by OpenCL until enqueued commands using it complete.
    cl().ReleaseMemObject(s.first);
    s.first = nullptr;
    s.second = 0;
  }
  cl_int err = CL_SUCCESS;
  cl_mem m = cl().CreateBuffer(context(), CL_MEM_READ_WRITE, std::max<size_t>(bytes, 4), nullptr,
                               &err);
  if (m == nullptr || err != CL_SUCCESS) {
    if (error) *error = "scratch of " + std::to_string(bytes) + " bytes: " + ClErrorName(err);
    return nullptr;
  }
  s.first = m;
  s.second = bytes;
  return m;
}

std::vector<std::pair<std::string, cl_event>> ContextImpl::TakeEvents() {
  std::vector<std::pair<std::string, cl_event>> out;
  out.swap(events_);
  return out;
}

}  // namespace difflite::gpu
