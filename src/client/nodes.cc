// The client's calls that make and read nodes other than files and
// directories: mknod (FIFOs, sockets, devices) and symlinks.
#include <fmt/format.h>
#include <sys/stat.h>

#include "client/client_impl.h"
#include "proto/file_type.h"

namespace cistern::client {

namespace {

const net::Method& kMknod() {
  static const auto m = net::Method::of("cistern.meta.MetaService.Mknod");
  return m;
}
const net::Method& kSymlink() {
  static const auto m = net::Method::of("cistern.meta.MetaService.Symlink");
  return m;
}

}  // namespace

Error ClientImpl::mknod(const std::string& path, uint32_t mode, uint64_t rdev) {
  const meta::FileType type = meta::typeOfMode(mode);
  if (type == meta::REGULAR) {
    std::unique_ptr<File> f;
    if (Error e = open(path, O_WRONLY | O_CREAT | O_EXCL, mode & 07777, &f)) return e;
    return f->close();
  }
  if (!meta::isSpecial(type)) {
    return toError(Status(ErrorCode::kInvalidArgument,
                          fmt::format("mknod mode {:o} names no FIFO, socket or device", mode)),
                   path);
  }
  auto parts = split(path);
  if (!parts.ok()) return toError(parts.status(), path);
  if (parts->empty()) return toError(Status(ErrorCode::kAlreadyExists), path);
  auto p = resolveParent(*parts);
  if (!p.ok()) return toError(p.status(), path);
  meta::MknodReq req;
  *req.mutable_caller() = caller();
  req.set_parent(p->ino());
  req.set_name(parts->back());
  req.set_type(type);
  req.set_mode(mode & 07777);
  req.set_rdev(rdev);
  req.set_client(clientId());
  req.set_seq(nextSeq());
  meta::InodeResp resp;
  Status s = metaCall(kMknod(), req, &resp);
  forget(p->ino(), parts->back());
  return toError(s, path);
}

Error ClientImpl::symlink(const std::string& target, const std::string& path) {
  auto parts = split(path);
  if (!parts.ok()) return toError(parts.status(), path);
  if (parts->empty()) return toError(Status(ErrorCode::kAlreadyExists), path);
  auto p = resolveParent(*parts);
  if (!p.ok()) return toError(p.status(), path);
  meta::SymlinkReq req;
  *req.mutable_caller() = caller();
  req.set_parent(p->ino());
  req.set_name(parts->back());
  req.set_target(target);
  req.set_client(clientId());
  req.set_seq(nextSeq());
  meta::InodeResp resp;
  Status s = metaCall(kSymlink(), req, &resp);
  forget(p->ino(), parts->back());
  return toError(s, path);
}

// A symlink's target never changes, so the inode the path resolves to (from
// the dentry cache or a Lookup) has it.
Error ClientImpl::readlink(const std::string& path, std::string* target) {
  auto n = resolvePath(path);
  if (!n.ok()) return toError(n.status(), path);
  if (n->type() != meta::SYMLINK)
    return toError(Status(ErrorCode::kInvalidArgument, "not a symlink"), path);
  *target = n->symlink_target();
  return {};
}

}  // namespace cistern::client
