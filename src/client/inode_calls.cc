// libcistern's inode API (include/cistern/client.h): the namespace by inode
// number, each call as the given credentials. One meta call each; the
// client's own caches drop what a mutation changes.
#include <fmt/format.h>
#include <sys/stat.h>

#include "client/client_impl.h"
#include "client/methods.h"
#include "client/open_files.h"
#include "proto/file_type.h"

namespace cistern::client {
namespace {

constexpr uint32_t kRenameExchange = 2;  // RENAME_EXCHANGE (renameat2(2))

std::string inodeText(uint64_t ino) { return fmt::format("inode {}", ino); }
std::string entryText(uint64_t parent, const std::string& name) {
  return fmt::format("inode {}/{}", parent, name);
}

}  // namespace

// `out`, when given, becomes the inode's attributes.
Error ClientImpl::answer(const Status& s, const meta::InodeResp& resp, FileInfo* out,
                         const std::string& what) {
  if (!s.ok()) return toError(s, what);
  if (out) *out = infoOf(resp.inode());
  return {};
}
Error ClientImpl::answer(const Result<meta::Inode>& r, FileInfo* out, const std::string& what) {
  if (!r.ok()) return toError(r.status(), what);
  if (out) *out = infoOf(*r);
  return {};
}

FileInfo ClientImpl::infoOf(const meta::Inode& inode) {
  FileInfo info = toInfo(inode);
  if (inode.type() == meta::REGULAR) {
    // This client's own writes may not have reached meta yet.
    if (auto node = open_files_->find(inode.ino())) {
      if (auto size = node->file->unrecordedSize()) info.size = *size;
    }
  }
  return info;
}

meta::Caller callerOf(const Credentials& who) {
  meta::Caller c;
  c.set_uid(who.uid);
  c.set_gid(who.gid);
  for (uint32_t g : who.groups) c.add_groups(g);
  return c;
}

Error ClientImpl::lookup(const Credentials& who, uint64_t parent, const std::string& name,
                         FileInfo* out) {
  meta::LookupReq req;
  *req.mutable_caller() = callerOf(who);
  req.set_parent(parent);
  req.set_name(name);
  meta::InodeResp resp;
  return answer(metaCall(kLookup(), req, &resp), resp, out, entryText(parent, name));
}

Error ClientImpl::getattr(uint64_t ino, FileInfo* out) {
  meta::GetattrReq req;
  req.set_ino(ino);
  meta::InodeResp resp;
  return answer(metaCall(kGetattr(), req, &resp), resp, out, inodeText(ino));
}

Result<meta::Inode> ClientImpl::setattrAs(const meta::Caller& who, uint64_t ino,
                                          const AttrChanges& changes) {
  meta::SetattrReq req;
  *req.mutable_caller() = who;
  req.set_ino(ino);
  if (changes.mode) req.set_mode(*changes.mode & 07777);
  if (changes.uid) req.set_uid(*changes.uid);
  if (changes.gid) req.set_gid(*changes.gid);
  if (changes.atime_ns) req.set_atime_ns(*changes.atime_ns);
  if (changes.mtime_ns) req.set_mtime_ns(*changes.mtime_ns);
  req.set_atime_now(changes.atime_now);
  req.set_mtime_now(changes.mtime_now);
  stamp(&req);
  meta::InodeResp resp;
  Status s;
  std::shared_ptr<OpenInode> open_here = open_files_->find(ino);
  if (changes.size) {
    // A file open here: its buffered bytes go out first, and the cut
    // reaches past the length it has not recorded yet.
    uint64_t local_size = 0;
    if (open_here) {
      RETURN_ON_ERROR(open_here->file->flushBuffers());
      local_size = open_here->file->size();
    }
    // Cut first, commit second (docs/client.md, "Truncate").
    RETURN_ON_ERROR(cutForTruncate(who, ino, W_OK, *changes.size, local_size).status());
    req.set_size(*changes.size);
    s = setattrSize(&req, &resp);
  } else {
    s = metaCall(kSetattr(), req, &resp);
  }
  forgetAttrs(ino);
  RETURN_ON_ERROR(s);
  if (open_here) {
    if (changes.size) open_here->file->setSize(*changes.size);
    open_here->mode = meta::typeBits(resp.inode().type()) | (resp.inode().mode() & 07777);
  }
  return std::move(*resp.mutable_inode());
}

Error ClientImpl::setattr(const Credentials& who, uint64_t ino, const AttrChanges& changes,
                          FileInfo* out) {
  return answer(setattrAs(callerOf(who), ino, changes), out, inodeText(ino));
}

template <typename Req>
Result<meta::Inode> ClientImpl::makeName(const net::Method& method, const meta::Caller& who,
                                         uint64_t parent, const std::string& name, Req* req) {
  *req->mutable_caller() = who;
  req->set_parent(parent);
  req->set_name(name);
  stamp(req);
  meta::InodeResp resp;
  Status s = metaCall(method, *req, &resp);
  forget(parent, name);
  RETURN_ON_ERROR(s);
  return std::move(*resp.mutable_inode());
}

Result<meta::Inode> ClientImpl::metaMkdir(const meta::Caller& who, uint64_t parent,
                                          const std::string& name, uint32_t mode) {
  meta::MkdirReq req;
  req.set_mode(mode & 07777);
  return makeName(kMkdir(), who, parent, name, &req);
}

Result<meta::Inode> ClientImpl::metaMknod(const meta::Caller& who, uint64_t parent,
                                          const std::string& name, uint32_t mode, uint64_t rdev) {
  const meta::FileType type = meta::typeOfMode(mode);
  if (type == meta::REGULAR) {
    meta::CreateReq req;
    req.set_mode(mode & 07777);
    req.set_exclusive(true);
    return makeName(kCreate(), who, parent, name, &req);
  }
  meta::MknodReq req;
  req.set_type(type);
  req.set_mode(mode & 07777);
  req.set_rdev(rdev);
  return makeName(kMknod(), who, parent, name, &req);
}

Result<meta::Inode> ClientImpl::metaSymlink(const meta::Caller& who, uint64_t parent,
                                            const std::string& name, const std::string& target) {
  meta::SymlinkReq req;
  req.set_target(target);
  return makeName(kSymlink(), who, parent, name, &req);
}

Status ClientImpl::metaRemove(const meta::Caller& who, uint64_t parent, const std::string& name,
                              bool dir) {
  if (!dir) holdIfOpen(parent, name);
  meta::RemoveReq req;
  *req.mutable_caller() = who;
  req.set_parent(parent);
  req.set_name(name);
  stamp(&req);
  meta::Empty resp;
  Status s = metaCall(dir ? kRmdir() : kUnlink(), req, &resp);
  forget(parent, name);
  return s;
}

Status ClientImpl::metaRename(const meta::Caller& who, uint64_t parent, const std::string& name,
                              uint64_t new_parent, const std::string& new_name, uint32_t flags) {
  if (!(flags & kRenameExchange)) holdIfOpen(new_parent, new_name);  // replaced if it exists
  meta::RenameReq req;
  *req.mutable_caller() = who;
  req.set_src_parent(parent);
  req.set_src_name(name);
  req.set_dst_parent(new_parent);
  req.set_dst_name(new_name);
  req.set_flags(flags);
  stamp(&req);
  meta::Empty resp;
  Status s = metaCall(kRename(), req, &resp);
  forget(parent, name);
  forget(new_parent, new_name);
  return s;
}

Error ClientImpl::mkdirAt(const Credentials& who, uint64_t parent, const std::string& name,
                          uint32_t mode, FileInfo* out) {
  return answer(metaMkdir(callerOf(who), parent, name, mode), out, entryText(parent, name));
}

Error ClientImpl::mknodAt(const Credentials& who, uint64_t parent, const std::string& name,
                          uint32_t mode, uint64_t rdev, FileInfo* out) {
  return answer(metaMknod(callerOf(who), parent, name, mode, rdev), out, entryText(parent, name));
}

Error ClientImpl::symlinkAt(const Credentials& who, uint64_t parent, const std::string& name,
                            const std::string& target, FileInfo* out) {
  return answer(metaSymlink(callerOf(who), parent, name, target), out, entryText(parent, name));
}

Error ClientImpl::linkAt(const Credentials& who, uint64_t ino, uint64_t new_parent,
                         const std::string& new_name, FileInfo* out) {
  meta::LinkReq req;
  *req.mutable_caller() = callerOf(who);
  req.set_ino(ino);
  req.set_new_parent(new_parent);
  req.set_new_name(new_name);
  stamp(&req);
  meta::InodeResp resp;
  Status s = metaCall(kLink(), req, &resp);
  forget(new_parent, new_name);
  forgetAttrs(ino);
  return answer(s, resp, out, entryText(new_parent, new_name));
}

Error ClientImpl::unlinkAt(const Credentials& who, uint64_t parent, const std::string& name) {
  return toError(metaRemove(callerOf(who), parent, name, false), entryText(parent, name));
}

Error ClientImpl::rmdirAt(const Credentials& who, uint64_t parent, const std::string& name) {
  return toError(metaRemove(callerOf(who), parent, name, true), entryText(parent, name));
}

Error ClientImpl::renameAt(const Credentials& who, uint64_t parent, const std::string& name,
                           uint64_t new_parent, const std::string& new_name, unsigned flags) {
  return toError(metaRename(callerOf(who), parent, name, new_parent, new_name, flags),
                 entryText(parent, name));
}

// A symlink's target never changes: the cached inode has it.
Error ClientImpl::readlinkAt(uint64_t ino, std::string* target) {
  auto n = getattr(ino);
  if (!n.ok()) return toError(n.status(), inodeText(ino));
  if (n->type() != meta::SYMLINK)
    return toError(Status(ErrorCode::kInvalidArgument, "not a symlink"), inodeText(ino));
  *target = n->symlink_target();
  return {};
}

Error ClientImpl::access(const Credentials& who, uint64_t ino, int mask) {
  meta::AccessReq req;
  *req.mutable_caller() = callerOf(who);
  req.set_ino(ino);
  req.set_mask(static_cast<uint32_t>(mask & (R_OK | W_OK | X_OK)));  // the same bits as kMay*
  meta::Empty resp;
  return toError(metaCall(kAccess(), req, &resp), inodeText(ino));
}

Result<DirPage> ClientImpl::readdirAs(const meta::Caller& who, uint64_t ino,
                                      const std::string& cookie, uint32_t limit, bool attributes) {
  meta::ReaddirReq req;
  *req.mutable_caller() = who;
  req.set_ino(ino);
  req.set_cookie(cookie);
  req.set_limit(limit);
  req.set_plus(attributes);
  meta::ReaddirResp resp;
  RETURN_ON_ERROR(metaCall(kReaddir(), req, &resp));
  DirPage out;
  out.entries.reserve(static_cast<size_t>(resp.names_size()));
  for (int i = 0; i < resp.names_size(); ++i) {
    DirEntry e;
    e.name = resp.names(i);
    if (i < resp.inodes_size() && resp.inodes(i).ino() != 0) {
      e.info = infoOf(resp.inodes(i));
    } else if (i < resp.entries_size()) {  // no attributes asked, or removed meanwhile
      e.info.ino = resp.entries(i).ino();
      e.info.mode = meta::typeBits(resp.entries(i).type());
    }
    out.entries.push_back(std::move(e));
  }
  if (resp.names_size() > 0) out.next_cookie = resp.next_cookie();
  return out;
}

Error ClientImpl::readdirAt(const Credentials& who, uint64_t ino, const std::string& cookie,
                            uint32_t limit, bool attributes, DirPage* out) {
  auto page = readdirAs(callerOf(who), ino, cookie, limit, attributes);
  if (!page.ok()) return toError(page.status(), inodeText(ino));
  *out = std::move(page).value();
  return {};
}

Error ClientImpl::setxattr(const Credentials& who, uint64_t ino, const std::string& name,
                           const std::string& value, int flags) {
  meta::XattrReq req;
  *req.mutable_caller() = callerOf(who);
  req.set_ino(ino);
  req.set_name(name);
  req.set_value(value);
  req.set_flags(static_cast<uint32_t>(flags));  // XATTR_CREATE / XATTR_REPLACE, as in meta
  stamp(&req);
  meta::Empty resp;
  Status s = metaCall(kSetXattr(), req, &resp);
  forgetAttrs(ino);
  return toError(s, inodeText(ino));
}

Error ClientImpl::getxattr(const Credentials& who, uint64_t ino, const std::string& name,
                           std::string* value) {
  meta::XattrReq req;
  *req.mutable_caller() = callerOf(who);
  req.set_ino(ino);
  req.set_name(name);
  meta::XattrResp resp;
  if (Status s = metaCall(kGetXattr(), req, &resp); !s.ok()) return toError(s, inodeText(ino));
  *value = std::move(*resp.mutable_value());
  return {};
}

Error ClientImpl::listxattr(const Credentials& who, uint64_t ino, std::vector<std::string>* names) {
  meta::XattrReq req;
  *req.mutable_caller() = callerOf(who);
  req.set_ino(ino);
  meta::XattrResp resp;
  if (Status s = metaCall(kListXattr(), req, &resp); !s.ok()) return toError(s, inodeText(ino));
  names->assign(resp.names().begin(), resp.names().end());
  return {};
}

Error ClientImpl::removexattr(const Credentials& who, uint64_t ino, const std::string& name) {
  meta::XattrReq req;
  *req.mutable_caller() = callerOf(who);
  req.set_ino(ino);
  req.set_name(name);
  stamp(&req);
  meta::Empty resp;
  Status s = metaCall(kRemoveXattr(), req, &resp);
  forgetAttrs(ino);
  return toError(s, inodeText(ino));
}

}  // namespace cistern::client
