// Internal to the create-like operations: checks on the parent directory and
// the fields every new inode gets.
#pragma once

#include "meta/meta_store.h"

namespace cistern::meta {

// The directory `parent` after checking that it exists, is a directory, and
// that `c` may search it (x). Adding or removing entries needs w as well,
// checked once the operation knows it will change the directory (so that,
// as on Linux, an existing name gives kAlreadyExists before kPermissionDenied).
Result<Inode> searchableDir(kv::ReadTransaction& t, const Caller& c, uint64_t parent);

// The directory `parent` in which `c` is about to create the new name `name`:
// searchable, `name` absent (kAlreadyExists otherwise), and writable by `c`.
Result<Inode> dirForNewName(kv::ReadTransaction& t, const Caller& c, uint64_t parent,
                            std::string_view name);

// The entry `name` of directory `parent` that `c` is about to remove or
// replace: the directory (searchable and writable by `c`) and the inode the
// entry names. The type and sticky-bit checks are the caller's: their order
// decides the errno.
struct Removal {
  Inode dir;
  Inode victim;
};
Result<Removal> entryToRemove(kv::ReadTransaction& t, const Caller& c, uint64_t parent,
                              std::string_view name);

// A new inode owned by `c` in directory `dir`: mode masked to permission
// bits, gid and S_ISGID inherited from a set-group-ID directory, its
// tenant and parent the directory's, times now.
Inode newInode(uint64_t ino, FileType type, uint32_t mode, const Caller& c, const Inode& dir,
               int64_t now_ns);

// Stores new inode `n`, counts it (in the store and in the quotas above
// `parent`: kQuotaExceeded when one has no inode left), and names it
// `name` in directory `parent`.
Status insertNewInode(kv::Transaction& t, uint64_t parent, std::string_view name, const Inode& n);

Result<Inode> parseInode(const std::string& bytes);

}  // namespace cistern::meta
