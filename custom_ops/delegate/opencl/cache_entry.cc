#include "opencl/cache_entry.h"

namespace difflite::gpu {
namespace {

// "2": entries of the first format carried an unkeyed checksum, which anyone could recompute.
constexpr char kMagic[8] = {'D', 'L', 'C', 'L', 'B', 'I', 'N', '2'};
constexpr char kUnkeyedMagic[8] = {'D', 'L', 'C', 'L', 'B', 'I', 'N', '1'};

uint64_t LoadLe64(const unsigned char* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

bool GetU64(const std::string& in, size_t* pos, uint64_t* v) {
  if (in.size() < 8 || *pos > in.size() - 8) return false;
  *v = LoadLe64(reinterpret_cast<const unsigned char*>(in.data()) + *pos);
  *pos += 8;
  return true;
}

uint64_t Rotl(uint64_t x, int b) { return (x << b) | (x >> (64 - b)); }

struct SipState {
  uint64_t v0, v1, v2, v3;

  void Round() {
    v0 += v1; v1 = Rotl(v1, 13); v1 ^= v0; v0 = Rotl(v0, 32);
    v2 += v3; v3 = Rotl(v3, 16); v3 ^= v2;
    v0 += v3; v3 = Rotl(v3, 21); v3 ^= v0;
    v2 += v1; v1 = Rotl(v1, 17); v1 ^= v2; v2 = Rotl(v2, 32);
  }
  void Compress(uint64_t m) {
    v3 ^= m;
    Round();
    Round();
    v0 ^= m;
  }
};

bool StartsWith(const std::string& s, const char (&magic)[8]) {
  return s.size() >= sizeof(magic) && s.compare(0, sizeof(magic), magic, sizeof(magic)) == 0;
}

}  // namespace

CacheSecret SecretFromBytes(const unsigned char (&bytes)[kCacheSecretBytes]) {
  return {LoadLe64(bytes), LoadLe64(bytes + 8)};
}

uint64_t SipHash24(const CacheSecret& secret, const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  SipState s{secret.k0 ^ 0x736f6d6570736575ull, secret.k1 ^ 0x646f72616e646f6dull,
             secret.k0 ^ 0x6c7967656e657261ull, secret.k1 ^ 0x7465646279746573ull};
  const size_t whole = size - size % 8;
  for (size_t i = 0; i < whole; i += 8) s.Compress(LoadLe64(p + i));
  uint64_t last = static_cast<uint64_t>(size & 0xff) << 56;
  for (size_t i = whole; i < size; ++i) last |= static_cast<uint64_t>(p[i]) << (8 * (i - whole));
  s.Compress(last);
  s.v2 ^= 0xff;
  for (int i = 0; i < 4; ++i) s.Round();
  return s.v0 ^ s.v1 ^ s.v2 ^ s.v3;
}

std::string SerializeEntry(const std::string& key, const std::vector<unsigned char>& binary,
                           const CacheSecret& secret) {
  std::string entry(kMagic, sizeof(kMagic));
  PutU64(&entry, key.size());
  entry += key;
  PutU64(&entry, binary.size());
  entry.append(reinterpret_cast<const char*>(binary.data()), binary.size());
  PutU64(&entry, SipHash24(secret, entry.data(), entry.size()));
  return entry;
}

std::string ParseEntry(const std::string& entry, const std::string& key,
                       const CacheSecret& secret, std::vector<unsigned char>* binary) {
  if (StartsWith(entry, kUnkeyedMagic)) return "an unkeyed entry of an older format";
  if (!StartsWith(entry, kMagic)) return "not a difflite program cache entry";
  size_t pos = sizeof(kMagic);
  uint64_t key_len = 0, bin_len = 0, tag = 0;
  if (!GetU64(entry, &pos, &key_len) || key_len > entry.size() - pos) return "truncated";
  const size_t key_at = pos;
  pos += key_len;
  if (!GetU64(entry, &pos, &bin_len) || bin_len > entry.size() - pos) return "truncated";
  const size_t bin_at = pos;
  pos += bin_len;
  const size_t body = pos;
  if (!GetU64(entry, &pos, &tag) || pos != entry.size()) return "truncated or has trailing bytes";
  // Nothing of the entry is believed before its tag is.
  if (SipHash24(secret, entry.data(), body) != tag) {
    return "its tag does not match this cache's key (damaged, or not written by difflite)";
  }
  if (entry.compare(key_at, key_len, key) != 0) {
    return "written for another device, driver, source or options";
  }
  if (bin_len == 0) return "empty binary";
  binary->assign(entry.begin() + bin_at, entry.begin() + bin_at + bin_len);
  return "";
}

}  // namespace difflite::gpu
