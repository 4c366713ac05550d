// The bytes of one program cache entry (program_cache.h): framing, the program's key text, the
// driver's binary and a keyed tag, so that only a process holding the cache folder's secret
// could have written it. Kept apart from the file handling so the fuzz target
// (custom_ops/fuzz/fuzz_program_cache.cc) reaches the parser alone.
#ifndef DIFFLITE_OPENCL_CACHE_ENTRY_H_
#define DIFFLITE_OPENCL_CACHE_ENTRY_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace difflite::gpu {

// SipHash-2-4's 128-bit key, as two little-endian 64-bit halves.
struct CacheSecret {
  uint64_t k0 = 0, k1 = 0;
};
constexpr size_t kCacheSecretBytes = 16;
CacheSecret SecretFromBytes(const unsigned char (&bytes)[kCacheSecretBytes]);

// SipHash-2-4 with a 64-bit output, written from its specification: Aumasson and Bernstein,
// "SipHash: a fast short-input PRF" (INDOCRYPT 2012), section 2.
uint64_t SipHash24(const CacheSecret& secret, const void* data, size_t size);

// Layout: magic, key length, key, binary length, binary, SipHash-2-4 of all that precedes it.
// Lengths and tag are little-endian uint64.
std::string SerializeEntry(const std::string& key, const std::vector<unsigned char>& binary,
                           const CacheSecret& secret);
// "" when `entry` is whole, tagged with `secret` and written for `key` (its binary in *binary);
// else why not.
std::string ParseEntry(const std::string& entry, const std::string& key,
                       const CacheSecret& secret, std::vector<unsigned char>* binary);

}  // namespace difflite::gpu

#endif  // DIFFLITE_OPENCL_CACHE_ENTRY_H_
