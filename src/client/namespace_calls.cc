// libcistern: the namespace calls on paths (stat, list, mkdir, rename,
// unlink, rmdir, truncate, mknod, symlink, readlink; open is in
// open_files.cc).
#include <fmt/format.h>
#include <sys/stat.h>

#include "client/client_impl.h"
#include "client/methods.h"
#include "proto/file_type.h"

namespace cistern::client {
FileInfo toInfo(const meta::Inode& n) {
  FileInfo f;
  f.ino = n.ino();
  f.mode = meta::typeBits(n.type()) | (n.mode() & 07777);
  f.nlink = n.nlink();
  f.uid = n.uid();
  f.gid = n.gid();
  f.size = n.type() == meta::SYMLINK ? n.symlink_target().size() : n.size();
  f.mtime_ns = n.mtime_ns();
  f.ctime_ns = n.ctime_ns();
  f.atime_ns = n.atime_ns();
  f.chunk_size = n.layout().chunk_size();
  f.rdev = n.rdev();
  f.parent = n.parent();
  return f;
}

Error ClientImpl::stat(const std::string& path, FileInfo* out) {
  auto n = resolvePath(path);
  if (!n.ok()) return toError(n.status(), path);
  *out = infoOf(*n);
  return {};
}

Error ClientImpl::list(const std::string& path, std::vector<DirEntry>* out) {
  out->clear();
  auto dir = resolvePath(path);
  if (!dir.ok()) return toError(dir.status(), path);
  if (dir->type() != meta::DIRECTORY) return toError(Status(ErrorCode::kNotDirectory), path);
  std::string cookie;
  do {
    auto page = readdirAs(caller(), dir->ino(), cookie, 1000, /*attributes=*/true);
    if (!page.ok()) return toError(page.status(), path);
    for (auto& e : page->entries) out->push_back(std::move(e));
    cookie = std::move(page->next_cookie);
  } while (!cookie.empty());
  return {};
}

Error ClientImpl::mkdir(const std::string& path, uint32_t mode, bool parents) {
  auto parts = split(path);
  if (!parts.ok()) return toError(parts.status(), path);
  if (parts->empty()) {
    if (parents) return {};
    return toError(Status(ErrorCode::kAlreadyExists), path);
  }
  uint64_t parent = kRootIno;
  size_t first = parents ? 0 : parts->size() - 1;
  if (!parents) {
    auto p = resolveParent(*parts);
    if (!p.ok()) return toError(p.status(), path);
    parent = p->ino();
  }
  for (size_t i = first; i < parts->size(); ++i) {
    const std::string& name = (*parts)[i];
    if (parents) {
      auto existing = lookup(parent, name);
      if (existing.ok()) {
        if (existing->type() != meta::DIRECTORY)
          return toError(Status(ErrorCode::kNotDirectory), path);
        parent = existing->ino();
        continue;
      }
      if (existing.status().code() != ErrorCode::kNotFound) return toError(existing.status(), path);
    }
    auto made = metaMkdir(caller(), parent, name, mode);
    if (!made.ok() && parents && made.code() == ErrorCode::kAlreadyExists) {
      auto again = lookup(parent, name);  // made by someone else meanwhile
      if (!again.ok()) return toError(again.status(), path);
      if (again->type() != meta::DIRECTORY) return toError(Status(ErrorCode::kNotDirectory), path);
      parent = again->ino();
      continue;
    }
    if (!made.ok()) return toError(made.status(), path);
    remember(parent, name, *made);
    parent = made->ino();
  }
  return {};
}

Error ClientImpl::rename(const std::string& from, const std::string& to) {
  auto a = split(from);
  if (!a.ok()) return toError(a.status(), from);
  auto b = split(to);
  if (!b.ok()) return toError(b.status(), to);
  if (a->empty() || b->empty()) return toError(Status(ErrorCode::kNotPermitted), from);
  auto pa = resolve(*a, a->size() - 1);
  if (!pa.ok()) return toError(pa.status(), from);
  auto pb = resolve(*b, b->size() - 1);
  if (!pb.ok()) return toError(pb.status(), to);
  Status s = metaRename(caller(), pa->ino(), a->back(), pb->ino(), b->back(), 0);
  if (!s.ok()) {
    // Name the side the error is about.
    bool dst = s.code() == ErrorCode::kNotEmpty || s.code() == ErrorCode::kIsDirectory ||
               s.code() == ErrorCode::kAlreadyExists;
    return toError(s, dst ? to : from);
  }
  return {};
}

// unlink and rmdir: the meta service checks the type and permissions.
Error ClientImpl::removeName(const std::string& path, bool dir) {
  auto parts = split(path);
  if (!parts.ok()) return toError(parts.status(), path);
  if (parts->empty()) {
    return toError(
        dir ? Status(ErrorCode::kNotPermitted, "the root") : Status(ErrorCode::kIsDirectory), path);
  }
  auto p = resolve(*parts, parts->size() - 1);
  if (!p.ok()) return toError(p.status(), path);
  return toError(metaRemove(caller(), p->ino(), parts->back(), dir), path);
}

Error ClientImpl::unlink(const std::string& path) { return removeName(path, false); }
Error ClientImpl::rmdir(const std::string& path) { return removeName(path, true); }

Error ClientImpl::truncate(const std::string& path, uint64_t size) {
  auto n = resolvePath(path);
  if (!n.ok()) return toError(n.status(), path);
  // Cut first, commit second (setattrAs): a truncate that stops between them
  // leaves no old byte past the new end.
  return toError(setattrAs(caller(), n->ino(), {.size = size}).status(), path);
}

Error ClientImpl::mknod(const std::string& path, uint32_t mode, uint64_t rdev) {
  const meta::FileType type = meta::typeOfMode(mode);
  if (type != meta::REGULAR && !meta::isSpecial(type)) {
    return toError(Status(ErrorCode::kInvalidArgument,
                          fmt::format("mknod mode {:o} names no FIFO, socket or device", mode)),
                   path);
  }
  auto parts = split(path);
  if (!parts.ok()) return toError(parts.status(), path);
  if (parts->empty()) return toError(Status(ErrorCode::kAlreadyExists), path);
  auto p = resolveParent(*parts);
  if (!p.ok()) return toError(p.status(), path);
  return toError(metaMknod(caller(), p->ino(), parts->back(), mode, rdev).status(), path);
}

Error ClientImpl::symlink(const std::string& target, const std::string& path) {
  auto parts = split(path);
  if (!parts.ok()) return toError(parts.status(), path);
  if (parts->empty()) return toError(Status(ErrorCode::kAlreadyExists), path);
  auto p = resolveParent(*parts);
  if (!p.ok()) return toError(p.status(), path);
  return toError(metaSymlink(caller(), p->ino(), parts->back(), target).status(), path);
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
