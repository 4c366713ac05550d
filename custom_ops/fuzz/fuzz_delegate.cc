// libFuzzer target over what the op library reads from a model (issue 16): the FlexBuffer
// custom-option parser, every difflite op's attribute parsing and node validation (Infer) and,
// where they accept, their CPU kernels on buffers of exactly the validated sizes; and the
// delegate's model walk (Delegate::Prepare, then the partition kernels' Init, Prepare and Invoke)
// over a graph built from the input, served by a stand-in for the TFLite runtime (FakeRuntime)
// whose every tensor is its own heap block, so AddressSanitizer sees a read or write past any of
// them (TFLite's arena would hide it).
//
// The first byte picks the mode:
//   0  raw custom options (the rest of a length-prefixed blob) for every op, then tensor infos;
//   1  options built as a FlexBuffer map from the input (known keys, values of every type);
//   2+ a graph of 1..8 tensors and 1..6 nodes (difflite ops, an unknown difflite name, a builtin),
//      each node's options raw or built, run through the delegate (backend=cpu); between a
//      partition's two Invokes, LoRA factors set (difflite_lora_set) for its difflite.LoRA nodes.
// (Node kinds 240..247, difflite.LoRA, were ADD before the op existed; no corpus entry used them,
// so the corpus still builds the graphs it was saved for.)
// Built with -fsanitize=fuzzer,address,undefined (CMake: -DDIFFLITE_FUZZ=ON); run on files it
// replays them once each (the regression corpus custom_ops/fuzz/corpus/).
#include <algorithm>
#include <climits>
#include <cstdarg>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "delegate_util.h"
#include "difflite/attrs.h"
#include "difflite/op_api.h"
#include "difflite/tflite_abi.h"
#include "flexbuffers_config.h"

extern "C" difflite::tfl::Delegate* tflite_plugin_create_delegate(char** keys, char** values, size_t n,
                                                                  void (*report)(const char*));
extern "C" void tflite_plugin_destroy_delegate(difflite::tfl::Delegate* delegate);
extern "C" int difflite_lora_set(difflite::tfl::Delegate* delegate, int32_t slot, int32_t rank,
                                 int32_t in_features, int32_t out_features, const float* down,
                                 const float* up);

namespace {

using namespace difflite;

// Tensors the harness backs with memory: larger ones stay unallocated, as a runtime that cannot
// allocate them would leave them (and no op's inferred output can then grow past a few MB).
constexpr int64_t kMaxElements = 4096;

// The fuzz input, read front to back; zeros once it runs out.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint8_t Byte() { return pos_ < size_ ? data_[pos_++] : 0; }
  uint32_t Below(uint32_t n) { return n == 0 ? 0 : Byte() % n; }
  bool Flip() { return Byte() & 1; }
  std::vector<uint8_t> Bytes(size_t n) {
    n = std::min(n, size_ - pos_);
    std::vector<uint8_t> out(data_ + pos_, data_ + pos_ + n);
    pos_ += n;
    return out;
  }
  int64_t Int() {
    static const int64_t kInts[] = {0, 1, 2, 3, 4, 8, 32, 36, -1, -2, 65536, INT32_MAX, INT64_MAX,
                                    INT64_MIN, int64_t{1} << 31, int64_t{1} << 40};
    const uint8_t b = Byte();
    return b < 128 ? kInts[b % 16] : static_cast<int64_t>(b) - 192;
  }
  double Float() {
    static const double kFloats[] = {0.0, 1e-5, 1e-6, 0.5, 1.0, -1.0, 0.125, 1e300, -1e300,
                                     1.0 / 0.0, -1.0 / 0.0, 0.0 / 0.0, 3.5e38, 1e-45};
    return kFloats[Byte() % 14];
  }
  const char* String() {
    static const char* kStrings[] = {"none", "silu", "erf", "tanh", "sigmoid", "auto",
                                     "partial_softmax", "flash", "relu", "", "s\xc3\xadlu", "NONE"};
    return kStrings[Byte() % 12];
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

int Dim(Input& in) {
  static const int kSmall[] = {1, 2, 3, 4, 8, 16, 36, 5, 7};
  const uint8_t b = in.Byte();
  if (b < 224) return kSmall[b % 9];
  static const int kOdd[] = {0, -1, 65536, INT32_MAX};
  return kOdd[b % 4];
}

// A shape of rank 0..5; one whose element count lands between what the harness allocates and
// what the library refuses (more than 2^31 - 1) becomes [2^31 - 1, 2]: no case asks for
// gigabytes (an op's output is no larger than a few of its inputs).
Shape MakeShape(Input& in) {
  Shape s(in.Below(6));
  for (int& d : s) d = Dim(in);
  const int64_t n = NumElements(s);
  if (n > kMaxElements && n <= INT32_MAX) s = {INT32_MAX, 2};
  return s;
}

DType MakeDType(Input& in) {
  const uint8_t b = in.Byte();
  if (b < 192) return DType::kFloat32;
  static const DType kOthers[] = {DType::kFloat16, DType::kInt32, DType::kOther, DType::kInt8};
  return kOthers[b % 4];
}

void BuildValue(Input& in, flexbuffers::Builder& fbb, int depth);

void BuildMap(Input& in, flexbuffers::Builder& fbb, int depth) {
  static const char* kKeys[] = {"groups", "epsilon", "activation", "approximate", "heads",
                                "scale", "causal", "variant", "tile", "x"};
  std::set<int> used;  // a FlexBuffer map has each key once
  const size_t start = fbb.StartMap();
  const int n = static_cast<int>(in.Below(7));
  for (int i = 0; i < n; ++i) {
    const int k = static_cast<int>(in.Below(10));
    if (!used.insert(k).second) continue;
    fbb.Key(kKeys[k]);
    BuildValue(in, fbb, depth + 1);
  }
  fbb.EndMap(start);
}

void BuildValue(Input& in, flexbuffers::Builder& fbb, int depth) {
  switch (in.Below(depth > 3 ? 6 : 8)) {
    case 0: fbb.Int(in.Int()); break;
    case 1: fbb.UInt(static_cast<uint64_t>(in.Int())); break;
    case 2: fbb.Double(in.Float()); break;
    case 3: fbb.Float(static_cast<float>(in.Float())); break;
    case 4: fbb.Bool(in.Flip()); break;
    case 5: fbb.String(in.String()); break;
    case 6: {
      const size_t start = fbb.StartVector();
      const int n = static_cast<int>(in.Below(4));
      for (int i = 0; i < n; ++i) BuildValue(in, fbb, depth + 1);
      fbb.EndVector(start, false, false);
      break;
    }
    default: BuildMap(in, fbb, depth); break;
  }
}

std::vector<uint8_t> Options(Input& in) {
  if (in.Flip()) return in.Bytes(in.Below(64));  // raw bytes
  flexbuffers::Builder fbb;
  BuildMap(in, fbb, 0);
  fbb.Finish();
  return fbb.GetBuffer();
}

// A difflite.LoRA node's options: mostly {slot: 0..3 or any int}, else any options.
std::vector<uint8_t> LoraOptions(Input& in) {
  if (in.Below(4) == 0) return Options(in);
  flexbuffers::Builder fbb;
  const size_t start = fbb.StartMap();
  fbb.Key("slot");
  if (in.Flip()) {
    fbb.Int(in.Int());
  } else {
    fbb.Int(in.Below(4));
  }
  fbb.EndMap(start);
  fbb.Finish();
  return fbb.GetBuffer();
}

// Each op's parser on `options`; each op it accepts validates fuzzed tensors, and runs when it
// accepts them too, on buffers of exactly the sizes it validated.
void FuzzOps(Input& in, const std::vector<uint8_t>& options) {
  AttrMap attrs;
  if (!AttrMap::Parse(options.data(), options.size(), &attrs).empty()) return;
  for (const OpDef* def : OpRegistry<OpDef>::All()) {
    std::string error;
    std::unique_ptr<OpInstance> op = def->create(attrs, &error);
    if (op == nullptr) continue;
    op->Describe();
    std::vector<TensorInfo> ins(in.Below(5));
    for (TensorInfo& t : ins) {
      t.dtype = MakeDType(in);
      t.shape = MakeShape(in);
    }
    std::vector<TensorInfo> outs;
    bool ok = op->Infer(ins, &outs).empty();
    for (size_t i = 0; ok && i < ins.size(); ++i) ok = CheckElementCount(ins[i], "input").empty();
    for (size_t i = 0; ok && i < outs.size(); ++i) ok = CheckElementCount(outs[i], "output").empty();
    for (const TensorInfo& t : ins) ok = ok && NumElements(t.shape) <= kMaxElements;
    if (!ok) continue;
    // Each buffer its own heap block of exactly the validated bytes.
    std::vector<std::unique_ptr<uint8_t[]>> blocks;
    auto block = [&](const TensorInfo& t) {
      const size_t bytes = static_cast<size_t>(NumElements(t.shape)) * DTypeSize(t.dtype);
      blocks.emplace_back(new uint8_t[std::max<size_t>(bytes, 1)]);
      for (size_t i = 0; i < bytes; ++i) blocks.back()[i] = static_cast<uint8_t>(i * 37 + 11) & 0x3f;
      return static_cast<void*>(blocks.back().get());
    };
    std::vector<InTensor> run_in;
    std::vector<OutTensor> run_out;
    for (const TensorInfo& t : ins) run_in.push_back({t.dtype, t.shape, block(t)});
    for (const TensorInfo& t : outs) run_out.push_back({t.dtype, t.shape, block(t)});
    ExecOptions exec;
    exec.num_threads = 1;
    op->Run(run_in, run_out, exec);
  }
}

// ---------------------------------------------------------------------------------------------
// The model walk: a stand-in for the TFLite runtime.

tfl::IntArray* MakeIntArray(const std::vector<int>& v) { return NewIntArray(v); }

struct FakeRuntime {
  tfl::Context ctx;
  std::vector<tfl::Tensor> tensors;
  std::vector<tfl::Node> nodes;
  std::vector<tfl::Registration> regs;
  std::vector<std::string> names;
  std::vector<std::vector<uint8_t>> options;
  std::vector<bool> graph_output;
  tfl::IntArray* plan = nullptr;
  // What ReplaceNodeSubsetsWithDelegateKernels was given.
  bool replaced = false;
  tfl::Registration kernel;
  std::vector<int> delegated;

  ~FakeRuntime() {
    for (tfl::Tensor& t : tensors) {
      std::free(t.dims);
      std::free(t.data.data);
    }
    for (tfl::Node& n : nodes) {
      std::free(n.inputs);
      std::free(n.outputs);
    }
    std::free(plan);
  }

  static FakeRuntime* Of(const tfl::Context* c) { return static_cast<FakeRuntime*>(c->impl_); }

  // data sized exactly for `t`'s dims and type (none when too big or invalid).
  static void Allocate(tfl::Tensor* t) {
    std::free(t->data.data);
    t->data.data = nullptr;
    t->bytes = 0;
    const int64_t n = NumElements(ToVector(t->dims));
    const size_t size = DTypeSize(ToDType(t->type));
    if (n < 0 || n > kMaxElements || size == 0 || n == 0) return;
    t->bytes = static_cast<size_t>(n) * size;
    t->data.data = std::malloc(t->bytes);
    auto* f = static_cast<uint8_t*>(t->data.data);
    for (size_t i = 0; i < t->bytes; ++i) f[i] = static_cast<uint8_t>(i * 37 + 11) & 0x3f;
  }

  static tfl::Status GetExecutionPlan(tfl::Context* c, tfl::IntArray** plan) {
    *plan = Of(c)->plan;
    return tfl::kOk;
  }
  static tfl::Status GetNodeAndRegistration(tfl::Context* c, int index, tfl::Node** node,
                                            tfl::Registration** reg) {
    FakeRuntime* rt = Of(c);
    if (index < 0 || static_cast<size_t>(index) >= rt->nodes.size()) return tfl::kError;
    *node = &rt->nodes[index];
    *reg = &rt->regs[index];
    return tfl::kOk;
  }
  static tfl::Status ResizeTensor(tfl::Context* /*c*/, tfl::Tensor* t, tfl::IntArray* dims) {
    std::free(t->dims);
    t->dims = dims;
    Allocate(t);
    return tfl::kOk;
  }
  static void ReportError(tfl::Context* /*c*/, const char* /*format*/, ...) {}
  static tfl::Status Replace(tfl::Context* c, tfl::Registration reg, const tfl::IntArray* list,
                             tfl::Delegate* /*delegate*/) {
    FakeRuntime* rt = Of(c);
    rt->replaced = true;
    rt->kernel = reg;
    rt->delegated = ToVector(list);
    return tfl::kOk;
  }
  static tfl::Tensor* GetTensor(const tfl::Context* c, int index) {
    return &Of(c)->tensors[static_cast<size_t>(index)];
  }

  void Wire() {
    std::memset(&ctx, 0, sizeof(ctx));
    ctx.impl_ = this;
    ctx.tensors = tensors.data();
    ctx.tensors_size = tensors.size();
    ctx.GetExecutionPlan = &GetExecutionPlan;
    ctx.GetNodeAndRegistration = &GetNodeAndRegistration;
    ctx.ResizeTensor = &ResizeTensor;
    ctx.ReportError = &ReportError;
    ctx.ReplaceNodeSubsetsWithDelegateKernels = &Replace;
    ctx.GetTensor = &GetTensor;
    ctx.recommended_num_threads = 1;
  }
};

void BuildGraph(Input& in, FakeRuntime* rt) {
  const int n_tensors = 1 + static_cast<int>(in.Below(8));
  rt->tensors.resize(n_tensors);
  for (tfl::Tensor& t : rt->tensors) {
    std::memset(&t, 0, sizeof(t));
    static const tfl::Type kTypes[] = {tfl::kFloat16, tfl::kInt32, tfl::kInt8, tfl::kBool};
    const uint8_t b = in.Byte();
    t.type = b < 192 ? tfl::kFloat32 : kTypes[b % 4];
    t.dims = MakeIntArray(MakeShape(in));
    const bool constant = in.Below(4) == 0;
    t.allocation_type = constant ? tfl::kMmapRo : tfl::kArenaRw;
    t.is_variable = in.Below(16) == 0;
  }
  const int n_nodes = 1 + static_cast<int>(in.Below(6));
  static const char* kNames[] = {"difflite.GroupNorm", "difflite.Gelu", "difflite.GeGLU",
                                 "difflite.Attention", "difflite.WinogradConv3x3", "difflite.Nope",
                                 "other.Custom"};
  rt->nodes.resize(n_nodes);
  rt->regs.resize(n_nodes);
  rt->names.resize(n_nodes);
  rt->options.resize(n_nodes);
  auto index = [&](bool allow_missing) {
    const uint8_t b = in.Byte();
    if (b >= 250) return b == 255 ? n_tensors + 3 : (allow_missing ? -1 : -5);
    return static_cast<int>(b % n_tensors);
  };
  for (int i = 0; i < n_nodes; ++i) {
    tfl::Node& node = rt->nodes[i];
    tfl::Registration& reg = rt->regs[i];
    std::memset(&node, 0, sizeof(node));
    std::memset(&reg, 0, sizeof(reg));
    const uint8_t kind = in.Byte();
    if (kind < 248) {
      rt->names[i] = kind < 240 ? kNames[kind % 7] : "difflite.LoRA";
      reg.builtin_code = tfl::kBuiltinCustom;
      reg.custom_name = rt->names[i].c_str();
      rt->options[i] = kind < 240 ? Options(in) : LoraOptions(in);
      node.custom_initial_data = rt->options[i].empty() ? nullptr : rt->options[i].data();
      node.custom_initial_data_size = static_cast<int>(rt->options[i].size());
    } else {
      reg.builtin_code = 0;  // ADD
    }
    std::vector<int> ins(in.Below(5)), outs(1 + in.Below(2));
    for (int& t : ins) t = index(true);
    for (int& t : outs) t = index(false);
    node.inputs = MakeIntArray(ins);
    node.outputs = MakeIntArray(outs);
  }
  std::vector<int> plan(n_nodes);
  for (int i = 0; i < n_nodes; ++i) plan[i] = i;
  rt->plan = MakeIntArray(plan);
  // Constants and graph inputs get their data now; tensors a node writes and nobody reads are
  // graph outputs.
  std::vector<bool> written(n_tensors), read(n_tensors);
  for (const tfl::Node& n : rt->nodes) {
    for (int t : ToVector(n.outputs)) {
      if (t >= 0 && t < n_tensors) written[t] = true;
    }
    for (int t : ToVector(n.inputs)) {
      if (t >= 0 && t < n_tensors) read[t] = true;
    }
  }
  rt->graph_output.resize(n_tensors);
  for (int t = 0; t < n_tensors; ++t) {
    rt->graph_output[t] = written[t] && !read[t];
    if (!written[t] || rt->tensors[t].allocation_type == tfl::kMmapRo) {
      FakeRuntime::Allocate(&rt->tensors[t]);
    }
  }
}

// One partition per run of consecutive delegated nodes of the plan, as TFLite would cut them
// (a node TFLite runs in between splits them).
std::vector<std::vector<int>> Partitions(const FakeRuntime& rt) {
  std::vector<std::vector<int>> parts;
  std::set<int> delegated(rt.delegated.begin(), rt.delegated.end());
  std::vector<int> current;
  for (int i = 0; i < static_cast<int>(rt.nodes.size()); ++i) {
    if (delegated.count(i)) {
      current.push_back(i);
    } else if (!current.empty()) {
      parts.push_back(current);
      current.clear();
    }
  }
  if (!current.empty()) parts.push_back(current);
  return parts;
}

// Factors for the LoRA nodes of a prepared partition: slots 0..3 (the op's among them, or not),
// the node's own K and N or others, ranks 0..4; arrays of exactly the size each call names, so
// the library reads them only within bounds. Most calls fail (unknown slot, other features); they
// must fail cleanly, and a success makes the next Invoke run the kernel with factors.
void SetLoraFactors(Input& in, const FakeRuntime& rt, const std::vector<int>& part,
                    tfl::Delegate* delegate) {
  for (int i : part) {
    if (rt.names[i] != "difflite.LoRA") continue;
    const std::vector<int> ins = ToVector(rt.nodes[i].inputs);
    Shape y, x;
    if (ins.size() == 2 && ins[0] >= 0 && ins[1] >= 0 && static_cast<size_t>(ins[0]) < rt.tensors.size() &&
        static_cast<size_t>(ins[1]) < rt.tensors.size()) {
      y = ToVector(rt.tensors[ins[0]].dims);
      x = ToVector(rt.tensors[ins[1]].dims);
    }
    const int n = y.empty() || in.Below(8) == 0 ? Dim(in) : y.back();
    const int k = x.empty() || in.Below(8) == 0 ? Dim(in) : x.back();
    const int rank = static_cast<int>(in.Below(5));
    const int64_t down_count = int64_t{rank} * k, up_count = int64_t{n} * rank;
    if (k <= 0 || n <= 0 || down_count > kMaxElements || up_count > kMaxElements) continue;
    std::vector<float> down(static_cast<size_t>(down_count)), up(static_cast<size_t>(up_count));
    for (size_t j = 0; j < down.size(); ++j) down[j] = 0.01f * static_cast<float>(j % 7) - 0.03f;
    for (size_t j = 0; j < up.size(); ++j) up[j] = 0.02f * static_cast<float>(j % 5) - 0.04f;
    difflite_lora_set(delegate, static_cast<int32_t>(in.Below(4)), rank, k, n, down.data(), up.data());
  }
}

void FuzzModelWalk(Input& in) {
  FakeRuntime rt;
  BuildGraph(in, &rt);
  rt.Wire();
  char backend_key[] = "backend", backend_value[] = "cpu";
  char threads_key[] = "num_threads", threads_value[] = "1";
  char* keys[] = {backend_key, threads_key};
  char* values[] = {backend_value, threads_value};
  tfl::Delegate* delegate = tflite_plugin_create_delegate(keys, values, 2, nullptr);
  if (delegate == nullptr) std::abort();
  if (delegate->Prepare(&rt.ctx, delegate) == tfl::kOk && rt.replaced) {
    const int n_tensors = static_cast<int>(rt.tensors.size());
    for (const std::vector<int>& part : Partitions(rt)) {
      std::set<int> inside(part.begin(), part.end()), produced, consumed_outside;
      std::vector<int> inputs, outputs;
      for (int i : part) {
        for (int t : ToVector(rt.nodes[i].outputs)) produced.insert(t);
      }
      for (int i = 0; i < static_cast<int>(rt.nodes.size()); ++i) {
        if (inside.count(i)) continue;
        for (int t : ToVector(rt.nodes[i].inputs)) consumed_outside.insert(t);
      }
      std::set<int> seen;
      for (int i : part) {
        for (int t : ToVector(rt.nodes[i].inputs)) {
          if (t >= 0 && !produced.count(t) && seen.insert(t).second) inputs.push_back(t);
        }
      }
      for (int t : produced) {
        if (t < 0 || t >= n_tensors) continue;
        if (consumed_outside.count(t) || rt.graph_output[t]) {
          outputs.push_back(t);
        } else {
          // Between two delegated nodes: the runtime allocates nothing there.
          std::free(rt.tensors[t].data.data);
          rt.tensors[t].data.data = nullptr;
          rt.tensors[t].bytes = 0;
        }
      }
      tfl::IntArray* nodes = MakeIntArray(part);
      tfl::IntArray* in_list = MakeIntArray(inputs);
      tfl::IntArray* out_list = MakeIntArray(outputs);
      tfl::DelegateParams params{delegate, nodes, in_list, out_list};
      tfl::Node macro;
      std::memset(&macro, 0, sizeof(macro));
      macro.inputs = in_list;
      macro.outputs = out_list;
      macro.builtin_data = &params;
      macro.delegate = delegate;
      macro.user_data = rt.kernel.init(&rt.ctx, reinterpret_cast<const char*>(&params), 0);
      for (int t : outputs) {
        if (rt.tensors[t].data.data == nullptr) FakeRuntime::Allocate(&rt.tensors[t]);
      }
      if (rt.kernel.prepare(&rt.ctx, &macro) == tfl::kOk) {
        // The partition's temporaries (its delegate-owned tensors): TFLite's arena holds them
        // during the Invoke; here each gets its own block, as every tensor does.
        for (int t : ToVector(macro.temporaries)) {
          if (t >= 0 && t < n_tensors && rt.tensors[t].data.data == nullptr) {
            FakeRuntime::Allocate(&rt.tensors[t]);
          }
        }
        rt.kernel.invoke(&rt.ctx, &macro);
        SetLoraFactors(in, rt, part, delegate);
        rt.kernel.invoke(&rt.ctx, &macro);
      }
      if (rt.kernel.free != nullptr) rt.kernel.free(&rt.ctx, macro.user_data);
      std::free(macro.temporaries);
      std::free(nodes);
      std::free(in_list);
      std::free(out_list);
    }
  }
  tflite_plugin_destroy_delegate(delegate);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Input in(data, size);
  const uint8_t mode = in.Byte() % 4;
  if (mode == 0) {
    const std::vector<uint8_t> options = in.Bytes(in.Byte());
    FuzzOps(in, options);
  } else if (mode == 1) {
    flexbuffers::Builder fbb;
    BuildMap(in, fbb, 0);
    fbb.Finish();
    FuzzOps(in, fbb.GetBuffer());
  } else {
    FuzzModelWalk(in);
  }
  return 0;
}
