// difflite's own declaration of the slice of the TensorFlow Lite C ABI that an
// external delegate touches.
//
// Which layout this mirrors
// -------------------------
// The plain C structs that the TFLite interpreter hands to delegates
// (tensorflow/lite/core/c/common.h and c_api_types.h), as they are laid out in
// TensorFlow Lite 2.21 -- the runtime inside `tensorflow` 2.21 (tf.lite) and
// inside `ai-edge-litert` 2.3.0. Those headers promise that fields are only
// ever appended, never reordered, so only the prefix we use has to agree.
//
// Nothing here is copied: the names live in `difflite::tfl`, the spelling and
// the comments are ours. What must match the runtime is the memory layout:
//   * member order and types of every struct up to the last member we touch,
//   * the full size of `Registration` (it is passed BY VALUE to
//     Context::ReplaceNodeSubsetsWithDelegateKernels, so the callee reads
//     exactly sizeof(its struct) bytes from our argument),
//   * the full size of `Tensor` only if one indexes Context::tensors directly;
//     the delegate prefers Context::GetTensor and checks at run time that both
//     agree (delegate_util.cc: TensorAbiMatches).
// The static_asserts at the end pin the offsets for LP64 targets (x86-64,
// aarch64); tests/test_custom_ops_cpu.py exercises them against both runtimes.
#ifndef DIFFLITE_TFLITE_ABI_H_
#define DIFFLITE_TFLITE_ABI_H_

#include <cstddef>
#include <cstdint>

namespace difflite {
namespace tfl {

// Result codes of every runtime callback (C enum, int-sized).
enum Status : int {
  kOk = 0,
  kError = 1,
  kDelegateError = 2,
  kApplicationError = 3,
  kDelegateDataNotFound = 4,
  kDelegateDataWriteError = 5,
  kDelegateDataReadError = 6,
  kUnresolvedOps = 7,
  kCancelled = 8,
};

// Element types. Only the values the op library looks at are named; the
// enum is int-sized like the C one, so any other value still fits.
enum Type : int {
  kNoType = 0,
  kFloat32 = 1,
  kInt32 = 2,
  kUInt8 = 3,
  kInt64 = 4,
  kString = 5,
  kBool = 6,
  kInt16 = 7,
  kComplex64 = 8,
  kInt8 = 9,
  kFloat16 = 10,
  kFloat64 = 11,
  kComplex128 = 12,
  kUInt64 = 13,
  kResource = 14,
  kVariant = 15,
  kUInt32 = 16,
  kUInt16 = 17,
  // Signed 4-bit integers. A constant's bytes hold two values each: the element
  // at an even index in the low nibble, the next one in the high nibble, each
  // sign-extended from 4 bits. NB the runtime's number (18) is not the .tflite
  // schema's TensorType number for int4 (17): the two enums diverge at int4.
  kInt4 = 18,
  kBFloat16 = 19,
};

// Where a tensor's bytes live (order matters: the values are implicit in C).
enum AllocationType : int {
  kMemNone = 0,
  kMmapRo = 1,             // constant data mapped from the model file
  kArenaRw = 2,            // interpreter arena, valid during Invoke
  kArenaRwPersistent = 3,
  kDynamic = 4,            // heap, resized on demand
  kPersistentRo = 5,       // computed at Prepare, read-only afterwards
  kCustom = 6,
  kVariantObject = 7,
  kNonCpu = 8,
};

// Bits of Delegate::flags.
enum DelegateFlags : int64_t {
  kDelegateFlagsNone = 0,
  // The delegate copes with tensors whose shape is only known late. Without
  // it the interpreter prepares every node before handing the graph over, and
  // an unresolved custom op aborts that.
  kDelegateFlagsAllowDynamicTensors = 1,
  kDelegateFlagsRequirePropagatedShapes = 2,
  kDelegateFlagsPerOperatorProfiling = 4,
};

// The builtin code of the CUSTOM operator and of a delegate macro-node.
constexpr int32_t kBuiltinCustom = 32;
constexpr int32_t kBuiltinDelegate = 51;

// A length-prefixed int list (shapes, tensor index lists). `data` is a
// trailing flexible array, as in C; arrays handed to Context::ResizeTensor are
// released by the runtime with free(), so they must come from malloc().
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#endif
struct IntArray {
  int size;
  int data[];
};
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

// A length-prefixed float list, laid out like IntArray (quantisation scales).
#if defined(__GNUC__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wpedantic"
#endif
struct FloatArray {
  int size;
  float data[];
};
#if defined(__GNUC__)
#pragma GCC diagnostic pop
#endif

// The older single (per-tensor) quantisation pair, real = scale * (q - zero_point).
// The runtime fills it for a tensor quantised per tensor (one scale), in addition
// to the affine descriptor below; it is left zero for per-axis quantisation.
struct QuantParams {
  float scale;
  int32_t zero_point;
};

// What Quantization::params points at (C enum, int-sized).
enum QuantizationType : int {
  kNoQuantization = 0,      // params is null
  kAffineQuantization = 1,  // params is an AffineQuantization*
};

// Affine quantisation, per tensor (one scale) or per axis: along dimension
// `quantized_dimension`, index c uses scale->data[c] and zero_point->data[c],
// real = scale * (q - zero_point). The runtime checks when it loads a model that
// the two lists are equally long and hold 1 or dims[quantized_dimension] entries.
struct AffineQuantization {
  FloatArray* scale;
  IntArray* zero_point;
  int32_t quantized_dimension;
};

// The current quantisation descriptor of a tensor.
struct Quantization {
  QuantizationType type;
  void* params;  // AffineQuantization* when type is kAffineQuantization
};

// The untyped data pointer of a tensor (a union of pointers in C).
union DataPtr {
  void* data;
  float* f;
  uint16_t* f16;
  int32_t* i32;
  char* raw;
  const char* raw_const;
};

struct Delegate;
struct Context;
struct Registration;

struct Tensor {
  Type type;
  DataPtr data;
  IntArray* dims;
  QuantParams params;
  AllocationType allocation_type;
  size_t bytes;
  const void* allocation;
  const char* name;
  Delegate* delegate;
  int buffer_handle;
  bool data_is_stale;
  bool is_variable;
  Quantization quantization;
  void* sparsity;
  const IntArray* dims_signature;
};

struct Node {
  IntArray* inputs;
  IntArray* outputs;
  IntArray* intermediates;
  IntArray* temporaries;
  void* user_data;        // what Registration::init returned
  void* builtin_data;     // for a delegate macro-node: a DelegateParams*
  const void* custom_initial_data;  // CUSTOM ops: the custom_options bytes
  int custom_initial_data_size;
  Delegate* delegate;
  bool might_have_side_effect;
};

// What the runtime passes (as `buffer` of Registration::init) to a delegate
// kernel: the nodes it replaces and the tensors crossing its boundary.
struct DelegateParams {
  Delegate* delegate;
  IntArray* nodes_to_replace;
  IntArray* input_tensors;
  IntArray* output_tensors;
};

// The interpreter's view handed to delegates and kernels. Every member up to
// ReleaseSubgraphContext is listed so that the function pointers we call sit
// at the runtime's offsets; members we never touch are typed as opaque.
struct Context {
  size_t tensors_size;
  Status (*GetExecutionPlan)(Context* context, IntArray** execution_plan);
  Tensor* tensors;
  void* impl_;
  // Takes ownership of new_size (malloc'ed IntArray).
  Status (*ResizeTensor)(Context* context, Tensor* tensor, IntArray* new_size);
  void (*ReportError)(Context* context, const char* format, ...);
  Status (*AddTensors)(Context* context, int tensors_to_add,
                       int* first_new_tensor_index);
  Status (*GetNodeAndRegistration)(Context* context, int node_index,
                                   Node** node, Registration** registration);
  // Registration is passed by value (see the size check below).
  Status (*ReplaceNodeSubsetsWithDelegateKernels)(
      Context* context, Registration registration,
      const IntArray* nodes_to_replace, Delegate* delegate);
  int recommended_num_threads;
  void* (*GetExternalContext)(Context* context, int type);
  void (*SetExternalContext)(Context* context, int type, void* external);
  bool allow_fp32_relax_to_fp16;
  void* profiler;
  void* (*AllocatePersistentBuffer)(Context* context, size_t bytes);
  Status (*AllocateBufferForEval)(Context* context, size_t bytes, void** ptr);
  Status (*RequestScratchBufferInArena)(Context* context, size_t bytes,
                                        int* buffer_index);
  void* (*GetScratchBuffer)(Context* context, int buffer_index);
  // Like ResizeTensor but copies the shape (no ownership transfer).
  Status (*ResizeTensorExplicit)(Context* context, Tensor* tensor, int dims,
                                 const int* shape);
  Status (*PreviewDelegatePartitioning)(Context* context,
                                        const IntArray* nodes_to_replace,
                                        DelegateParams** partition_params,
                                        int* num_partitions);
  Tensor* (*GetTensor)(const Context* context, int tensor_index);
  void* (*GetEvalTensor)(const Context* context, int tensor_index);
  Status (*GetModelMetadata)(const Context* context, const char* name,
                             const char** ptr, size_t* bytes);
  Status (*AcquireSubgraphContext)(Context* context, int subgraph_index,
                                   Context** acquired);
  Status (*ReleaseSubgraphContext)(Context* context, int subgraph_index);
};

// An operator implementation (builtin, custom, or a delegate kernel). Every
// member is listed: the struct crosses the ABI by value.
struct Registration {
  void* (*init)(Context* context, const char* buffer, size_t length);
  void (*free)(Context* context, void* buffer);
  Status (*prepare)(Context* context, Node* node);
  Status (*invoke)(Context* context, Node* node);
  const char* (*profiling_string)(const Context* context, const Node* node);
  int32_t builtin_code;
  const char* custom_name;
  int version;
  void* registration_external;  // must stay null: selects the legacy path
  void* (*async_kernel)(Context* context, Node* node);
  uint64_t inplace_operator;
};

struct Delegate {
  void* data_;
  Status (*Prepare)(Context* context, Delegate* delegate);
  Status (*CopyFromBufferHandle)(Context* context, Delegate* delegate,
                                 int buffer_handle, Tensor* tensor);
  Status (*CopyToBufferHandle)(Context* context, Delegate* delegate,
                               int buffer_handle, Tensor* tensor);
  void (*FreeBufferHandle)(Context* context, Delegate* delegate,
                           int* buffer_handle);
  int64_t flags;
  void* opaque_delegate_builder;  // must stay null
};

// ---------------------------------------------------------------------------
// Builtin operators: the codes (schema BuiltinOperator) and the parameter
// structs that Node::builtin_data points at, for the builtins the OpenCL
// backend runs. Same source as above: TFLite 2.21
// (tensorflow/lite/core/c/builtin_op_data.h), where members are only ever
// appended, so reading a prefix is safe. Ops without parameters (TILE,
// SELECT_V2, MAXIMUM, LOGISTIC, ...) may have builtin_data == nullptr.

enum class BuiltinOp : int32_t {
  kAdd = 0,
  kConcatenation = 2,
  kConv2d = 3,
  kDepthwiseConv2d = 4,
  kDequantize = 6,
  kFloor = 8,
  kFullyConnected = 9,
  kLogistic = 14,
  kMul = 18,
  kRelu = 19,
  kRelu6 = 21,
  kReshape = 22,
  kResizeBilinear = 23,
  kSoftmax = 25,
  kTanh = 28,
  kPad = 34,
  kGather = 36,
  kTranspose = 39,
  kMean = 40,
  kSub = 41,
  kDiv = 42,
  kSqueeze = 43,
  kStridedSlice = 45,
  kExp = 47,
  kSplit = 49,
  kCast = 53,
  kMaximum = 55,
  kMinimum = 57,
  kNeg = 59,
  kPadV2 = 60,
  kSelect = 64,
  kSin = 66,
  kTile = 69,
  kExpandDims = 70,
  kLog = 73,
  kSum = 74,
  kSqrt = 75,
  kRsqrt = 76,
  kPow = 78,
  kReduceProd = 81,
  kReduceMax = 82,
  kReduceMin = 89,
  kSquare = 92,
  kResizeNearestNeighbor = 97,
  kSquaredDifference = 99,
  kAbs = 101,
  kSplitV = 102,
  kCeil = 104,
  kCos = 108,
  kSelectV2 = 123,
  kBatchMatmul = 126,
  kBroadcastTo = 130,
  kGelu = 150,
  kSign = 158,
};

// Padding of convolutions (C enum, int-sized; values implicit in C).
enum Padding : int {
  kPaddingUnknown = 0,
  kPaddingSame = 1,
  kPaddingValid = 2,
};

// Activation fused into an op's output (C enum, int-sized).
enum FusedActivation : int {
  kActNone = 0,
  kActRelu = 1,
  kActReluN1To1 = 2,
  kActRelu6 = 3,
  kActTanh = 4,
  kActSignBit = 5,
  kActSigmoid = 6,
};

// CONV_2D.
struct ConvParams {
  Padding padding;
  int stride_width;
  int stride_height;
  FusedActivation activation;
  int dilation_width_factor;   // version >= 2
  int dilation_height_factor;
};

// DEPTHWISE_CONV_2D (depth_multiplier is redundant with the filter shape).
struct DepthwiseConvParams {
  Padding padding;
  int stride_width;
  int stride_height;
  int depth_multiplier;
  FusedActivation activation;
  int dilation_width_factor;
  int dilation_height_factor;
};

// FULLY_CONNECTED.
struct FullyConnectedParams {
  FusedActivation activation;
  int weights_format;  // 0: default; anything else is a packed int8 format
  bool keep_num_dims;
  bool asymmetric_quantize_inputs;
};

// SOFTMAX.
struct SoftmaxParams {
  float beta;
};

// CONCATENATION.
struct ConcatenationParams {
  int axis;
  FusedActivation activation;
};

// ADD and SUB (the flag is for int16 kernels).
struct AddSubParams {
  FusedActivation activation;
  bool pot_scale_int16;
};

// MUL and DIV.
struct MulDivParams {
  FusedActivation activation;
};

// BATCH_MATMUL.
struct BatchMatMulParams {
  bool adj_x;
  bool adj_y;
  bool asymmetric_quantize_inputs;
};

// RESIZE_BILINEAR and RESIZE_NEAREST_NEIGHBOR (same layout in C).
struct ResizeParams {
  bool align_corners;
  bool half_pixel_centers;
};

// RESHAPE (legacy: the target shape is normally the second input).
struct ReshapeParams {
  int32_t shape[8];
  int num_dimensions;
};

// GATHER.
struct GatherParams {
  int axis;
  int batch_dims;
};

// MEAN, SUM, REDUCE_MAX, REDUCE_MIN, REDUCE_PROD.
struct ReducerParams {
  bool keep_dims;
};

// SPLIT and SPLIT_V.
struct SplitParams {
  int num_splits;
};

// SQUEEZE.
struct SqueezeParams {
  int32_t squeeze_dims[8];
  int num_squeeze_dims;
};

// STRIDED_SLICE.
struct StridedSliceParams {
  int begin_mask;
  int end_mask;
  int ellipsis_mask;
  int new_axis_mask;
  int shrink_axis_mask;
  bool offset;  // version >= 8: `end` is relative to `begin`
};

// CAST.
struct CastParams {
  Type in_data_type;
  Type out_data_type;
};

// GELU.
struct GeluParams {
  bool approximate;  // tanh approximation instead of erf
};

#if UINTPTR_MAX == 0xFFFFFFFFFFFFFFFFu
// LP64 layout pins (x86-64, aarch64): a mismatch here means this header no
// longer describes the runtime.
static_assert(sizeof(Tensor) == 112, "Tensor layout");
static_assert(offsetof(Tensor, dims) == 16, "Tensor::dims");
static_assert(offsetof(Tensor, params) == 24, "Tensor::params");
static_assert(offsetof(Tensor, allocation_type) == 32, "Tensor::allocation_type");
static_assert(offsetof(Tensor, bytes) == 40, "Tensor::bytes");
static_assert(offsetof(Tensor, name) == 56, "Tensor::name");
static_assert(offsetof(Tensor, quantization) == 80, "Tensor::quantization");
static_assert(offsetof(Tensor, dims_signature) == 104, "Tensor::dims_signature");
static_assert(sizeof(Quantization) == 16, "Quantization layout");
static_assert(offsetof(AffineQuantization, zero_point) == 8, "AffineQuantization::zero_point");
static_assert(offsetof(AffineQuantization, quantized_dimension) == 16,
              "AffineQuantization::quantized_dimension");
static_assert(offsetof(FloatArray, data) == 4, "FloatArray::data");
static_assert(offsetof(Node, custom_initial_data) == 48, "Node::custom data");
static_assert(offsetof(Node, custom_initial_data_size) == 56, "Node::size");
static_assert(offsetof(Context, ResizeTensor) == 32, "Context::ResizeTensor");
static_assert(offsetof(Context, ReportError) == 40, "Context::ReportError");
static_assert(offsetof(Context, GetNodeAndRegistration) == 56,
              "Context::GetNodeAndRegistration");
static_assert(offsetof(Context, ReplaceNodeSubsetsWithDelegateKernels) == 64,
              "Context::ReplaceNodeSubsetsWithDelegateKernels");
static_assert(offsetof(Context, ResizeTensorExplicit) == 144,
              "Context::ResizeTensorExplicit");
static_assert(offsetof(Context, GetTensor) == 160, "Context::GetTensor");
static_assert(sizeof(Registration) == 88, "Registration is passed by value");
static_assert(offsetof(Registration, builtin_code) == 40,
              "Registration::builtin_code");
static_assert(offsetof(Registration, custom_name) == 48,
              "Registration::custom_name");
static_assert(sizeof(Delegate) == 56, "Delegate layout");
static_assert(offsetof(Delegate, flags) == 40, "Delegate::flags");
static_assert(sizeof(ConvParams) == 24, "ConvParams layout");
static_assert(sizeof(DepthwiseConvParams) == 28, "DepthwiseConvParams layout");
static_assert(offsetof(FullyConnectedParams, keep_num_dims) == 8,
              "FullyConnectedParams::keep_num_dims");
static_assert(sizeof(ConcatenationParams) == 8, "ConcatenationParams layout");
static_assert(sizeof(BatchMatMulParams) == 3, "BatchMatMulParams layout");
static_assert(sizeof(ResizeParams) == 2, "ResizeParams layout");
static_assert(sizeof(ReshapeParams) == 36, "ReshapeParams layout");
static_assert(sizeof(GatherParams) == 8, "GatherParams layout");
static_assert(offsetof(StridedSliceParams, shrink_axis_mask) == 16,
              "StridedSliceParams::shrink_axis_mask");
static_assert(sizeof(CastParams) == 8, "CastParams layout");
#endif

}  // namespace tfl
}  // namespace difflite

#endif  // DIFFLITE_TFLITE_ABI_H_
