// libFuzzer target over the OpenCL program cache's entry parser (issue 35, item 7): what a
// process reads from a cache folder before it believes anything (opencl/cache_entry.h). Each
// input is used three ways, under a fixed secret and key text:
//   1. as an entry file, raw: the framing is checked and the tag refused, never read out of bounds;
//   2. the same with its last 8 bytes replaced by the right tag, so the fuzzer reaches what the
//      parser does past the tag (the lengths, the key comparison, the binary's copy);
//   3. split into a key text and a binary that SerializeEntry writes: it must parse back to the
//      same binary, and be refused once any one of its bytes changes.
// Built with -fsanitize=fuzzer,address,undefined (CMake: -DDIFFLITE_FUZZ=ON); run on files it
// replays them once each (the seeds in custom_ops/fuzz/program_cache_corpus/).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "opencl/cache_entry.h"

namespace {

using difflite::gpu::CacheSecret;

// The secret of the seeds (tests/support/program_cache.py writes them): bytes 00 .. 0f.
constexpr CacheSecret kSecret{0x0706050403020100ull, 0x0f0e0d0c0b0a0908ull};
const char kKey[] = "device=fuzz\noptions=-cl-std=CL1.2\nsource=1:2";

void Check(bool ok) {
  if (!ok) std::abort();
}

void ParseRaw(const std::string& entry) {
  std::vector<unsigned char> binary;
  if (difflite::gpu::ParseEntry(entry, kKey, kSecret, &binary).empty()) Check(!binary.empty());
}

void ParseRetagged(std::string entry) {
  if (entry.size() < 8) return;
  const uint64_t tag = difflite::gpu::SipHash24(kSecret, entry.data(), entry.size() - 8);
  for (int i = 0; i < 8; ++i) entry[entry.size() - 8 + i] = static_cast<char>((tag >> (8 * i)) & 0xff);
  ParseRaw(entry);
}

void RoundTrip(const uint8_t* data, size_t size) {
  if (size < 2) return;
  const size_t key_len = data[0] % size;
  const std::string key(reinterpret_cast<const char*>(data + 1), key_len - (key_len > 0));
  const std::vector<unsigned char> binary(data + key_len, data + size);
  std::string entry = difflite::gpu::SerializeEntry(key, binary, kSecret);
  std::vector<unsigned char> back;
  Check(difflite::gpu::ParseEntry(entry, key, kSecret, &back).empty() && back == binary);
  const size_t at = (static_cast<size_t>(data[size - 1]) * 7919u) % entry.size();
  entry[at] = static_cast<char>(entry[at] ^ (1 + data[size / 2] % 255));
  back.clear();
  Check(!difflite::gpu::ParseEntry(entry, key, kSecret, &back).empty() && back.empty());
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string raw(reinterpret_cast<const char*>(data), size);
  ParseRaw(raw);
  ParseRetagged(raw);
  RoundTrip(data, size);
  return 0;
}
