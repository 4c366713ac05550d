// The helpers op_api.h declares (types, shapes, the ops' shared input checks).
#include <cstdint>
#include <cstring>
#include <sstream>

#include "difflite/op_api.h"

namespace difflite {

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kFloat32: return "float32";
    case DType::kFloat16: return "float16";
    case DType::kInt32: return "int32";
    case DType::kInt8: return "int8";
    case DType::kInt4: return "int4";
    default: return "unsupported-type";
  }
}

size_t DTypeSize(DType t) {
  switch (t) {
    case DType::kFloat32: return 4;
    case DType::kFloat16: return 2;
    case DType::kInt32: return 4;
    case DType::kInt8: return 1;
    default: return 0;
  }
}

std::string ShapeToString(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? "," : "") << s[i];
  os << "]";
  return os.str();
}

int64_t NumElements(const Shape& s) {
  int64_t n = 1;
  for (int d : s) {
    // A hostile model may declare any dims: a negative one, or a product past int64
    // (65536^4 wraps to 0), is -1 rather than a wrapped count.
    if (d < 0 || (d > 0 && n > INT64_MAX / d)) return -1;
    n *= d;
  }
  return n;
}

std::string ExpectInputCount(const std::vector<TensorInfo>& inputs, size_t n) {
  if (inputs.size() == n) return "";
  return "expects " + std::to_string(n) + " inputs, got " +
         std::to_string(inputs.size());
}

std::string ExpectFloat32(const TensorInfo& t, const char* what) {
  if (t.dtype == DType::kFloat32) return "";
  if (t.dtype == DType::kFloat16) {
    return std::string(what) +
           " is float16: the CPU kernels compute float32 only (not yet "
           "supported)";
  }
  return std::string(what) + " must be float32, got " + DTypeName(t.dtype);
}

std::string ExpectPositiveDims(const TensorInfo& t, const char* what) {
  for (int d : t.shape) {
    if (d <= 0) {
      return std::string(what) + " has a non-positive dimension: " +
             ShapeToString(t.shape);
    }
  }
  return "";
}

}  // namespace difflite
