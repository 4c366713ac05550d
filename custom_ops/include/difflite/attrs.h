// Attributes of a custom op, decoded from the FlexBuffer map stored in the
// operator's custom_options. Decoding is bounds-checked (the buffer is
// verified first); typed getters report a missing key or a wrong type as an
// error string. Attribute names are spelled by the ops, never here.
#ifndef DIFFLITE_ATTRS_H_
#define DIFFLITE_ATTRS_H_

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <map>
#include <string>

namespace difflite {

struct AttrValue {
  enum Kind { kInt, kFloat, kBool, kString, kOther } kind = kOther;
  int64_t i = 0;
  double f = 0.0;
  bool b = false;
  std::string s;
  std::string type_name;  // the FlexBuffer type, for messages
};

class AttrMap {
 public:
  // Decodes `size` bytes at `data`. Returns "" or the reason it failed (not a
  // FlexBuffer, not a map, ...). An empty buffer decodes to an empty map.
  static std::string Parse(const void* data, size_t size, AttrMap* out);

  const std::map<std::string, AttrValue>& values() const { return values_; }

  // Each returns "" and sets *out, or a reason (missing / wrong type).
  std::string GetInt(const char* key, int64_t* out) const;
  std::string GetFloat(const char* key, double* out) const;  // int accepted
  std::string GetBool(const char* key, bool* out) const;
  std::string GetString(const char* key, std::string* out) const;
  // "" if every key of the map is in `known`, else names the first stranger.
  std::string CheckKnown(std::initializer_list<const char*> known) const;

  std::map<std::string, AttrValue> values_;
};

}  // namespace difflite

#endif  // DIFFLITE_ATTRS_H_
