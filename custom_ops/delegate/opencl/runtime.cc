#include "runtime.h"

#include <chrono>
#include <cstring>
#include <set>
#include <sstream>
#include <utility>

#include "cl_loader.h"
#include "delegate_util.h"
#include "kernel_source.h"

namespace difflite::gpu {
namespace {

std::string PlatformString(const ClApi& cl, cl_platform_id p,
                           cl_platform_info what) {
  size_t n = 0;
  if (cl.GetPlatformInfo(p, what, 0, nullptr, &n) != CL_SUCCESS || n == 0) {
    return "";
  }
  std::string s(n, '\0');
  if (cl.GetPlatformInfo(p, what, n, &s[0], nullptr) != CL_SUCCESS) return "";
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

std::string DeviceString(const ClApi& cl, cl_device_id d, cl_device_info what) {
  size_t n = 0;
  if (cl.GetDeviceInfo(d, what, 0, nullptr, &n) != CL_SUCCESS || n == 0) {
    return "";
  }
  std::string s(n, '\0');
  if (cl.GetDeviceInfo(d, what, n, &s[0], nullptr) != CL_SUCCESS) return "";
  while (!s.empty() && s.back() == '\0') s.pop_back();
  return s;
}

template <typename T>
T DeviceValue(const ClApi& cl, cl_device_id d, cl_device_info what) {
  T v{};
  if (cl.GetDeviceInfo(d, what, sizeof(T), &v, nullptr) != CL_SUCCESS) {
    return T{};
  }
  return v;
}

// One line: newlines of a build log become " | ", long logs are cut.
std::string OneLine(const std::string& s, size_t max_len) {
  std::string out;
  for (char c : s) {
    if (c == '\n') {
      if (!out.empty() && out.compare(out.size() - std::min<size_t>(3, out.size()), 3, " | ") != 0) {
        out += " | ";
      }
    } else if (c != '\r') {
      out.push_back(c);
    }
    if (out.size() > max_len) {
      out += " ...";
      break;
    }
  }
  return out;
}

// Where the #pragma for half goes: in front of every program.
const char kPrelude[] =
    "#ifdef DL_FP16\n"
    "#pragma OPENCL EXTENSION cl_khr_fp16 : enable\n"
    "#endif\n"
    "#line 1\n";

// `#include "NAME.cl"` (alone on its line) names the embedded program NAME.
bool IncludedName(const std::string& line, std::string* name) {
  const size_t start = line.find_first_not_of(" \t");
  const std::string prefix = "#include \"";
  const std::string suffix = ".cl\"";
  if (start == std::string::npos || line.compare(start, prefix.size(), prefix) != 0) return false;
  const size_t end = line.find_last_not_of(" \t\r");
  const size_t first = start + prefix.size();
  if (end + 1 < first + suffix.size() ||
      line.compare(end + 1 - suffix.size(), suffix.size(), suffix) != 0) {
    return false;
  }
  *name = line.substr(first, end + 1 - suffix.size() - first);
  return !name->empty();
}

// The source with every `#include "NAME.cl"` replaced by the embedded program NAME (each once,
// like an include guard): kernels share OpenCL code without a file system on the device.
bool ExpandIncludes(const char* text, size_t size, std::set<std::string>* seen,
                    std::string* out, std::string* error) {
  std::istringstream in(std::string(text, size));
  std::string line, name;
  for (int number = 1; std::getline(in, line); ++number) {
    if (!IncludedName(line, &name)) {
      *out += line + "\n";
      continue;
    }
    if (!seen->insert(name).second) continue;  // each file once, like an include guard
    const EmbeddedProgram* inc = FindEmbeddedProgram(name);
    if (inc == nullptr) {
      *error = "#include \"" + name + ".cl\": no embedded OpenCL source of that name";
      return false;
    }
    *out += "#line 1\n";
    if (!ExpandIncludes(inc->source, inc->size, seen, out, error)) return false;
    *out += "#line " + std::to_string(number + 1) + "\n";
  }
  return true;
}

}  // namespace

const EmbeddedProgram* FindEmbeddedProgram(const std::string& name) {
  for (size_t i = 0; i < kEmbeddedProgramCount; ++i) {
    if (name == kEmbeddedPrograms[i].name) return &kEmbeddedPrograms[i];
  }
  return nullptr;
}

std::string EnumerateDevices(const ClApi& cl, std::vector<DeviceEntry>* out) {
  out->clear();
  cl_uint np = 0;
  cl_int err = cl.GetPlatformIDs(0, nullptr, &np);
  if (err != CL_SUCCESS || np == 0) {
    return "no OpenCL platform found (clGetPlatformIDs: " +
           (err != CL_SUCCESS ? ClErrorName(err) : std::string("0 platforms")) +
           "); is an ICD (e.g. pocl-opencl-icd or the GPU driver's) installed "
           "under /etc/OpenCL/vendors?";
  }
  std::vector<cl_platform_id> platforms(np);
  err = cl.GetPlatformIDs(np, platforms.data(), nullptr);
  if (err != CL_SUCCESS) return "clGetPlatformIDs: " + ClErrorName(err);
  for (cl_platform_id p : platforms) {
    cl_uint nd = 0;
    if (cl.GetDeviceIDs(p, CL_DEVICE_TYPE_ALL, 0, nullptr, &nd) != CL_SUCCESS ||
        nd == 0) {
      continue;
    }
    std::vector<cl_device_id> devices(nd);
    if (cl.GetDeviceIDs(p, CL_DEVICE_TYPE_ALL, nd, devices.data(), nullptr) !=
        CL_SUCCESS) {
      continue;
    }
    const std::string pname = PlatformString(cl, p, CL_PLATFORM_NAME);
    for (cl_device_id d : devices) {
      DeviceEntry e;
      e.platform = p;
      e.device = d;
      e.is_gpu = (DeviceValue<cl_device_type>(cl, d, CL_DEVICE_TYPE) &
                  CL_DEVICE_TYPE_GPU) != 0;
      e.name = DeviceString(cl, d, CL_DEVICE_NAME);
      e.platform_name = pname;
      out->push_back(e);
    }
  }
  if (out->empty()) return "no OpenCL device found on any platform";
  return "";
}

std::shared_ptr<Runtime> Runtime::Get(int device_index, bool profile,
                                      std::string* error) {
  static std::mutex mutex;
  static auto* runtimes = new std::map<std::pair<int, bool>, std::shared_ptr<Runtime>>();
  std::lock_guard<std::mutex> lock(mutex);
  const ClApi* cl = LoadOpenCl(error);
  if (cl == nullptr) return nullptr;
  std::vector<DeviceEntry> devices;
  std::string e = EnumerateDevices(*cl, &devices);
  if (!e.empty()) {
    *error = e;
    return nullptr;
  }
  int index = device_index;
  if (index < 0) {
    index = 0;
    for (size_t i = 0; i < devices.size(); ++i) {
      if (devices[i].is_gpu) {
        index = static_cast<int>(i);
        break;
      }
    }
  }
  if (index >= static_cast<int>(devices.size())) {
    std::string list;
    for (size_t i = 0; i < devices.size(); ++i) {
      list += (i ? ", " : "") + std::to_string(i) + ": " + devices[i].name +
              " (" + devices[i].platform_name + ")";
    }
    *error = "device=" + std::to_string(device_index) + " is out of range (" +
             std::to_string(devices.size()) + " OpenCL devices: " + list + ")";
    return nullptr;
  }
  auto key = std::make_pair(index, profile);
  auto it = runtimes->find(key);
  if (it != runtimes->end()) return it->second;
  std::shared_ptr<Runtime> rt(new Runtime());
  e = rt->Init(cl, devices[index], profile);
  if (!e.empty()) {
    *error = e;
    return nullptr;
  }
  rt->device_index_ = index;
  (*runtimes)[key] = rt;
  return rt;
}

std::string Runtime::Init(const ClApi* cl, const DeviceEntry& entry,
                          bool profile) {
  cl_ = cl;
  device_ = entry.device;
  profile_ = profile;
  DeviceInfo& d = info_;
  d.name = entry.name;
  d.platform = entry.platform_name;
  d.vendor = DeviceString(*cl, device_, CL_DEVICE_VENDOR);
  d.version = DeviceString(*cl, device_, CL_DEVICE_VERSION);
  d.is_gpu = entry.is_gpu;
  d.local_mem_bytes = static_cast<size_t>(
      DeviceValue<cl_ulong>(*cl, device_, CL_DEVICE_LOCAL_MEM_SIZE));
  d.max_work_group_size =
      DeviceValue<size_t>(*cl, device_, CL_DEVICE_MAX_WORK_GROUP_SIZE);
  d.compute_units = DeviceValue<cl_uint>(*cl, device_, CL_DEVICE_MAX_COMPUTE_UNITS);
  d.global_mem_bytes = DeviceValue<cl_ulong>(*cl, device_, CL_DEVICE_GLOBAL_MEM_SIZE);
  d.max_alloc_bytes = DeviceValue<cl_ulong>(*cl, device_, CL_DEVICE_MAX_MEM_ALLOC_SIZE);
  const cl_uint align_bits =
      DeviceValue<cl_uint>(*cl, device_, CL_DEVICE_MEM_BASE_ADDR_ALIGN);
  d.base_align_bytes = std::max<size_t>(align_bits / 8, 4);
  d.host_unified_memory =
      DeviceValue<cl_bool>(*cl, device_, CL_DEVICE_HOST_UNIFIED_MEMORY) == CL_TRUE;
  d.driver_version = DeviceString(*cl, device_, CL_DRIVER_VERSION);
  size_t items[3] = {1, 1, 1};
  if (cl->GetDeviceInfo(device_, CL_DEVICE_MAX_WORK_ITEM_SIZES, sizeof(items),
                        items, nullptr) == CL_SUCCESS) {
    std::memcpy(d.max_work_item_sizes, items, sizeof(items));
  }
  const std::string ext = DeviceString(*cl, device_, CL_DEVICE_EXTENSIONS);
  d.has_fp16 = (" " + ext + " ").find(" cl_khr_fp16 ") != std::string::npos;
  if ((" " + ext + " ").find(" cl_nv_device_attribute_query ") != std::string::npos) {
    constexpr cl_device_info kComputeCapabilityMajorNv = 0x4000;  // cl_ext.h's names
    constexpr cl_device_info kComputeCapabilityMinorNv = 0x4001;
    const cl_uint major = DeviceValue<cl_uint>(*cl, device_, kComputeCapabilityMajorNv);
    const cl_uint minor = DeviceValue<cl_uint>(*cl, device_, kComputeCapabilityMinorNv);
    d.nv_compute_capability = static_cast<int>(10 * major + minor);
  }
  if (d.max_work_group_size == 0) d.max_work_group_size = 1;

  cl_int err = CL_SUCCESS;
  const cl_context_properties props[] = {
      CL_CONTEXT_PLATFORM,
      reinterpret_cast<cl_context_properties>(entry.platform), 0};
  context_ = cl->CreateContext(props, 1, &device_, nullptr, nullptr, &err);
  if (context_ == nullptr || err != CL_SUCCESS) {
    return "clCreateContext on " + d.name + ": " + ClErrorName(err);
  }
  queue_ = cl->CreateCommandQueue(
      context_, device_, profile ? CL_QUEUE_PROFILING_ENABLE : 0, &err);
  if (queue_ == nullptr || err != CL_SUCCESS) {
    cl->ReleaseContext(context_);
    context_ = nullptr;
    return "clCreateCommandQueue on " + d.name + ": " + ClErrorName(err);
  }
  return "";
}

std::string Runtime::BaseOptions(DType storage, bool half_math) const {
  if (storage == DType::kFloat16) {
    // Without cl_khr_fp16 `half` only names buffers, read and written through
    // core OpenCL 1.2's vload_half / vstore_half (ops/common/dl_storage.cl).
    if (!info_.has_fp16) return "-cl-std=CL1.2 -DDL_T=half -DDL_T4=half4 -DDL_HALF_IO=1";
    return std::string("-cl-std=CL1.2 -DDL_T=half -DDL_T4=half4 -DDL_FP16=1") +
           (half_math ? " -DDL_FP16_MATH=1" : "");
  }
  return "-cl-std=CL1.2 -DDL_T=float -DDL_T4=float4";
}

cl_program Runtime::Program(const std::string& program, const std::string& kernel,
                            const std::string& options, const ProgramCache& disk,
                            std::string* error) {
  const std::string key = program + "\n" + kernel + "\n" + options;
  std::unique_lock<std::mutex> lock(cache_mutex_);
  built_.wait(lock, [&] { return building_.count(key) == 0; });
  auto it = programs_.find(key);
  if (it != programs_.end()) return it->second;
  auto f = failed_.find(key);
  if (f != failed_.end()) {
    *error = f->second;
    return nullptr;
  }
  building_.insert(key);
  lock.unlock();
  const auto t0 = std::chrono::steady_clock::now();
  bool from_disk = false;
  cl_program prog = Build(program, kernel, options, disk, &from_disk, error);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  lock.lock();
  counts_.seconds += seconds;
  if (prog != nullptr) counts_.builds.push_back({program, kernel, options, from_disk, seconds});
  building_.erase(key);
  if (prog != nullptr) {
    programs_[key] = prog;
  } else {
    failed_[key] = *error;
  }
  built_.notify_all();
  return prog;
}

std::string Runtime::CacheKey(const std::string& text, const std::string& options) const {
  return "device=" + info_.name + "\nvendor=" + info_.vendor + "\ndriver=" +
         info_.driver_version + "\nplatform=" + info_.platform + "\nversion=" + info_.version +
         "\noptions=" + options + "\nsource=" + std::to_string(text.size()) + ":" +
         std::to_string(Fnv1a64(text.data(), text.size()));
}

cl_program Runtime::Build(const std::string& program, const std::string& kernel,
                          const std::string& options, const ProgramCache& disk, bool* from_disk,
                          std::string* error) {
  const EmbeddedProgram* src = FindEmbeddedProgram(program);
  if (src == nullptr) {
    *error = "no embedded OpenCL program '" + program + "'";
    return nullptr;
  }
  std::string text = kPrelude;
  std::set<std::string> seen = {program};
  if (!ExpandIncludes(src->source, src->size, &seen, &text, error)) return nullptr;
  text = KeepOneKernel(text, kernel);
  const std::string key = CacheKey(text, options);
  std::vector<unsigned char> binary;
  std::string why;
  if (disk.Load(key, &binary, &why)) {
    cl_program prog = BuildFromBinary(binary, options, kernel, &why);
    if (prog != nullptr) {
      std::lock_guard<std::mutex> lock(cache_mutex_);
      ++counts_.from_disk;
      *from_disk = true;
      return prog;
    }
  }
  if (!why.empty()) {
    const std::string entry = disk.PathOf(key);
    Log("program cache: " + entry + " (" + program + "): " + why + "; rebuilding");
    std::lock_guard<std::mutex> lock(cache_mutex_);
    ++counts_.rejected;
    counts_.rejections.push_back({program, entry, why});
  }
  cl_program prog = BuildFromSource(program, text, options, error);
  if (prog == nullptr) return nullptr;
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    ++counts_.compiled;
  }
  if (disk.enabled()) {
    const std::vector<unsigned char> built = BinaryOf(prog);
    const std::string e = built.empty() ? "the driver gave no binary" : disk.Store(key, built);
    if (!e.empty()) Log("program cache: not storing " + program + ": " + e);
  }
  return prog;
}

cl_program Runtime::BuildFromSource(const std::string& program, const std::string& text,
                                    const std::string& options, std::string* error) {
  const char* strings[1] = {text.c_str()};
  const size_t lengths[1] = {text.size()};
  cl_int err = CL_SUCCESS;
  cl_program prog = cl_->CreateProgramWithSource(context_, 1, strings, lengths, &err);
  if (prog == nullptr || err != CL_SUCCESS) {
    *error = "clCreateProgramWithSource(" + program + "): " + ClErrorName(err);
    return nullptr;
  }
  err = cl_->BuildProgram(prog, 1, &device_, options.c_str(), nullptr, nullptr);
  if (err == CL_SUCCESS) return prog;
  size_t n = 0;
  std::string log;
  if (cl_->GetProgramBuildInfo(prog, device_, CL_PROGRAM_BUILD_LOG, 0, nullptr, &n) ==
          CL_SUCCESS &&
      n > 1) {
    log.resize(n);
    cl_->GetProgramBuildInfo(prog, device_, CL_PROGRAM_BUILD_LOG, n, &log[0], nullptr);
    while (!log.empty() && log.back() == '\0') log.pop_back();
  }
  cl_->ReleaseProgram(prog);
  *error = kBuildFailed + program + "' (" + options + ") failed: " +
           ClErrorName(err) + (log.empty() ? "" : ": " + OneLine(log, 1500));
  return nullptr;
}

cl_program Runtime::BuildFromBinary(const std::vector<unsigned char>& binary,
                                    const std::string& options, const std::string& kernel,
                                    std::string* why) {
  const unsigned char* data = binary.data();
  const size_t size = binary.size();
  cl_int status = CL_SUCCESS, err = CL_SUCCESS;
  cl_program prog =
      cl_->CreateProgramWithBinary(context_, 1, &device_, &size, &data, &status, &err);
  if (prog == nullptr || err != CL_SUCCESS || status != CL_SUCCESS) {
    *why = "the driver refused the stored binary: clCreateProgramWithBinary: " +
           ClErrorName(err != CL_SUCCESS ? err : status);
  } else if ((err = cl_->BuildProgram(prog, 1, &device_, options.c_str(), nullptr, nullptr)) !=
             CL_SUCCESS) {
    *why = "the driver refused the stored binary: clBuildProgram: " + ClErrorName(err);
  } else {
    cl_kernel k = cl_->CreateKernel(prog, kernel.c_str(), &err);
    if (k != nullptr) cl_->ReleaseKernel(k);
    if (k == nullptr || err != CL_SUCCESS) {
      *why = "the stored binary has no kernel " + kernel + ": " + ClErrorName(err);
    }
  }
  if (why->empty()) return prog;
  if (prog != nullptr) cl_->ReleaseProgram(prog);
  return nullptr;
}

std::vector<unsigned char> Runtime::BinaryOf(cl_program prog) const {
  size_t size = 0;
  if (cl_->GetProgramInfo(prog, CL_PROGRAM_BINARY_SIZES, sizeof(size), &size, nullptr) !=
          CL_SUCCESS ||
      size == 0) {
    return {};
  }
  std::vector<unsigned char> binary(size);
  unsigned char* ptr = binary.data();
  if (cl_->GetProgramInfo(prog, CL_PROGRAM_BINARIES, sizeof(ptr), &ptr, nullptr) != CL_SUCCESS) {
    return {};
  }
  return binary;
}

cl_kernel Runtime::Kernel(const std::string& program,
                          const std::string& kernel_name,
                          const std::string& options, DType storage,
                          bool half_math, const ProgramCache& disk, std::string* error) {
  const std::string full =
      BaseOptions(storage, half_math) + (options.empty() ? "" : " " + options);
  const std::string key = program + "\n" + full + "\n" + kernel_name;
  {
    std::lock_guard<std::mutex> lock(cache_mutex_);
    auto it = kernels_.find(key);
    if (it != kernels_.end()) return it->second;
  }
  cl_program prog = Program(program, kernel_name, full, disk, error);
  if (prog == nullptr) return nullptr;
  std::lock_guard<std::mutex> lock(cache_mutex_);
  auto it = kernels_.find(key);
  if (it != kernels_.end()) return it->second;
  cl_int err = CL_SUCCESS;
  cl_kernel k = cl_->CreateKernel(prog, kernel_name.c_str(), &err);
  if (k == nullptr || err != CL_SUCCESS) {
    *error = "clCreateKernel(" + program + ":" + kernel_name +
             "): " + ClErrorName(err);
    return nullptr;
  }
  kernels_[key] = k;
  return k;
}

size_t Runtime::KernelWorkGroupSize(cl_kernel kernel) const {
  size_t wg = 0;
  if (cl_->GetKernelWorkGroupInfo(kernel, device_, CL_KERNEL_WORK_GROUP_SIZE,
                                  sizeof(wg), &wg, nullptr) != CL_SUCCESS ||
      wg == 0) {
    wg = info_.max_work_group_size;
  }
  return std::min(wg, info_.max_work_group_size);
}

Runtime::ProgramCounts Runtime::programs() const {
  std::lock_guard<std::mutex> lock(cache_mutex_);
  ProgramCounts counts = counts_;
  counts.built = programs_.size();
  return counts;
}

}  // namespace difflite::gpu
