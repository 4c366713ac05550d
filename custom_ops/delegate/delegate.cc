// The TFLite external delegate of the op library: plugin entry points, options, and the
// choice of backend. backend=cpu is delegate/cpu/ (backend.h), backend=opencl
// delegate/opencl/ (executor.h); Delegate::Prepare goes to the one the options chose.
// Also the run-time LoRA entry points (difflite_lora_set, difflite_lora_error): the factors of
// a delegate's difflite.LoRA slots, kept in its LoraSlots (lora_slots.h) for either backend.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <mutex>
#include <new>
#include <set>
#include <string>
#include <vector>

#include "cpu/backend.h"
#include "cpu/quantized_claim.h"
#include "delegate_util.h"
#include "difflite/lora_slots.h"
#include "difflite/tflite_abi.h"
#include "opencl/executor.h"

#if defined(_WIN32)
#define DIFFLITE_EXPORT __declspec(dllexport)
#else
#define DIFFLITE_EXPORT __attribute__((visibility("default")))
#endif

namespace difflite {

DelegateState::DelegateState() = default;
DelegateState::~DelegateState() = default;

namespace {

using tfl::Context;
using tfl::Delegate;

// The delegates this library made and has not destroyed: a pointer handed to difflite_lora_set is
// looked up here before anything reads through it.
std::mutex& LiveMutex() {
  static auto* m = new std::mutex();
  return *m;
}
std::set<const Delegate*>& Live() {
  static auto* s = new std::set<const Delegate*>();
  return *s;
}

// difflite_lora_error's text: the last failure of difflite_lora_set on this thread.
thread_local std::string lora_error;

tfl::Status DelegatePrepare(Context* ctx, Delegate* delegate) {
  return NoThrow(ctx, "delegate prepare", tfl::kDelegateError, [&] {
    DelegateState* st = StateOf(delegate);
    if (st->opencl != nullptr) return st->opencl->PrepareDelegate(ctx, delegate);
    return cpu::PrepareDelegate(ctx, delegate);
  });
}

// ---------------------------------------------------------------------------
// Plugin entry points.

void Report(void (*report_error)(const char*), const std::string& msg) {
  const std::string line = "difflite: " + Printable(msg);
  if (report_error != nullptr) {
    report_error(line.c_str());
  } else {
    std::fprintf(stderr, "%s\n", line.c_str());
  }
}

bool ParseInt(const std::string& val, long lo, long hi, long* out) {
  char* end = nullptr;
  const long v = std::strtol(val.c_str(), &end, 10);
  if (val.empty() || end == nullptr || *end != '\0' || v < lo || v > hi) {
    return false;
  }
  *out = v;
  return true;
}

// `val` if it is one of `choices`, else false and "KEY must be A, B or C, got 'VAL'".
bool ParseChoice(const std::string& key, const std::string& val,
                 const std::vector<std::string>& choices, std::string* out,
                 std::string* error) {
  if (std::find(choices.begin(), choices.end(), val) != choices.end()) {
    *out = val;
    return true;
  }
  std::string listed;
  for (size_t i = 0; i < choices.size(); ++i) {
    listed += (i == 0 ? "" : i + 1 == choices.size() ? " or " : ", ") + choices[i];
  }
  *error = key + " must be " + listed + ", got '" + val + "'";
  return false;
}

bool ParseOptions(char** keys, char** values, size_t n, Options* o,
                  std::string* error) {
  for (size_t i = 0; i < n; ++i) {
    const std::string key = keys && keys[i] ? keys[i] : "";
    const std::string val = values && values[i] ? values[i] : "";
    long v = 0;
    if (key == "backend") {
      if (!ParseChoice(key, val, {"cpu", "opencl"}, &o->backend, error)) return false;
    } else if (key == "precision") {
      if (!ParseChoice(key, val, {"fp32", "fp16"}, &o->precision, error)) return false;
    } else if (key == "verbose") {
      if (val != "0" && val != "1") {
        *error = "verbose must be 0 or 1, got '" + val + "'";
        return false;
      }
      o->verbose = val == "1";
    } else if (key == "num_threads") {
      if (!ParseInt(val, 0, 256, &v)) {
        *error = "num_threads must be an integer in [0, 256], got '" + val +
                 "'";
        return false;
      }
      o->num_threads = static_cast<int>(v);
    } else if (key == "device") {
      if (!ParseInt(val, -1, 1023, &v)) {
        *error = "device must be an integer >= 0 (an index into the OpenCL "
                 "devices; -1: first GPU), got '" + val + "'";
        return false;
      }
      o->device = static_cast<int>(v);
    } else if (key == "profile") {
      if (val != "0" && val != "1" && val != "2") {
        *error = "profile must be 0, 1 (per op type) or 2 (per node and kernel), got '" +
                 val + "'";
        return false;
      }
      o->profile = val[0] - '0';
    } else if (key == "kernels") {
      if (!ParseChoice(key, val, {"auto", "tiled", "flat"}, &o->kernels, error)) return false;
    } else if (key == "math") {
      if (!ParseChoice(key, val, {"auto", "fp32"}, &o->math, error)) return false;
    } else if (key == "stats_path") {
      if (val.empty()) {
        *error = "stats_path must name a file";
        return false;
      }
      o->stats_path = val;
    } else if (key == "cache_dir") {
      if (val.empty()) {
        *error = "cache_dir must name a folder, or be off";
        return false;
      }
      o->cache_dir = val;
    } else if (key == "zero_copy") {
      if (!ParseChoice(key, val, {"auto", "off"}, &o->zero_copy, error)) return false;
    } else if (key == "tensor_cores") {
      if (!ParseChoice(key, val, {"auto", "off"}, &o->tensor_cores, error)) return false;
    } else if (key == "weight_slabs") {
      if (!ParseChoice(key, val, {"auto", "off"}, &o->weight_slabs, error)) return false;
    } else if (key == "lend_scratch") {
      if (!ParseChoice(key, val, {"auto", "off"}, &o->lend_scratch, error)) return false;
    } else {
      *error = "unknown option '" + key +
               "' (known: backend, precision, verbose, num_threads, device, "
               "profile, stats_path, kernels, math, cache_dir, zero_copy, tensor_cores, "
               "weight_slabs, lend_scratch)";
      return false;
    }
  }
  // Environment variables that set an OpenCL option left at auto, without code:
  // - DIFFLITE_KERNELS: a phone-like (tiled) kernel style on a CPU OpenCL device, whose memory then
  //   stands in for a phone's (PoCL's buffers are host memory);
  // - DIFFLITE_TENSOR_CORES: off (benchmarks timing the phone profile's own kernels on an NVIDIA
  //   GPU), on without asking the device (PoCL's CUDA driver targeting sm_80, which answers no
  //   cl_nv_device_attribute_query), or emulated (tests of the tiles' indexing on any device);
  // - DIFFLITE_WEIGHT_SLABS, DIFFLITE_LEND_SCRATCH: off, for benchmarks measuring what they save
  //   side by side.
  const struct {
    const char* name;
    std::vector<std::string> choices;
    std::string* field;
  } env_options[] = {
      {"DIFFLITE_KERNELS", {"auto", "tiled", "flat"}, &o->kernels},
      {"DIFFLITE_TENSOR_CORES", {"auto", "off", "on", "emulate"}, &o->tensor_cores},
      {"DIFFLITE_WEIGHT_SLABS", {"auto", "off"}, &o->weight_slabs},
      {"DIFFLITE_LEND_SCRATCH", {"auto", "off"}, &o->lend_scratch},
  };
  for (const auto& env : env_options) {
    const char* value = std::getenv(env.name);
    if (o->backend == "opencl" && *env.field == "auto" && value != nullptr &&
        !ParseChoice(env.name, value, env.choices, env.field, error)) {
      return false;
    }
  }
  // DIFFLITE_PROGRAM_CACHE: a folder, or off, for the processes whose commands pass no cache_dir
  // (`generate`, `verify`, `bench` on the host); empty counts as unset.
  const char* cache = std::getenv("DIFFLITE_PROGRAM_CACHE");
  if (o->backend == "opencl" && o->cache_dir.empty() && cache != nullptr && cache[0] != '\0') {
    o->cache_dir = cache;
  }
  if (o->backend == "cpu" && (o->device != -1 || o->profile || !o->stats_path.empty() ||
                              o->kernels != "auto" || o->math != "auto" ||
                              !o->cache_dir.empty() || o->zero_copy != "auto" ||
                              o->tensor_cores != "auto" || o->weight_slabs != "auto" ||
                              o->lend_scratch != "auto")) {
    *error = "device, profile, stats_path, kernels, math, cache_dir, zero_copy, tensor_cores, "
             "weight_slabs and lend_scratch apply to backend=opencl only";
    return false;
  }
  return true;
}

}  // namespace
}  // namespace difflite

extern "C" {

DIFFLITE_EXPORT difflite::tfl::Delegate* tflite_plugin_create_delegate(
    char** options_keys, char** options_values, size_t num_options,
    void (*report_error)(const char*)) {
  using namespace difflite;
  Options options;
  std::string error;
  if (!ParseOptions(options_keys, options_values, num_options, &options,
                    &error)) {
    Report(report_error, error);
    return nullptr;
  }
  auto* st = new (std::nothrow) DelegateState();
  if (st == nullptr) {
    Report(report_error, "out of memory");
    return nullptr;
  }
  std::memset(&st->delegate, 0, sizeof(st->delegate));
  st->options = options;
  try {
    st->lora = std::make_shared<LoraSlots>();
  } catch (...) {
    delete st;
    Report(report_error, "out of memory");
    return nullptr;
  }
  if (options.backend == "opencl") {
    try {
      st->opencl = gpu::Backend::Create(options, st->lora, &error);
    } catch (...) {
      error = "OpenCL backend failed: " + ExceptionText();
    }
    if (st->opencl == nullptr) {
      delete st;
      Report(report_error, "backend=opencl unavailable: " + error);
      return nullptr;
    }
  }
  st->delegate.data_ = st;
  st->delegate.Prepare = &DelegatePrepare;
  st->delegate.flags = tfl::kDelegateFlagsAllowDynamicTensors;
  try {
    std::lock_guard<std::mutex> lock(LiveMutex());
    Live().insert(&st->delegate);
  } catch (...) {
    delete st;
    Report(report_error, "out of memory");
    return nullptr;
  }
  if (options.verbose) {
    if (st->opencl != nullptr) {
      Log("delegate created: backend=opencl " + st->opencl->Describe());
    } else {
      Log("delegate created: backend=" + options.backend +
          " precision=" + options.precision +
          " num_threads=" + std::to_string(options.num_threads) +
          (options.precision == "fp16"
               ? " (the CPU backend computes in float32 regardless)"
               : ""));
    }
  }
  return &st->delegate;
}

DIFFLITE_EXPORT void tflite_plugin_destroy_delegate(
    difflite::tfl::Delegate* delegate) {
  using namespace difflite;
  if (delegate == nullptr) return;
  {
    std::lock_guard<std::mutex> lock(LiveMutex());
    Live().erase(delegate);
  }
  auto* st = static_cast<DelegateState*>(delegate->data_);
  // The factors go now, while the backend (and its device) is still there; ops that outlive the
  // delegate keep the emptied table.
  if (st->lora != nullptr) st->lora->Clear();
  delete st;
}

// Sets the factors of slot `slot` of `delegate`'s difflite.LoRA ops (see lora_slots.h and
// DESIGN.md §5): down = D [rank][in_features], up = U [out_features][rank], row-major float32,
// copied; rank 0 clears the slot (the other arguments are not read). 0, or nonzero with a line
// for difflite_lora_error; a failed call leaves the slot's factors in place. Call it between
// Invokes, after the interpreter allocated its tensors.
DIFFLITE_EXPORT int difflite_lora_set(difflite::tfl::Delegate* delegate, int32_t slot, int32_t rank,
                                      int32_t in_features, int32_t out_features, const float* down,
                                      const float* up) {
  using namespace difflite;
  std::string error;
  try {
    std::shared_ptr<LoraSlots> lora;
    bool verbose = false;
    {
      std::lock_guard<std::mutex> lock(LiveMutex());
      if (delegate != nullptr && Live().count(delegate) != 0) {
        lora = StateOf(delegate)->lora;
        verbose = StateOf(delegate)->options.verbose;
      }
    }
    if (lora == nullptr) {
      error = "not a difflite delegate";
    } else {
      error = lora->Set(slot, rank, in_features, out_features, down, up);
      if (verbose) {
        Log("lora: " +
            (!error.empty() ? "refused: " + error
             : rank == 0    ? "slot " + std::to_string(slot) + " cleared"
                            : "slot " + std::to_string(slot) + " set to rank " + std::to_string(rank)) +
            " (" + std::to_string(lora->FactorBytes()) + " bytes of factors held)");
      }
    }
  } catch (...) {
    error = "setting LoRA factors failed: " + ExceptionText();
  }
  try {
    lora_error = Printable(error);
  } catch (...) {
    lora_error.clear();
    return 1;
  }
  return error.empty() ? 0 : 1;
}

// The bytes `delegate` holds for run-time LoRA factors, all slots together, as its backend keeps
// them (OpenCL: device buffers in the storage type; CPU: float32 on the host); -1 where `delegate`
// is not a live difflite delegate.
DIFFLITE_EXPORT int64_t difflite_lora_bytes(difflite::tfl::Delegate* delegate) {
  using namespace difflite;
  std::shared_ptr<LoraSlots> lora;
  {
    std::lock_guard<std::mutex> lock(LiveMutex());
    if (delegate == nullptr || Live().count(delegate) == 0) return -1;
    lora = StateOf(delegate)->lora;
  }
  return lora == nullptr ? 0 : static_cast<int64_t>(lora->FactorBytes());
}

// The last error of difflite_lora_set on this thread ("" after a success), one line; valid until
// this thread's next call.
DIFFLITE_EXPORT const char* difflite_lora_error(void) {
  return difflite::lora_error.c_str();
}

}  // extern "C"

