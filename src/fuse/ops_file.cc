// FUSE operations on open files and the session setup: create, open, read,
// write, flush, release, fsync, init.
#include <fcntl.h>
#include <linux/falloc.h>

#include <cstring>
#include <vector>

#include "fuse/ops.h"
#include "fuse/pack_view.h"

namespace cistern::fuse::ops {

namespace {

Handle* handleOf(fuse_file_info* fi) { return reinterpret_cast<Handle*>(fi->fh); }

// The open flags the client takes: the kernel has dealt with O_CREAT and
// O_EXCL (create() passes O_EXCL on), O_NOCTTY and the like, and it gives
// every write of an O_APPEND descriptor its offset itself (the file's end
// under the inode's lock), so the client must not move it again.
int clientFlags(int flags) { return flags & (O_ACCMODE | O_TRUNC | O_DIRECT | O_EXCL); }

// The kernel's handle of a File the client opened. `fresh`: this open made the file.
void attach(FuseFs& f, std::unique_ptr<File> file, const FileInfo& info, int flags, bool fresh,
            fuse_file_info* fi) {
  bool shared = file->openHandles() > 1;
  auto* handle = new Handle{std::move(file), (flags & O_ACCMODE) != O_RDONLY || (flags & O_TRUNC),
                            (flags & O_DIRECT) != 0};
  fi->fh = reinterpret_cast<uint64_t>(handle);
  // The kernel writes past its page cache for O_DIRECT, and for a handle
  // opened write-only: it can neither read nor be mapped, so it has no use
  // for the page cache, and on that path the kernel sends writes without
  // first asking for the file's security.capability (a round trip per
  // write(2); for a new small file one of seven requests). The mount's own
  // write buffering is the same either way; with -o writeback, write-only
  // handles keep the kernel's cache.
  bool write_only = (flags & O_ACCMODE) == O_WRONLY;
  if (handle->direct || (write_only && !f.options().writeback_cache)) {
    fi->direct_io = 1;
    handle->kernel_direct = true;
  }
  // flush() has nothing to do for a handle that cannot write: the kernel
  // need not send it at close (one request less per read-only open; with
  // the writeback cache the kernel still flushes its dirty pages).
  if (!handle->write) fi->noflush = 1;
  // Close-to-open: cached pages survive only if nobody changed the file
  // since; otherwise the kernel also forgets the length it has cached, which
  // would cut reads of a file that another client made longer.
  const bool keep = shared || (!fresh && !(flags & O_TRUNC) && f.unchangedSinceLastSeen(info));
  // A small file whose bytes came with the open goes into the page cache
  // now: the read that follows is served there, one round trip less (after
  // dropping what a changed file left cached).
  std::string whole;
  bool stored = false;
  if (!fresh && !handle->kernel_direct && !(flags & O_TRUNC) &&
      handle->file->wholeContents(&whole)) {
    if (!keep) f.invalidateData(info.ino);
    stored = f.storeWhole(info.ino, whole);
  }
  fi->keep_cache = keep || stored;
  if (!keep && !fresh && !stored) f.invalidateAttrs(info.ino);
  f.remember(info);
}

// Closes a handle; the last one of an inode leaves what it recorded for
// the next open's close-to-open check.
Error closeHandle(FuseFs& f, Handle* h) {
  const bool last = h->file->openHandles() == 1;
  Error e = h->file->close();
  if (last) f.remember(h->file->info());
  delete h;
  return e;
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
int removePrivilegesForWrite(fuse_req_t req, FuseFs& f, File& file) {
  // The mount's own authority, as for the kernel's own chmod (and no
  // FuseFs::who: its supplementary groups cost a read of /proc per call).
  const Credentials mount;
  const uint64_t ino = file.ino();
  // The mode as this client last saw it (the open, its own setattr calls).
  uint32_t mode = file.info().mode;
  uint32_t drop = mode & S_ISUID;
  if ((mode & (S_ISGID | S_IXGRP)) == (S_ISGID | S_IXGRP)) drop |= S_ISGID;
  if (drop != 0 && fuse_req_ctx(req)->uid != 0) {
    FileInfo info;
    if (Error e = f.client().setattr(mount, ino, {.mode = mode & 07777 & ~drop}, &info))
      return e.errno_value;
    f.invalidateAttrs(ino);
  }
  if (f.knownNoXattrs(ino) || f.knownNoCaps(ino)) return 0;
  const uint64_t gen = f.capsGen(ino);
  std::string value;
  Error e = f.client().getxattr(mount, ino, "security.capability", &value);
  if (e.errno_value == ENODATA) {
    f.noteNoCaps(ino, gen);
    return 0;
  }
  if (e) return e.errno_value;
  f.xattrChange(ino);
  e = f.client().removexattr(mount, ino, "security.capability");
  f.xattrChange(ino);
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
  if (PackViews::isView(parent)) {
    replyErr(req, EROFS);
    return;
  }
  if (!S_ISREG(mode)) {
    replyErr(req, EPERM);
    return;
  }
  std::unique_ptr<File> file;
  FileInfo info;
  bool created = false;
  if (!f.answered(req, f.client().createAt(f.who(req), parent, name, mode & 07777,
                                           clientFlags(fi->flags), &file, &info, &created)))
    return;
  if (created) f.noteNoXattrs(info.ino);
  attach(f, std::move(file), info, fi->flags, created, fi);
  fuse_entry_param e = f.entryOf(info);
  if (fuse_reply_create(req, &e, fi) != 0) {
    // The opener is gone (interrupted): drop the handle again.
    (void)closeHandle(f, handleOf(fi));
  }
}

void open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  CISTERN_FUSE_OP("open");
  FuseFs& f = fs(req);
  std::unique_ptr<File> file;
  if (PackViews::isView(ino)) {
    // A sample of a pack view: read-only and never changing, so the kernel
    // keeps its pages; nothing to flush at close.
    if (!f.answered(req, f.views().open(ino, fi->flags, &file))) return;
    // A sample read whole at open: into the page cache with it.
    if (std::string whole; !(fi->flags & O_DIRECT) && file->wholeContents(&whole))
      (void)f.storeWhole(ino, whole);
    fi->fh = reinterpret_cast<uint64_t>(new Handle{std::move(file), false, false});
    fi->keep_cache = 1;
    fi->noflush = 1;
    if (fuse_reply_open(req, fi) != 0) delete handleOf(fi);
    return;
  }
  FileInfo info;
  if (!f.answered(req, f.client().openAt(f.who(req), ino, clientFlags(fi->flags), &file, &info)))
    return;
  attach(f, std::move(file), info, fi->flags, false, fi);
  if (fuse_reply_open(req, fi) != 0) (void)closeHandle(f, handleOf(fi));
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
  // Direct reads go straight from storage into the reply: into a buffer of
  // the client's shared memory, borrowed for this request (idle threads hold
  // none), which same-host servers fill themselves. Buffered reads copy out
  // of the inode's read-ahead.
  std::unique_ptr<SharedBuffer> window;
  if (h->direct) {
    window = fs(req).client().borrowSharedBuffer(size);
    uint8_t* dst = window ? window->data() : threadBuf();
    e = h->file->pread(dst, size, static_cast<uint64_t>(off), &done);
    // A server may still write into the window: read again into our buffer.
    if (!e && window && !window->intact()) {
      dst = threadBuf();
      e = h->file->pread(dst, size, static_cast<uint64_t>(off), &done);
    }
    data = dst;
  } else {
    e = h->file->pread(threadBuf(), size, static_cast<uint64_t>(off), &done);
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
    if (int err = removePrivilegesForWrite(req, fs(req), *h->file)) {
      replyErr(req, err);
      return;
    }
  }
  Error e = h->file->pwrite(buf, size, static_cast<uint64_t>(off), &done);
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
    if (Error e = h->file->flush(/*end_session=*/h->file->openHandles() == 1)) {
      replyErr(req, e.errno_value);
      return;
    }
  }
  replyErr(req, 0);
}

void release(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  CISTERN_FUSE_OP("release");
  (void)closeHandle(fs(req), handleOf(fi));  // errors went to flush; the kernel ignores these
  replyErr(req, 0);
}

// No ioctls: ENOTTY at once. Python's open() asks isatty() (TCGETS) of
// every file it opens; left unimplemented, libfuse answered ENOSYS, which
// the kernel does not remember for ioctls, and the round trip cost ~50 µs.
void ioctl(fuse_req_t req, fuse_ino_t, unsigned int, void*, fuse_file_info*, unsigned, const void*,
           size_t, size_t) {
  CISTERN_FUSE_OP("ioctl");
  replyErr(req, ENOTTY);
}

void fsync(fuse_req_t req, fuse_ino_t, int, fuse_file_info* fi) {
  CISTERN_FUSE_OP("fsync");
  Error e = handleOf(fi)->file->fsync();
  replyErr(req, e ? e.errno_value : 0);
}

// Preallocation (mode 0 or FALLOC_FL_KEEP_SIZE): cistern allocates chunks as
// they are written and reserves no space, so this only extends the length
// (holes read as zeros), which lets writers such as fio lay a file out and
// then overwrite it with parallel direct writes. Punching holes and zeroing
// ranges are not supported (EOPNOTSUPP).
void fallocate(fuse_req_t req, fuse_ino_t, int mode, off_t offset, off_t length,
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
  if (mode & FALLOC_FL_KEEP_SIZE) {
    replyErr(req, 0);
    return;
  }
  Error e = handleOf(fi)->file->allocate(end);
  replyErr(req, e ? e.errno_value : 0);
}

}  // namespace cistern::fuse::ops
