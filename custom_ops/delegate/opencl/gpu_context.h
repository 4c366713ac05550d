// What the ops see of the backend (GpuContext): the runtime's context, queue
// and kernels, the program cache, op scratch memory, and profiling events.
#ifndef DIFFLITE_OPENCL_GPU_CONTEXT_H_
#define DIFFLITE_OPENCL_GPU_CONTEXT_H_

#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "difflite/gpu_api.h"
#include "difflite/lora_slots.h"
#include "opencl/program_cache.h"
#include "opencl/runtime.h"

namespace difflite::gpu {

// An intermediates' buffer lent to one op as its scratch slot `slot` (no tensor lives in it at
// that op's step), `bytes` large.
struct LentScratch {
  int slot = 0;
  cl_mem mem = nullptr;
  size_t bytes = 0;
};

class ContextImpl final : public GpuContext {
 public:
  ContextImpl(std::shared_ptr<Runtime> rt, DType storage, bool flat, bool half_math,
              bool tensor_cores, bool tensor_cores_emulated, ProgramCache disk)
      : rt_(std::move(rt)), storage_(storage), half_math_(half_math), flat_(flat),
        tensor_cores_(tensor_cores), tensor_cores_emulated_(tensor_cores_emulated),
        disk_(std::move(disk)) {}
  ~ContextImpl() override;

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
  bool TensorCores() const override { return tensor_cores_; }
  bool TensorCoresEmulated() const override { return tensor_cores_emulated_; }
  // The op factories run on a pool of threads (BackendImpl::ClaimAll).
  void NoteGemmTile(const std::string& tile) override {
    std::lock_guard<std::mutex> lock(gemm_tiles_mu_);
    ++gemm_tiles_[tile];
  }
  std::map<std::string, int> gemm_tiles() const {
    std::lock_guard<std::mutex> lock(gemm_tiles_mu_);
    return gemm_tiles_;
  }
  LoraSlots* lora_slots() const override { return lora_.get(); }
  cl_kernel Kernel(const std::string& program, const std::string& kernel_name,
                   const std::string& options, std::string* error) override;
  std::string Enqueue(cl_kernel kernel, cl_uint dims, const size_t* global,
                      const size_t* local, const char* label) override;
  cl_mem Scratch(size_t bytes, int slot, std::string* error) override;

  void set_label(const std::string& l) { label_ = l; }
  // What Scratch hands the op about to run before its own buffers (nullptr: nothing lent).
  void Lend(const std::vector<LentScratch>* lent) { lent_ = lent; }
  void set_lora_slots(std::shared_ptr<LoraSlots> lora) { lora_ = std::move(lora); }
  // profile=2: events keyed by node label and kernel label, not by op type alone.
  void set_detail(bool on) { detail_ = on; }
  std::vector<std::pair<std::string, cl_event>> TakeEvents();
  const ProgramCache& disk() const { return disk_; }

 private:
  std::shared_ptr<Runtime> rt_;
  DType storage_;
  bool half_math_;  // -DDL_FP16_MATH: half multiply-adds in the GEMM tiles and attention
  bool flat_;
  bool tensor_cores_;
  bool tensor_cores_emulated_;  // tensor_cores=emulate (DIFFLITE_TENSOR_CORES): for tests
  mutable std::mutex gemm_tiles_mu_;
  std::map<std::string, int> gemm_tiles_;  // NoteGemmTile: tile name -> GEMMs that took it
  ProgramCache disk_;
  std::shared_ptr<LoraSlots> lora_;  // the delegate's (delegate.cc)
  std::map<int, std::pair<cl_mem, size_t>> scratch_;
  const std::vector<LentScratch>* lent_ = nullptr;
  std::vector<std::pair<std::string, cl_event>> events_;
  std::string label_;
  bool detail_ = false;
};

}  // namespace difflite::gpu

#endif  // DIFFLITE_OPENCL_GPU_CONTEXT_H_
