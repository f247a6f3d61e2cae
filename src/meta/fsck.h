// fsck: checks the namespace's invariants in one consistent snapshot.
//
//   - every dentry is in an existing directory and points to an existing inode of its type;
//   - a file's nlink equals the number of dentries naming it; a file with none
//     is allowed only while open for writing after unlink (nlink 0, a session);
//   - every directory but the root has exactly one dentry, in the directory its
//     `parent` field names; following parents from any directory reaches the root;
//   - every session belongs to an existing inode; every whole-file GC entry
//     belongs to an inode that is gone or open-unlinked;
//   - (checkChunks) every chunk in storage belongs to a file, or to a GC entry.
// Memory grows with the number of inodes (an offline tool). Read-only.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "common/result.h"
#include "kv/engine.h"

namespace cistern::meta {

struct FsckReport {
  uint64_t inodes = 0;
  uint64_t dentries = 0;
  uint64_t sessions = 0;
  uint64_t gc_entries = 0;
  std::vector<std::string> problems;  // one sentence each; empty when clean
  bool clean() const { return problems.empty(); }
};

Result<FsckReport> fsck(kv::Engine& engine);

// The chunk ids storage targets hold, for checkChunks().
class ChunkLister {
 public:
  virtual ~ChunkLister() = default;
  virtual size_t targets() const = 0;
  // Up to `limit` chunk ids of target `target` at or after (inode, index), in
  // (inode, index) order; fewer only at the end.
  virtual Result<std::vector<std::pair<uint64_t, uint32_t>>> list(size_t target, uint64_t inode,
                                                                  uint32_t index,
                                                                  uint32_t limit) = 0;
};

struct ChunkCheck {
  struct At {
    size_t target;
    uint64_t inode;
    uint32_t index;
  };
  static constexpr size_t kOrphansListedMax = 100000;
  uint64_t chunks = 0;
  // Chunks of files past their recorded length: bytes a writer has not made
  // part of the length (yet, or ever: one that died before its close).
  uint64_t past_end = 0;
  // Chunks of no file with no GC entry to remove them: a write that landed
  // after its file was deleted. Each is a problem (at most 20 named).
  uint64_t orphans = 0;
  std::vector<At> orphan_list;  // the first kOrphansListedMax of them
  std::vector<std::string> problems;
};

// Every chunk of every target against the namespace, one file at a time
// (memory does not grow with the namespace). A chunk whose file looks gone
// is listed and looked up again before it counts as an orphan, since a
// delete may race the scan. Read-only.
Result<ChunkCheck> checkChunks(kv::Engine& engine, ChunkLister& lister);

}  // namespace cistern::meta
