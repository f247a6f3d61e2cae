// The files open through one client (docs/client.md, "Open files").
//
// Every handle of one inode (open(), openAt(), createAt(); the FUSE mount's
// kernel handles) shares one OpenInode and its FileImpl, so a read through
// one handle sees a write through another at once and the inode has one
// write buffer and one read-ahead however many times it is open. The meta
// sessions are the handles' own: a handle that can write holds one (its
// length and mtime are recorded at flush and close); a handle that only
// reads holds none, and the inode takes one ("hold") only when this client
// unlinks it or renames over it, so that it stays readable until its last
// close — the common case costs no commit. At most buffered_files_max inodes
// get buffers; handles of the others read and write straight through.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "client/file_impl.h"

namespace cistern::client {

struct OpenInode {
  uint64_t ino = 0;
  std::unique_ptr<FileImpl> file;
  // Type and permission bits as this client last saw them (the opens, its
  // own setattr calls).
  std::atomic<uint32_t> mode{0};
  // Guarded by OpenFiles' mutex:
  uint32_t handles = 0;
  uint64_t hold_session = 0;  // taken before this client unlinks the file
  bool buffered = false;
};

class OpenFiles {
 public:
  explicit OpenFiles(uint32_t buffered_max) : buffered_max_(buffered_max) {}

  // The entry of `inode` with one more handle, made on its first open
  // (`name` names the file in errors).
  std::shared_ptr<OpenInode> acquire(ClientImpl* client, const meta::Inode& inode,
                                     const std::string& name);
  // The entry of `ino` if open here.
  std::shared_ptr<OpenInode> find(uint64_t ino);
  bool empty() const { return open_count_.load(std::memory_order_relaxed) == 0; }
  uint32_t handles(const OpenInode& node);
  // One handle fewer. True when it was the last: the entry has left the
  // table and `*hold` is its hold session (0: none) for the caller to end.
  bool drop(OpenInode& node, uint64_t* hold);
  bool hasHold(const OpenInode& node);
  // Keeps `session` as the hold of `node` if it has none and is still open;
  // false: the caller ends it.
  bool keepHold(OpenInode& node, uint64_t session);

 private:
  const uint32_t buffered_max_;
  std::mutex mu_;
  std::unordered_map<uint64_t, std::shared_ptr<OpenInode>> open_;
  std::atomic<size_t> open_count_{0};
  uint32_t buffered_ = 0;
};

}  // namespace cistern::client
