#include "storage/shm_registry.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "common/host.h"
#include "common/log.h"

namespace cistern::storage {

ShmMapping::~ShmMapping() {
  if (data) ::munmap(data, bytes);
}

Result<uint64_t> ShmRegistry::attach(std::string_view boot_id, uint32_t pid, uint32_t fd,
                                     uint64_t bytes, std::string_view token) {
  auto unreachable = [&](std::string_view why) {
    return Status(ErrorCode::kNotFound,
                  fmt::format("shared memory of pid {} fd {}: {}", pid, fd, why));
  };
  if (bytes == 0 || bytes > bytes_max_ || bytes % 4096 != 0) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("shared memory of {} bytes: not a multiple of 4096 in (0, {}]", bytes,
                              bytes_max_));
  }
  if (token.size() < 16 || token.size() > 4096) {
    return Status(ErrorCode::kInvalidArgument, "shared memory token must be 16..4096 bytes");
  }
  if (hostBootId().empty() || boot_id != hostBootId()) return unreachable("another host");
  // O_PATH opens nothing for real (no device or FIFO side effects): check
  // that it is a regular file before opening it for writing.
  std::string path = fmt::format("/proc/{}/fd/{}", pid, fd);
  int pfd = ::open(path.c_str(), O_PATH | O_CLOEXEC);
  if (pfd < 0) return unreachable(std::strerror(errno));
  struct stat st;
  int rc = ::fstat(pfd, &st);
  if (rc != 0 || !S_ISREG(st.st_mode) || static_cast<uint64_t>(st.st_size) < bytes) {
    ::close(pfd);
    return unreachable("not a shared memory file of that size");
  }
  int mfd = ::open(fmt::format("/proc/self/fd/{}", pfd).c_str(), O_RDWR | O_CLOEXEC);
  int err = errno;
  ::close(pfd);
  if (mfd < 0) return unreachable(std::strerror(err));
  // A client could otherwise shrink the file under our mapping, and our next
  // write there would die of SIGBUS.
  int seals = ::fcntl(mfd, F_GET_SEALS);
  if (seals < 0 || !(seals & F_SEAL_SHRINK)) {
    ::close(mfd);
    return unreachable("not a memfd sealed against shrinking");
  }
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, mfd, 0);
  err = errno;
  ::close(mfd);
  if (p == MAP_FAILED) return unreachable(std::strerror(err));
  auto m = std::make_shared<ShmMapping>();
  m->data = static_cast<uint8_t*>(p);
  m->bytes = bytes;
  m->pid = pid;
  // The same memory only if the token is there (a pid of another namespace
  // or a reused pid names some other file).
  if (std::memcmp(m->data, token.data(), token.size()) != 0) return unreachable("token mismatch");

  std::vector<std::shared_ptr<const ShmMapping>> dropped;  // unmapped outside the lock
  std::lock_guard lock(mu_);
  for (auto it = maps_.begin(); it != maps_.end();) {
    bool dead = ::kill(static_cast<pid_t>(it->second->pid), 0) != 0 && errno == ESRCH;
    if (!dead) {
      ++it;
      continue;
    }
    dropped.push_back(std::move(it->second));
    it = maps_.erase(it);
  }
  while (maps_.size() >= attached_max_) {  // the oldest
    dropped.push_back(std::move(maps_.begin()->second));
    maps_.erase(maps_.begin());
  }
  uint64_t h = next_handle_++;
  maps_.emplace(h, std::move(m));
  return h;
}

std::shared_ptr<const ShmMapping> ShmRegistry::get(uint64_t handle) const {
  std::lock_guard lock(mu_);
  auto it = maps_.find(handle);
  return it == maps_.end() ? nullptr : it->second;
}

void ShmRegistry::detach(uint64_t handle) {
  std::shared_ptr<const ShmMapping> m;  // unmapped outside the lock
  std::lock_guard lock(mu_);
  if (auto it = maps_.find(handle); it != maps_.end()) {
    m = std::move(it->second);
    maps_.erase(it);
  }
}

size_t ShmRegistry::attached() const {
  std::lock_guard lock(mu_);
  return maps_.size();
}

}  // namespace cistern::storage
