// Compiled OpenCL programs kept on disk, so that a process after the first
// starts without compiling.
//
// Trust (DESIGN.md section 5, "Compiled programs are cached on disk"): a binary
// given to the driver is code the device (on PoCL, the host) runs, and a
// damaged one can crash the driver's loader, so nothing found in the folder is
// believed on sight. The folder is used only when it is a real folder (not a
// symlink) owned by this user and writable by nobody else; it holds a secret
// key (`key`, 0600) and an entry is used only when its SipHash-2-4 tag under
// that key matches, i.e. a process holding the key wrote it. Entries are
// opened without following symlinks and read only when they are regular files
// of this user under kMaxEntryBytes. Anything else is a miss: the caller
// rebuilds and stores the entry again, never a program loaded blindly.
//
// One file per key (device, driver, program source, build options): the key's
// text is stored in the entry and compared on load. Entries are written to a
// temporary file in the same folder and renamed into place: processes sharing
// the folder see an entry whole or not at all.
#ifndef DIFFLITE_OPENCL_PROGRAM_CACHE_H_
#define DIFFLITE_OPENCL_PROGRAM_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace difflite::gpu {

// The largest entry read: PoCL's binaries of the SD kernels are under 1 MiB,
// GPU drivers' a few MiB; a larger file is not one this library wrote.
constexpr size_t kMaxEntryBytes = size_t{64} << 20;

class ProgramCache {
 public:
  // No cache (every Load misses, Store does nothing).
  ProgramCache() = default;
  // The folder `dir` (created, mode 0700, with its key where missing); "" or
  // "off": no cache. A folder that fails the checks above is not used:
  // enabled() is false and refused() says why.
  static ProgramCache Open(const std::string& dir);

  // $XDG_CACHE_HOME/difflite/opencl, else $HOME/.cache/difflite/opencl; "" on
  // Android (the app or benchmark_model passes cache_dir) or without a home.
  static std::string DefaultDir();

  bool enabled() const { return folder_ != nullptr; }
  const std::string& dir() const { return dir_; }  // as asked for, "" for none
  const std::string& refused() const { return refused_; }

  // The binary stored under `key`. false with *why empty: no entry; with *why
  // set: an entry was there and was rejected (the reason).
  bool Load(const std::string& key, std::vector<unsigned char>* binary, std::string* why) const;
  // "" or a reason (a failed store only costs the next process a compile).
  std::string Store(const std::string& key, const std::vector<unsigned char>& binary) const;

  // The entry's path for `key` (tests corrupt it).
  std::string PathOf(const std::string& key) const;

 private:
  struct Folder;  // the open folder and its secret
  std::string dir_, refused_;
  std::shared_ptr<const Folder> folder_;
};

// FNV-1a, 64 bits: entry names and the key's digest of the source text (no
// defence against anyone: the tag is).
uint64_t Fnv1a64(const void* data, size_t size, uint64_t seed = 0xcbf29ce484222325ull);

}  // namespace difflite::gpu

#endif  // DIFFLITE_OPENCL_PROGRAM_CACHE_H_
