// The directory view of a pack (docs/pack_format.md, "Directory view"): in
// a directory that holds a pack, the hidden name `.view` is a read-only
// tree of its samples, each a file, "train/cat/001.jpg" at
// `<pack>/.view/train/cat/001.jpg`. Nothing of it is in the KV: its nodes
// are synthetic ids answered from the pack's index (names by binary
// search, absent names by its Bloom filter, which also holds the
// directory prefixes), and a sample's bytes come from its shard with one
// read, checked against its CRC32C.
//
// Node ids: bit 63 set (meta's inode numbers count up from 1 and never
// reach it) | view slot (12 bits) | level (8 bits: 255 a file; L a
// directory, the first L components of the name of entry `index`, which
// is the first entry under it; 0 the view's root) | entry index (43 bits).
// A slot is one open pack (its reader and index cache), held while the
// kernel holds a lookup of any of its nodes (lookup counts, forget); at
// most kMaxViews at once, each with kViewCacheBytes of index pages. A view
// shows the generation that was newest when `.view` was looked up; a
// lookup after an append opens a new slot for the new generation.
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <memory>
#include <mutex>
#include <string>

#include "cistern/client.h"

namespace cistern::fuse {

class PackViews {
 public:
  static constexpr const char* kName = ".view";
  static constexpr uint32_t kMaxViews = 16;
  static constexpr uint64_t kViewCacheBytes = 32ull << 20;
  // Samples up to this size are read whole, and checked, at open; larger
  // ones by range, checked when read through to their end.
  static constexpr uint64_t kWholeReadBytes = 1ull << 20;
  // Entry and attribute timeouts of view nodes: a slot's contents never change.
  static constexpr double kTimeoutS = 3600;

  explicit PackViews(Client& client);
  ~PackViews();

  static bool isView(uint64_t node) { return (node >> 63) != 0; }

  // `.view` looked up in the directory `dir` (whose attributes are
  // `dir_info`): its root if `dir` holds a pack; ENOENT if it does not;
  // EMFILE when kMaxViews views are in use. The name `.view` is cached by
  // the kernel for `entry_timeout_s` (the mount's): a lookup after that
  // sees the pack's newest generation.
  Error lookupRoot(const Credentials& who, const FileInfo& dir_info, double entry_timeout_s,
                   fuse_entry_param* out);
  Error lookup(uint64_t parent, const std::string& name, fuse_entry_param* out);
  Error getattr(uint64_t node, struct stat* out);
  // A sample opened for reading (EROFS for writing, EISDIR for a directory).
  Error open(uint64_t node, int flags, std::unique_ptr<File>* out);
  // One readdir reply's entries from offset `off` into buf[0, size);
  // `plus`: with attributes (each entry then counts as a lookup).
  Error readdir(fuse_req_t req, uint64_t node, off_t off, bool plus, char* buf, size_t size,
                size_t* used);
  // The kernel dropped `n` lookups of `node`.
  void forget(uint64_t node, uint64_t n);
  // Unless a lookup's reply reached the kernel: takes back its count.
  void unref(uint64_t node) { forget(node, 1); }

 private:
  struct Slot;
  Client& client_;
  std::mutex mu_;  // slot assignment and lookup counts
  std::unique_ptr<Slot[]> slots_;
};

}  // namespace cistern::fuse
