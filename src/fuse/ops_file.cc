// FUSE operations on open files and the session setup: create, open, read,
// write, flush, release, fsync, init.
#include <fcntl.h>
#include <linux/falloc.h>

#include <cstring>
#include <vector>

#include "fuse/ops.h"

namespace cistern::fuse::ops {

namespace {

Handle* handleOf(fuse_file_info* fi) { return reinterpret_cast<Handle*>(fi->fh); }

// O_TRUNC needs write permission even with O_RDONLY (Linux truncates then).
bool wantsWrite(int flags) { return (flags & O_ACCMODE) != O_RDONLY || (flags & O_TRUNC); }

// meta Open of an existing file: permission check, a write session for
// writers, and O_TRUNC (whose old bytes leave storage now, so that none of
// them shows through a hole of the new contents).
bool openExisting(fuse_req_t req, FuseFs& f, uint64_t ino, int flags, meta::Inode* inode,
                  uint64_t* session, std::string* inline_data) {
  int acc = flags & O_ACCMODE;
  bool write = wantsWrite(flags);
  bool trunc = write && (flags & O_TRUNC);
  std::shared_ptr<OpenInode> node;
  meta::Caller who = f.caller(req);
  if (trunc) {
    // The old bytes leave storage before the open commits the empty file, so
    // that none shows through a hole of the new contents.
    int mask = W_OK | (acc != O_WRONLY ? R_OK : 0);
    if (int err = f.prepareTruncate(ino, who, mask, 0, &node)) {
      replyErr(req, err);
      return false;
    }
  }
  meta::OpenReq in;
  *in.mutable_caller() = who;
  in.set_ino(ino);
  in.set_read(acc != O_WRONLY);
  in.set_write(write);
  in.set_truncate(trunc);
  f.client().stamp(&in);
  meta::OpenResp out;
  if (!f.call(req, "Open", in, &out)) return false;
  if (trunc && node) node->file->setSize(0);
  if (write) {
    // Writes go to chunks: an inline file's bytes move there first.
    if (Status s = f.client().prepareWrites(&out); !s.ok()) {
      replyErr(req, replyErrno(s));
      return false;
    }
  }
  *inode = out.inode();
  *session = out.session();
  *inline_data = std::move(*out.mutable_inline_data());
  return true;
}

// The kernel's handle: the shared FileImpl of the inode plus this open's session.
void attach(FuseFs& f, const meta::Inode& inode, uint64_t session, int flags, bool fresh,
            std::string inline_data, fuse_file_info* fi) {
  bool write = wantsWrite(flags);
  auto node = f.acquire(inode, write);
  // A file this open created may end with its bytes inline; any other open
  // says whether they are (and they are the ones to read then).
  if (fresh && session != 0) {
    node->file->setFresh();
  } else {
    node->file->adoptInline(inode, std::move(inline_data));
  }
  bool shared = f.handles(*node) > 1;
  bool direct = (flags & O_DIRECT) != 0;
  auto* handle = new Handle{node, session, write, direct};
  fi->fh = reinterpret_cast<uint64_t>(handle);
  // The kernel writes past its page cache for O_DIRECT, and for a handle
  // opened write-only: it can neither read nor be mapped, so it has no use
  // for the page cache, and on that path the kernel sends writes without
  // first asking for the file's security.capability (a round trip per
  // write(2); for a new small file one of seven requests). The mount's own
  // write buffering is the same either way; with -o writeback, write-only
  // handles keep the kernel's cache.
  bool write_only = (flags & O_ACCMODE) == O_WRONLY;
  if (direct || (write_only && !f.options().writeback_cache)) {
    fi->direct_io = 1;
    handle->kernel_direct = true;
  }
  // flush() has nothing to do for a handle that cannot write: the kernel
  // need not send it at close (one request less per read-only open; with
  // the writeback cache the kernel still flushes its dirty pages).
  if (!write) fi->noflush = 1;
  // Close-to-open: cached pages survive only if nobody changed the file
  // since; otherwise the kernel also forgets the length it has cached, which
  // would cut reads of a file that another client made longer.
  fi->keep_cache = shared || (!fresh && !(flags & O_TRUNC) && f.unchangedSinceLastSeen(inode));
  if (!fi->keep_cache && !fresh) f.invalidateAttrs(inode.ino());
  f.remember(inode);
}

// What the kernel's file_remove_privs does before a write through its page
// cache, and leaves to the file system on a handle it writes directly (see
// attach): a writer without CAP_FSETID clears S_ISUID, and S_ISGID of a
// group-executable file; any write drops a file capability
// (security.capability). The kernel flags the writes that must clear the
// bits (FUSE_WRITE_KILL_SUIDGID), but libfuse 3.14 does not pass the flag
// on, so uid 0 stands for CAP_FSETID here. A file this mount just created
// has no xattrs (FuseFs::knownNoXattrs): no meta call for the capability.
// Returns an errno, 0 if done or nothing to do.
int removePrivilegesForWrite(fuse_req_t req, FuseFs& f, OpenInode& node) {
  // The mount's own authority, as for the kernel's own chmod (and no
  // FuseFs::who: its supplementary groups cost a read of /proc per call).
  const Credentials mount;
  uint32_t mode = node.mode.load();
  uint32_t drop = mode & S_ISUID;
  if ((mode & (S_ISGID | S_IXGRP)) == (S_ISGID | S_IXGRP)) drop |= S_ISGID;
  if (drop != 0 && fuse_req_ctx(req)->uid != 0) {
    FileInfo info;
    if (Error e = f.client().setattr(mount, node.ino, {.mode = mode & 07777 & ~drop}, &info))
      return e.errno_value;
    node.mode = info.mode & 07777;
    f.invalidateAttrs(node.ino);
  }
  if (f.knownNoXattrs(node.ino) || f.knownNoCaps(node)) return 0;
  const uint64_t gen = node.xattr_gen.load();
  std::string value;
  Error e = f.client().getxattr(mount, node.ino, "security.capability", &value);
  if (e.errno_value == ENODATA) {
    f.noteNoCaps(node, gen);
    return 0;
  }
  if (e) return e.errno_value;
  e = f.client().removexattr(mount, node.ino, "security.capability");
  return !e || e.errno_value == ENODATA ? 0 : e.errno_value;
}

}  // namespace

void init(void* userdata, fuse_conn_info* conn) {
  auto* f = static_cast<FuseFs*>(userdata);
  conn->max_write = 1 << 20;
  conn->time_gran = 1;
  if (conn->capable & FUSE_CAP_ATOMIC_O_TRUNC) conn->want |= FUSE_CAP_ATOMIC_O_TRUNC;
  if (conn->capable & FUSE_CAP_AUTO_INVAL_DATA) conn->want |= FUSE_CAP_AUTO_INVAL_DATA;
  if (conn->capable & FUSE_CAP_ASYNC_READ) conn->want |= FUSE_CAP_ASYNC_READ;
  // Lookups, creates and readdirs in one directory run at the same time (the
  // meta service's transactions order them); without it the kernel holds a
  // per-directory lock around each request it sends.
  if (conn->capable & FUSE_CAP_PARALLEL_DIROPS) conn->want |= FUSE_CAP_PARALLEL_DIROPS;
  if (f->options().writeback_cache && (conn->capable & FUSE_CAP_WRITEBACK_CACHE))
    conn->want |= FUSE_CAP_WRITEBACK_CACHE;
  conn->want &= ~(FUSE_CAP_SPLICE_READ | FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE);
}

void create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi) {
  CISTERN_FUSE_OP("create");
  FuseFs& f = fs(req);
  if (!S_ISREG(mode)) {
    replyErr(req, EPERM);
    return;
  }
  bool write = wantsWrite(fi->flags);
  meta::CreateReq in;
  *in.mutable_caller() = f.caller(req);
  in.set_parent(parent);
  in.set_name(name);
  in.set_mode(mode & 07777);
  in.set_exclusive((fi->flags & O_EXCL) != 0);
  in.set_open_write(write);
  f.client().stamp(&in);
  meta::InodeResp out;
  if (!f.call(req, "Create", in, &out)) return;
  meta::Inode inode = out.inode();
  uint64_t session = out.session();
  if (session != 0) f.noteNoXattrs(inode.ino());  // a write session: made by this call
  bool fresh = session != 0 || !write;
  std::string inline_data;
  if (session == 0) {
    // It existed (no O_EXCL): open it like open(2) would, or it is new and read-only.
    if (inode.type() != meta::REGULAR) {
      replyErr(req, inode.type() == meta::DIRECTORY ? EISDIR : EINVAL);
      return;
    }
    if (!openExisting(req, f, inode.ino(), fi->flags, &inode, &session, &inline_data)) return;
    fresh = false;
  }
  attach(f, inode, session, fi->flags, fresh, std::move(inline_data), fi);
  fuse_entry_param e = f.entryOf(client::toInfo(inode));
  if (fuse_reply_create(req, &e, fi) != 0) {
    // The opener is gone (interrupted): drop the handle again.
    auto* h = handleOf(fi);
    (void)f.release(h);
    delete h;
  }
}

void open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  CISTERN_FUSE_OP("open");
  FuseFs& f = fs(req);
  meta::Inode inode;
  uint64_t session = 0;
  std::string inline_data;
  if (!openExisting(req, f, ino, fi->flags, &inode, &session, &inline_data)) return;
  attach(f, inode, session, fi->flags, false, std::move(inline_data), fi);
  if (fuse_reply_open(req, fi) != 0) {
    auto* h = handleOf(fi);
    (void)f.release(h);
    delete h;
  }
}

void read(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) {
  CISTERN_FUSE_OP("read");
  // One buffer per FUSE thread, reused: requests are at most max_write (1 MiB).
  thread_local std::vector<uint8_t> buf;
  auto threadBuf = [&] {
    if (buf.size() < size) buf.resize(size);
    return buf.data();
  };
  size_t done = 0;
  Handle* h = handleOf(fi);
  const uint8_t* data;
  Error e;
  // Direct reads go straight from storage into the reply: into a window of
  // the client's shared memory, borrowed for this request (idle threads hold
  // none), which same-host servers fill themselves. Buffered reads copy out
  // of the handle's read-ahead.
  client::ShmWindow window;
  if (h->direct) {
    uint8_t* dst = window.borrow(fs(req).client().shm(), size) ? window.data() : threadBuf();
    e = h->node->file->preadDirect(dst, size, static_cast<uint64_t>(off), &done);
    // A server may still write into the window: read again into our buffer.
    if (!e && !window.intact()) {
      dst = threadBuf();
      e = h->node->file->preadDirect(dst, size, static_cast<uint64_t>(off), &done);
    }
    data = dst;
  } else {
    e = h->node->file->pread(threadBuf(), size, static_cast<uint64_t>(off), &done);
    data = buf.data();
  }
  if (e) {
    replyErr(req, e.errno_value);
    return;
  }
  fuse_reply_buf(req, reinterpret_cast<const char*>(data), done);
}

void write(fuse_req_t req, fuse_ino_t, const char* buf, size_t size, off_t off,
           fuse_file_info* fi) {
  CISTERN_FUSE_OP("write");
  size_t done = 0;
  Handle* h = handleOf(fi);
  if (h->kernel_direct) {
    if (int err = removePrivilegesForWrite(req, fs(req), *h->node)) {
      replyErr(req, err);
      return;
    }
  }
  Error e = h->direct ? h->node->file->pwriteDirect(buf, size, static_cast<uint64_t>(off), &done)
                      : h->node->file->pwrite(buf, size, static_cast<uint64_t>(off), &done);
  if (e) {
    replyErr(req, e.errno_value);
    return;
  }
  fuse_reply_write(req, done);
}

// close(2) of a descriptor: the bytes and the length become visible to other
// clients (close-to-open), and write errors are reported to close().
void flush(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  CISTERN_FUSE_OP("flush");
  Handle* h = handleOf(fi);
  if (h->write) {
    // The usual open-write-close: the only handle's close also ends its
    // session, in the same commit as the length (one commit less per file).
    uint64_t session = 0;
    if (fs(req).handles(*h->node) == 1) session = h->session.exchange(0);
    if (Error e = h->node->file->syncAndEnd(session)) {
      replyErr(req, e.errno_value);
      return;
    }
  }
  replyErr(req, 0);
}

void release(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  CISTERN_FUSE_OP("release");
  Handle* h = handleOf(fi);
  (void)fs(req).release(h);  // errors went to flush; the kernel ignores these
  delete h;
  replyErr(req, 0);
}

void fsync(fuse_req_t req, fuse_ino_t, int, fuse_file_info* fi) {
  CISTERN_FUSE_OP("fsync");
  Error e = handleOf(fi)->node->file->fsync();
  replyErr(req, e ? e.errno_value : 0);
}

// Preallocation (mode 0 or FALLOC_FL_KEEP_SIZE): cistern allocates chunks as
// they are written and reserves no space, so this only extends the length
// (holes read as zeros), which lets writers such as fio lay a file out and
// then overwrite it with parallel direct writes. Punching holes and zeroing
// ranges are not supported (EOPNOTSUPP).
void fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset, off_t length,
               fuse_file_info* fi) {
  CISTERN_FUSE_OP("fallocate");
  if (mode & ~FALLOC_FL_KEEP_SIZE) {
    replyErr(req, EOPNOTSUPP);
    return;
  }
  if (offset < 0 || length <= 0) {
    replyErr(req, EINVAL);
    return;
  }
  uint64_t end = static_cast<uint64_t>(offset) + static_cast<uint64_t>(length);
  Handle* h = handleOf(fi);
  if ((mode & FALLOC_FL_KEEP_SIZE) || end <= h->node->file->size()) {
    replyErr(req, 0);
    return;
  }
  FuseFs& f = fs(req);
  if (Error e = h->node->file->flushBuffers()) {
    replyErr(req, e.errno_value);
    return;
  }
  meta::SetattrReq in;
  *in.mutable_caller() = f.caller(req);
  in.set_ino(ino);
  in.set_size(end);
  f.client().stamp(&in);
  meta::InodeResp out;
  if (Status s = f.client().setattrSize(&in, &out); !s.ok()) {
    replyErr(req, replyErrno(s));
    return;
  }
  h->node->file->setSize(std::max(end, h->node->file->size()));
  f.client().forgetAttrs(ino);
  replyErr(req, 0);
}

}  // namespace cistern::fuse::ops
