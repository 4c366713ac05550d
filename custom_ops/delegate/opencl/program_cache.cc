#include "opencl/program_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>

namespace difflite::gpu {
namespace {

// Entry layout: magic, key length, key, binary length, binary, checksum of all
// that precedes it. Lengths and checksum are little-endian uint64.
constexpr char kMagic[8] = {'D', 'L', 'C', 'L', 'B', 'I', 'N', '1'};

void PutU64(std::string* out, uint64_t v) {
  for (int i = 0; i < 8; ++i) out->push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

bool GetU64(const std::string& in, size_t* pos, uint64_t* v) {
  if (in.size() < 8 || *pos > in.size() - 8) return false;
  *v = 0;
  for (int i = 0; i < 8; ++i) {
    *v |= static_cast<uint64_t>(static_cast<unsigned char>(in[*pos + i])) << (8 * i);
  }
  *pos += 8;
  return true;
}

std::string Hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

bool MakeDirs(const std::string& dir) {
  for (size_t i = 1; i <= dir.size(); ++i) {
    if (i != dir.size() && dir[i] != '/') continue;
    const std::string part = dir.substr(0, i);
    if (mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) return false;
  }
  struct stat st;
  return stat(dir.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

std::string Serialize(const std::string& key, const std::vector<unsigned char>& binary) {
  std::string entry(kMagic, sizeof(kMagic));
  PutU64(&entry, key.size());
  entry += key;
  PutU64(&entry, binary.size());
  entry.append(reinterpret_cast<const char*>(binary.data()), binary.size());
  PutU64(&entry, Fnv1a64(entry.data(), entry.size()));
  return entry;
}

// "" when `entry` is a whole, intact entry for `key` (its binary in *binary).
std::string Parse(const std::string& entry, const std::string& key,
                  std::vector<unsigned char>* binary) {
  if (entry.size() < sizeof(kMagic) + 24 || entry.compare(0, sizeof(kMagic), kMagic, sizeof(kMagic)) != 0) {
    return "not a difflite program cache entry";
  }
  size_t pos = sizeof(kMagic);
  uint64_t key_len = 0, bin_len = 0, sum = 0;
  if (!GetU64(entry, &pos, &key_len) || key_len > entry.size() - pos) return "truncated";
  const std::string stored_key = entry.substr(pos, key_len);
  pos += key_len;
  if (!GetU64(entry, &pos, &bin_len) || bin_len > entry.size() - pos) return "truncated";
  const size_t bin_at = pos;
  pos += bin_len;
  const size_t body = pos;
  if (!GetU64(entry, &pos, &sum) || pos != entry.size()) return "truncated or has trailing bytes";
  if (Fnv1a64(entry.data(), body) != sum) return "checksum mismatch";
  if (stored_key != key) return "written for another device, driver, source or options";
  if (bin_len == 0) return "empty binary";
  binary->assign(entry.begin() + bin_at, entry.begin() + bin_at + bin_len);
  return "";
}

}  // namespace

uint64_t Fnv1a64(const void* data, size_t size, uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  uint64_t h = seed;
  for (size_t i = 0; i < size; ++i) {
    h ^= p[i];
    h *= 0x100000001b3ull;
  }
  return h;
}

ProgramCache::ProgramCache(const std::string& dir) : dir_(dir == "off" ? "" : dir) {
  while (dir_.size() > 1 && dir_.back() == '/') dir_.pop_back();
}

std::string ProgramCache::DefaultDir() {
#ifdef __ANDROID__
  return "";
#else
  const char* xdg = std::getenv("XDG_CACHE_HOME");
  if (xdg != nullptr && xdg[0] == '/') return std::string(xdg) + "/difflite/opencl";
  const char* home = std::getenv("HOME");
  if (home != nullptr && home[0] == '/') return std::string(home) + "/.cache/difflite/opencl";
  return "";
#endif
}

std::string ProgramCache::PathOf(const std::string& key) const {
  return dir_ + "/" + Hex64(Fnv1a64(key.data(), key.size())) + ".clbin";
}

bool ProgramCache::Load(const std::string& key, std::vector<unsigned char>* binary,
                        std::string* why) const {
  why->clear();
  if (!enabled()) return false;
  std::ifstream in(PathOf(key), std::ios::binary);
  if (!in) return false;
  const std::string entry((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  *why = Parse(entry, key, binary);
  return why->empty();
}

std::string ProgramCache::Store(const std::string& key,
                                const std::vector<unsigned char>& binary) const {
  if (!enabled()) return "";
  if (!MakeDirs(dir_)) return "cannot create " + dir_ + ": " + std::strerror(errno);
  static std::atomic<unsigned> counter{0};
  const std::string path = PathOf(key);
  const std::string tmp = path + ".tmp." + std::to_string(getpid()) + "." +
                          std::to_string(counter.fetch_add(1));
  const std::string entry = Serialize(key, binary);
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return "cannot write " + tmp + ": " + std::strerror(errno);
  size_t done = 0;
  while (done < entry.size()) {
    const ssize_t n = write(fd, entry.data() + done, entry.size() - done);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      const std::string e = std::strerror(errno);
      close(fd);
      unlink(tmp.c_str());
      return "cannot write " + tmp + ": " + e;
    }
    done += static_cast<size_t>(n);
  }
  if (close(fd) != 0 || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string e = std::strerror(errno);
    unlink(tmp.c_str());
    return "cannot store " + path + ": " + e;
  }
  return "";
}

}  // namespace difflite::gpu
