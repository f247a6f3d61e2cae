// fsck: checks the namespace's invariants in one consistent snapshot.
//
//   - every dentry is in an existing directory and points to an existing inode of its type;
//   - a file's nlink equals the number of dentries naming it; a file with none
//     is allowed only while open for writing after unlink (nlink 0, a session);
//   - every directory but the root has exactly one dentry, in the directory its
//     `parent` field names; following parents from any directory reaches the root;
//   - every session belongs to an existing inode; every whole-file GC entry
//     belongs to an inode that is gone or open-unlinked.
// Memory grows with the number of inodes (an offline tool). Read-only.
#pragma once

#include <string>
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

}  // namespace cistern::meta
