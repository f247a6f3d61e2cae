// Shared memory that same-host clients lend a storage server for reads and
// writes (docs/client.md, "Same-host reads and writes"). A client creates a memfd, writes a
// random token at its start and sends its pid, the descriptor number and the
// token (ShmAttach). The server opens /proc/<pid>/fd/<fd> — O_PATH first, so
// that nothing but a regular file is ever opened for real — maps it, checks
// the token and hands back a handle. The memfd must be sealed against
// shrinking (F_SEAL_SHRINK): a client must not be able to cut the file under
// the server's mapping. BatchRead then reads chunk bytes straight into the
// client's memory, and Write takes them from there: no socket copies.
//
// Bounded: at most `attached_max` mappings of at most `bytes_max` each.
// Clients detach when they close; the memory of clients that died without
// detaching is dropped at the next attach, and the oldest mapping makes room
// when all are in use (its client re-attaches when a read names a handle
// the server no longer knows). Thread-safe.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "common/result.h"

namespace cistern::storage {

struct ShmMapping {
  uint8_t* data = nullptr;
  uint64_t bytes = 0;
  uint32_t pid = 0;  // of the client that lent it
  ~ShmMapping();
};

class ShmRegistry {
 public:
  explicit ShmRegistry(uint32_t attached_max = 64, uint64_t bytes_max = 1ull << 30)
      : attached_max_(attached_max), bytes_max_(bytes_max) {}

  // kNotFound when the memory cannot be reached from here (another host,
  // another pid namespace, no permission, a token mismatch);
  // kInvalidArgument for sizes out of bounds.
  Result<uint64_t> attach(std::string_view boot_id, uint32_t pid, uint32_t fd, uint64_t bytes,
                          std::string_view token);
  // Null when `handle` is unknown (never attached, dropped, detached).
  std::shared_ptr<const ShmMapping> get(uint64_t handle) const;
  void detach(uint64_t handle);
  size_t attached() const;

 private:
  const uint32_t attached_max_;
  const uint64_t bytes_max_;
  mutable std::mutex mu_;
  uint64_t next_handle_ = 1;
  std::map<uint64_t, std::shared_ptr<const ShmMapping>> maps_;
};

}  // namespace cistern::storage
