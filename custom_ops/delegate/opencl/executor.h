// backend=opencl: claims every node it has a GPU op for (builtins and difflite
// custom ops), aiming at one partition for the whole graph, and runs each
// partition with OpenCL: constants uploaded once at Prepare, intermediates
// planned into one device arena, host<->device copies only at the partition
// boundary.
#ifndef DIFFLITE_OPENCL_EXECUTOR_H_
#define DIFFLITE_OPENCL_EXECUTOR_H_

#include <memory>
#include <string>

#include "delegate_util.h"
#include "difflite/tflite_abi.h"

namespace difflite {
class LoraSlots;
}

namespace difflite::gpu {

struct BackendImpl;

class Backend {
 public:
  // Loads OpenCL, picks the device, creates (or shares) the runtime. nullptr
  // and a one-line *error when OpenCL or a device is missing. `lora`: the
  // delegate's run-time LoRA factors, which the ops reach through their GpuContext.
  static std::unique_ptr<Backend> Create(const Options& options, std::shared_ptr<LoraSlots> lora,
                                         std::string* error);
  ~Backend();

  // Delegate::Prepare: claim nodes, build their GPU ops, replace them with
  // partition kernels.
  tfl::Status PrepareDelegate(tfl::Context* ctx, tfl::Delegate* delegate);

  // "device=... storage=..." for logs.
  std::string Describe() const;

 private:
  Backend() = default;
  std::shared_ptr<BackendImpl> impl_;  // partitions share it (they may outlive the delegate)
};

}  // namespace difflite::gpu

#endif  // DIFFLITE_OPENCL_EXECUTOR_H_
