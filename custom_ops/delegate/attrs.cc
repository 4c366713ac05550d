// FlexBuffer decoding of custom-op attributes (see difflite/attrs.h).
#include "difflite/attrs.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "flexbuffers_config.h"

namespace difflite {
namespace {

const char* FlexTypeName(flexbuffers::Type t) {
  switch (t) {
    case flexbuffers::FBT_NULL: return "null";
    case flexbuffers::FBT_INT:
    case flexbuffers::FBT_INDIRECT_INT: return "int";
    case flexbuffers::FBT_UINT:
    case flexbuffers::FBT_INDIRECT_UINT: return "uint";
    case flexbuffers::FBT_FLOAT:
    case flexbuffers::FBT_INDIRECT_FLOAT: return "float";
    case flexbuffers::FBT_KEY: return "key";
    case flexbuffers::FBT_STRING: return "string";
    case flexbuffers::FBT_MAP: return "map";
    case flexbuffers::FBT_BOOL: return "bool";
    case flexbuffers::FBT_BLOB: return "blob";
    default: return "vector";
  }
}

AttrValue Decode(const flexbuffers::Reference& r) {
  AttrValue v;
  v.type_name = FlexTypeName(r.GetType());
  switch (r.GetType()) {
    case flexbuffers::FBT_INT:
    case flexbuffers::FBT_INDIRECT_INT:
      v.kind = AttrValue::kInt;
      v.i = r.AsInt64();
      break;
    case flexbuffers::FBT_UINT:
    case flexbuffers::FBT_INDIRECT_UINT: {
      uint64_t u = r.AsUInt64();
      if (u <= static_cast<uint64_t>(INT64_MAX)) {
        v.kind = AttrValue::kInt;
        v.i = static_cast<int64_t>(u);
      }
      break;
    }
    case flexbuffers::FBT_FLOAT:
    case flexbuffers::FBT_INDIRECT_FLOAT:
      v.kind = AttrValue::kFloat;
      v.f = r.AsDouble();
      break;
    case flexbuffers::FBT_BOOL:
      v.kind = AttrValue::kBool;
      v.b = r.AsBool();
      break;
    case flexbuffers::FBT_STRING: {
      v.kind = AttrValue::kString;
      auto s = r.AsString();
      v.s.assign(s.c_str(), s.length());
      break;
    }
    default:
      break;
  }
  return v;
}

std::string Quote(const char* key) { return std::string("'") + key + "'"; }

}  // namespace

std::string AttrMap::Parse(const void* data, size_t size, AttrMap* out) {
  out->values_.clear();
  if (size == 0) return "";
  if (data == nullptr) return "custom options pointer is null";
  if (size >= (size_t(1) << 31)) return "custom options too large";
  // Copy into an aligned buffer we own: the model's bytes may be unaligned. At least one zero
  // byte follows the data: FlexBuffers reads keys with strlen, and the verifier lets a key run
  // to the buffer's last byte unterminated (a fuzzer finding: custom_ops/fuzz/corpus/).
  std::vector<uint64_t> storage(size / 8 + 1);
  std::memcpy(storage.data(), data, size);
  const uint8_t* buf = reinterpret_cast<const uint8_t*>(storage.data());
  if (!flexbuffers::VerifyBuffer(buf, size)) {
    return "custom options are not a valid FlexBuffer";
  }
  flexbuffers::Reference root = flexbuffers::GetRoot(buf, size);
  if (!root.IsMap()) {
    return std::string("custom options must be a FlexBuffer map, got ") +
           FlexTypeName(root.GetType());
  }
  flexbuffers::Map map = root.AsMap();
  flexbuffers::TypedVector keys = map.Keys();
  flexbuffers::Vector values = map.Values();
  if (keys.size() != values.size()) return "malformed FlexBuffer map";
  for (size_t i = 0; i < keys.size(); ++i) {
    flexbuffers::Reference k = keys[i];
    if (!k.IsKey()) return "malformed FlexBuffer map key";
    out->values_[k.AsKey()] = Decode(values[i]);
  }
  return "";
}

std::string AttrMap::GetInt(const char* key, int64_t* out) const {
  auto it = values_.find(key);
  if (it == values_.end()) return "missing attribute " + Quote(key);
  if (it->second.kind != AttrValue::kInt) {
    return "attribute " + Quote(key) + " must be an int, got " +
           it->second.type_name;
  }
  *out = it->second.i;
  return "";
}

std::string AttrMap::GetFloat(const char* key, double* out) const {
  auto it = values_.find(key);
  if (it == values_.end()) return "missing attribute " + Quote(key);
  const AttrValue& v = it->second;
  if (v.kind == AttrValue::kFloat) {
    *out = v.f;
  } else if (v.kind == AttrValue::kInt) {
    *out = static_cast<double>(v.i);
  } else {
    return "attribute " + Quote(key) + " must be a float, got " + v.type_name;
  }
  if (!std::isfinite(*out)) {
    return "attribute " + Quote(key) + " must be finite";
  }
  return "";
}

std::string AttrMap::GetBool(const char* key, bool* out) const {
  auto it = values_.find(key);
  if (it == values_.end()) return "missing attribute " + Quote(key);
  if (it->second.kind != AttrValue::kBool) {
    return "attribute " + Quote(key) + " must be a bool, got " +
           it->second.type_name;
  }
  *out = it->second.b;
  return "";
}

std::string AttrMap::GetString(const char* key, std::string* out) const {
  auto it = values_.find(key);
  if (it == values_.end()) return "missing attribute " + Quote(key);
  if (it->second.kind != AttrValue::kString) {
    return "attribute " + Quote(key) + " must be a string, got " +
           it->second.type_name;
  }
  *out = it->second.s;
  return "";
}

std::string AttrMap::CheckKnown(
    std::initializer_list<const char*> known) const {
  for (const auto& kv : values_) {
    bool found = false;
    for (const char* k : known) {
      if (kv.first == k) {
        found = true;
        break;
      }
    }
    if (!found) return "unknown attribute " + Quote(kv.first.c_str());
  }
  return "";
}

}  // namespace difflite
