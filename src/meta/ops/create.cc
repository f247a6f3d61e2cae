// create: a new regular file with its layout fixed now: chunk size and stripe
// width from the parent directory's layout or the defaults, chains taken from
// the chain table starting at an offset that a hash of the inode number
// picks, so files spread over all chains (inode numbers themselves come in
// strides: a plain modulo would favour some chains).
#include <fmt/format.h>

#include "meta/meta_store.h"
#include "meta/ops/new_inode.h"
#include "meta/permission.h"
#include "meta/schema.h"

namespace cistern::meta {
namespace {

Result<Layout> chooseLayout(kv::ReadTransaction& t, const MetaOptions& o, const Inode& dir,
                            uint64_t ino) {
  ASSIGN_OR_RETURN(std::vector<uint32_t> chains, loadChainIds(t));
  if (chains.empty())
    return Status(ErrorCode::kResourceExhausted, "no storage chains in the chain table");
  uint32_t chunk = o.chunk_size_default;
  uint32_t width = o.stripe_width_default;
  if (dir.has_dir_layout()) {
    if (dir.dir_layout().chunk_size()) chunk = dir.dir_layout().chunk_size();
    if (dir.dir_layout().stripe_width()) width = dir.dir_layout().stripe_width();
  }
  if (width == 0 || width > chains.size()) width = static_cast<uint32_t>(chains.size());
  Layout l;
  l.set_chunk_size(chunk);
  l.set_stripe_width(width);
  uint64_t h = ino + 0x9e3779b97f4a7c15ull;  // splitmix64's finalizer
  h = (h ^ (h >> 30)) * 0xbf58476d1ce4e5b9ull;
  h = (h ^ (h >> 27)) * 0x94d049bb133111ebull;
  h ^= h >> 31;
  size_t start = h % chains.size();
  for (uint32_t i = 0; i < width; ++i) l.add_chains(chains[(start + i) % chains.size()]);
  return l;
}

}  // namespace

Result<Inode> MetaStore::create(const Caller& c, uint64_t parent, std::string_view name,
                                uint32_t mode, bool exclusive, const RequestId& rid) {
  ASSIGN_OR_RETURN(Opened o, createImpl(c, parent, name, mode, exclusive, nullptr, rid));
  return std::move(o.inode);
}

Result<MetaStore::Opened> MetaStore::createFile(const Caller& c, uint64_t parent,
                                                std::string_view name, uint32_t mode,
                                                bool exclusive, const RequestId& rid) {
  return createImpl(c, parent, name, mode, exclusive, nullptr, rid);
}

Result<MetaStore::Opened> MetaStore::createOpen(const Caller& c, uint64_t parent,
                                                std::string_view name, uint32_t mode,
                                                bool exclusive, std::string_view client,
                                                const RequestId& rid) {
  return createImpl(c, parent, name, mode, exclusive, &client, rid);
}

// The recorded result is an OpenResp-like pair (inode, session) so that a
// replayed request returns the session the first attempt created.
Result<MetaStore::Opened> MetaStore::createImpl(const Caller& c, uint64_t parent,
                                                std::string_view name, uint32_t mode,
                                                bool exclusive, const std::string_view* client,
                                                const RequestId& rid) {
  RETURN_ON_ERROR(checkName(name));
  if (isDotOrDotDot(name)) return Status(ErrorCode::kIsDirectory, name);
  ASSIGN_OR_RETURN(uint64_t ino, allocator_.next());
  uint64_t session = 0;
  if (client) {
    ASSIGN_OR_RETURN(session, allocator_.next());
  }
  ASSIGN_OR_RETURN(std::string bytes, mutate(rid, [&](kv::Transaction& t) -> Result<std::string> {
                     ASSIGN_OR_RETURN(Inode dir, searchableDir(t, c, parent));
                     ASSIGN_OR_RETURN(auto existing, loadDentry(t, parent, name));
                     if (existing) {
                       if (exclusive) return Status(ErrorCode::kAlreadyExists, name);
                       if (existing->type() == DIRECTORY)
                         return Status(ErrorCode::kIsDirectory, name);
                       InodeResp r;
                       ASSIGN_OR_RETURN(*r.mutable_inode(), requireInode(t, existing->ino()));
                       return r.SerializeAsString();
                     }
                     RETURN_ON_ERROR(checkAccess(dir, c, kMayWrite));
                     InodeResp r;
                     r.set_created(true);
                     Inode& n = *r.mutable_inode();
                     n = newInode(ino, REGULAR, mode, c, dir, nowNs());
                     ASSIGN_OR_RETURN(*n.mutable_layout(), chooseLayout(t, options_, dir, ino));
                     // Its bytes may stay inline if this session stays the only writer (inline.cc).
                     if (client && options_.inline_max_bytes > 0) n.set_inline_ok(true);
                     RETURN_ON_ERROR(insertNewInode(t, parent, name, n));
                     if (client) {
                       Session s;
                       s.set_client(std::string(*client));
                       s.set_opened_ns(n.mtime_ns());
                       t.set(sessionKey(ino, session), s.SerializeAsString());
                       r.set_session(session);
                     }
                     return r.SerializeAsString();
                   }));
  InodeResp r;
  if (!r.ParseFromString(bytes))
    return Status(ErrorCode::kCorruption, fmt::format("create result of {} does not parse", name));
  return Opened{std::move(*r.mutable_inode()), r.session(), {}, r.created()};
}

}  // namespace cistern::meta
