#include "opencl/program_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "opencl/cache_entry.h"

namespace difflite::gpu {

struct ProgramCache::Folder {
  int fd = -1;
  CacheSecret secret;
  ~Folder() {
    if (fd >= 0) close(fd);
  }
};

namespace {

constexpr char kSecretName[] = "key";
constexpr mode_t kWritableByOthers = S_IWGRP | S_IWOTH;
constexpr mode_t kAnyAccessByOthers = S_IRWXG | S_IRWXO;

std::string Hex64(uint64_t v) {
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

std::string ErrnoText() { return std::strerror(errno); }

std::string EntryName(const std::string& key) {
  return Hex64(Fnv1a64(key.data(), key.size())) + ".clbin";
}

std::string TempName(const std::string& name) {
  static std::atomic<unsigned> counter{0};
  return name + ".tmp." + std::to_string(getpid()) + "." + std::to_string(counter.fetch_add(1));
}

// "" when `st` is this user's and grants none of `forbidden`.
std::string CheckOwnership(const struct stat& st, mode_t forbidden) {
  if (st.st_uid != geteuid()) {
    return "owned by uid " + std::to_string(st.st_uid) + ", not this user (" +
           std::to_string(geteuid()) + ")";
  }
  if ((st.st_mode & forbidden) != 0) {
    char mode[8];
    std::snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    return std::string("open to other users (mode ") + mode + ")";
  }
  return "";
}

bool MakeDirs(const std::string& dir) {
  for (size_t i = 1; i <= dir.size(); ++i) {
    if (i != dir.size() && dir[i] != '/') continue;
    if (mkdir(dir.substr(0, i).c_str(), 0700) != 0 && errno != EEXIST) return false;
  }
  return true;
}

// The folder itself, never a symlink to one, this user's and writable by no one else
// (as ssh treats ~/.ssh): anyone who can add files there could plant entries.
std::string OpenOwnFolder(const std::string& dir, int* fd) {
  if (!MakeDirs(dir)) return "cannot create it: " + ErrnoText();
  *fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (*fd < 0) {
    return errno == ELOOP || errno == ENOTDIR ? "a symbolic link or not a folder"
                                              : "cannot open it: " + ErrnoText();
  }
  struct stat st;
  if (fstat(*fd, &st) != 0) return "cannot stat it: " + ErrnoText();
  const std::string why = CheckOwnership(st, kWritableByOthers);
  return why.empty() ? "" : why + "; chmod go-w it, or name another cache_dir";
}

// `name` in the folder, read whole when it is a regular file of this user granting none of
// `forbidden`, of at most `max_bytes`; the reason otherwise. Never follows a symlink, never
// blocks on a FIFO, never reads more than the size fstat gave. *missing: there is no such file.
std::string ReadOwnedFile(int dirfd, const std::string& name, size_t max_bytes, mode_t forbidden,
                          std::string* content, bool* missing) {
  *missing = false;
  const int fd = openat(dirfd, name.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    *missing = errno == ENOENT;
    if (*missing) return "";
    return errno == ELOOP ? "a symbolic link" : "cannot open it: " + ErrnoText();
  }
  struct stat st;
  std::string why;
  if (fstat(fd, &st) != 0) {
    why = "cannot stat it: " + ErrnoText();
  } else if (!S_ISREG(st.st_mode)) {
    why = "not a regular file";
  } else if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    why = std::to_string(st.st_size) + " bytes, over the bound of " + std::to_string(max_bytes);
  } else {
    why = CheckOwnership(st, forbidden);
  }
  if (why.empty()) {
    content->resize(static_cast<size_t>(st.st_size));
    size_t done = 0;
    while (why.empty() && done < content->size()) {
      const ssize_t n = read(fd, &(*content)[done], content->size() - done);
      if (n > 0) {
        done += static_cast<size_t>(n);
      } else if (n == 0) {
        why = "shorter than its size (written while read)";
      } else if (errno != EINTR) {
        why = "cannot read it: " + ErrnoText();
      }
    }
  }
  close(fd);
  return why;
}

// A new file `name` (never an existing one, nor through a symlink), mode 0600, holding `data`.
std::string WriteNewFile(int dirfd, const std::string& name, const std::string& data) {
  const int fd = openat(dirfd, name.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC,
                        0600);
  if (fd < 0) return "cannot create " + name + ": " + ErrnoText();
  size_t done = 0;
  std::string why;
  while (why.empty() && done < data.size()) {
    const ssize_t n = write(fd, data.data() + done, data.size() - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
    } else if (n == 0 || errno != EINTR) {
      why = "cannot write " + name + ": " + (n == 0 ? "no progress" : ErrnoText());
    }
  }
  if (close(fd) != 0 && why.empty()) why = "cannot write " + name + ": " + ErrnoText();
  if (!why.empty()) unlinkat(dirfd, name.c_str(), 0);
  return why;
}

bool RandomBytes(std::string* out, size_t n) {
  const int fd = open("/dev/urandom", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  out->resize(n);
  size_t done = 0;
  while (done < n) {
    const ssize_t got = read(fd, &(*out)[done], n - done);
    if (got <= 0 && !(got < 0 && errno == EINTR)) break;
    if (got > 0) done += static_cast<size_t>(got);
  }
  close(fd);
  return done == n;
}

// A fresh secret, published whole: link() keeps the one of a process that got there first
// (whose entries stay valid); rename() where the file system forbids hard links.
std::string CreateSecretFile(int dirfd) {
  std::string secret;
  if (!RandomBytes(&secret, kCacheSecretBytes)) return "cannot read /dev/urandom";
  const std::string tmp = TempName(kSecretName);
  std::string why = WriteNewFile(dirfd, tmp, secret);
  if (!why.empty()) return why;
  if (linkat(dirfd, tmp.c_str(), dirfd, kSecretName, 0) != 0 && errno != EEXIST &&
      renameat(dirfd, tmp.c_str(), dirfd, kSecretName) != 0) {
    why = "cannot create its key: " + ErrnoText();
  }
  unlinkat(dirfd, tmp.c_str(), 0);
  return why;
}

std::string LoadSecret(int dirfd, CacheSecret* secret) {
  std::string bytes;
  bool missing = false;
  std::string why = ReadOwnedFile(dirfd, kSecretName, kCacheSecretBytes, kAnyAccessByOthers,
                                  &bytes, &missing);
  if (missing) {
    why = CreateSecretFile(dirfd);
    if (why.empty()) {
      why = ReadOwnedFile(dirfd, kSecretName, kCacheSecretBytes, kAnyAccessByOthers, &bytes,
                          &missing);
    }
  }
  if (why.empty() && (missing || bytes.size() != kCacheSecretBytes)) why = "not 16 bytes";
  if (!why.empty()) return std::string("its ") + kSecretName + " file: " + why;
  unsigned char raw[kCacheSecretBytes];
  std::memcpy(raw, bytes.data(), kCacheSecretBytes);
  *secret = SecretFromBytes(raw);
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

ProgramCache ProgramCache::Open(const std::string& dir) {
  ProgramCache cache;
  cache.dir_ = dir == "off" ? "" : dir;
  while (cache.dir_.size() > 1 && cache.dir_.back() == '/') cache.dir_.pop_back();
  if (cache.dir_.empty()) return cache;
  auto folder = std::make_shared<Folder>();
  cache.refused_ = OpenOwnFolder(cache.dir_, &folder->fd);
  if (cache.refused_.empty()) cache.refused_ = LoadSecret(folder->fd, &folder->secret);
  if (cache.refused_.empty()) cache.folder_ = std::move(folder);
  return cache;
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
  return dir_ + "/" + EntryName(key);
}

bool ProgramCache::Load(const std::string& key, std::vector<unsigned char>* binary,
                        std::string* why) const {
  why->clear();
  if (!enabled()) return false;
  std::string entry;
  bool missing = false;
  *why = ReadOwnedFile(folder_->fd, EntryName(key), kMaxEntryBytes, kWritableByOthers, &entry,
                       &missing);
  if (missing) return false;
  if (why->empty()) *why = ParseEntry(entry, key, folder_->secret, binary);
  return why->empty();
}

std::string ProgramCache::Store(const std::string& key,
                                const std::vector<unsigned char>& binary) const {
  if (!enabled()) return "";
  const std::string name = EntryName(key);
  const std::string tmp = TempName(name);
  const std::string why = WriteNewFile(folder_->fd, tmp, SerializeEntry(key, binary, folder_->secret));
  if (!why.empty()) return why;
  if (renameat(folder_->fd, tmp.c_str(), folder_->fd, name.c_str()) != 0) {
    const std::string e = ErrnoText();
    unlinkat(folder_->fd, tmp.c_str(), 0);
    return "cannot store " + PathOf(key) + ": " + e;
  }
  return "";
}

}  // namespace difflite::gpu
