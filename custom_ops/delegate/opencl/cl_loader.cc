#include "cl_loader.h"

#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

namespace difflite::gpu {
namespace {

struct Loaded {
  ClApi api;
  void* handle = nullptr;
  std::string error;
  bool ok = false;
};

template <typename F>
bool Bind(void* handle, const char* name, F* slot, std::string* missing) {
  void* sym = dlsym(handle, name);
  if (sym == nullptr) {
    if (!missing->empty()) *missing += ", ";
    *missing += name;
    return false;
  }
  *slot = reinterpret_cast<F>(sym);
  return true;
}

// DIFFLITE_CL_TRACE=1: log every buffer's creation and release and every kernel launch on
// stderr (flushed), to find which object a driver crash in clReleaseMemObject is about, or which
// kernel a driver that aborts on a faulting launch (PoCL's CUDA driver) was running.
ClApi g_real;
using GetMemObjectInfoFn = cl_int (*)(cl_mem, cl_mem_info, size_t, void*, size_t*);
GetMemObjectInfoFn g_mem_info = nullptr;

cl_int TraceEnqueue(cl_command_queue q, cl_kernel k, cl_uint dims, const size_t* offset,
                    const size_t* global, const size_t* local, cl_uint waits, const cl_event* wait,
                    cl_event* event) {
  char name[128] = "?";
  g_real.GetKernelInfo(k, CL_KERNEL_FUNCTION_NAME, sizeof(name) - 1, name, nullptr);
  std::fprintf(stderr, "difflite-cl: launch %s global=%zu,%zu,%zu local=%zu,%zu,%zu\n", name, global[0],
               dims > 1 ? global[1] : 1, dims > 2 ? global[2] : 1, local ? local[0] : 0,
               local && dims > 1 ? local[1] : 0, local && dims > 2 ? local[2] : 0);
  std::fflush(stderr);
  return g_real.EnqueueNDRangeKernel(q, k, dims, offset, global, local, waits, wait, event);
}

cl_mem TraceCreateBuffer(cl_context c, cl_mem_flags f, size_t n, void* host, cl_int* err) {
  cl_mem m = g_real.CreateBuffer(c, f, n, host, err);
  std::fprintf(stderr, "difflite-cl: create %p bytes=%zu\n", static_cast<void*>(m), n);
  return m;
}

cl_mem TraceCreateSubBuffer(cl_mem parent, cl_mem_flags f, cl_buffer_create_type t,
                            const void* info, cl_int* err) {
  cl_mem m = g_real.CreateSubBuffer(parent, f, t, info, err);
  const auto* region = static_cast<const cl_buffer_region*>(info);
  std::fprintf(stderr, "difflite-cl: sub %p of %p origin=%zu bytes=%zu\n", static_cast<void*>(m),
               static_cast<void*>(parent), region->origin, region->size);
  return m;
}

cl_int TraceRelease(cl_mem m) {
  cl_uint refs = 0;
  if (g_mem_info != nullptr) g_mem_info(m, CL_MEM_REFERENCE_COUNT, sizeof(refs), &refs, nullptr);
  std::fprintf(stderr, "difflite-cl: release %p refs=%u\n", static_cast<void*>(m), refs);
  std::fflush(stderr);
  const cl_int err = g_real.ReleaseMemObject(m);
  if (err != CL_SUCCESS) std::fprintf(stderr, "difflite-cl: release %p failed %d\n", static_cast<void*>(m), err);
  return err;
}

void InstallTrace(ClApi* api, void* handle) {
  const char* env = std::getenv("DIFFLITE_CL_TRACE");
  if (env == nullptr || *env == '\0' || *env == '0') return;
  g_real = *api;
  g_mem_info = reinterpret_cast<GetMemObjectInfoFn>(dlsym(handle, "clGetMemObjectInfo"));
  api->EnqueueNDRangeKernel = &TraceEnqueue;
  api->CreateBuffer = &TraceCreateBuffer;
  api->CreateSubBuffer = &TraceCreateSubBuffer;
  api->ReleaseMemObject = &TraceRelease;
}

// DIFFLITE_CL_FAULT=KIND[:N]: from the Nth call of that kind on (default the first), the call
// fails as a failing driver's would: build (clBuildProgram: CL_BUILD_PROGRAM_FAILURE), alloc
// (clCreateBuffer: CL_MEM_OBJECT_ALLOCATION_FAILURE) or enqueue (clEnqueueNDRangeKernel:
// CL_OUT_OF_RESOURCES); enqueue:NAME fails every launch of the kernel function NAME (one that
// only runs at Invoke: a fault mid-run). How the tests and a user check what such a device gives.
ClApi g_next;
std::atomic<long> g_fault_calls{0};
long g_fault_from = 0;
std::string g_fault_kernel;

bool Faulted() { return ++g_fault_calls >= g_fault_from; }

bool KernelFaulted(cl_kernel k) {
  if (g_fault_kernel.empty()) return Faulted();
  char name[256] = {0};
  return g_next.GetKernelInfo(k, CL_KERNEL_FUNCTION_NAME, sizeof(name) - 1, name, nullptr) == CL_SUCCESS &&
         g_fault_kernel == name;
}

cl_int FaultBuild(cl_program p, cl_uint n, const cl_device_id* d, const char* o,
                  void(CL_CALLBACK* notify)(cl_program, void*), void* data) {
  return Faulted() ? CL_BUILD_PROGRAM_FAILURE : g_next.BuildProgram(p, n, d, o, notify, data);
}

cl_mem FaultCreateBuffer(cl_context c, cl_mem_flags f, size_t n, void* host, cl_int* err) {
  if (!Faulted()) return g_next.CreateBuffer(c, f, n, host, err);
  if (err != nullptr) *err = CL_MEM_OBJECT_ALLOCATION_FAILURE;
  return nullptr;
}

cl_int FaultEnqueue(cl_command_queue q, cl_kernel k, cl_uint dims, const size_t* offset,
                    const size_t* global, const size_t* local, cl_uint waits, const cl_event* wait,
                    cl_event* event) {
  return KernelFaulted(k) ? CL_OUT_OF_RESOURCES
                         : g_next.EnqueueNDRangeKernel(q, k, dims, offset, global, local, waits, wait, event);
}

void InstallFault(ClApi* api) {
  const char* env = std::getenv("DIFFLITE_CL_FAULT");
  if (env == nullptr || *env == '\0') return;
  const std::string spec(env);
  const size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  const std::string arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
  const bool numeric = !arg.empty() && arg.find_first_not_of("0123456789") == std::string::npos;
  g_fault_from = numeric ? std::max(1L, std::atol(arg.c_str())) : 1;
  if (!numeric) g_fault_kernel = arg;
  g_next = *api;
  if (kind == "build") {
    api->BuildProgram = &FaultBuild;
  } else if (kind == "alloc") {
    api->CreateBuffer = &FaultCreateBuffer;
  } else if (kind == "enqueue") {
    api->EnqueueNDRangeKernel = &FaultEnqueue;
  } else {
    std::fprintf(stderr, "difflite: DIFFLITE_CL_FAULT=%s: unknown kind (build, alloc, enqueue)\n", env);
  }
}

void LoadOnce(Loaded* out) {
  std::vector<std::string> candidates;
  const char* env = std::getenv("DIFFLITE_OPENCL_LIBRARY");
  if (env != nullptr && *env != '\0') {
    candidates.push_back(env);
  } else {
    candidates = {"libOpenCL.so.1", "libOpenCL.so"};
#if defined(__ANDROID__)
    candidates.push_back("/system/vendor/lib64/libOpenCL.so");
    candidates.push_back("/vendor/lib64/libOpenCL.so");
    candidates.push_back("/system/lib64/libOpenCL.so");
#endif
  }
  std::string tried;
  for (const std::string& path : candidates) {
    dlerror();
    out->handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (out->handle != nullptr) break;
    const char* why = dlerror();
    if (!tried.empty()) tried += "; ";
    tried += path + ": " + (why ? why : "not found");
  }
  if (out->handle == nullptr) {
    out->error =
        "no OpenCL library could be loaded (" + tried +
        "); install an OpenCL ICD loader and a driver (e.g. Debian "
        "ocl-icd-libopencl1 with pocl-opencl-icd or the GPU vendor's ICD)";
    return;
  }
  std::string missing;
  ClApi& a = out->api;
  Bind(out->handle, "clGetPlatformIDs", &a.GetPlatformIDs, &missing);
  Bind(out->handle, "clGetPlatformInfo", &a.GetPlatformInfo, &missing);
  Bind(out->handle, "clGetDeviceIDs", &a.GetDeviceIDs, &missing);
  Bind(out->handle, "clGetDeviceInfo", &a.GetDeviceInfo, &missing);
  Bind(out->handle, "clCreateContext", &a.CreateContext, &missing);
  Bind(out->handle, "clReleaseContext", &a.ReleaseContext, &missing);
  Bind(out->handle, "clCreateCommandQueue", &a.CreateCommandQueue, &missing);
  Bind(out->handle, "clReleaseCommandQueue", &a.ReleaseCommandQueue, &missing);
  Bind(out->handle, "clCreateBuffer", &a.CreateBuffer, &missing);
  Bind(out->handle, "clCreateSubBuffer", &a.CreateSubBuffer, &missing);
  Bind(out->handle, "clRetainMemObject", &a.RetainMemObject, &missing);
  Bind(out->handle, "clReleaseMemObject", &a.ReleaseMemObject, &missing);
  Bind(out->handle, "clEnqueueWriteBuffer", &a.EnqueueWriteBuffer, &missing);
  Bind(out->handle, "clEnqueueReadBuffer", &a.EnqueueReadBuffer, &missing);
  Bind(out->handle, "clEnqueueCopyBuffer", &a.EnqueueCopyBuffer, &missing);
  Bind(out->handle, "clEnqueueFillBuffer", &a.EnqueueFillBuffer, &missing);
  Bind(out->handle, "clCreateProgramWithSource", &a.CreateProgramWithSource,
       &missing);
  Bind(out->handle, "clBuildProgram", &a.BuildProgram, &missing);
  Bind(out->handle, "clGetProgramBuildInfo", &a.GetProgramBuildInfo, &missing);
  Bind(out->handle, "clCreateProgramWithBinary", &a.CreateProgramWithBinary, &missing);
  Bind(out->handle, "clGetProgramInfo", &a.GetProgramInfo, &missing);
  Bind(out->handle, "clReleaseProgram", &a.ReleaseProgram, &missing);
  Bind(out->handle, "clCreateKernel", &a.CreateKernel, &missing);
  Bind(out->handle, "clGetKernelInfo", &a.GetKernelInfo, &missing);
  Bind(out->handle, "clReleaseKernel", &a.ReleaseKernel, &missing);
  Bind(out->handle, "clSetKernelArg", &a.SetKernelArg, &missing);
  Bind(out->handle, "clGetKernelWorkGroupInfo", &a.GetKernelWorkGroupInfo,
       &missing);
  Bind(out->handle, "clEnqueueNDRangeKernel", &a.EnqueueNDRangeKernel,
       &missing);
  Bind(out->handle, "clFinish", &a.Finish, &missing);
  Bind(out->handle, "clFlush", &a.Flush, &missing);
  Bind(out->handle, "clWaitForEvents", &a.WaitForEvents, &missing);
  Bind(out->handle, "clGetEventProfilingInfo", &a.GetEventProfilingInfo,
       &missing);
  Bind(out->handle, "clReleaseEvent", &a.ReleaseEvent, &missing);
  if (!missing.empty()) {
    out->error = "the OpenCL library lacks " + missing +
                 " (OpenCL 1.2 is required)";
    return;
  }
  InstallTrace(&out->api, out->handle);
  InstallFault(&out->api);
  // The handle stays open for the process: kernels and contexts created
  // through it are never unloaded under a running interpreter.
  out->ok = true;
}

}  // namespace

const ClApi* LoadOpenCl(std::string* error) {
  static Loaded* loaded = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    loaded = new Loaded();
    LoadOnce(loaded);
  });
  if (!loaded->ok) {
    if (error != nullptr) *error = loaded->error;
    return nullptr;
  }
  return &loaded->api;
}

std::string ClErrorName(cl_int code) {
  const char* name = nullptr;
  switch (code) {
    case CL_SUCCESS: name = "CL_SUCCESS"; break;
    case CL_DEVICE_NOT_FOUND: name = "CL_DEVICE_NOT_FOUND"; break;
    case CL_DEVICE_NOT_AVAILABLE: name = "CL_DEVICE_NOT_AVAILABLE"; break;
    case CL_COMPILER_NOT_AVAILABLE: name = "CL_COMPILER_NOT_AVAILABLE"; break;
    case CL_MEM_OBJECT_ALLOCATION_FAILURE:
      name = "CL_MEM_OBJECT_ALLOCATION_FAILURE"; break;
    case CL_OUT_OF_RESOURCES: name = "CL_OUT_OF_RESOURCES"; break;
    case CL_OUT_OF_HOST_MEMORY: name = "CL_OUT_OF_HOST_MEMORY"; break;
    case CL_BUILD_PROGRAM_FAILURE: name = "CL_BUILD_PROGRAM_FAILURE"; break;
    case CL_MISALIGNED_SUB_BUFFER_OFFSET:
      name = "CL_MISALIGNED_SUB_BUFFER_OFFSET"; break;
    case CL_INVALID_VALUE: name = "CL_INVALID_VALUE"; break;
    case CL_INVALID_PLATFORM: name = "CL_INVALID_PLATFORM"; break;
    case CL_INVALID_DEVICE: name = "CL_INVALID_DEVICE"; break;
    case CL_INVALID_CONTEXT: name = "CL_INVALID_CONTEXT"; break;
    case CL_INVALID_COMMAND_QUEUE: name = "CL_INVALID_COMMAND_QUEUE"; break;
    case CL_INVALID_MEM_OBJECT: name = "CL_INVALID_MEM_OBJECT"; break;
    case CL_INVALID_BUILD_OPTIONS: name = "CL_INVALID_BUILD_OPTIONS"; break;
    case CL_INVALID_PROGRAM: name = "CL_INVALID_PROGRAM"; break;
    case CL_INVALID_PROGRAM_EXECUTABLE:
      name = "CL_INVALID_PROGRAM_EXECUTABLE"; break;
    case CL_INVALID_KERNEL_NAME: name = "CL_INVALID_KERNEL_NAME"; break;
    case CL_INVALID_KERNEL: name = "CL_INVALID_KERNEL"; break;
    case CL_INVALID_ARG_INDEX: name = "CL_INVALID_ARG_INDEX"; break;
    case CL_INVALID_ARG_VALUE: name = "CL_INVALID_ARG_VALUE"; break;
    case CL_INVALID_ARG_SIZE: name = "CL_INVALID_ARG_SIZE"; break;
    case CL_INVALID_KERNEL_ARGS: name = "CL_INVALID_KERNEL_ARGS"; break;
    case CL_INVALID_WORK_DIMENSION: name = "CL_INVALID_WORK_DIMENSION"; break;
    case CL_INVALID_WORK_GROUP_SIZE: name = "CL_INVALID_WORK_GROUP_SIZE"; break;
    case CL_INVALID_WORK_ITEM_SIZE: name = "CL_INVALID_WORK_ITEM_SIZE"; break;
    case CL_INVALID_GLOBAL_OFFSET: name = "CL_INVALID_GLOBAL_OFFSET"; break;
    case CL_INVALID_EVENT: name = "CL_INVALID_EVENT"; break;
    case CL_INVALID_BUFFER_SIZE: name = "CL_INVALID_BUFFER_SIZE"; break;
    case CL_INVALID_GLOBAL_WORK_SIZE: name = "CL_INVALID_GLOBAL_WORK_SIZE"; break;
    case -1001: name = "CL_PLATFORM_NOT_FOUND_KHR"; break;
    default: break;
  }
  std::string s = name ? name : "OpenCL error";
  return s + " (" + std::to_string(code) + ")";
}

std::string SetArgs(const ClApi& cl, cl_kernel kernel,
                    const std::vector<std::pair<size_t, const void*>>& args) {
  for (size_t i = 0; i < args.size(); ++i) {
    const cl_int err = cl.SetKernelArg(kernel, static_cast<cl_uint>(i), args[i].first,
                                       args[i].second);
    if (err != CL_SUCCESS) {
      return "clSetKernelArg(" + std::to_string(i) + "): " + ClErrorName(err);
    }
  }
  return "";
}

}  // namespace difflite::gpu
