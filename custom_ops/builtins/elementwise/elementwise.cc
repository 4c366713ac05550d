// Elementwise builtins on the GPU (elementwise.cl): unary math (LOGISTIC,
// TANH, EXP, LOG, SQRT, RSQRT, NEG, ABS, SIN, COS, SIGN, GELU, RELU, RELU6,
// SQUARE, FLOOR, CEIL), binary arithmetic with numpy broadcasting (ADD, SUB,
// MUL, DIV, MAXIMUM, MINIMUM, SQUARED_DIFFERENCE, POW), SELECT/SELECT_V2 and
// CAST between int32 and float. Float tensors only for the math (int32
// arithmetic stays with TFLite); fused activations other than NONE are
// refused.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "common/kernel_util.h"

namespace difflite::gpu::builtin {
namespace {

constexpr const char* kProgram = "elementwise";

// Op codes: keep in sync with elementwise.cl.
enum Unary {
  kLogistic = 0, kTanh, kExp, kLog, kSqrt, kRsqrt, kNeg, kAbs, kSin, kCos, kSign,
  kGeluErf, kGeluTanh, kRelu, kRelu6, kSquare, kFloor, kCeil,
};
enum Binary { kAdd = 0, kSub, kMul, kDiv, kMax, kMin, kSqDiff, kPow };

class UnaryOp final : public GpuOp {
 public:
  // vec: unary_vec (16 elements per item) instead of one per item.
  UnaryOp(cl_kernel k, size_t local, int n, int code, const char* label, bool vec)
      : k_(k), local_(local), n_(n), code_(code), label_(label), vec_(vec) {}
  std::string Run(GpuContext& ctx, const std::vector<GpuTensor>& in,
                  const std::vector<GpuTensor>& out) override {
    std::string e = Args().Mem(in[0].mem).Mem(out[0].mem).Int(n_).Int(code_).Set(ctx.cl(), k_);
    if (!e.empty()) return e;
    const size_t items = vec_ ? static_cast<size_t>((n_ + 15) / 16) : static_cast<size_t>(n_);
    return Launch1D(ctx, k_, items, local_, label_);
  }

 private:
  cl_kernel k_;
  size_t local_;
  int n_, code_;
  const char* label_;
  bool vec_;
};

int UnaryCode(const NodeView& node) {
  const std::string n = node.op_name;
  if (n == "LOGISTIC") return kLogistic;
  if (n == "TANH") return kTanh;
  if (n == "EXP") return kExp;
  if (n == "LOG") return kLog;
  if (n == "SQRT") return kSqrt;
  if (n == "RSQRT") return kRsqrt;
  if (n == "NEG") return kNeg;
  if (n == "ABS") return kAbs;
  if (n == "SIN") return kSin;
  if (n == "COS") return kCos;
  if (n == "SIGN") return kSign;
  if (n == "RELU") return kRelu;
  if (n == "RELU6") return kRelu6;
  if (n == "SQUARE") return kSquare;
  if (n == "FLOOR") return kFloor;
  if (n == "CEIL") return kCeil;
  if (n == "GELU") {
    const auto* p = Params<tfl::GeluParams>(node);
    return (p != nullptr && p->approximate) ? kGeluTanh : kGeluErf;
  }
  return -1;
}

std::unique_ptr<GpuOp> CreateUnary(const NodeView& node, GpuContext& ctx, std::string* error) {
  std::string e = ExpectCounts(node, 1, 1, 1);
  if (e.empty()) e = ExpectFloat(node, node.inputs[0], "input");
  if (e.empty()) e = ExpectFloat(node, node.outputs[0], "output");
  if (e.empty()) e = ExpectShape(node.outputs[0], node.inputs[0].shape, "output");
  const int code = UnaryCode(node);
  if (e.empty() && code < 0) e = std::string("unknown unary op ") + node.op_name;
  const bool vec = ctx.PreferFlatKernels();
  cl_kernel k = nullptr;
  if (e.empty()) e = GetKernel(ctx, kProgram, vec ? "unary_vec" : "unary", "", &k);
  if (!e.empty()) return Refuse(error, e);
  return std::make_unique<UnaryOp>(k, Local1D(ctx, k, vec ? 16 : 128),
                                   static_cast<int>(NumElements(node.inputs[0].shape)), code,
                                   node.op_name, vec);
}

// The broadcast index space of inputs onto `out` (numpy rules, right-aligned).
std::string Broadcast(const std::vector<const TensorInfo*>& ins, const Shape& out,
                      IndexSpace* space) {
  const int rank = static_cast<int>(out.size());
  space->dims = out;
  space->strides.assign(ins.size(), std::vector<int>(rank, 0));
  for (size_t o = 0; o < ins.size(); ++o) {
    const Shape& s = ins[o]->shape;
    const int r = static_cast<int>(s.size());
    if (r > rank) return "input rank exceeds the output's";
    const std::vector<int> st = Strides(s);
    for (int d = 0; d < r; ++d) {
      const int od = rank - r + d;
      if (s[d] == out[od]) {
        space->strides[o][od] = out[od] == 1 ? 0 : st[d];
      } else if (s[d] != 1) {
        return "cannot broadcast " + ShapeToString(s) + " to " + ShapeToString(out);
      }
    }
  }
  space->Collapse();
  if (space->rank() > kMaxRank) return "too many dims after broadcasting";
  return "";
}

Shape BroadcastShape(const Shape& a, const Shape& b) {
  const size_t r = std::max(a.size(), b.size());
  Shape out(r, 1);
  for (size_t i = 0; i < r; ++i) {
    const int da = i < r - a.size() ? 1 : a[i - (r - a.size())];
    const int db = i < r - b.size() ? 1 : b[i - (r - b.size())];
    out[i] = da == 1 ? db : da;
  }
  return out;
}

class BinaryOp final : public GpuOp {
 public:
  enum Kind { kFlat, kFlat4, kNd, kNd4, kRows };
  BinaryOp(cl_kernel k, size_t local, Kind kind, int n, int code, IndexSpace space,
           const char* label)
      : k_(k), local_(local), kind_(kind), n_(n), code_(code), space_(std::move(space)),
        label_(label) {}
  std::string Run(GpuContext& ctx, const std::vector<GpuTensor>& in,
                  const std::vector<GpuTensor>& out) override {
    if (kind_ == kRows) {
      // Outer dims = all but the innermost; items = rows * chunks of 16.
      const int inner = space_.dims.back();
      const int chunks = (inner + 15) / 16;
      const int rows = n_ / inner;
      const int outer_rank = space_.rank() - 1;
      std::vector<int> dims(space_.dims.begin(), space_.dims.end() - 1);
      std::vector<int> sa(space_.strides[0].begin(), space_.strides[0].end() - 1);
      std::vector<int> sb(space_.strides[1].begin(), space_.strides[1].end() - 1);
      std::string e = Args()
                          .Mem(in[0].mem)
                          .Mem(in[1].mem)
                          .Mem(out[0].mem)
                          .Int(inner)
                          .Int(chunks)
                          .Int(rows * chunks)
                          .Int(code_)
                          .Int(outer_rank)
                          .Int8(dims, 1)
                          .Int8(sa)
                          .Int8(sb)
                          .Int(space_.strides[0].back())
                          .Int(space_.strides[1].back())
                          .Set(ctx.cl(), k_);
      if (!e.empty()) return e;
      return Launch1D(ctx, k_, static_cast<size_t>(rows) * chunks, local_, label_);
    }
    const int items = kind_ == kFlat4 || kind_ == kNd4 ? n_ / 4 : n_;
    Args a;
    a.Mem(in[0].mem).Mem(in[1].mem).Mem(out[0].mem).Int(items).Int(code_);
    if (kind_ == kFlat || kind_ == kFlat4) {
      a.Int(space_.strides[0][0]).Int(space_.strides[1][0]);
    } else {
      a.Int(space_.rank()).Int8(space_.dims, 1).Int8(space_.strides[0]).Int8(space_.strides[1]);
    }
    if (kind_ == kNd4) a.Int(space_.strides[0].back() != 0).Int(space_.strides[1].back() != 0);
    std::string e = a.Set(ctx.cl(), k_);
    if (!e.empty()) return e;
    return Launch1D(ctx, k_, static_cast<size_t>(items), local_, label_);
  }

 private:
  cl_kernel k_;
  size_t local_;
  Kind kind_;
  int n_, code_;
  IndexSpace space_;
  const char* label_;
};

int BinaryCode(const std::string& n) {
  if (n == "ADD") return kAdd;
  if (n == "SUB") return kSub;
  if (n == "MUL") return kMul;
  if (n == "DIV") return kDiv;
  if (n == "MAXIMUM") return kMax;
  if (n == "MINIMUM") return kMin;
  if (n == "SQUARED_DIFFERENCE") return kSqDiff;
  if (n == "POW") return kPow;
  return -1;
}

// Whether binary_nd4 can take the broadcast `space`: 4 innermost elements an
// item, each operand either contiguous there with every stride a multiple of 4
// (aligned vectors) or broadcast along it.
bool QuadsAlongInnermost(const IndexSpace& space) {
  if (space.dims.back() % 4 != 0) return false;
  for (const std::vector<int>& s : space.strides) {
    if (s.back() > 1) return false;
    if (s.back() == 1 && !std::all_of(s.begin(), s.end() - 1, [](int v) { return v % 4 == 0; })) {
      return false;
    }
  }
  return true;
}

// binary_nd4's index space: the innermost dim counted in quads, its strides in elements.
IndexSpace InQuads(IndexSpace space) {
  space.dims.back() /= 4;
  for (std::vector<int>& s : space.strides) s.back() *= 4;
  return space;
}

std::unique_ptr<GpuOp> CreateBinary(const NodeView& node, GpuContext& ctx, std::string* error) {
  std::string e = ExpectCounts(node, 2, 2, 1);
  if (!e.empty()) return Refuse(error, e);
  const std::string name = node.op_name;
  const int code = BinaryCode(name);
  if (code < 0) return Refuse(error, "unknown binary op " + name);
  int activation = tfl::kActNone;
  if (node.builtin_data != nullptr) {
    if (name == "ADD" || name == "SUB") {
      activation = Params<tfl::AddSubParams>(node)->activation;
    } else if (name == "MUL" || name == "DIV") {
      activation = Params<tfl::MulDivParams>(node)->activation;
    }
  }
  e = ActivationNone(activation, node.op_name);
  if (e.empty()) e = ExpectFloat(node, node.inputs[0], "input 0");
  if (e.empty()) e = ExpectFloat(node, node.inputs[1], "input 1");
  if (e.empty()) e = ExpectFloat(node, node.outputs[0], "output");
  const Shape& out = node.outputs[0].shape;
  if (e.empty()) {
    e = ExpectShape(node.outputs[0], BroadcastShape(node.inputs[0].shape, node.inputs[1].shape),
                    "output");
  }
  IndexSpace space;
  if (e.empty()) e = Broadcast({&node.inputs[0], &node.inputs[1]}, out, &space);
  if (!e.empty()) return Refuse(error, e);
  const int ia = space.strides[0].back(), ib = space.strides[1].back();
  BinaryOp::Kind kind = BinaryOp::kNd;
  if (ctx.PreferFlatKernels() && ia <= 1 && ib <= 1 && space.dims.back() >= 16) {
    kind = BinaryOp::kRows;
  } else if (space.rank() == 1 && ia <= 1 && ib <= 1) {
    // 4 elements an item where they split evenly: one aligned vector access an operand
    // (one 2- or 4-byte access a work-item left the UNet's residual ADDs issue-bound).
    kind = NumElements(out) % 4 == 0 ? BinaryOp::kFlat4 : BinaryOp::kFlat;
  } else if (!ctx.PreferFlatKernels() && QuadsAlongInnermost(space)) {
    // The UNet's time-embedding ADDs ([N,H,W,C] + [N,1,1,C]): one element an item was
    // issue-bound, like the same-shape ADDs before binary_flat4.
    kind = BinaryOp::kNd4;
    space = InQuads(std::move(space));
  }
  const char* kernel = kind == BinaryOp::kRows    ? "binary_rows"
                       : kind == BinaryOp::kFlat4 ? "binary_flat4"
                       : kind == BinaryOp::kFlat  ? "binary_flat"
                       : kind == BinaryOp::kNd4   ? "binary_nd4"
                                                  : "binary_nd";
  cl_kernel k = nullptr;
  e = GetKernel(ctx, kProgram, kernel, "", &k);
  if (!e.empty()) return Refuse(error, e);
  return std::make_unique<BinaryOp>(k, Local1D(ctx, k, kind == BinaryOp::kRows ? 16 : 128),
                                    kind, static_cast<int>(NumElements(out)), code,
                                    std::move(space), node.op_name);
}

class SelectOp final : public GpuOp {
 public:
  SelectOp(cl_kernel k, size_t local, int n, IndexSpace space)
      : k_(k), local_(local), n_(n), space_(std::move(space)) {}
  std::string Run(GpuContext& ctx, const std::vector<GpuTensor>& in,
                  const std::vector<GpuTensor>& out) override {
    std::string e = Args()
                        .Mem(in[0].mem)
                        .Mem(in[1].mem)
                        .Mem(in[2].mem)
                        .Mem(out[0].mem)
                        .Int(n_)
                        .Int(space_.rank())
                        .Int8(space_.dims, 1)
                        .Int8(space_.strides[0])
                        .Int8(space_.strides[1])
                        .Int8(space_.strides[2])
                        .Set(ctx.cl(), k_);
    if (!e.empty()) return e;
    return Launch1D(ctx, k_, static_cast<size_t>(n_), local_, "select");
  }

 private:
  cl_kernel k_;
  size_t local_;
  int n_;
  IndexSpace space_;
};

std::unique_ptr<GpuOp> CreateSelect(const NodeView& node, GpuContext& ctx, std::string* error) {
  std::string e = ExpectCounts(node, 3, 3, 1);
  if (!e.empty()) return Refuse(error, e);
  const TensorInfo& c = node.inputs[0];
  if (c.dtype != DType::kInt32 && c.dtype != DType::kFloat32) {
    return Refuse(error, "the condition must be a bool constant, int32 or float32");
  }
  e = ExpectFloat(node, node.inputs[1], "input 1");
  if (e.empty()) e = ExpectFloat(node, node.inputs[2], "input 2");
  if (e.empty()) e = ExpectFloat(node, node.outputs[0], "output");
  const Shape& out = node.outputs[0].shape;
  if (e.empty() && std::string(node.op_name) == "SELECT") {
    if (c.shape != out || node.inputs[1].shape != out || node.inputs[2].shape != out) {
      e = "SELECT with differing shapes (row selection) is not supported";
    }
  }
  if (e.empty()) {
    e = ExpectShape(node.outputs[0],
                    BroadcastShape(c.shape, BroadcastShape(node.inputs[1].shape,
                                                           node.inputs[2].shape)),
                    "output");
  }
  IndexSpace space;
  if (e.empty()) e = Broadcast({&c, &node.inputs[1], &node.inputs[2]}, out, &space);
  cl_kernel k = nullptr;
  if (e.empty()) {
    e = GetKernel(ctx, kProgram, c.dtype == DType::kInt32 ? "select_i" : "select_f", "", &k);
  }
  if (!e.empty()) return Refuse(error, e);
  return std::make_unique<SelectOp>(k, Local1D(ctx, k, 128), static_cast<int>(NumElements(out)),
                                    std::move(space));
}

class CastOp final : public GpuOp {
 public:
  CastOp(cl_kernel k, size_t local, int n) : k_(k), local_(local), n_(n) {}
  int AliasInput(size_t /*output*/) const override { return k_ == nullptr ? 0 : -1; }
  std::string Run(GpuContext& ctx, const std::vector<GpuTensor>& in,
                  const std::vector<GpuTensor>& out) override {
    if (k_ == nullptr) {  // same type: a copy
      if (in[0].mem == out[0].mem) return "";
      const size_t bytes = static_cast<size_t>(n_) * DTypeSize(out[0].dtype);
      const cl_int err = ctx.cl().EnqueueCopyBuffer(ctx.queue(), in[0].mem, out[0].mem, 0, 0,
                                                    bytes, 0, nullptr, nullptr);
      return err == CL_SUCCESS ? "" : "clEnqueueCopyBuffer(CAST): error " + std::to_string(err);
    }
    std::string e = Args().Mem(in[0].mem).Mem(out[0].mem).Int(n_).Set(ctx.cl(), k_);
    if (!e.empty()) return e;
    return Launch1D(ctx, k_, static_cast<size_t>(n_), local_, "cast");
  }

 private:
  cl_kernel k_;
  size_t local_;
  int n_;
};

std::unique_ptr<GpuOp> CreateCast(const NodeView& node, GpuContext& ctx, std::string* error) {
  std::string e = ExpectCounts(node, 1, 1, 1);
  if (e.empty()) e = ExpectShape(node.outputs[0], node.inputs[0].shape, "output");
  if (!e.empty()) return Refuse(error, e);
  const DType from = node.inputs[0].dtype, to = node.outputs[0].dtype;
  const int n = static_cast<int>(NumElements(node.inputs[0].shape));
  if (from == to) return std::make_unique<CastOp>(nullptr, 1, n);
  const char* kernel = nullptr;
  if (from == DType::kInt32 && to == DType::kFloat32) kernel = "cast_i2f";
  if (from == DType::kFloat32 && to == DType::kInt32) kernel = "cast_f2i";
  if (kernel == nullptr) {
    return Refuse(error, std::string("CAST from ") + DTypeName(from) + " to " + DTypeName(to) +
                             " is not supported");
  }
  cl_kernel k = nullptr;
  e = GetKernel(ctx, kProgram, kernel, "", &k);
  if (!e.empty()) return Refuse(error, e);
  return std::make_unique<CastOp>(k, Local1D(ctx, k, 128), n);
}

const GpuOpDef kUnaryDefs[] = {
    {"LOGISTIC", &CreateUnary}, {"TANH", &CreateUnary},  {"EXP", &CreateUnary},
    {"LOG", &CreateUnary},      {"SQRT", &CreateUnary},  {"RSQRT", &CreateUnary},
    {"NEG", &CreateUnary},      {"ABS", &CreateUnary},   {"SIN", &CreateUnary},
    {"COS", &CreateUnary},      {"SIGN", &CreateUnary},  {"GELU", &CreateUnary},
    {"RELU", &CreateUnary},     {"RELU6", &CreateUnary}, {"SQUARE", &CreateUnary},
    {"FLOOR", &CreateUnary},    {"CEIL", &CreateUnary},
};
const GpuOpDef kBinaryDefs[] = {
    {"ADD", &CreateBinary},     {"SUB", &CreateBinary},     {"MUL", &CreateBinary},
    {"DIV", &CreateBinary},     {"MAXIMUM", &CreateBinary}, {"MINIMUM", &CreateBinary},
    {"SQUARED_DIFFERENCE", &CreateBinary}, {"POW", &CreateBinary},
};
const GpuOpDef kSelectAndCastDefs[] = {
    {"SELECT", &CreateSelect},
    {"SELECT_V2", &CreateSelect},
    {"CAST", &CreateCast},
};
DIFFLITE_REGISTER_OPS(kUnaryDefs);
DIFFLITE_REGISTER_OPS(kBinaryDefs);
DIFFLITE_REGISTER_OPS(kSelectAndCastDefs);

}  // namespace
}  // namespace difflite::gpu::builtin
