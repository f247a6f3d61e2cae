// FUSE operations on names and attributes: each is one call of libcistern's
// inode API with the caller's credentials (the meta service checks
// permissions and names). A truncate of a file open here also writes out its
// buffers first and cuts past the length it has not recorded (setattrAs).
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>

#include <cstring>
#include <string>
#include <vector>

#include "fuse/ops.h"
#include "fuse/pack_view.h"

namespace cistern::fuse::ops {

namespace {

constexpr uint32_t kRenameNoReplace = 1;  // RENAME_NOREPLACE
constexpr uint32_t kRenameExchange = 2;   // RENAME_EXCHANGE

int64_t toNs(const timespec& t) { return int64_t{t.tv_sec} * 1'000'000'000 + t.tv_nsec; }

// Around a setxattr or removexattr: a remembered "no security.capability"
// stops holding when the change starts, and an answer read while it was
// under way does not hold afterwards either.
class XattrChange {
 public:
  XattrChange(FuseFs& f, fuse_ino_t ino) : f_(f), ino_(ino) { f_.xattrChange(ino_); }
  ~XattrChange() { f_.xattrChange(ino_); }
  XattrChange(const XattrChange&) = delete;
  XattrChange& operator=(const XattrChange&) = delete;

 private:
  FuseFs& f_;
  fuse_ino_t ino_;
};

// A write or truncate by someone who is not the owner makes the kernel clear
// the file's setuid/setgid bits with a chmod of its own; with
// default_permissions the kernel rejects every other chmod by a non-owner
// before it reaches us. So a mode change from a non-owner that only drops
// S_ISUID/S_ISGID is that kernel chmod: the mount does it on its own authority.
bool killsPrivilegesOnly(FuseFs& f, fuse_ino_t ino, uint32_t uid, uint32_t mode) {
  FileInfo info;
  if (f.client().getattr(ino, &info)) return false;
  uint32_t old = info.mode & 07777;
  return info.uid != uid && (old & (S_ISUID | S_ISGID)) != 0 &&
         mode == (old & ~uint32_t{S_ISUID | S_ISGID});
}

// A node of a pack's directory view (pack_view.h): nothing there changes.
bool readOnlyView(fuse_req_t req, fuse_ino_t ino) {
  if (!PackViews::isView(ino)) return false;
  replyErr(req, EROFS);
  return true;
}

// A lookup answered from a pack view: its count is taken back if the
// kernel did not get the reply (an interrupted request).
void replyViewEntry(fuse_req_t req, FuseFs& f, const fuse_entry_param& e) {
  if (fuse_reply_entry(req, &e) != 0) f.views().unref(e.ino);
}

}  // namespace

void lookup(fuse_req_t req, fuse_ino_t parent, const char* name) {
  CISTERN_FUSE_OP("lookup");
  FuseFs& f = fs(req);
  fuse_entry_param view;
  if (PackViews::isView(parent)) {
    if (f.answered(req, f.views().lookup(parent, name, &view))) replyViewEntry(req, f, view);
    return;
  }
  FileInfo info;
  uint64_t ticket = f.dirAttrsTicket();
  Error e = f.client().lookup(f.who(req), parent, name, &info);
  if (e.errno_value == ENOENT && std::strcmp(name, PackViews::kName) == 0) {
    // No such name in the directory: its pack's view, if it holds one.
    FileInfo dir;
    if (!f.client().getattr(parent, &dir)) {
      Error v = f.views().lookupRoot(f.who(req), dir, f.options().entry_timeout_s, &view);
      if (!v) {
        replyViewEntry(req, f, view);
        return;
      }
      if (v.errno_value != ENOENT) e = v;
    }
  }
  if (e.errno_value == ENOENT && f.options().negative_timeout_s > 0) {
    fuse_entry_param neg;
    std::memset(&neg, 0, sizeof(neg));
    neg.entry_timeout = f.options().negative_timeout_s;  // ino 0: a cached "no such name"
    fuse_reply_entry(req, &neg);
    return;
  }
  if (!f.answered(req, e)) return;
  f.keepDirAttrs(info, ticket);
  f.replyEntry(req, info);
}

// The kernel's lookup counts need no state here (inodes live in the KV),
// but for the nodes of pack views, which hold their view open.
void forget(fuse_req_t req, fuse_ino_t ino, uint64_t n) {
  CISTERN_FUSE_OP("forget");
  if (PackViews::isView(ino)) fs(req).views().forget(ino, n);
  fuse_reply_none(req);
}
void forgetMulti(fuse_req_t req, size_t count, fuse_forget_data* forgets) {
  CISTERN_FUSE_OP("forget_multi");
  for (size_t i = 0; i < count; ++i) {
    if (PackViews::isView(forgets[i].ino))
      fs(req).views().forget(forgets[i].ino, forgets[i].nlookup);
  }
  fuse_reply_none(req);
}

void getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info*) {
  CISTERN_FUSE_OP("getattr");
  FuseFs& f = fs(req);
  if (PackViews::isView(ino)) {
    struct stat st;
    if (f.answered(req, f.views().getattr(ino, &st)))
      fuse_reply_attr(req, &st, PackViews::kTimeoutS);
    return;
  }
  FileInfo info;
  double valid_s = 0;
  if (f.cachedDirAttrs(ino, &info, &valid_s)) {
    struct stat st;
    f.fillStat(info, &st);
    fuse_reply_attr(req, &st, valid_s);
    return;
  }
  uint64_t ticket = f.dirAttrsTicket();
  if (!f.answered(req, f.client().getattr(ino, &info))) return;
  f.keepDirAttrs(info, ticket);
  f.replyAttr(req, info);
}

void setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info*) {
  CISTERN_FUSE_OP("setattr");
  if (readOnlyView(req, ino)) return;
  FuseFs& f = fs(req);
  Credentials who = f.who(req);
  AttrChanges changes;
  if (to_set & FUSE_SET_ATTR_MODE) {
    changes.mode = attr->st_mode & 07777;
    if (who.uid != 0 && killsPrivilegesOnly(f, ino, who.uid, *changes.mode)) who.uid = 0;
  }
  if (to_set & FUSE_SET_ATTR_UID) changes.uid = attr->st_uid;
  if (to_set & FUSE_SET_ATTR_GID) changes.gid = attr->st_gid;
  if (to_set & FUSE_SET_ATTR_ATIME_NOW) {
    changes.atime_now = true;
  } else if (to_set & FUSE_SET_ATTR_ATIME) {
    changes.atime_ns = toNs(attr->st_atim);
  }
  if (to_set & FUSE_SET_ATTR_MTIME_NOW) {
    changes.mtime_now = true;
  } else if (to_set & FUSE_SET_ATTR_MTIME) {
    changes.mtime_ns = toNs(attr->st_mtim);
  }
  // (A truncate of a file open here: the client writes its buffered bytes
  // first, and the cut reaches past the length it has not recorded yet.)
  if (to_set & FUSE_SET_ATTR_SIZE) {
    if (attr->st_size < 0) {
      replyErr(req, EINVAL);
      return;
    }
    changes.size = static_cast<uint64_t>(attr->st_size);
  }
  FileInfo info;
  if (!f.answered(req, f.client().setattr(who, ino, changes, &info))) return;
  f.dropDirAttrs(ino);
  f.replyAttr(req, info);
}

void readlink(fuse_req_t req, fuse_ino_t ino) {
  CISTERN_FUSE_OP("readlink");
  if (PackViews::isView(ino)) {
    replyErr(req, EINVAL);  // not a symlink
    return;
  }
  FuseFs& f = fs(req);
  std::string target;
  if (f.answered(req, f.client().readlinkAt(ino, &target)))
    fuse_reply_readlink(req, target.c_str());
}

// Regular files (mknod(2) with S_IFREG) and FIFOs, sockets and devices, whose
// node cistern keeps while the kernel moves their data.
void mknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev) {
  CISTERN_FUSE_OP("mknod");
  if (readOnlyView(req, parent)) return;
  FuseFs& f = fs(req);
  FileInfo info;
  if (f.answered(req, f.client().mknodAt(f.who(req), parent, name, mode, rdev, &info)))
    f.replyEntry(req, info);
}

void mkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode) {
  CISTERN_FUSE_OP("mkdir");
  if (readOnlyView(req, parent)) return;
  FuseFs& f = fs(req);
  FileInfo info;
  uint64_t ticket = f.dirAttrsTicket();
  if (!f.answered(req, f.client().mkdirAt(f.who(req), parent, name, mode, &info))) return;
  f.keepDirAttrs(info, ticket);
  f.replyEntry(req, info);
}

namespace {

void removeName(fuse_req_t req, fuse_ino_t parent, const char* name, bool dir) {
  FuseFs& f = fs(req);
  // (A file open here that this removes stays readable: the client holds it.)
  const Credentials who = f.who(req);
  Error e = dir ? f.client().rmdirAt(who, parent, name) : f.client().unlinkAt(who, parent, name);
  if (!f.answered(req, e)) return;
  // A removed directory's inode is gone (its number not known here); names
  // added or removed leave the parent's inode as it was.
  if (dir) f.dropAllDirAttrs();
  replyErr(req, 0);
}

}  // namespace

void unlink(fuse_req_t req, fuse_ino_t parent, const char* name) {
  CISTERN_FUSE_OP("unlink");
  if (readOnlyView(req, parent)) return;
  removeName(req, parent, name, false);
}

void rmdir(fuse_req_t req, fuse_ino_t parent, const char* name) {
  CISTERN_FUSE_OP("rmdir");
  if (readOnlyView(req, parent)) return;
  removeName(req, parent, name, true);
}

void symlink(fuse_req_t req, const char* link, fuse_ino_t parent, const char* name) {
  CISTERN_FUSE_OP("symlink");
  if (readOnlyView(req, parent)) return;
  FuseFs& f = fs(req);
  FileInfo info;
  if (f.answered(req, f.client().symlinkAt(f.who(req), parent, name, link, &info)))
    f.replyEntry(req, info);
}

void rename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t newparent,
            const char* newname, unsigned int flags) {
  CISTERN_FUSE_OP("rename");
  if (readOnlyView(req, newparent)) return;
  if (readOnlyView(req, parent)) return;
  FuseFs& f = fs(req);
  if (flags & ~(kRenameNoReplace | kRenameExchange)) {
    replyErr(req, EINVAL);  // RENAME_WHITEOUT: no overlay support
    return;
  }
  if (!f.answered(req, f.client().renameAt(f.who(req), parent, name, newparent, newname, flags)))
    return;
  f.dropAllDirAttrs();  // a moved or replaced directory's inode changed
  replyErr(req, 0);
}

void link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char* newname) {
  CISTERN_FUSE_OP("link");
  if (readOnlyView(req, newparent)) return;
  if (readOnlyView(req, ino)) return;
  FuseFs& f = fs(req);
  FileInfo info;
  if (f.answered(req, f.client().linkAt(f.who(req), ino, newparent, newname, &info)))
    f.replyEntry(req, info);
}

void statfs(fuse_req_t req, fuse_ino_t ino) {
  CISTERN_FUSE_OP("statfs");
  FuseFs& f = fs(req);
  SpaceInfo space;
  if (!f.answered(req, f.client().statfs(&space, ino))) return;
  struct statvfs st;
  std::memset(&st, 0, sizeof(st));
  uint64_t bsize = space.block_size;
  st.f_bsize = bsize;
  st.f_frsize = bsize;
  st.f_blocks = space.bytes_total / bsize;
  st.f_bfree = space.bytes_free / bsize;
  st.f_bavail = st.f_bfree;
  if (space.inodes_total > 0) {  // a quota's
    st.f_files = space.inodes_total;
    st.f_ffree =
        space.inodes_total > space.inodes_used ? space.inodes_total - space.inodes_used : 0;
  } else {
    // Inodes are only bounded by the KV: report plenty free.
    st.f_files = space.inodes_used + (uint64_t{1} << 32);
    st.f_ffree = uint64_t{1} << 32;
  }
  st.f_favail = st.f_ffree;
  st.f_namemax = space.name_max;
  fuse_reply_statfs(req, &st);
}

void access(fuse_req_t req, fuse_ino_t ino, int mask) {
  CISTERN_FUSE_OP("access");
  if (PackViews::isView(ino)) {
    replyErr(req, (mask & W_OK) ? EROFS : 0);  // the kernel checked the mode bits
    return;
  }
  FuseFs& f = fs(req);
  if (f.answered(req, f.client().access(f.who(req), ino, mask))) replyErr(req, 0);
}

void setxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size,
              int flags) {
  CISTERN_FUSE_OP("setxattr");
  if (readOnlyView(req, ino)) return;
  FuseFs& f = fs(req);
  f.forgetNoXattrs(ino);  // before: a getxattr after the set must ask meta
  XattrChange change(f, ino);
  if (!f.answered(req, f.client().setxattr(f.who(req), ino, name, std::string(value, size), flags)))
    return;
  f.dropDirAttrs(ino);  // its ctime changed
  replyErr(req, 0);
}

void getxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size) {
  CISTERN_FUSE_OP("getxattr");
  FuseFs& f = fs(req);
  if (f.knownNoXattrs(ino) || PackViews::isView(ino)) {
    replyErr(req, ENODATA);
    return;
  }
  const bool caps = std::strcmp(name, "security.capability") == 0;
  if (caps && f.knownNoCaps(ino)) {
    replyErr(req, ENODATA);
    return;
  }
  const uint64_t gen = caps ? f.capsGen(ino) : 0;
  std::string value;
  if (Error e = f.client().getxattr(f.who(req), ino, name, &value)) {
    if (caps && e.errno_value == ENODATA) f.noteNoCaps(ino, gen);
    replyErr(req, e.errno_value);
    return;
  }
  if (size == 0) {
    fuse_reply_xattr(req, value.size());
  } else if (value.size() > size) {
    replyErr(req, ERANGE);
  } else {
    fuse_reply_buf(req, value.data(), value.size());
  }
}

void listxattr(fuse_req_t req, fuse_ino_t ino, size_t size) {
  CISTERN_FUSE_OP("listxattr");
  FuseFs& f = fs(req);
  if (f.knownNoXattrs(ino) || PackViews::isView(ino)) {
    if (size == 0)
      fuse_reply_xattr(req, 0);
    else
      fuse_reply_buf(req, nullptr, 0);
    return;
  }
  std::vector<std::string> names;
  if (!f.answered(req, f.client().listxattr(f.who(req), ino, &names))) return;
  std::string list;
  for (const auto& n : names) {
    list += n;
    list.push_back('\0');
  }
  if (size == 0) {
    fuse_reply_xattr(req, list.size());
  } else if (list.size() > size) {
    replyErr(req, ERANGE);
  } else {
    fuse_reply_buf(req, list.data(), list.size());
  }
}

void removexattr(fuse_req_t req, fuse_ino_t ino, const char* name) {
  CISTERN_FUSE_OP("removexattr");
  if (readOnlyView(req, ino)) return;
  FuseFs& f = fs(req);
  XattrChange change(f, ino);
  if (!f.answered(req, f.client().removexattr(f.who(req), ino, name))) return;
  f.dropDirAttrs(ino);  // its ctime changed
  replyErr(req, 0);
}

}  // namespace cistern::fuse::ops
