// A partition's constants on the device (see partition.h): each weight is read
// once from the model and held once, in the storage type.
//
// - Upload order follows the nodes: a node's constants are uploaded, then its op
//   packs its own copy where it keeps one (GpuOp::PackWeights, on the device),
//   and an upload no op reads at Run is released at once. So at most one weight
//   is held twice, and only on devices whose kernels want a packed layout. The constants in
//   weight slabs (weight_slabs.cc), which no op packs, are written first.
// - The model's bytes go to the device as they are where they are already in the
//   storage type (float16 weights in half storage); otherwise they are converted
//   through one bounded staging buffer (kStagingBytes), never a whole tensor.
//   Quantized weights (int8, int4: a folded DEQUANTIZE) go to the device as the
//   model's integers, with a small buffer of float32 scales, where every op that
//   reads them dequantizes in its kernels (GpuOp::ReadsQuantized); otherwise they
//   are dequantized a chunk at a time into the staging buffer, in the storage type.
// - Zero copy: where the device shares memory with the host (phones, CPUs,
//   integrated GPUs) and the model's bytes need no conversion, the buffer is made
//   over the model file's own pages (CL_MEM_USE_HOST_PTR on the interpreter's
//   read-only mapping): the weights live once, as clean file pages the system
//   may page out and back in. Option zero_copy=off turns it off.
// - After a copy, the model's pages of that weight are released from the process
//   (madvise MADV_DONTNEED on the file mapping: clean pages, re-read from the file
//   should TFLite ever touch them), so the interpreter's mapping does not keep a
//   second copy resident.
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "opencl/cl_loader.h"
#include "opencl/half.h"
#include "opencl/partition.h"

namespace difflite::gpu {

namespace {

constexpr size_t kStagingBytes = 4u << 20;

// The address ranges of this process mapped from files (/proc/self/maps).
class FileMappings {
 public:
  FileMappings() {
    std::ifstream maps("/proc/self/maps");
    std::string line;
    while (std::getline(maps, line)) {
      std::istringstream in(line);
      std::string range, perms, offset, dev;
      unsigned long inode = 0;
      if (!(in >> range >> perms >> offset >> dev >> inode) || inode == 0) continue;
      const size_t dash = range.find('-');
      if (dash == std::string::npos) continue;
      ranges_.emplace_back(std::stoull(range.substr(0, dash), nullptr, 16),
                           std::stoull(range.substr(dash + 1), nullptr, 16));
    }
    std::sort(ranges_.begin(), ranges_.end());
  }

  bool Contains(const void* p, size_t n) const {
    const auto a = reinterpret_cast<uintptr_t>(p);
    return a + n <= End(a);
  }

  // Where the mapping holding address `a` ends (0: none holds it).
  uintptr_t End(uintptr_t a) const {
    auto it = std::upper_bound(ranges_.begin(), ranges_.end(), std::make_pair(a, UINTPTR_MAX));
    if (it == ranges_.begin()) return 0;
    --it;
    return a >= it->first ? it->second : 0;
  }

 private:
  std::vector<std::pair<uintptr_t, uintptr_t>> ranges_;
};

size_t PageSize() {
  static const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  return page;
}

bool SameEncoding(tfl::Type model, DType storage) {
  return (model == tfl::kFloat32 && storage == DType::kFloat32) ||
         (model == tfl::kFloat16 && storage == DType::kFloat16) ||
         (model == tfl::kInt32 && storage == DType::kInt32) ||
         (model == tfl::kInt8 && storage == DType::kInt8) ||
         (model == tfl::kInt4 && storage == DType::kInt4);
}

// Device bytes of `c` held in `storage`.
size_t StorageBytes(const HostConst& c, DType storage) {
  if (SameEncoding(c.model_type, storage)) return c.model_bytes();
  return c.elements() * DTypeSize(storage);
}

// Elements [first, first + count) of the int8 / int4 constant `c` as floats, each handed to
// store(i, value) for i in [0, count): (q - zero_point[ch]) * scale[ch], in float as TFLite's
// DEQUANTIZE computes it (the integer difference converted, then one rounded product).
// The channel advances every `inner` elements and wraps after `channels`.
template <typename Store>
void Dequantize(const HostConst& c, size_t first, size_t count, Store store) {
  const QuantScales& qs = c.quant;
  const auto* q = static_cast<const uint8_t*>(c.bytes);
  const bool int4 = c.model_type == tfl::kInt4;
  size_t ch = (first / qs.inner) % qs.channels;
  size_t left = qs.inner - first % qs.inner;  // elements before the channel changes
  float scale = qs.Scale(ch);
  int zero = qs.Zero(ch);
  for (size_t i = 0; i < count; ++i, --left) {
    if (left == 0) {
      ch = ch + 1 == qs.channels ? 0 : ch + 1;
      left = qs.inner;
      scale = qs.Scale(ch);
      zero = qs.Zero(ch);
    }
    const size_t e = first + i;
    int v;
    if (int4) {
      // Even elements in the low nibble, odd ones in the high nibble; the nibble's top
      // bit is the sign: (n ^ 8) - 8 maps 0..7 to 0..7 and 8..15 to -8..-1.
      const int nibble = (e & 1) ? (q[e >> 1] >> 4) : (q[e >> 1] & 0xF);
      v = (nibble ^ 8) - 8;
    } else {
      v = static_cast<int8_t>(q[e]);
    }
    store(i, static_cast<float>(v - zero) * scale);
  }
}

// Elements [first, first + count) of `c` in `storage` at `out`.
void ConvertElements(const HostConst& c, size_t first, size_t count, DType storage, void* out) {
  if (SameEncoding(c.model_type, storage)) {
    const size_t es = DTypeSize(storage);
    std::memcpy(out, static_cast<const uint8_t*>(c.bytes) + first * es, count * es);
    return;
  }
  if (c.quantized()) {
    if (storage == DType::kFloat16) {
      auto* dst = static_cast<uint16_t*>(out);
      Dequantize(c, first, count, [dst](size_t i, float v) { dst[i] = FloatToHalf(v); });
    } else {
      auto* dst = static_cast<float*>(out);
      Dequantize(c, first, count, [dst](size_t i, float v) { dst[i] = v; });
    }
    return;
  }
  if (storage == DType::kFloat16) {  // float32 model bytes
    const float* src = static_cast<const float*>(c.bytes) + first;
    auto* dst = static_cast<uint16_t*>(out);
    for (size_t i = 0; i < count; ++i) dst[i] = FloatToHalf(src[i]);
    return;
  }
  WidenTo(c, first, count, static_cast<float*>(out));  // float16 model bytes, float storage
}

}  // namespace

class WeightUploader {
 public:
  WeightUploader(const Runtime& rt, bool zero_copy, UploadReport* report)
      : rt_(rt), zero_copy_(zero_copy && rt.info().host_unified_memory), report_(report) {}

  ~WeightUploader() {
    if (transient_ != nullptr) rt_.cl().ReleaseMemObject(transient_);
  }

  // A new read-only device buffer holding `c` in `storage`; *zero_copy: over the model's
  // pages. "" or a reason.
  std::string Upload(const HostConst& c, DType storage, cl_mem* out, bool* zero_copy) {
    *zero_copy = Wrap(c, storage, out);
    if (*zero_copy) return "";
    const size_t bytes = StorageBytes(c, storage);
    cl_int err = CL_SUCCESS;
    *out = rt_.cl().CreateBuffer(rt_.context(), CL_MEM_READ_ONLY, std::max<size_t>(bytes, 4),
                                 nullptr, &err);
    if (*out == nullptr || err != CL_SUCCESS) {
      *out = nullptr;
      return "cannot allocate " + std::to_string(bytes) + " bytes: " + ClErrorName(err);
    }
    const std::string e = Write(c, storage, *out, 0);
    if (e.empty()) ReleaseModelPages(c);
    return e;
  }

  // `c` in `storage` written `offset` bytes into `slab` (a weight slab).
  std::string UploadAt(const HostConst& c, DType storage, cl_mem slab, size_t offset) {
    const std::string e = Write(c, storage, slab, offset);
    if (e.empty()) ReleaseModelPages(c);
    return e;
  }

  // Whether Upload would make `c`'s buffer over the model's pages (where the driver agrees).
  bool WillWrap(const HostConst& c, DType storage) const {
    return SameEncoding(c.model_type, storage) && CanWrapBytes(c.bytes, StorageBytes(c, storage));
  }

  // For a constant read once, by one op's PackWeights: written into the one transient buffer
  // that every such constant goes through in turn, so that packing allocates and frees no
  // device memory per weight (and wraps no model pages: they are released after the copy).
  // ReserveTransient first.
  std::string UploadTransient(const HostConst& c, DType storage, cl_mem* out) {
    if (StorageBytes(c, storage) > transient_bytes_) return "transient buffer too small";
    const std::string e = Write(c, storage, transient_, 0);
    if (e.empty()) ReleaseModelPages(c);
    *out = transient_;
    return e;
  }

  std::string ReserveTransient(size_t bytes) {
    if (bytes == 0) return "";
    cl_int err = CL_SUCCESS;
    transient_ = rt_.cl().CreateBuffer(rt_.context(), CL_MEM_READ_WRITE, bytes, nullptr, &err);
    if (transient_ == nullptr || err != CL_SUCCESS) {
      transient_ = nullptr;
      return "cannot allocate a " + std::to_string(bytes) + "-byte packing buffer: " + ClErrorName(err);
    }
    transient_bytes_ = bytes;
    report_->staging_bytes = std::max(report_->staging_bytes, bytes);
    return "";
  }

  // A read-only buffer of the scales of the quantized constant `c` (one per ScaleGroup()
  // elements, in that order): float16 block scales as the model stores them (HalfScales: over the
  // model's pages where Wrap could, else copied), otherwise float32 (the runtime's own array, or
  // block scales widened).
  std::string UploadScales(const HostConst& c, cl_mem* out) {
    if (c.HalfScales() && WrapBytes(c.quant.block_scales, c.ScaleBytes(), out)) return "";
    std::vector<float> widened;
    const void* host = HostScales(c, &widened);
    cl_int err = CL_SUCCESS;
    *out = rt_.cl().CreateBuffer(rt_.context(), CL_MEM_READ_ONLY | CL_MEM_COPY_HOST_PTR,
                                 c.ScaleBytes(), const_cast<void*>(host), &err);
    if (*out == nullptr || err != CL_SUCCESS) {
      *out = nullptr;
      return "cannot allocate " + std::to_string(c.ScaleBytes()) + " bytes of scales: " +
             ClErrorName(err);
    }
    ReleasePages(c.quant.block_scales, c.quant.block_scale_bytes());
    return "";
  }

  // UploadScales' scales written `offset` bytes into `slab`.
  std::string UploadScalesAt(const HostConst& c, cl_mem slab, size_t offset) {
    std::vector<float> widened;
    const void* host = HostScales(c, &widened);
    const cl_int err = rt_.cl().EnqueueWriteBuffer(rt_.queue(), slab, CL_TRUE, offset,
                                                   c.ScaleBytes(), host, 0, nullptr, nullptr);
    if (err != CL_SUCCESS) return "clEnqueueWriteBuffer of scales: " + ClErrorName(err);
    ReleasePages(c.quant.block_scales, c.quant.block_scale_bytes());
    return "";
  }

  // The whole pages of the model's copy of `c`, dropped from this process.
  void ReleaseModelPages(const HostConst& c) { ReleasePages(c.bytes, c.model_bytes()); }

  // Once every constant is uploaded: the model's pages of all the released constants dropped
  // again, each run of neighbours at once (their shared pages too), none a zero-copy buffer is
  // over. Why again: a page cache of large folios (Linux 6.x) maps a whole folio, up to 2 MiB,
  // on a fault, so reading a small constant (a bias) after its neighbours were released maps
  // them back; on the 2-core host 154 MiB of an SD 1.5 int4 UNet's 533 came back so. The
  // report's released_bytes is this pass's.
  void ReleaseAgain() {
    std::sort(released_.begin(), released_.end());
    std::sort(kept_.begin(), kept_.end());
    const uintptr_t page = PageSize();
    report_->released_bytes = 0;
    for (size_t i = 0; i < released_.size();) {
      const uintptr_t begin = released_[i].first;
      uintptr_t end = released_[i].second;
      for (++i; i < released_.size() && released_[i].first < end + page &&
                !KeptBetween(end, released_[i].first);
           ++i) {
        end = std::max(end, released_[i].second);
      }
      // The file's last page too, where this run ends the file (the rest of the page is past it).
      const uintptr_t mapping_end = files_.End(begin);
      const bool ends_file = end + page >= mapping_end && !KeptBetween(end, mapping_end);
      report_->released_bytes += DropWholePages(begin, ends_file ? mapping_end : end);
    }
  }

 private:
  // The whole pages of [bytes, bytes + size) where they are the model file's, dropped from this
  // process (and remembered for ReleaseAgain).
  void ReleasePages(const void* bytes, size_t size) {
    if (bytes == nullptr || !files_.Contains(bytes, size)) return;
    const auto begin = reinterpret_cast<uintptr_t>(bytes);
    released_.emplace_back(begin, begin + size);
    DropWholePages(begin, begin + size);
  }

  // The pages wholly inside [begin, end) dropped from this process (madvise MADV_DONTNEED): the
  // bytes dropped.
  static size_t DropWholePages(uintptr_t begin, uintptr_t end) {
    const uintptr_t page = PageSize();
    const uintptr_t first = (begin + page - 1) / page * page, last = end / page * page;
    return last > first && madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED) == 0
               ? last - first
               : 0;
  }

  // A read-only buffer over the model's own pages, where the device shares memory with the host
  // and the bytes need no conversion; false (nothing made) otherwise or where the driver refuses.
  bool Wrap(const HostConst& c, DType storage, cl_mem* out) {
    return SameEncoding(c.model_type, storage) && WrapBytes(c.bytes, StorageBytes(c, storage), out);
  }

  // The scales of `c` as the kernels read them, in host memory: the model's float16 block scales,
  // the runtime's float32 array, or block scales widened into `widened`.
  static const void* HostScales(const HostConst& c, std::vector<float>* widened) {
    const QuantScales& qs = c.quant;
    if (c.HalfScales()) return qs.block_scales;
    if (qs.scale != nullptr) return qs.scale;
    const size_t count = c.elements() / c.ScaleGroup();
    widened->resize(count);
    for (size_t i = 0; i < count; ++i) (*widened)[i] = qs.Scale(i);
    return widened->data();
  }

  // Whether [bytes, bytes + size) is model pages WrapBytes may make a buffer over.
  bool CanWrapBytes(const void* bytes, size_t size) const {
    const size_t align = std::max<size_t>(rt_.info().base_align_bytes, 64);
    return zero_copy_ && size >= 4 && size % 4 == 0 &&
           reinterpret_cast<uintptr_t>(bytes) % align == 0 && files_.Contains(bytes, size);
  }

  // Whether a zero-copy buffer's bytes meet [a, b) (kept_ sorted).
  bool KeptBetween(uintptr_t a, uintptr_t b) const {
    auto it = std::lower_bound(kept_.begin(), kept_.end(), std::make_pair(a, uintptr_t{0}));
    if (it != kept_.begin() && std::prev(it)->second > a) return true;
    return it != kept_.end() && it->first < b;
  }

  // A read-only buffer over [bytes, bytes + size) of the model's own pages, as Wrap.
  bool WrapBytes(const void* bytes, size_t size, cl_mem* out) {
    if (!CanWrapBytes(bytes, size)) return false;
    cl_int err = CL_SUCCESS;
    *out = rt_.cl().CreateBuffer(rt_.context(), CL_MEM_READ_ONLY | CL_MEM_USE_HOST_PTR, size,
                                 const_cast<void*>(bytes), &err);
    if (*out == nullptr || err != CL_SUCCESS) {
      *out = nullptr;
      return false;
    }
    report_->zero_copy_bytes += size;
    const auto begin = reinterpret_cast<uintptr_t>(bytes);
    kept_.emplace_back(begin, begin + size);
    return true;
  }

  // `c` in `storage` into `mem` from byte `at`.
  std::string Write(const HostConst& c, DType storage, cl_mem mem, size_t at) {
    const size_t n = c.elements();
    const size_t es = DTypeSize(storage);
    cl_command_queue q = rt_.queue();
    if (SameEncoding(c.model_type, storage) && (c.model_bytes() >= 4 || c.quantized())) {
      const cl_int err = rt_.cl().EnqueueWriteBuffer(q, mem, CL_TRUE, at, c.model_bytes(),
                                                     c.bytes, 0, nullptr, nullptr);
      return err == CL_SUCCESS ? "" : "clEnqueueWriteBuffer: " + ClErrorName(err);
    }
    if (es == 0) return "a quantized weight of fewer than 4 bytes";
    // Converted (or padded to 4 bytes) through the staging buffer, a chunk at a time.
    const size_t chunk = std::max<size_t>(kStagingBytes / es, 1);
    staging_.resize(std::max<size_t>(std::min(n, chunk) * es, 4));
    report_->staging_bytes = std::max(report_->staging_bytes, staging_.size());
    for (size_t first = 0; first < n; first += chunk) {
      const size_t count = std::min(chunk, n - first);
      std::fill(staging_.begin(), staging_.end(), 0);
      ConvertElements(c, first, count, storage, staging_.data());
      const size_t size = std::max<size_t>(count * es, n * es < 4 ? 4 : 0);
      const cl_int err = rt_.cl().EnqueueWriteBuffer(q, mem, CL_TRUE, at + first * es, size,
                                                     staging_.data(), 0, nullptr, nullptr);
      if (err != CL_SUCCESS) return "clEnqueueWriteBuffer: " + ClErrorName(err);
    }
    return "";
  }

  const Runtime& rt_;
  const bool zero_copy_;
  UploadReport* report_;
  FileMappings files_;
  std::vector<std::pair<uintptr_t, uintptr_t>> released_;  // [begin, end) of released constants
  std::vector<std::pair<uintptr_t, uintptr_t>> kept_;      // of zero-copy buffers' bytes
  std::vector<uint8_t> staging_;
  cl_mem transient_ = nullptr;
  size_t transient_bytes_ = 0;
};

size_t HostConst::ScaleGroup() const {
  if (!quantized() || !quant.has_scales()) return 0;
  for (size_t c = 0; c < quant.channels && quant.zero_point != nullptr; ++c) {
    if (quant.zero_point[c] != 0) return 0;
  }
  const size_t group = quant.channels == 1 ? elements() : quant.inner;
  return group * quant.channels == elements() ? group : 0;
}

void WidenTo(const HostConst& c, size_t first, size_t count, float* out) {
  if (c.quantized()) {
    Dequantize(c, first, count, [out](size_t i, float v) { out[i] = v; });
  } else if (c.model_type == tfl::kFloat16) {
    const uint16_t* src = static_cast<const uint16_t*>(c.bytes) + first;
    for (size_t i = 0; i < count; ++i) out[i] = HalfToFloat(src[i]);
  } else {
    std::memcpy(out, static_cast<const float*>(c.bytes) + first, count * 4);
  }
}

std::string Partition::UploadConstants() {
  const auto t0 = std::chrono::steady_clock::now();
  upload = UploadReport();
  WeightUploader uploader(*be_->rt, be_->options.zero_copy != "off", &upload);
  std::map<int, int> packers_left = CountPackers();
  size_t transient_bytes = 0;
  for (const auto& kv : packers_left) {
    const Slot& s = slots_.at(kv.first);
    if (!s.used && kv.second == 1) transient_bytes = std::max(transient_bytes, s.bytes);
  }
  std::string e = uploader.ReserveTransient(transient_bytes);
  if (e.empty()) {
    e = AllocateWeightSlabs([&uploader](const Slot& s) { return uploader.WillWrap(*s.host, s.storage); });
  }
  if (!e.empty()) return e;
  for (auto& [idx, s] : slots_) {  // no op packs these: their upload order does not matter
    if (!s.in_slab) continue;
    e = uploader.UploadAt(*s.host, s.storage, s.mem, s.offset);
    if (e.empty() && s.quantized) e = uploader.UploadScalesAt(*s.host, s.scales, s.scales_offset);
    if (!e.empty()) return "uploading constant tensor " + std::to_string(idx) + ": " + e;
  }
  for (size_t step : exec_) {
    ClaimedNode& n = *nodes_[step];
    std::vector<GpuTensor> in(n.inputs.size());
    bool packs = false;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const int idx = n.inputs[i];
      if (idx < 0) continue;
      Slot& s = slots_.at(idx);
      if (s.kind != Slot::kConst || !(s.used || s.packed)) continue;
      if (s.mem == nullptr) {
        // Read once, by this node's PackWeights: no buffer of its own.
        const bool transient = !s.used && packers_left.count(idx) && packers_left[idx] == 1;
        e = transient ? uploader.UploadTransient(*s.host, s.storage, &s.mem)
                      : uploader.Upload(*s.host, s.storage, &s.mem, &s.zero_copy);
        if (e.empty() && s.quantized) e = uploader.UploadScales(*s.host, &s.scales);
        if (!e.empty()) return "uploading constant tensor " + std::to_string(idx) + ": " + e;
        s.owns_mem = !transient;
      }
      in[i] = {s.mem, s.storage, s.shape, s.scales, s.offset, s.scales_offset};
      packs = packs || n.op->PacksInput(i);
    }
    if (!packs) continue;
    e = n.op->PackWeights(*be_->gctx, in);
    if (e.empty() && be_->rt->cl().Finish(be_->rt->queue()) != CL_SUCCESS) e = "clFinish";
    if (!e.empty()) return "node " + std::to_string(n.node_index) + " (" + n.name + "): " + e;
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      const int idx = n.inputs[i];
      if (idx >= 0 && n.op->PacksInput(i) && --packers_left[idx] == 0) DropPackedOnly(idx, &uploader);
    }
  }
  weights_bytes = 0;
  for (const auto& kv : slots_) {
    const Slot& s = kv.second;
    if (s.kind != Slot::kConst || s.mem == nullptr) continue;
    const size_t held = std::max<size_t>(s.bytes, 4) + (s.scales != nullptr ? s.scale_bytes : 0);
    weights_bytes += held;
    if (s.quantized) upload.quantized_bytes += held;
    if (!s.quantized && s.host != nullptr && s.host->quantized()) upload.dequantized_bytes += held;
  }
  upload.held_bytes = weights_bytes;
  uploader.ReleaseAgain();
  for (size_t step : exec_) {
    const ClaimedNode& n = *nodes_[step];
    const size_t own = n.op->WeightBytes();
    weights_bytes += own;
    for (size_t i = 0; i < n.inputs.size() && own > 0; ++i) {  // packed copies of int8 / int4
      const int idx = n.inputs[i];
      if (idx < 0 || !n.op->PacksInput(i)) continue;
      const Slot& s = slots_.at(idx);
      if (s.quantized) upload.quantized_bytes += own;
      if (!s.quantized && s.host != nullptr && s.host->quantized()) upload.dequantized_bytes += own;
      break;
    }
  }
  DropHostConstants();
  upload.seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return "";
}

// Constant -> the number of nodes that pack their own copy of it.
std::map<int, int> Partition::CountPackers() const {
  std::map<int, int> packers;
  for (size_t step : exec_) {
    const ClaimedNode& n = *nodes_[step];
    for (size_t i = 0; i < n.inputs.size(); ++i) {
      if (n.inputs[i] >= 0 && n.op->PacksInput(i)) ++packers[n.inputs[i]];
    }
  }
  return packers;
}

// A constant no op reads at Run, once its last packer has packed it: its upload goes.
void Partition::DropPackedOnly(int idx, WeightUploader* uploader) {
  Slot& s = slots_.at(idx);
  if (s.used || s.mem == nullptr) return;
  if (s.owns_mem) be_->rt->cl().ReleaseMemObject(s.mem);
  if (s.scales != nullptr) be_->rt->cl().ReleaseMemObject(s.scales);
  if (s.zero_copy) uploader->ReleaseModelPages(*s.host);  // copies released theirs already
  s.mem = nullptr;
  s.scales = nullptr;
  s.owns_mem = false;
  s.zero_copy = false;
}

// Host views of constants are no longer needed, except folded outputs read by TFLite.
void Partition::DropHostConstants() {
  for (auto& kv : slots_) {
    if (kv.second.kind == Slot::kConst && !kv.second.is_output) kv.second.host.reset();
  }
  for (auto& n : nodes_) {
    n->consts.clear();
    if (n->folded && !slots_.at(n->outputs[0]).is_output) n->folded_value.reset();
    for (TensorInfo& t : n->in_info) t.const_data = nullptr;
  }
}

}  // namespace difflite::gpu
