#include "meta/fsck.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <optional>
#include <set>
#include <unordered_map>

#include "kv/key_codec.h"
#include "meta/schema.h"

namespace cistern::meta {
namespace {

// Calls fn(key, value) for every row of [begin, end), a page at a time.
// The inode number that follows the prefix of a session, inline or GC key.
Result<uint64_t> inoOf(std::string_view key) {
  kv::KeyReader r(key);
  ASSIGN_OR_RETURN(auto p, r.prefix());
  (void)p;
  return r.u64();
}

struct Node {
  FileType type;
  uint32_t nlink;
  uint64_t parent;
  uint32_t links = 0;          // dentries naming it
  uint64_t dentry_parent = 0;  // for directories: where its dentry is
  bool data_inline = false;
  uint64_t size = 0;
  bool inline_found = false;  // its (kInlineData, ino) row exists
};

}  // namespace

Result<FsckReport> fsck(kv::Engine& engine) {
  FsckReport report;
  auto problem = [&](std::string s) { report.problems.push_back(std::move(s)); };
  std::unordered_map<uint64_t, Node> nodes;
  std::set<uint64_t> open;
  auto t = engine.beginRead();
  const std::string inode_begin = kv::KeyWriter(kv::Prefix::kInode).key();

  RETURN_ON_ERROR(
      scanRange(*t, inode_begin, kv::strinc(inode_begin), [&](const kv::KeyValue& row) -> Status {
        Inode n;
        if (!n.ParseFromString(row.value)) {
          problem("an inode record does not parse");
          return Status::OK();
        }
        Node& node = nodes[n.ino()];
        node = Node{n.type(), n.nlink(), n.parent()};
        node.data_inline = n.data_inline();
        node.size = n.size();
        report.inodes++;
        return Status::OK();
      }));
  const std::string session_begin = kv::KeyWriter(kv::Prefix::kSession).key();
  RETURN_ON_ERROR(scanRange(*t, session_begin, kv::strinc(session_begin),
                            [&](const kv::KeyValue& row) -> Status {
                              ASSIGN_OR_RETURN(uint64_t ino, inoOf(row.key));
                              open.insert(ino);
                              report.sessions++;
                              if (!nodes.count(ino))
                                problem(fmt::format("session of missing inode {}", ino));
                              return Status::OK();
                            }));
  const std::string inline_begin = kv::KeyWriter(kv::Prefix::kInlineData).key();
  RETURN_ON_ERROR(
      scanRange(*t, inline_begin, kv::strinc(inline_begin), [&](const kv::KeyValue& row) -> Status {
        ASSIGN_OR_RETURN(uint64_t ino, inoOf(row.key));
        auto it = nodes.find(ino);
        if (it == nodes.end() || !it->second.data_inline) {
          problem(fmt::format("inline bytes of inode {}, which is not an inline file", ino));
        } else if (row.value.size() != it->second.size) {
          problem(fmt::format("inode {} has size {} but {} inline bytes", ino, it->second.size,
                              row.value.size()));
        }
        if (it != nodes.end()) it->second.inline_found = true;
        return Status::OK();
      }));
  const std::string dentry_begin = kv::KeyWriter(kv::Prefix::kDentry).key();
  RETURN_ON_ERROR(
      scanRange(*t, dentry_begin, kv::strinc(dentry_begin), [&](const kv::KeyValue& row) -> Status {
        kv::KeyReader r(row.key);
        ASSIGN_OR_RETURN(auto p, r.prefix());
        (void)p;
        ASSIGN_OR_RETURN(uint64_t parent, r.u64());
        ASSIGN_OR_RETURN(std::string name, r.bytes());
        report.dentries++;
        DirEntry e;
        if (!e.ParseFromString(row.value)) {
          problem(fmt::format("dentry {}/{} does not parse", parent, name));
          return Status::OK();
        }
        auto dir = nodes.find(parent);
        if (dir == nodes.end() || dir->second.type != DIRECTORY) {
          problem(fmt::format("dentry {}/{} is in a missing directory", parent, name));
        }
        auto target = nodes.find(e.ino());
        if (target == nodes.end()) {
          problem(fmt::format("dentry {}/{} points to missing inode {}", parent, name, e.ino()));
          return Status::OK();
        }
        if (target->second.type != e.type()) {
          problem(fmt::format("dentry {}/{} says type {} but inode {} is type {}", parent, name,
                              static_cast<int>(e.type()), e.ino(),
                              static_cast<int>(target->second.type)));
        }
        target->second.links++;
        target->second.dentry_parent = parent;
        return Status::OK();
      }));
  const std::string gc_begin = gcBegin();
  RETURN_ON_ERROR(scanRange(*t, gc_begin, gcEnd(), [&](const kv::KeyValue& row) -> Status {
    ASSIGN_OR_RETURN(uint64_t ino, inoOf(row.key));
    report.gc_entries++;
    GcEntry e;
    if (!e.ParseFromString(row.value)) {
      problem(fmt::format("gc entry of inode {} does not parse", ino));
      return Status::OK();
    }
    auto it = nodes.find(ino);
    if (e.whole_file() && it != nodes.end() && !(it->second.nlink == 0 && open.count(ino))) {
      problem(fmt::format("whole-file gc entry for inode {}, which is still linked", ino));
    }
    return Status::OK();
  }));

  ASSIGN_OR_RETURN(int64_t count, inodeCount(*t, /*snapshot=*/false));
  if (count != static_cast<int64_t>(report.inodes)) {
    problem(fmt::format("inode counter says {} but {} inodes exist", count, report.inodes));
  }
  for (auto& [ino, n] : nodes) {
    if (ino == kRootIno) {
      if (n.type != DIRECTORY) problem("the root is not a directory");
      if (n.links != 0) problem("the root has a dentry");
      continue;
    }
    if (n.type == DIRECTORY) {
      if (n.links != 1) {
        problem(fmt::format("directory {} has {} dentries", ino, n.links));
      } else if (n.parent != n.dentry_parent) {
        problem(fmt::format("directory {} says parent {} but its dentry is in {}", ino, n.parent,
                            n.dentry_parent));
      }
      // Following parents must reach the root within as many steps as there are directories.
      uint64_t at = ino;
      size_t steps = 0;
      while (at != kRootIno && steps <= nodes.size()) {
        auto up = nodes.find(at);
        if (up == nodes.end()) break;
        at = up->second.parent;
        ++steps;
      }
      if (at != kRootIno)
        problem(fmt::format("directory {} does not reach the root (cycle or lost parent)", ino));
      continue;
    }
    if (n.data_inline && !n.inline_found)
      problem(fmt::format("inline inode {} has no inline bytes", ino));
    if (n.links == 0) {
      if (!(n.nlink == 0 && open.count(ino)))
        problem(fmt::format("orphan inode {} (nlink {}, no dentry)", ino, n.nlink));
    } else if (n.links != n.nlink) {
      problem(fmt::format("inode {} has nlink {} but {} dentries", ino, n.nlink, n.links));
    }
  }
  return report;
}

namespace {

// What the namespace says about the chunks of one inode.
struct Owner {
  bool exists = false;      // a regular file with this inode number
  bool gc_queued = false;   // a GC entry will remove its chunks
  uint64_t first_past = 0;  // chunks from this index on are past its length
};

Result<Owner> ownerOf(kv::Engine& engine, uint64_t ino) {
  Owner o;
  RETURN_ON_ERROR(kv::runReadTransaction(engine, [&](kv::ReadTransaction& t) -> Status {
    o = Owner();
    ASSIGN_OR_RETURN(auto n, loadInode(t, ino));
    if (n && n->type() == REGULAR) {
      o.exists = true;
      uint64_t chunk = std::max<uint64_t>(n->layout().chunk_size(), 1);
      o.first_past = n->data_inline() ? 1 : (n->size() + chunk - 1) / chunk;
    }
    const std::string begin = kv::KeyWriter(kv::Prefix::kGcQueue).u64(ino).key();
    ASSIGN_OR_RETURN(auto gc, t.getRange(begin, kv::strinc(begin), {.limit = 1}));
    o.gc_queued = !gc.kvs.empty();
    return Status::OK();
  }));
  return o;
}

}  // namespace

Result<ChunkCheck> checkChunks(kv::Engine& engine, ChunkLister& lister) {
  ChunkCheck check;
  constexpr uint32_t kPage = 1000;
  for (size_t target = 0; target < lister.targets(); ++target) {
    uint64_t ino = 0;
    uint32_t index = 0;
    std::optional<uint64_t> owner_ino;
    Owner owner;
    for (;;) {
      ASSIGN_OR_RETURN(auto ids, lister.list(target, ino, index, kPage));
      for (const auto& [chunk_ino, chunk_index] : ids) {
        check.chunks++;
        if (owner_ino != chunk_ino) {
          ASSIGN_OR_RETURN(owner, ownerOf(engine, chunk_ino));
          owner_ino = chunk_ino;
        }
        if (owner.exists) {
          if (chunk_index >= owner.first_past) check.past_end++;
          continue;
        }
        if (owner.gc_queued) continue;
        // Gone and not queued: unless a delete and its GC ran since, an orphan.
        ASSIGN_OR_RETURN(auto again, lister.list(target, chunk_ino, chunk_index, 1));
        if (again.empty() || again[0] != std::make_pair(chunk_ino, chunk_index)) continue;
        ASSIGN_OR_RETURN(Owner now, ownerOf(engine, chunk_ino));
        if (now.exists || now.gc_queued) continue;
        check.orphans++;
        if (check.orphan_list.size() < ChunkCheck::kOrphansListedMax)
          check.orphan_list.push_back({target, chunk_ino, chunk_index});
        if (check.problems.size() < 20) {
          check.problems.push_back(fmt::format("chunk {}:{} on target {} belongs to no file",
                                               chunk_ino, chunk_index, target + 1));
        }
      }
      if (ids.size() < kPage) break;
      ino = ids.back().first;
      index = ids.back().second + 1;
      if (index == 0) ++ino;  // past the last index of that inode
    }
  }
  if (check.orphans > check.problems.size()) {
    check.problems.push_back(
        fmt::format("{} more chunks belong to no file", check.orphans - check.problems.size()));
  }
  return check;
}

}  // namespace cistern::meta
