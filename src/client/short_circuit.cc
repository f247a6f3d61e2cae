#include "client/short_circuit.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "common/crc32c.h"
#include "common/io_memory.h"
#include "storage.pb.h"

namespace cistern::client {

namespace {

constexpr uint64_t kBlockBytes = 4096;
// What unaligned ranges go through, a block more for the ends.
constexpr size_t kBounceBytes = size_t{1} << 20;

// Per thread, allocated on first use and reused.
uint8_t* bounce() {
  thread_local io_memory::Region region;
  if (!region) region = io_memory::Region(kBounceBytes + kBlockBytes);
  return region.data();
}

// Reads exactly `n` bytes at `pos`; a file shorter than that is a
// corruption (the slot is not what the Locate said).
Status preadFull(int fd, uint8_t* p, size_t n, uint64_t pos, const std::string& path) {
  for (size_t done = 0; done < n;) {
    ssize_t got = ::pread(fd, p + done, n - done, static_cast<off_t>(pos + done));
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) {
      return Status(ErrorCode::kIOError,
                    fmt::format("read {} at {}: {}", path, pos + done, std::strerror(errno)));
    }
    if (got == 0) {
      return Status(ErrorCode::kCorruption, fmt::format("{} ends before {}", path, pos + done));
    }
    done += static_cast<size_t>(got);
  }
  return Status::OK();
}

}  // namespace

struct ShortCircuit::Fd {
  int fd = -1;
  uint64_t dev = 0, ino = 0;
  Fd(int f, uint64_t d, uint64_t i) : fd(f), dev(d), ino(i) {}
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
  ~Fd() { ::close(fd); }
};

ShortCircuit::ShortCircuit(size_t files_max) : files_max_(std::max<size_t>(files_max, 1)) {}
ShortCircuit::~ShortCircuit() = default;

bool ShortCircuit::refused(const net::Endpoint& server) const {
  std::lock_guard lock(mu_);
  return !refused_.empty() && refused_.count(server.toString()) > 0;
}

void ShortCircuit::refuse(const net::Endpoint& server) {
  std::lock_guard lock(mu_);
  refused_.insert(server.toString());
}

bool ShortCircuit::anyRefused() const {
  std::lock_guard lock(mu_);
  return !refused_.empty();
}

std::shared_ptr<ShortCircuit::Fd> ShortCircuit::open(const storage::LocatedRange& loc, Status* s) {
  const std::string& path = loc.path();
  {
    std::lock_guard lock(mu_);
    if (auto it = files_.find(path); it != files_.end()) {
      if (it->second.first->dev == loc.dev() && it->second.first->ino == loc.ino()) {
        lru_.splice(lru_.begin(), lru_, it->second.second);
        return it->second.first;
      }
      // The server's file of that name is another one now: open it anew.
      lru_.erase(it->second.second);
      files_.erase(it);
    }
  }
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_DIRECT);
  if (fd < 0 && errno == EINVAL) fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);  // no O_DIRECT
  if (fd < 0) {
    *s = Status(ErrorCode::kNotSupported, fmt::format("open {}: {}", path, std::strerror(errno)));
    return nullptr;
  }
  struct stat st;
  if (::fstat(fd, &st) != 0 || st.st_dev != loc.dev() || st.st_ino != loc.ino()) {
    ::close(fd);
    *s = Status(
        ErrorCode::kNotSupported,
        fmt::format("{} here is not the storage server's file (another mount namespace?)", path));
    return nullptr;
  }
  auto file = std::make_shared<Fd>(fd, loc.dev(), loc.ino());
  std::lock_guard lock(mu_);
  if (auto it = files_.find(path); it != files_.end()) return it->second.first;  // raced: theirs
  lru_.push_front(path);
  files_[path] = {file, lru_.begin()};
  while (files_.size() > files_max_) {
    files_.erase(lru_.back());  // closed once its last reader is done
    lru_.pop_back();
  }
  return file;
}

Status ShortCircuit::read(const storage::LocatedRange& loc, uint64_t offset, uint32_t n,
                          uint8_t* out, size_t* got) {
  *got = 0;
  const uint64_t length = loc.chunk_length();
  const uint64_t end = std::min<uint64_t>(offset + n, length);
  if (offset >= end) return Status::OK();
  const uint64_t b0 = offset / kBlockBytes, b1 = (end - 1) / kBlockBytes;
  if (static_cast<uint64_t>(loc.crcs_size()) != b1 - b0 + 1) {
    return Status(ErrorCode::kNotSupported,
                  fmt::format("located {} CRCs for {} blocks", loc.crcs_size(), b1 - b0 + 1));
  }
  Status opened;
  auto file = open(loc, &opened);
  if (!file) return opened;
  // Block `b` (of the chunk) as read into `p`: its bytes up to the chunk's length.
  auto check = [&](uint64_t b, const uint8_t* p) -> Status {
    size_t valid = static_cast<size_t>(std::min(kBlockBytes, length - b * kBlockBytes));
    if (crc32c(p, valid) == loc.crcs(static_cast<int>(b - b0))) return Status::OK();
    return Status(ErrorCode::kCorruption,
                  fmt::format("block {} of the slot at {} of {} does not match its CRC", b,
                              loc.slot_offset(), loc.path()));
  };
  uint64_t at = offset;  // the next chunk byte to deliver
  // Whole blocks at a block-aligned place of `out`: straight into it.
  if (offset % kBlockBytes == 0 && reinterpret_cast<uintptr_t>(out) % kBlockBytes == 0) {
    const uint64_t body = (end - offset) / kBlockBytes * kBlockBytes;
    if (body > 0) {
      RETURN_ON_ERROR(preadFull(file->fd, out, body, loc.slot_offset() + offset, loc.path()));
      for (uint64_t x = 0; x < body; x += kBlockBytes)
        RETURN_ON_ERROR(check((offset + x) / kBlockBytes, out + x));
      at += body;
    }
  }
  // The rest (unaligned, or the chunk's partial last block) whole blocks at
  // a time through this thread's buffer. The slot's data area is whole
  // blocks, so a partial last block can be read whole.
  while (at < end) {
    uint8_t* buf = bounce();
    if (buf == nullptr)
      return Status(ErrorCode::kResourceExhausted, "no memory for a short-circuit read buffer");
    const uint64_t from = at / kBlockBytes * kBlockBytes;
    const uint64_t to =
        std::min((end + kBlockBytes - 1) / kBlockBytes * kBlockBytes, from + kBounceBytes);
    RETURN_ON_ERROR(preadFull(file->fd, buf, to - from, loc.slot_offset() + from, loc.path()));
    for (uint64_t x = from; x < to; x += kBlockBytes)
      RETURN_ON_ERROR(check(x / kBlockBytes, buf + (x - from)));
    const uint64_t take = std::min(end, to) - at;
    std::memcpy(out + (at - offset), buf + (at - from), take);
    at += take;
  }
  *got = end - offset;
  return Status::OK();
}

}  // namespace cistern::client
