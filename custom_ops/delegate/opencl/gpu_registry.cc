// The list of GPU ops and the small helpers of gpu_api.h. The builtins
// (builtins/<op>/) register themselves with DIFFLITE_REGISTER_GPU_OP; the
// difflite custom ops' GPU sides come from DiffliteCustomGpuOps()
// (ops/gpu_op_list.cc), appended when the list is first read.
#include <cstring>
#include <mutex>

#include "cl_loader.h"
#include "difflite/gpu_api.h"

namespace difflite::gpu {

// ops/gpu_op_list.cc.
std::vector<const GpuOpDef*> DiffliteCustomGpuOps();

namespace {

std::vector<const GpuOpDef*>& Registry() {
  static auto* ops = new std::vector<const GpuOpDef*>();
  return *ops;
}

std::mutex& RegistryMutex() {
  static auto* m = new std::mutex();
  return *m;
}

// Called with the mutex held: adds the custom ops once (after every static
// registration of the builtins has run, i.e. on first use).
void AddCustomOpsOnce() {
  static bool done = false;
  if (done) return;
  done = true;
  for (const GpuOpDef* def : DiffliteCustomGpuOps()) {
    if (def == nullptr || def->name == nullptr || def->create == nullptr) continue;
    bool replaced = false;
    for (const GpuOpDef*& d : Registry()) {
      if (std::strcmp(d->name, def->name) == 0) {
        d = def;
        replaced = true;
      }
    }
    if (!replaced) Registry().push_back(def);
  }
}

}  // namespace

bool RegisterGpuOp(const GpuOpDef* def) {
  if (def == nullptr || def->name == nullptr || def->create == nullptr) {
    return false;
  }
  std::lock_guard<std::mutex> lock(RegistryMutex());
  for (const GpuOpDef*& d : Registry()) {
    if (std::strcmp(d->name, def->name) == 0) {
      d = def;
      return true;
    }
  }
  Registry().push_back(def);
  return true;
}

const std::vector<const GpuOpDef*>& AllGpuOps() {
  std::lock_guard<std::mutex> lock(RegistryMutex());
  AddCustomOpsOnce();
  return Registry();
}

const GpuOpDef* FindGpuOp(const char* name) {
  if (name == nullptr) return nullptr;
  std::lock_guard<std::mutex> lock(RegistryMutex());
  AddCustomOpsOnce();
  for (const GpuOpDef* d : Registry()) {
    if (std::strcmp(d->name, name) == 0) return d;
  }
  return nullptr;
}

std::string SetArgs(const ClApi& cl, cl_kernel kernel,
                    const std::vector<std::pair<size_t, const void*>>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const cl_int err = cl.SetKernelArg(kernel, static_cast<cl_uint>(i),
                                       args[i].first, args[i].second);
    if (err != CL_SUCCESS) {
      return "clSetKernelArg(" + std::to_string(i) + "): " + ClErrorName(err);
    }
  }
  return "";
}

}  // namespace difflite::gpu
