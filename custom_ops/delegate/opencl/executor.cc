// backend=opencl (see executor.h): the Backend facade and the stats report.
// Its parts: claim.cc (which nodes run on the GPU), partition.cc with
// partition_plan.cc and weights.cc (a partition's plan, upload and run).
#include "opencl/executor.h"

#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <numeric>
#include <sstream>
#include <string>

#include "opencl/backend.h"
#include "opencl/partition.h"
#include "opencl/program_cache.h"

namespace difflite::gpu {

namespace {

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c < 0x20 || c >= 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\u%04x", c);
      out += buf;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  return out + "\"";
}

}  // namespace

std::mutex& ImplMutex() {
  static auto* m = new std::mutex();
  return *m;
}

std::map<const tfl::Delegate*, BackendImpl*>& ImplOf() {
  static auto* m = new std::map<const tfl::Delegate*, BackendImpl*>();
  return *m;
}

BackendImpl* FindImpl(const tfl::Delegate* d) {
  std::lock_guard<std::mutex> lock(ImplMutex());
  auto it = ImplOf().find(d);
  return it == ImplOf().end() ? nullptr : it->second;
}

void BackendImpl::WriteStats() {
  if (options.stats_path.empty()) return;
  size_t arena = 0, tensors_arena = 0, weights = 0, scratch = 0, lent = 0, staging = 0;
  std::string largest_scratch_op;
  std::vector<size_t> own(kScratchSlots, 0);  // the context's scratch buffers: one per slot
  UploadReport up;
  std::map<std::string, std::pair<double, long>> prof;
  long invokes = 0;
  for (const Partition* p : partitions) {
    arena += p->arena_bytes;
    tensors_arena += p->tensors_arena_bytes;
    // Device bytes as held: int8 / int4 weights read quantized count their integers and
    // scales, those dequantized at upload count in the storage type.
    weights += p->weights_bytes;
    for (size_t slot = 0; slot < p->own_scratch.size(); ++slot) {
      own[slot] = std::max(own[slot], p->own_scratch[slot]);
    }
    if (p->scratch_bytes > scratch) largest_scratch_op = p->largest_scratch_op;
    scratch = std::max(scratch, p->scratch_bytes);
    lent = std::max(lent, p->lent_scratch_bytes);
    staging += p->staging_bytes;
    up.zero_copy_bytes += p->upload.zero_copy_bytes;
    up.quantized_bytes += p->upload.quantized_bytes;
    up.dequantized_bytes += p->upload.dequantized_bytes;
    up.released_bytes += p->upload.released_bytes;
    up.staging_bytes = std::max(up.staging_bytes, p->upload.staging_bytes);
    up.slabs += p->upload.slabs;
    up.slab_bytes += p->upload.slab_bytes;
    up.seconds += p->upload.seconds;
    for (const auto& kv : p->profile()) {
      prof[kv.first].first += kv.second.first;
      prof[kv.first].second += kv.second.second;
    }
    invokes = std::max(invokes, p->invokes());
  }
  const Runtime::ProgramCounts programs = rt->programs();
  std::ostringstream os;
  os << "{\"arena_bytes\": " << arena << ", \"arena_tensors_bytes\": " << tensors_arena
     << ", \"weights_bytes\": " << weights
     << ", \"scratch_bytes\": " << scratch + staging << ", \"scratch_lent_bytes\": " << lent
     << ", \"scratch_held_bytes\": " << std::accumulate(own.begin(), own.end(), staging)
     << ", \"scratch_largest_op\": " << JsonString(largest_scratch_op)
     << ", \"nodes_claimed\": " << nodes_claimed
     << ", \"nodes_total\": " << nodes_total << ", \"partitions\": " << partitions.size()
     << ", \"device\": " << JsonString(rt->info().name)
     << ", \"platform\": " << JsonString(rt->info().platform)
     << ", \"storage\": " << JsonString(DTypeName(storage))
     << ", \"arithmetic\": " << JsonString(half_math ? "float16" : "float32")
     << ", \"kernels\": " << JsonString(gctx->PreferFlatKernels() ? "flat" : "tiled")
     << ", \"tensor_cores\": " << (gctx->TensorCores() ? "true" : "false")
     << ", \"nv_compute_capability\": " << rt->info().nv_compute_capability
     << ", \"gemm_tiles\": {";
  const char* sep = "";
  for (const auto& [tile, count] : gctx->gemm_tiles()) {
    os << sep << JsonString(tile) << ": " << count;
    sep = ", ";
  }
  os << "}"
     << ", \"weights_zero_copy_bytes\": " << up.zero_copy_bytes
     << ", \"weights_quantized_bytes\": " << up.quantized_bytes
     << ", \"weights_dequantized_bytes\": " << up.dequantized_bytes
     << ", \"model_pages_released_bytes\": " << up.released_bytes
     << ", \"upload_staging_bytes\": " << up.staging_bytes
     << ", \"weight_slabs\": " << up.slabs << ", \"weight_slab_bytes\": " << up.slab_bytes
     << ", \"upload_seconds\": " << up.seconds << ", \"claim_seconds\": " << claim_seconds
     << ", \"programs_built\": " << programs.built
     << ", \"programs_compiled\": " << programs.compiled
     << ", \"programs_from_cache\": " << programs.from_disk
     << ", \"programs_rejected\": " << programs.rejected
     << ", \"program_cache\": " << JsonString(gctx->disk().dir())
     << ", \"program_cache_refused\": " << JsonString(gctx->disk().refused())
     << ", \"program_cache_rejected\": [";
  for (size_t i = 0; i < programs.rejections.size(); ++i) {
    const Runtime::CacheRejection& r = programs.rejections[i];
    os << (i ? ", " : "") << "{\"program\": " << JsonString(r.program)
       << ", \"entry\": " << JsonString(r.entry) << ", \"reason\": " << JsonString(r.reason) << "}";
  }
  os << "]"
     << ", \"build_seconds\": " << programs.seconds << ", \"program_builds\": [";
  for (size_t i = 0; i < programs.builds.size(); ++i) {
    const Runtime::ProgramBuild& b = programs.builds[i];
    os << (i ? ", " : "") << "{\"program\": " << JsonString(b.program)
       << ", \"kernel\": " << JsonString(b.kernel) << ", \"options\": " << JsonString(b.options)
       << ", \"from\": " << JsonString(b.from_disk ? "cache" : "source")
       << ", \"seconds\": " << b.seconds << "}";
  }
  os << "]";
  if (options.profile) {
    os << ", \"invokes\": " << invokes << ", \"profile_ms_per_invoke\": {";
    bool first = true;
    for (const auto& kv : prof) {
      os << (first ? "" : ", ") << JsonString(kv.first) << ": "
         << (invokes > 0 ? kv.second.first / invokes : 0.0);
      first = false;
    }
    os << "}";
  }
  os << "}\n";
  const std::string tmp = options.stats_path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) {
      Log("cannot write stats_path " + options.stats_path);
      return;
    }
    f << os.str();
  }
  if (std::rename(tmp.c_str(), options.stats_path.c_str()) != 0) {
    Log("cannot write stats_path " + options.stats_path);
  }
}

std::string BackendImpl::Describe() const {
  const DeviceInfo& d = rt->info();
  std::ostringstream os;
  os << "device=" << rt->device_index() << " '" << d.name << "' (" << d.platform << ", "
     << d.version << ", " << (d.is_gpu ? "GPU" : "not a GPU") << ", " << d.compute_units
     << " compute units, " << d.local_mem_bytes / 1024 << " KiB local memory, work-group <= "
     << d.max_work_group_size << (d.has_fp16 ? ", cl_khr_fp16" : "") << ") storage="
     << DTypeName(storage)
     << (storage != DType::kFloat16 ? ""
         : !d.has_fp16               ? " (vload_half, float arithmetic)"
         : half_math                 ? " (half multiply-adds in GEMMs and attention)"
                                     : " (float arithmetic: math=fp32)")
     << " kernels=" << (gctx->PreferFlatKernels() ? "flat" : "tiled")
     << (gctx->TensorCores() ? " tensor_cores" : "")
     << (rt->profiling() ? " profile=1" : "");
  return os.str();
}

std::unique_ptr<Backend> Backend::Create(const Options& options, std::shared_ptr<LoraSlots> lora,
                                         std::string* error) {
  std::shared_ptr<Runtime> rt = Runtime::Get(options.device, options.profile > 0, error);
  if (rt == nullptr) return nullptr;
  std::unique_ptr<Backend> b(new Backend());
  b->impl_ = std::make_shared<BackendImpl>();
  BackendImpl& impl = *b->impl_;
  impl.options = options;
  impl.rt = rt;
  impl.storage = options.precision == "fp16" ? DType::kFloat16 : DType::kFloat32;
  impl.half_math = impl.storage == DType::kFloat16 && rt->info().has_fp16 && options.math == "auto";
  const bool flat = options.kernels == "flat" || (options.kernels == "auto" && !rt->info().is_gpu);
  ProgramCache disk =
      ProgramCache::Open(options.cache_dir.empty() ? ProgramCache::DefaultDir() : options.cache_dir);
  if (!disk.refused().empty()) {
    Log("program cache: not using " + disk.dir() + ": " + disk.refused() +
        "; every program is compiled from source");
  }
  // Tensor cores read half operands: only where the storage is half already, so that they
  // round nothing float storage would keep (mma.sync m16n8k16 needs compute capability 8.0).
  // "on" skips the capability check: a device that cannot build the instruction fails the
  // tensor-core tiles' programs, and PickTile then takes the float tiles.
  const bool emulated = options.tensor_cores == "emulate";
  const bool tensor_cores =
      impl.storage == DType::kFloat16 && !flat &&
      ((rt->info().nv_compute_capability >= 80 && options.tensor_cores == "auto") ||
       options.tensor_cores == "on" || emulated);
  impl.gctx = std::make_unique<ContextImpl>(rt, impl.storage, flat, impl.half_math,
                                            tensor_cores, tensor_cores && emulated, disk);
  impl.gctx->set_detail(options.profile >= 2);
  impl.gctx->set_lora_slots(std::move(lora));
  return b;
}

Backend::~Backend() {
  std::lock_guard<std::mutex> lock(ImplMutex());
  for (auto it = ImplOf().begin(); it != ImplOf().end();) {
    if (it->second == impl_.get()) {
      it = ImplOf().erase(it);
    } else {
      ++it;
    }
  }
}

tfl::Status Backend::PrepareDelegate(tfl::Context* ctx, tfl::Delegate* delegate) {
  {
    std::lock_guard<std::mutex> lock(ImplMutex());
    ImplOf()[delegate] = impl_.get();
  }
  return NoThrow(ctx, "OpenCL delegate prepare", tfl::kDelegateError,
                 [&] { return impl_->PrepareDelegate(ctx, delegate); });
}

std::string Backend::Describe() const { return impl_->Describe(); }

}  // namespace difflite::gpu
