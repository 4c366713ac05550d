// Compiled OpenCL programs kept on disk, so that a process after the first
// starts without compiling.
//
// One file per key (device, driver, program source, build options): the key's
// text is stored in the entry and compared on load, and a checksum covers the
// whole entry, so a stale, truncated, corrupt or foreign entry is a miss (the
// caller rebuilds and stores it again), never a program loaded blindly. Entries
// are written to a temporary file in the same folder and renamed into place:
// processes sharing the folder see an entry whole or not at all.
#ifndef DIFFLITE_OPENCL_PROGRAM_CACHE_H_
#define DIFFLITE_OPENCL_PROGRAM_CACHE_H_

#include <cstdint>
#include <string>
#include <vector>

namespace difflite::gpu {

class ProgramCache {
 public:
  // `dir` "" or "off": no cache (every Load misses, Store does nothing).
  explicit ProgramCache(const std::string& dir);

  // $XDG_CACHE_HOME/difflite/opencl, else $HOME/.cache/difflite/opencl; "" on
  // Android (the app or benchmark_model passes cache_dir) or without a home.
  static std::string DefaultDir();

  bool enabled() const { return !dir_.empty(); }
  const std::string& dir() const { return dir_; }

  // The binary stored under `key`. false with *why empty: no entry; with *why
  // set: an entry was there and was rejected (the reason).
  bool Load(const std::string& key, std::vector<unsigned char>* binary, std::string* why) const;
  // "" or a reason (a failed store only costs the next process a compile).
  std::string Store(const std::string& key, const std::vector<unsigned char>& binary) const;

  // The entry's path for `key` (tests corrupt it).
  std::string PathOf(const std::string& key) const;

 private:
  std::string dir_;
};

// FNV-1a, 64 bits: entry names and checksums (not a defence against an
// attacker who can write the cache folder: that user can replace the library).
uint64_t Fnv1a64(const void* data, size_t size, uint64_t seed = 0xcbf29ce484222325ull);

}  // namespace difflite::gpu

#endif  // DIFFLITE_OPENCL_PROGRAM_CACHE_H_
