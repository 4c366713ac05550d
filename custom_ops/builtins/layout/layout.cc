// Data-movement builtins on the GPU: RESHAPE, SQUEEZE, EXPAND_DIMS (a view of
// the input's buffer, or one copy), TRANSPOSE, CONCATENATION, SPLIT, SPLIT_V,
// STRIDED_SLICE, PAD, PADV2, TILE, BROADCAST_TO (strided copies through the
// copy_nd program) and GATHER (gather.cl). Element values are never looked
// at, so float (any storage) and int32 tensors go through the same kernels.
#include <algorithm>
#include <climits>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "common/kernel_util.h"

namespace difflite::gpu::builtin {
namespace {

DType StorageOf(GpuContext& ctx, DType model) {
  return model == DType::kInt32 ? DType::kInt32 : ctx.storage();
}

std::string SameType(const TensorInfo& a, const TensorInfo& b) {
  if (a.dtype != DType::kFloat32 && a.dtype != DType::kInt32) {
    return std::string("tensor type ") + DTypeName(a.dtype) + " is not supported";
  }
  if (a.dtype != b.dtype) {
    return std::string("input is ") + DTypeName(a.dtype) + ", output is " + DTypeName(b.dtype);
  }
  return "";
}

// A node that copies its input 0 into its one output: min_in..max_in inputs, both ends of one
// supported type ("" or why not).
std::string ExpectCopyNode(const NodeView& node, size_t min_in, size_t max_in) {
  const std::string e = ExpectCounts(node, min_in, max_in, 1);
  return e.empty() ? SameType(node.inputs[0], node.outputs[0]) : e;
}

int NormAxis(int axis, int rank) { return axis < 0 ? axis + rank : axis; }

// An op made of fills and strided copies from inputs into outputs.
class CopyOp final : public GpuOp {
 public:
  struct Copy {
    size_t in = 0;
    size_t out = 0;
    StridedCopy copy;
  };
  struct Fill {
    size_t out = 0;
    float value = 0.f;
    size_t offset = 0;
    size_t count = 0;
  };

  explicit CopyOp(std::string label, size_t inputs) : label_(std::move(label)), uses_(inputs, false) {}

  int AliasInput(size_t output) const override { return output == 0 ? alias_ : -1; }
  bool UsesInput(size_t input) const override {
    return input < uses_.size() ? uses_[input] : false;
  }

  std::string Run(GpuContext& ctx, const std::vector<GpuTensor>& in,
                  const std::vector<GpuTensor>& out) override {
    if (alias_ >= 0 && in[alias_].mem == out[0].mem) return "";  // a view
    for (const Fill& f : fills_) {
      std::string e = FillValue(ctx, out[f.out].mem, out[f.out].dtype, f.value, f.offset, f.count);
      if (!e.empty()) return label_ + ": " + e;
    }
    for (const Copy& c : copies_) {
      std::string e = c.copy.Run(ctx, in[c.in].mem, out[c.out].mem, label_.c_str());
      if (!e.empty()) return e;
    }
    return "";
  }

  // Adds a copy of input `in` into output `out`; "" or a reason.
  std::string AddCopy(GpuContext& ctx, DType storage, size_t in, size_t out, IndexSpace space,
                      int src_off, int dst_off) {
    Copy c;
    c.in = in;
    c.out = out;
    std::string e = c.copy.Init(ctx, storage, std::move(space), src_off, dst_off);
    if (!e.empty()) return e;
    uses_[in] = true;
    copies_.push_back(std::move(c));
    return "";
  }
  void AddFill(size_t out, float value, size_t offset, size_t count) {
    fills_.push_back({out, value, offset, count});
  }
  void set_alias(int input) { alias_ = input; }

 private:
  std::string label_;
  std::vector<bool> uses_;
  std::vector<Copy> copies_;
  std::vector<Fill> fills_;
  int alias_ = -1;
};

// RESHAPE, SQUEEZE, EXPAND_DIMS: same elements, new shape.
std::unique_ptr<GpuOp> CreateReshape(const NodeView& node, GpuContext& ctx, std::string* error) {
  std::string e = ExpectCounts(node, 1, 2, 1);
  const TensorInfo& x = node.inputs.empty() ? TensorInfo() : node.inputs[0];
  const TensorInfo& y = node.outputs.empty() ? TensorInfo() : node.outputs[0];
  if (e.empty()) e = SameType(x, y);
  if (e.empty() && NumElements(x.shape) != NumElements(y.shape)) {
    e = "reshape of " + ShapeToString(x.shape) + " into " + ShapeToString(y.shape);
  }
  std::vector<int> wanted;
  if (e.empty() && std::strcmp(node.op_name, "RESHAPE") == 0 && node.inputs.size() == 2 &&
      ConstInts(node.inputs[1], &wanted)) {
    // The shape TFLite computes from the shape tensor (one -1 inferred) must be the declared
    // output's: a model whose two disagree is one TFLite refuses, not one to run.
    int64_t known = 1;
    int unknown = 0;
    bool sane = true;
    for (int d : wanted) {
      if (d == -1) {
        ++unknown;
      } else if (d < 0 || (d > 0 && known > INT32_MAX / d)) {
        sane = false;
      } else {
        known *= d;
      }
    }
    Shape resolved = wanted;
    for (int& d : resolved) {
      if (d == -1 && sane && unknown == 1 && known > 0) {
        d = static_cast<int>(NumElements(x.shape) / known);
      }
    }
    if (!sane || resolved != y.shape) {
      e = "the shape tensor " + ShapeToString(wanted) + " does not give the declared output " +
          ShapeToString(y.shape);
    }
  }
  if (!e.empty()) return Refuse(error, e);
  auto op = std::make_unique<CopyOp>(node.op_name, node.inputs.size());
  IndexSpace s;
  s.dims = {static_cast<int>(NumElements(x.shape))};
  s.strides = {{1}, {1}};
  e = op->AddCopy(ctx, StorageOf(ctx, x.dtype), 0, 0, s, 0, 0);
  if (!e.empty()) return Refuse(error, e);
  op->set_alias(0);
  return op;
}

std::unique_ptr<GpuOp> CreateTranspose(const NodeView& node, GpuContext& ctx, std::string* error) {
  std::string e = ExpectCounts(node, 2, 2, 1);
  if (!e.empty()) return Refuse(error, e);
  const TensorInfo& x = node.inputs[0];
  const TensorInfo& y = node.outputs[0];
  std::vector<int> perm;
  if (!ConstInts(node.inputs[1], &perm)) return Refuse(error, "perm must be a constant int32 tensor");
  e = SameType(x, y);
  if (!e.empty()) return Refuse(error, e);
  const int rank = static_cast<int>(x.shape.size());
  if (static_cast<int>(perm.size()) != rank || rank > kMaxRank) {
    return Refuse(error, "perm " + ShapeToString(perm) + " does not fit rank " + std::to_string(rank));
  }
  std::vector<bool> seen(rank, false);
  Shape out_shape(rank);
  for (int i = 0; i < rank; ++i) {
    const int p = NormAxis(perm[i], rank);
    if (p < 0 || p >= rank || seen[p]) return Refuse(error, "perm " + ShapeToString(perm) + " is not a permutation");
    seen[p] = true;
    perm[i] = p;
    out_shape[i] = x.shape[p];
  }
  e = ExpectShape(y, out_shape, "output");
  if (!e.empty()) return Refuse(error, e);
  const std::vector<int> xs = Strides(x.shape), ys = Strides(out_shape);
  IndexSpace s;
  s.dims = out_shape;
  s.strides.assign(2, std::vector<int>(rank));
  for (int i = 0; i < rank; ++i) {
    s.strides[0][i] = xs[perm[i]];
    s.strides[1][i] = ys[i];
  }
  auto op = std::make_unique<CopyOp>("TRANSPOSE", 2);
  e = op->AddCopy(ctx, StorageOf(ctx, x.dtype), 0, 0, s, 0, 0);
  if (!e.empty()) return Refuse(error, e);
  return op;
}

std::unique_ptr<GpuOp> CreateConcatenation(const NodeView& node, GpuContext& ctx,
                                           std::string* error) {
  if (node.inputs.empty() || node.outputs.size() != 1) {
    return Refuse(error, "CONCATENATION expects inputs and one output");
  }
  const auto* p = Params<tfl::ConcatenationParams>(node);
  if (p == nullptr) return Refuse(error, "CONCATENATION without parameters");
  std::string e = ActivationNone(p->activation, "CONCATENATION");
  if (!e.empty()) return Refuse(error, e);
  const TensorInfo& y = node.outputs[0];
  const int rank = static_cast<int>(y.shape.size());
  const int axis = NormAxis(p->axis, rank);
  if (axis < 0 || axis >= rank) return Refuse(error, "axis " + std::to_string(p->axis) + " out of range");
  const std::vector<int> ys = Strides(y.shape);
  auto op = std::make_unique<CopyOp>("CONCATENATION", node.inputs.size());
  int offset = 0;
  for (size_t i = 0; i < node.inputs.size(); ++i) {
    const TensorInfo& x = node.inputs[i];
    e = SameType(x, y);
    if (e.empty() && static_cast<int>(x.shape.size()) != rank) e = "inputs differ in rank";
    for (int d = 0; e.empty() && d < rank; ++d) {
      if (d != axis && x.shape[d] != y.shape[d]) {
        e = "input " + std::to_string(i) + " " + ShapeToString(x.shape) + " does not fit output " +
            ShapeToString(y.shape);
      }
    }
    if (!e.empty()) return Refuse(error, e);
    IndexSpace s;
    s.dims = x.shape;
    s.strides = {Strides(x.shape), ys};
    e = op->AddCopy(ctx, StorageOf(ctx, x.dtype), i, 0, s, 0, offset * ys[axis]);
    if (!e.empty()) return Refuse(error, e);
    offset += x.shape[axis];
  }
  if (offset != y.shape[axis]) return Refuse(error, "inputs do not add up to the output along the axis");
  return op;
}

// SPLIT (axis, value) and SPLIT_V (value, size_splits, axis): output sizes
// are the declared output shapes, checked against the input.
std::unique_ptr<GpuOp> CreateSplitCommon(const NodeView& node, GpuContext& ctx, size_t value_index,
                                         const TensorInfo& axis_t, std::string* error) {
  std::vector<int> axis_v;
  if (!ConstInts(axis_t, &axis_v) || axis_v.size() != 1) {
    return Refuse(error, "axis must be a constant int32 scalar");
  }
  const TensorInfo& x = node.inputs[value_index];
  const int rank = static_cast<int>(x.shape.size());
  const int axis = NormAxis(axis_v[0], rank);
  if (axis < 0 || axis >= rank) return Refuse(error, "axis out of range");
  const std::vector<int> xs = Strides(x.shape);
  auto op = std::make_unique<CopyOp>(node.op_name, node.inputs.size());
  int offset = 0;
  for (size_t o = 0; o < node.outputs.size(); ++o) {
    const TensorInfo& y = node.outputs[o];
    std::string e = SameType(x, y);
    if (e.empty() && static_cast<int>(y.shape.size()) != rank) e = "outputs differ in rank";
    for (int d = 0; e.empty() && d < rank; ++d) {
      if (d != axis && x.shape[d] != y.shape[d]) e = "output shape does not fit the input";
    }
    if (!e.empty()) return Refuse(error, e);
    IndexSpace s;
    s.dims = y.shape;
    s.strides = {xs, Strides(y.shape)};
    e = op->AddCopy(ctx, StorageOf(ctx, x.dtype), value_index, o, s, offset * xs[axis], 0);
    if (!e.empty()) return Refuse(error, e);
    offset += y.shape[axis];
  }
  if (offset != x.shape[axis]) return Refuse(error, "outputs do not add up to the input along the axis");
  return op;
}

std::unique_ptr<GpuOp> CreateSplit(const NodeView& node, GpuContext& ctx, std::string* error) {
  if (node.inputs.size() != 2 || node.outputs.empty()) return Refuse(error, "SPLIT expects 2 inputs");
  const auto* p = Params<tfl::SplitParams>(node);
  if (p != nullptr && p->num_splits != static_cast<int>(node.outputs.size())) {
    return Refuse(error, "num_splits does not match the outputs");
  }
  std::unique_ptr<GpuOp> op = CreateSplitCommon(node, ctx, 1, node.inputs[0], error);
  if (op == nullptr) return op;
  const int n = static_cast<int>(node.outputs.size());
  for (const TensorInfo& y : node.outputs) {
    if (y.shape != node.outputs[0].shape) return Refuse(error, "SPLIT outputs differ in shape");
  }
  (void)n;
  return op;
}

std::unique_ptr<GpuOp> CreateSplitV(const NodeView& node, GpuContext& ctx, std::string* error) {
  if (node.inputs.size() != 3 || node.outputs.empty()) return Refuse(error, "SPLIT_V expects 3 inputs");
  return CreateSplitCommon(node, ctx, 0, node.inputs[2], error);
}

std::unique_ptr<GpuOp> CreateStridedSlice(const NodeView& node, GpuContext& ctx,
                                          std::string* error) {
  std::string e = ExpectCounts(node, 4, 4, 1);
  if (!e.empty()) return Refuse(error, e);
  const auto* p = Params<tfl::StridedSliceParams>(node);
  if (p == nullptr) return Refuse(error, "STRIDED_SLICE without parameters");
  if (p->ellipsis_mask != 0 || p->new_axis_mask != 0 || p->offset) {
    return Refuse(error, "STRIDED_SLICE with ellipsis_mask, new_axis_mask or offset is not supported");
  }
  std::vector<int> begin, end, strides;
  if (!ConstInts(node.inputs[1], &begin) || !ConstInts(node.inputs[2], &end) ||
      !ConstInts(node.inputs[3], &strides)) {
    return Refuse(error, "begin, end and strides must be constant int32 tensors");
  }
  const TensorInfo& x = node.inputs[0];
  const TensorInfo& y = node.outputs[0];
  e = SameType(x, y);
  if (!e.empty()) return Refuse(error, e);
  const int rank = static_cast<int>(x.shape.size());
  if (begin.size() != end.size() || begin.size() != strides.size() ||
      static_cast<int>(begin.size()) > rank) {
    return Refuse(error, "begin/end/strides lengths do not fit the input");
  }
  const std::vector<int> xs = Strides(x.shape);
  IndexSpace s;
  s.strides.assign(2, {});
  Shape full, out_shape;
  int src_off = 0;
  for (int d = 0; d < rank; ++d) {
    const int dim = x.shape[d];
    int b = 0, en = dim, st = 1;
    const bool given = d < static_cast<int>(begin.size());
    if (given) {
      st = strides[d];
      if (st == 0) return Refuse(error, "stride 0");
      const bool shrink = (p->shrink_axis_mask >> d) & 1;
      if ((p->begin_mask >> d) & 1) {
        b = st > 0 ? 0 : dim - 1;
      } else {
        b = begin[d];
        if (b < 0) b += dim;
        b = st > 0 ? std::clamp(b, 0, dim) : std::clamp(b, -1, dim - 1);
      }
      if (shrink) {
        if (b < 0 || b >= dim) return Refuse(error, "shrunk index out of range");
        en = b + 1;
        st = 1;
      } else if ((p->end_mask >> d) & 1) {
        en = st > 0 ? dim : -1;
      } else {
        en = end[d];
        if (en < 0) en += dim;
        en = st > 0 ? std::clamp(en, 0, dim) : std::clamp(en, -1, dim - 1);
      }
      int size = st > 0 ? (en - b + st - 1) / st : (b - en + (-st) - 1) / (-st);
      size = std::max(size, 0);
      full.push_back(size);
      if (!shrink) out_shape.push_back(size);
    } else {
      full.push_back(dim);
      out_shape.push_back(dim);
    }
    if (full.back() > 0) src_off += b * xs[d];
    s.strides[0].push_back(xs[d] * st);
  }
  e = ExpectShape(y, out_shape, "output");
  if (!e.empty()) return Refuse(error, e);
  if (NumElements(full) == 0) return Refuse(error, "empty slice");
  s.dims = full;
  s.strides[1] = Strides(full);
  auto op = std::make_unique<CopyOp>("STRIDED_SLICE", 4);
  e = op->AddCopy(ctx, StorageOf(ctx, x.dtype), 0, 0, s, src_off, 0);
  if (!e.empty()) return Refuse(error, e);
  return op;
}

std::unique_ptr<GpuOp> CreatePad(const NodeView& node, GpuContext& ctx, std::string* error) {
  std::string e = ExpectCopyNode(node, 2, 3);
  if (!e.empty()) return Refuse(error, e);
  const TensorInfo& x = node.inputs[0];
  const TensorInfo& y = node.outputs[0];
  std::vector<int> pads;
  if (!ConstInts(node.inputs[1], &pads)) return Refuse(error, "paddings must be a constant int32 tensor");
  const int rank = static_cast<int>(x.shape.size());
  if (static_cast<int>(pads.size()) != 2 * rank) return Refuse(error, "paddings must be [rank, 2]");
  float value = 0.f;
  if (node.inputs.size() == 3 && Present(node.inputs[2])) {
    if (node.inputs[2].dtype == DType::kInt32) {
      std::vector<int> v;
      if (!ConstInts(node.inputs[2], &v) || v.size() != 1) return Refuse(error, "constant_values must be a constant scalar");
      value = static_cast<float>(v[0]);
    } else if (!ConstScalar(node.inputs[2], &value)) {
      return Refuse(error, "constant_values must be a constant scalar");
    }
  }
  Shape out_shape(rank);
  for (int d = 0; d < rank; ++d) {
    if (pads[2 * d] < 0 || pads[2 * d + 1] < 0) return Refuse(error, "negative paddings");
    out_shape[d] = x.shape[d] + pads[2 * d] + pads[2 * d + 1];
  }
  e = ExpectShape(y, out_shape, "output");
  if (!e.empty()) return Refuse(error, e);
  const std::vector<int> ys = Strides(out_shape);
  int dst_off = 0;
  for (int d = 0; d < rank; ++d) dst_off += pads[2 * d] * ys[d];
  auto op = std::make_unique<CopyOp>(node.op_name, node.inputs.size());
  op->AddFill(0, value, 0, static_cast<size_t>(NumElements(out_shape)));
  IndexSpace s;
  s.dims = x.shape;
  s.strides = {Strides(x.shape), ys};
  e = op->AddCopy(ctx, StorageOf(ctx, x.dtype), 0, 0, s, 0, dst_off);
  if (!e.empty()) return Refuse(error, e);
  return op;
}

std::unique_ptr<GpuOp> CreateTile(const NodeView& node, GpuContext& ctx, std::string* error) {
  std::string e = ExpectCopyNode(node, 2, 2);
  if (!e.empty()) return Refuse(error, e);
  const TensorInfo& x = node.inputs[0];
  const TensorInfo& y = node.outputs[0];
  std::vector<int> mult;
  if (!ConstInts(node.inputs[1], &mult)) return Refuse(error, "multiples must be a constant int32 tensor");
  const int rank = static_cast<int>(x.shape.size());
  if (static_cast<int>(mult.size()) != rank) return Refuse(error, "multiples must have one entry per dim");
  Shape out_shape(rank);
  for (int d = 0; d < rank; ++d) {
    if (mult[d] < 1) return Refuse(error, "multiples must be >= 1");
    out_shape[d] = x.shape[d] * mult[d];
  }
  e = ExpectShape(y, out_shape, "output");
  if (!e.empty()) return Refuse(error, e);
  const std::vector<int> xs = Strides(x.shape), ys = Strides(out_shape);
  IndexSpace s;
  s.strides.assign(2, {});
  for (int d = 0; d < rank; ++d) {
    s.dims.push_back(mult[d]);
    s.strides[0].push_back(0);
    s.strides[1].push_back(x.shape[d] * ys[d]);
    s.dims.push_back(x.shape[d]);
    s.strides[0].push_back(xs[d]);
    s.strides[1].push_back(ys[d]);
  }
  auto op = std::make_unique<CopyOp>("TILE", 2);
  e = op->AddCopy(ctx, StorageOf(ctx, x.dtype), 0, 0, s, 0, 0);
  if (!e.empty()) return Refuse(error, e);
  return op;
}

std::unique_ptr<GpuOp> CreateBroadcastTo(const NodeView& node, GpuContext& ctx,
                                         std::string* error) {
  std::string e = ExpectCopyNode(node, 2, 2);
  if (!e.empty()) return Refuse(error, e);
  const TensorInfo& x = node.inputs[0];
  const TensorInfo& y = node.outputs[0];
  const int rank = static_cast<int>(y.shape.size());
  const int xr = static_cast<int>(x.shape.size());
  if (xr > rank) return Refuse(error, "input rank exceeds the output's");
  const std::vector<int> xs = Strides(x.shape);
  IndexSpace s;
  s.dims = y.shape;
  s.strides = {std::vector<int>(rank, 0), Strides(y.shape)};
  for (int d = 0; d < xr; ++d) {
    const int od = rank - xr + d;
    if (x.shape[d] != 1 && x.shape[d] != y.shape[od]) {
      return Refuse(error, "cannot broadcast " + ShapeToString(x.shape) + " to " + ShapeToString(y.shape));
    }
    if (x.shape[d] != 1) s.strides[0][od] = xs[d];
  }
  auto op = std::make_unique<CopyOp>("BROADCAST_TO", 2);
  e = op->AddCopy(ctx, StorageOf(ctx, x.dtype), 0, 0, s, 0, 0);
  if (!e.empty()) return Refuse(error, e);
  return op;
}

// `q8_group` > 0: the params are read as the int8 constant they are (gather_q8), a scale per
// q8_group elements; the device never holds the table as floats.
class GatherOp final : public GpuOp {
 public:
  GatherOp(cl_kernel k, size_t local, int n, int n_idx, int axis_dim, int inner, int q8_group)
      : k_(k), local_(local), n_(n), n_idx_(n_idx), axis_dim_(axis_dim), inner_(inner),
        q8_group_(q8_group) {}
  bool ReadsQuantized(size_t input) const override { return input == 0 && q8_group_ > 0; }
  std::string Run(GpuContext& ctx, const std::vector<GpuTensor>& in,
                  const std::vector<GpuTensor>& out) override {
    Args args;
    args.Mem(in[0].mem);
    if (q8_group_ > 0) args.Mem(in[0].scales).Int(q8_group_);
    std::string e =
        args.Mem(in[1].mem).Mem(out[0].mem).Int(n_).Int(n_idx_).Int(axis_dim_).Int(inner_).Set(
            ctx.cl(), k_);
    if (!e.empty()) return e;
    return Launch1D(ctx, k_, static_cast<size_t>(n_), local_, "gather");
  }

 private:
  cl_kernel k_;
  size_t local_;
  int n_, n_idx_, axis_dim_, inner_, q8_group_;
};

std::unique_ptr<GpuOp> CreateGather(const NodeView& node, GpuContext& ctx, std::string* error) {
  std::string e = ExpectCounts(node, 2, 2, 1);
  if (!e.empty()) return Refuse(error, e);
  const auto* p = Params<tfl::GatherParams>(node);
  if (p == nullptr) return Refuse(error, "GATHER without parameters");
  if (p->batch_dims != 0) return Refuse(error, "GATHER with batch_dims != 0 is not supported");
  const TensorInfo& x = node.inputs[0];
  const TensorInfo& idx = node.inputs[1];
  const TensorInfo& y = node.outputs[0];
  e = SameType(x, y);
  if (!e.empty()) return Refuse(error, e);
  if (idx.dtype != DType::kInt32) return Refuse(error, "indices must be int32");
  const int rank = static_cast<int>(x.shape.size());
  const int axis = NormAxis(p->axis, rank);
  if (axis < 0 || axis >= rank) return Refuse(error, "axis out of range");
  Shape out_shape(x.shape.begin(), x.shape.begin() + axis);
  out_shape.insert(out_shape.end(), idx.shape.begin(), idx.shape.end());
  out_shape.insert(out_shape.end(), x.shape.begin() + axis + 1, x.shape.end());
  e = ExpectShape(y, out_shape, "output");
  if (!e.empty()) return Refuse(error, e);
  int inner = 1;
  for (int d = axis + 1; d < rank; ++d) inner *= x.shape[d];
  // An int8 table (embedding rows) is read as it is stored; int4 is dequantized at upload.
  const int q8_group = x.is_constant && x.quant_bits == 8 ? x.quant_group : 0;
  cl_kernel k = nullptr;
  e = q8_group > 0 ? GetKernel(ctx, "gather", "gather_q8", "", &k)
                   : GetKernel(ctx, "gather", "gather",
                               std::string("-DCOPY_T=") + CopyType(StorageOf(ctx, x.dtype)), &k);
  if (!e.empty()) return Refuse(error, e);
  return std::make_unique<GatherOp>(k, Local1D(ctx, k), static_cast<int>(NumElements(out_shape)),
                                    static_cast<int>(std::max<int64_t>(NumElements(idx.shape), 1)),
                                    x.shape[axis], inner, q8_group);
}

const GpuOpDef kLayoutOps[] = {
    {"RESHAPE", &CreateReshape},
    {"SQUEEZE", &CreateReshape},
    {"EXPAND_DIMS", &CreateReshape},
    {"TRANSPOSE", &CreateTranspose},
    {"CONCATENATION", &CreateConcatenation},
    {"SPLIT", &CreateSplit},
    {"SPLIT_V", &CreateSplitV},
    {"STRIDED_SLICE", &CreateStridedSlice},
    {"PAD", &CreatePad},
    {"PADV2", &CreatePad},
    {"TILE", &CreateTile},
    {"BROADCAST_TO", &CreateBroadcastTo},
    {"GATHER", &CreateGather},
};
DIFFLITE_REGISTER_OPS(kLayoutOps);

}  // namespace

}  // namespace difflite::gpu::builtin
