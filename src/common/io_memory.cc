#include "common/io_memory.h"

#include <sys/mman.h>

#include <cerrno>
#include <fstream>
#include <iterator>
#include <map>
#include <mutex>
#include <shared_mutex>
#include <string>

namespace cistern::io_memory {

namespace {

size_t roundUp(size_t bytes) { return (bytes + kPageBytes - 1) / kPageBytes * kPageBytes; }

// The regions handed out: start -> length. Read on every large chunk read.
struct Regions {
  std::shared_mutex mu;
  std::map<uintptr_t, size_t> by_start;
};
Regions& regions() {
  static Regions* r = new Regions();  // used until exit, by threads of any lifetime
  return *r;
}

}  // namespace

uint8_t* allocate(size_t bytes) {
  if (bytes == 0 || bytes > (size_t{1} << 46)) {
    errno = bytes == 0 ? EINVAL : ENOMEM;
    return nullptr;
  }
  const size_t len = roundUp(bytes);
  // Map one page more than needed and trim to a 2 MiB boundary: mmap itself
  // aligns to 4 KiB only.
  void* m =
      ::mmap(nullptr, len + kPageBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return nullptr;
  const auto raw = reinterpret_cast<uintptr_t>(m);
  const uintptr_t start = (raw + kPageBytes - 1) & ~(uintptr_t{kPageBytes} - 1);
  if (start > raw) ::munmap(m, start - raw);
  if (const uintptr_t tail = raw + len + kPageBytes - (start + len); tail > 0)
    ::munmap(reinterpret_cast<void*>(start + len), tail);
  auto* p = reinterpret_cast<uint8_t*>(start);
  // Advice only: where the kernel has no huge pages to give, 4 KiB ones.
  (void)::madvise(p, len, MADV_HUGEPAGE);
  Regions& r = regions();
  std::unique_lock lock(r.mu);
  r.by_start[start] = len;
  return p;
}

void free(uint8_t* p, size_t bytes) {
  if (!p) return;
  const size_t len = roundUp(bytes);
  {
    Regions& r = regions();
    std::unique_lock lock(r.mu);
    r.by_start.erase(reinterpret_cast<uintptr_t>(p));
  }
  ::munmap(p, len);
}

bool contains(const void* p, size_t n) {
  const auto at = reinterpret_cast<uintptr_t>(p);
  Regions& r = regions();
  std::shared_lock lock(r.mu);
  auto it = r.by_start.upper_bound(at);
  if (it == r.by_start.begin()) return false;
  it = std::prev(it);
  return at - it->first <= it->second && n <= it->second - (at - it->first);
}

bool hugePagesEnabled() {
  static const bool enabled = [] {
    std::ifstream f("/sys/kernel/mm/transparent_hugepage/enabled");
    std::string line;
    if (!std::getline(f, line)) return false;
    return line.find("[never]") == std::string::npos;
  }();
  return enabled;
}

Region& Region::operator=(Region&& o) noexcept {
  if (this != &o) {
    reset();
    data_ = o.data_;
    bytes_ = o.bytes_;
    o.data_ = nullptr;
    o.bytes_ = 0;
  }
  return *this;
}

void Region::reset() {
  free(data_, bytes_);
  data_ = nullptr;
  bytes_ = 0;
}

}  // namespace cistern::io_memory
