#include "common/kernel_util.h"

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "opencl/half.h"

namespace difflite::gpu::builtin {

std::unique_ptr<GpuOp> Refuse(std::string* error, const std::string& why) {
  *error = why;
  return nullptr;
}

std::string ExpectCounts(const NodeView& node, size_t min_in, size_t max_in,
                         size_t outputs) {
  const size_t n = node.inputs.size();
  if (n < min_in || n > max_in) {
    return std::string(node.op_name) + " expects " + std::to_string(min_in) +
           (max_in != min_in ? ".." + std::to_string(max_in) : std::string()) +
           " inputs, got " + std::to_string(n);
  }
  if (node.outputs.size() != outputs) {
    return std::string(node.op_name) + " expects " + std::to_string(outputs) +
           " outputs, got " + std::to_string(node.outputs.size());
  }
  return "";
}

bool Present(const TensorInfo& t) { return t.dtype != DType::kOther || !t.shape.empty(); }

std::string ExpectFloat(const NodeView& /*node*/, const TensorInfo& t, const char* what) {
  if (t.dtype == DType::kFloat32) return "";
  return std::string(what) + " must be float32, got " + DTypeName(t.dtype);
}

std::string ExpectShape(const TensorInfo& t, const Shape& want, const char* what) {
  if (t.shape == want) return "";
  return std::string(what) + " is declared " + ShapeToString(t.shape) + ", expected " +
         ShapeToString(want);
}

bool ConstInts(const TensorInfo& t, std::vector<int>* out) {
  if (t.dtype != DType::kInt32 || t.const_data == nullptr) return false;
  const auto* p = static_cast<const int32_t*>(t.const_data);
  out->assign(p, p + NumElements(t.shape));
  return true;
}

bool ConstScalar(const TensorInfo& t, float* out) {
  if (t.dtype != DType::kFloat32 || t.const_data == nullptr || NumElements(t.shape) != 1) {
    return false;
  }
  std::memcpy(out, t.const_data, 4);
  return true;
}

std::string ActivationNone(int activation, const char* op) {
  if (activation == tfl::kActNone) return "";
  return std::string(op) + " with a fused activation (" + std::to_string(activation) +
         ") is not supported";
}

std::vector<int> Strides(const Shape& shape) {
  std::vector<int> s(shape.size(), 1);
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) {
    s[i] = s[i + 1] * shape[i + 1];
  }
  return s;
}

void IndexSpace::Collapse() {
  std::vector<int> d;
  std::vector<std::vector<int>> s(strides.size());
  for (size_t k = 0; k < dims.size(); ++k) {
    if (dims[k] == 1) continue;
    bool merge = !d.empty();
    for (size_t o = 0; o < strides.size() && merge; ++o) {
      // previous kept dim is outer: merge when outer stride == inner stride * inner dim
      if (s[o].back() != strides[o][k] * dims[k]) merge = false;
    }
    if (merge) {
      d.back() *= dims[k];
      for (size_t o = 0; o < strides.size(); ++o) s[o].back() = strides[o][k];
    } else {
      d.push_back(dims[k]);
      for (size_t o = 0; o < strides.size(); ++o) s[o].push_back(strides[o][k]);
    }
  }
  if (d.empty()) {  // a single element
    d.push_back(1);
    for (auto& v : s) v.push_back(0);
  }
  dims = d;
  strides = s;
}

Args& Args::Value(const void* data, size_t size) {
  const auto* bytes = static_cast<const unsigned char*>(data);
  args_.emplace_back(bytes, bytes + size);
  return *this;
}

Args& Args::Mem(cl_mem m) { return Value(&m, sizeof(m)); }

Args& Args::Int(int v) {
  const cl_int c = v;
  return Value(&c, sizeof(c));
}

Args& Args::Float(float v) {
  const cl_float c = v;
  return Value(&c, sizeof(c));
}

Args& Args::Int8(const std::vector<int>& v, int fill) {
  cl_int8 c;
  for (int i = 0; i < 8; ++i) c.s[i] = i < static_cast<int>(v.size()) ? v[i] : fill;
  return Value(&c, sizeof(c));
}

Args& Args::Int4(const std::vector<int>& v, int fill) {
  cl_int4 c;
  for (int i = 0; i < 4; ++i) c.s[i] = i < static_cast<int>(v.size()) ? v[i] : fill;
  return Value(&c, sizeof(c));
}

std::string Args::Set(const ClApi& cl, cl_kernel kernel) const {
  std::vector<std::pair<size_t, const void*>> raw;
  raw.reserve(args_.size());
  for (const auto& bytes : args_) raw.emplace_back(bytes.size(), bytes.data());
  return SetArgs(cl, kernel, raw);
}

size_t EnvBytes(const char* name, size_t fallback, std::string* error) {
  const char* env = std::getenv(name);
  if (env == nullptr || *env == '\0') return fallback;
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(env, &end, 10);
  if (end == env || *end != '\0' || v <= 0 || errno == ERANGE) {
    *error = std::string(name) + "=" + env + ": expected a positive integer";
    return 0;
  }
  return static_cast<size_t>(v);
}

std::string GetKernel(GpuContext& ctx, const char* program, const char* name,
                      const std::string& options, cl_kernel* out) {
  std::string e;
  *out = ctx.Kernel(program, name, options, &e);
  if (*out == nullptr) {
    return e.empty() ? std::string("cannot build kernel ") + program + ":" + name : e;
  }
  return "";
}

size_t Local1D(GpuContext& ctx, cl_kernel kernel, size_t preferred) {
  size_t wg = ctx.KernelWorkGroupSize(kernel);
  wg = std::min(wg, ctx.device().max_work_item_sizes[0] > 0
                        ? ctx.device().max_work_item_sizes[0]
                        : wg);
  size_t local = std::min(preferred, std::max<size_t>(wg, 1));
  // a power of two keeps the rounding waste small
  size_t p = 1;
  while (p * 2 <= local) p *= 2;
  return p;
}

std::string Launch1D(GpuContext& ctx, cl_kernel kernel, size_t n, size_t local,
                     const char* label) {
  if (n == 0) return "";
  const size_t global = RoundUp(n, local);
  return ctx.Enqueue(kernel, 1, &global, &local, label);
}

std::string LaunchGroups(GpuContext& ctx, cl_kernel kernel, size_t groups, size_t group,
                         const char* label) {
  const size_t global = groups * group;
  return ctx.Enqueue(kernel, 1, &global, &group, label);
}

const char* CopyType(DType storage) {
  return DTypeSize(storage) == 2 ? "ushort" : "uint";
}

namespace {

// How many elements a work-item of copy_nd moves as one vector (up to 16
// bytes): the innermost dim must be contiguous on both sides, and its extent,
// every other stride and both offsets multiples of it, so that each vector is
// aligned. One 2- or 4-byte access an item left copies such as the UNet's
// channel CONCATENATIONs issue-bound.
int CopyWidth(const std::vector<int>& dims, const std::vector<int>& src_str,
              const std::vector<int>& dst_str, int src_off, int dst_off, size_t elem_bytes) {
  if (src_str.back() != 1 || dst_str.back() != 1) return 1;
  for (int w = static_cast<int>(16 / elem_bytes); w > 1; w /= 2) {
    bool ok = dims.back() % w == 0 && src_off % w == 0 && dst_off % w == 0;
    for (size_t k = 0; ok && k + 1 < dims.size(); ++k) {
      ok = src_str[k] % w == 0 && dst_str[k] % w == 0;
    }
    if (ok) return w;
  }
  return 1;
}

}  // namespace

std::string StridedCopy::Init(GpuContext& ctx, DType storage, IndexSpace space,
                              int src_off, int dst_off) {
  space.Collapse();
  if (space.rank() > kMaxRank) {
    return "index space of rank " + std::to_string(space.rank()) + " after collapsing (max " +
           std::to_string(kMaxRank) + ")";
  }
  int64_t count = 1;
  for (int d : space.dims) count *= d;
  count_ = static_cast<int>(count);
  src_off_ = src_off;
  dst_off_ = dst_off;
  dims_ = space.dims;
  src_str_ = space.strides[0];
  dst_str_ = space.strides[1];
  elem_bytes_ = DTypeSize(storage);
  plain_ = space.rank() == 1 && src_str_[0] == 1 && dst_str_[0] == 1;
  if (plain_) return "";
  rows_ = ctx.PreferFlatKernels() && src_str_.back() == 1 && dst_str_.back() == 1 &&
          dims_.back() >= 16;
  const int width =
      rows_ ? 1 : CopyWidth(dims_, src_str_, dst_str_, src_off, dst_off, elem_bytes_);
  std::string copy_t = CopyType(storage);
  if (width > 1) {  // copy_nd over vectors of `width` elements
    dims_.back() /= width;
    for (size_t k = 0; k + 1 < dims_.size(); ++k) {
      src_str_[k] /= width;
      dst_str_[k] /= width;
    }
    src_off_ /= width;
    dst_off_ /= width;
    count_ /= width;
    copy_t += std::to_string(width) + " -DCOPY_VECTOR=1";
  }
  std::string e = GetKernel(ctx, "copy_nd", rows_ ? "copy_rows" : "copy_nd",
                            "-DCOPY_T=" + copy_t, &kernel_);
  if (!e.empty()) return e;
  local_ = Local1D(ctx, kernel_, rows_ ? 16 : 64);
  return "";
}

std::string StridedCopy::Run(GpuContext& ctx, cl_mem src, cl_mem dst, const char* label) const {
  if (count_ == 0) return "";
  if (plain_) {
    const cl_int err = ctx.cl().EnqueueCopyBuffer(
        ctx.queue(), src, dst, static_cast<size_t>(src_off_) * elem_bytes_,
        static_cast<size_t>(dst_off_) * elem_bytes_, static_cast<size_t>(count_) * elem_bytes_,
        0, nullptr, nullptr);
    if (err != CL_SUCCESS) {
      return std::string("clEnqueueCopyBuffer(") + label + "): error " + std::to_string(err);
    }
    return "";
  }
  if (rows_) {
    const int inner = dims_.back();
    const int chunks = (inner + 15) / 16;
    const int items = count_ / inner * chunks;
    std::string e = Args()
                        .Mem(src)
                        .Int(src_off_)
                        .Mem(dst)
                        .Int(dst_off_)
                        .Int(inner)
                        .Int(chunks)
                        .Int(items)
                        .Int(static_cast<int>(dims_.size()) - 1)
                        .Int8(std::vector<int>(dims_.begin(), dims_.end() - 1), 1)
                        .Int8(std::vector<int>(src_str_.begin(), src_str_.end() - 1))
                        .Int8(std::vector<int>(dst_str_.begin(), dst_str_.end() - 1))
                        .Set(ctx.cl(), kernel_);
    if (!e.empty()) return e;
    return Launch1D(ctx, kernel_, static_cast<size_t>(items), local_, label);
  }
  std::string e = Args()
                      .Mem(src)
                      .Int(src_off_)
                      .Mem(dst)
                      .Int(dst_off_)
                      .Int(count_)
                      .Int(static_cast<int>(dims_.size()))
                      .Int8(dims_, 1)
                      .Int8(src_str_)
                      .Int8(dst_str_)
                      .Set(ctx.cl(), kernel_);
  if (!e.empty()) return e;
  return Launch1D(ctx, kernel_, static_cast<size_t>(count_), local_, label);
}

OwnedBuffer& OwnedBuffer::operator=(OwnedBuffer&& o) noexcept {
  if (this != &o) {
    if (mem_ != nullptr) cl_->ReleaseMemObject(mem_);
    cl_ = o.cl_;
    mem_ = o.mem_;
    bytes_ = o.bytes_;
    o.mem_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

OwnedBuffer::~OwnedBuffer() {
  if (mem_ != nullptr) cl_->ReleaseMemObject(mem_);
}

std::string OwnedBuffer::Allocate(GpuContext& ctx, size_t bytes) {
  if (mem_ != nullptr) cl_->ReleaseMemObject(mem_);
  cl_ = &ctx.cl();
  mem_ = nullptr;
  bytes_ = 0;
  if (bytes == 0) return "empty buffer";
  cl_int err = CL_SUCCESS;
  cl_mem m = ctx.cl().CreateBuffer(ctx.context(), CL_MEM_READ_WRITE, bytes, nullptr, &err);
  if (m == nullptr || err != CL_SUCCESS) {
    return "cannot allocate a " + std::to_string(bytes) + "-byte buffer: " + ClErrorName(err);
  }
  mem_ = m;
  bytes_ = bytes;
  return "";
}

std::string FillValue(GpuContext& ctx, cl_mem mem, DType storage, float value,
                      size_t offset_elems, size_t count) {
  if (count == 0) return "";
  const size_t es = DTypeSize(storage);
  cl_int err;
  if (es == 2) {
    const uint16_t h = FloatToHalf(value);
    err = ctx.cl().EnqueueFillBuffer(ctx.queue(), mem, &h, 2, offset_elems * 2, count * 2, 0,
                                     nullptr, nullptr);
  } else if (storage == DType::kInt32) {
    const cl_int v = static_cast<cl_int>(value);
    err = ctx.cl().EnqueueFillBuffer(ctx.queue(), mem, &v, 4, offset_elems * 4, count * 4, 0,
                                     nullptr, nullptr);
  } else {
    err = ctx.cl().EnqueueFillBuffer(ctx.queue(), mem, &value, 4, offset_elems * 4, count * 4,
                                     0, nullptr, nullptr);
  }
  if (err != CL_SUCCESS) return "clEnqueueFillBuffer: error " + std::to_string(err);
  return "";
}

std::string ExpectFloatTensor(const TensorInfo& t, const char* what) {
  if (t.dtype == DType::kFloat32 || t.dtype == DType::kFloat16) return "";
  return std::string(what) + " must be float32 or float16, got " + DTypeName(t.dtype);
}

std::string InferAsFloat(const OpInstance& op, const std::vector<TensorInfo>& inputs,
                         std::vector<TensorInfo>* outputs) {
  std::vector<TensorInfo> as_float = inputs;
  for (size_t i = 0; i < as_float.size(); ++i) {
    std::string e = ExpectFloatTensor(as_float[i], ("input " + std::to_string(i)).c_str());
    if (!e.empty()) return e;
    as_float[i].dtype = DType::kFloat32;
  }
  return op.Infer(as_float, outputs);
}

std::string CheckRunTensors(const GpuContext& ctx, const std::vector<GpuTensor>& inputs,
                            const std::vector<GpuTensor>& outputs, size_t n_in, size_t n_out,
                            int quantized) {
  if (inputs.size() != n_in || outputs.size() != n_out) {
    return "expects " + std::to_string(n_in) + " inputs and " + std::to_string(n_out) +
           " outputs, got " + std::to_string(inputs.size()) + " and " +
           std::to_string(outputs.size());
  }
  const DType storage = ctx.storage();
  for (size_t i = 0; i < inputs.size() + outputs.size(); ++i) {
    const bool is_in = i < inputs.size();
    const GpuTensor& t = is_in ? inputs[i] : outputs[i - inputs.size()];
    const std::string what =
        (is_in ? "input " : "output ") + std::to_string(is_in ? i : i - inputs.size());
    if (t.mem == nullptr) return what + " has no device buffer";
    if (static_cast<int>(i) == quantized && (t.dtype == DType::kInt8 || t.dtype == DType::kInt4)) {
      if (t.scales == nullptr) return what + " is quantized without scales";
      continue;
    }
    if (t.dtype != storage) {
      return what + " is stored as " + DTypeName(t.dtype) + " but the kernels were built for " +
             DTypeName(storage);
    }
  }
  return "";
}

}  // namespace difflite::gpu::builtin
