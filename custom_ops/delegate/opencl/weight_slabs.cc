// The weight slabs (see partition.h): constants sub-allocated from a few large device buffers
// instead of one buffer each.
//
// A driver may round every buffer up: NVIDIA's OpenCL gives each buffer of 1 MiB or more whole
// 2 MiB pages (200 buffers of 1.06 MiB took 398 MiB; benchmarks/cl_driver_memory.py), so the
// ~800 weight buffers of SDXL's int4 UNet held 369 MiB more than their bytes. Sub-buffers would
// avoid that, but NVIDIA's driver and PoCL's CUDA driver crash on them (docs/lab-notebook.md §6,
// §52): instead each kernel that reads a weight takes where it starts (GpuTensor::offset), and
// only constants whose every reader says so (GpuOp::ReadsAtOffset) go into a slab.
//
// Zero-copy constants (buffers over the model file's pages, on devices sharing memory with the
// host) stay as they are: they cost no device memory to begin with.
#include <algorithm>
#include <string>
#include <vector>

#include "opencl/cl_loader.h"
#include "opencl/partition.h"

namespace difflite::gpu {

namespace {

// A slab's size: large enough that its own rounding is small beside it, small enough that a
// device whose free memory is fragmented still finds room for one.
constexpr size_t kSlabBytes = 256u << 20;

size_t AlignUp(size_t n, size_t align) { return (n + align - 1) / align * align; }

}  // namespace

// Places every constant that may go into a slab (read at an offset, uploaded at all, not made
// zero-copy) one after the other, each piece (a weight, its scales) aligned to the device's base
// alignment, and makes the slabs. A constant larger than a slab keeps a buffer of its own.
std::string Partition::AllocateWeightSlabs(const std::function<bool(const Slot&)>& zero_copy) {
  if (be_->options.weight_slabs == "off") return "";
  const DeviceInfo& info = be_->rt->info();
  const size_t align = std::max<size_t>(info.base_align_bytes, 256);
  size_t cap = kSlabBytes;
  if (info.max_alloc_bytes > 0) cap = std::min<size_t>(cap, info.max_alloc_bytes);
  std::vector<size_t> sizes;  // the slabs' sizes, as planned
  std::vector<std::pair<Slot*, size_t>> placed;  // each constant and its slab
  for (size_t step : exec_) {  // node order, so a slab fills with the weights a stage reads
    for (int idx : nodes_[step]->inputs) {
      if (idx < 0) continue;
      Slot& s = slots_.at(idx);
      if (s.kind != Slot::kConst || !s.used || s.packed || !s.at_offset || s.in_slab ||
          s.host == nullptr || zero_copy(s)) {
        continue;
      }
      const size_t weight = AlignUp(std::max<size_t>(s.bytes, 4), align);
      const size_t need = weight + (s.quantized ? AlignUp(s.scale_bytes, align) : 0);
      if (need > cap) continue;
      if (sizes.empty() || sizes.back() + need > cap) sizes.push_back(0);
      s.in_slab = true;
      s.offset = sizes.back();
      s.scales_offset = s.quantized ? s.offset + weight : 0;
      sizes.back() += need;
      placed.emplace_back(&s, sizes.size() - 1);
    }
  }
  for (size_t bytes : sizes) {
    cl_int err = CL_SUCCESS;
    cl_mem slab = be_->rt->cl().CreateBuffer(be_->rt->context(), CL_MEM_READ_ONLY, bytes, nullptr,
                                             &err);
    if (slab == nullptr || err != CL_SUCCESS) {
      return "cannot allocate a " + std::to_string(bytes) + "-byte weight slab: " + ClErrorName(err);
    }
    slabs_.push_back(slab);
    upload.slab_bytes += bytes;
  }
  upload.slabs = slabs_.size();
  for (auto& [s, slab] : placed) {
    s->mem = slabs_[slab];
    if (s->quantized) s->scales = slabs_[slab];
  }
  return "";
}

}  // namespace difflite::gpu
