// The FUSE mount: cistern as a POSIX file system (docs/fuse.md).
//
// The kernel speaks inodes; cistern inode numbers are used as FUSE node ids
// (the root is 1 in both). Every request is answered through libcistern's
// public inode and handle API (include/cistern/client.h) with the caller's
// credentials (uid, gid, supplementary groups from the request), and the
// meta service checks every permission. The kernel checks mode bits too
// (default_permissions), also on the paths it walks from its dentry cache
// without asking us.
//
// Open files: each kernel handle is a File of the client (Client::openAt,
// createAt). The client shares one set of buffers among the handles of an
// inode, so a read through one descriptor sees a write through another at
// once; a handle that can write holds a meta write session (its length and
// mtime are recorded on flush and release); a file this mount unlinks or
// renames over while open stays readable until its last close. Memory: at
// most `buffered_files_max` open inodes get a write buffer and read-ahead
// (Client::Options::buffered_files_max); the rest read and write straight
// through.
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "cistern/client.h"
#include "fuse/mount_options.h"

namespace cistern::fuse {

class PackViews;

// fi->fh of an open file.
struct Handle {
  std::unique_ptr<File> file;
  bool write = false;   // opened for writing: flush() records what it wrote
  bool direct = false;  // O_DIRECT: parallel I/O past the page cache and read-ahead
  // The kernel sends this handle's writes past its page cache
  // (FOPEN_DIRECT_IO: O_DIRECT or write-only, see attach in ops_file.cc), so they skip
  // the kernel's removal of setuid/setgid and file capabilities, which the
  // mount does itself.
  bool kernel_direct = false;
};

class FuseFs {
 public:
  FuseFs(Client* client, MountOptions options);
  ~FuseFs();

  static const fuse_lowlevel_ops& ops();
  const MountOptions& options() const { return options_; }
  Client& client() { return *client_; }
  // The directory views of packs (pack_view.h).
  PackViews& views() { return *views_; }

  // Credentials of the request (groups read from /proc for non-root callers).
  Credentials who(fuse_req_t req) const;
  // The kernel's entry for an inode (a lookup reply, create, readdirplus).
  fuse_entry_param entryOf(const FileInfo& info);
  void replyEntry(fuse_req_t req, const FileInfo& info);
  void replyAttr(fuse_req_t req, const FileInfo& info);
  void fillStat(const FileInfo& info, struct stat* st);
  // The reply of an inode API call: the attributes, or its errno as the reply.
  bool answered(fuse_req_t req, const Error& e);

  // Close-to-open: true when the file is unchanged (mtime and size) since
  // this mount last saw it closed.
  bool unchangedSinceLastSeen(const FileInfo& info);
  void remember(const FileInfo& info);
  // Tells the kernel its cached attributes of `ino` are stale (attributes
  // only: safe inside an open of that inode).
  void invalidateAttrs(uint64_t ino);
  // Drops the inode's cached pages and attributes.
  void invalidateData(uint64_t ino);
  // Puts `bytes` (the whole file) into the kernel's page cache for `ino`
  // (FUSE_NOTIFY_STORE); false when the kernel refused.
  bool storeWhole(uint64_t ino, std::string_view bytes);
  void setSession(fuse_session* se) { session_ = se; }

  // A file this mount just created has no extended attributes: for
  // attr_timeout its getxattr and listxattr are answered here (the kernel
  // asks for security.capability before the first write of every file),
  // unless this mount sets one meanwhile. Another client's setxattr shows
  // after that time, like its attribute changes. A fixed table of
  // kNoXattrSlots entries; a colliding entry is overwritten (then the meta
  // service answers).
  void noteNoXattrs(uint64_t ino);
  // The kernel asks for security.capability before every write through its
  // page cache (to drop file capabilities), and the mount before every
  // write past it: meta's "none" is remembered for attr_timeout, unless
  // this mount changes the inode's xattrs meanwhile (another client's
  // setxattr shows after that time, as its attribute changes do). Take
  // capsGen() before asking meta; noteNoCaps() keeps the answer only if no
  // change of this mount began since. xattrChange() is called before and
  // after each setxattr and removexattr. A fixed table of kNoCapsSlots.
  uint64_t capsGen(uint64_t ino);
  void noteNoCaps(uint64_t ino, uint64_t gen);
  bool knownNoCaps(uint64_t ino);
  void xattrChange(uint64_t ino);
  bool knownNoXattrs(uint64_t ino);
  void forgetNoXattrs(uint64_t ino);

  // Attributes of directories, for attr_timeout from when meta answered.
  // The kernel re-reads a directory's attributes after every name added or
  // removed in it (default_permissions needs them for the next path walk),
  // but creating, removing and linking names leaves the directory's inode
  // unchanged (docs/meta_kv_schema.md), so those re-reads are answered here.
  // Changes of a directory's own inode through this mount (setattr, xattrs,
  // rename, rmdir) drop entries once meta has them; another client's change
  // shows within attr_timeout, as with the kernel's cache. Take a ticket
  // before asking meta: an answer is kept only if nothing was dropped from
  // its slot since. A fixed table of kDirAttrSlots entries.
  uint64_t dirAttrsTicket() { return dir_attrs_seq_.fetch_add(1) + 1; }
  void keepDirAttrs(const FileInfo& info, uint64_t ticket);
  // The cached attributes and the seconds they stay valid.
  bool cachedDirAttrs(uint64_t ino, FileInfo* out, double* valid_s);
  void dropDirAttrs(uint64_t ino);
  void dropAllDirAttrs();

  // Directory listings the kernel caches (FOPEN_CACHE_DIR): noteListed()
  // when a listing from meta reached its end; listingFresh() tells opendir
  // whether the kernel may keep the listing it has (FOPEN_KEEP_CACHE), i.e.
  // one was read within entry_timeout. The kernel drops it on any change of
  // the directory through this mount; another client's change shows within
  // entry_timeout, as its dentries do. A fixed table of kListedSlots.
  void noteListed(uint64_t ino);
  bool listingFresh(uint64_t ino);

 private:
  Client* const client_;
  const MountOptions options_;
  std::unique_ptr<PackViews> views_;
  fuse_session* session_ = nullptr;
  std::mutex seen_mu_;
  std::unordered_map<uint64_t, std::pair<int64_t, uint64_t>> seen_;  // ino -> (mtime, size)
  struct NoXattrs {
    uint64_t ino = 0;
    std::chrono::steady_clock::time_point until;
  };
  static constexpr size_t kNoXattrSlots = 4096;
  std::mutex no_xattrs_mu_;
  std::unique_ptr<NoXattrs[]> no_xattrs_;
  struct NoCaps {
    uint64_t ino = 0;  // 0: empty
    uint64_t gen = 0;  // the slot's change count the answer was read at
    std::chrono::steady_clock::time_point until;
  };
  static constexpr size_t kNoCapsSlots = 4096;
  std::mutex no_caps_mu_;
  std::unique_ptr<NoCaps[]> no_caps_;
  std::unique_ptr<uint64_t[]> caps_gen_;  // per slot: xattr changes begun and ended
  struct DirAttrs {
    uint64_t ino = 0;  // 0: empty
    std::chrono::steady_clock::time_point until;
    uint64_t dropped = 0;  // ticket count at the slot's last drop
    FileInfo info;
  };
  static constexpr size_t kDirAttrSlots = 1024;
  std::atomic<uint64_t> dir_attrs_seq_{0};
  std::mutex dir_attrs_mu_;
  std::unique_ptr<DirAttrs[]> dir_attrs_;
  struct Listed {
    uint64_t ino = 0;  // 0: empty
    std::chrono::steady_clock::time_point at;
  };
  static constexpr size_t kListedSlots = 1024;
  std::mutex listed_mu_;
  std::unique_ptr<Listed[]> listed_;
};

// Fills `st` from an inode's attributes (exposed for tests).
void infoToStat(const FileInfo& info, struct stat* st);
// Mounts and serves until SIGINT/SIGTERM (blocked in every thread by the
// caller, taken here with sigwait), then unmounts. `ready` runs once mounted.
Status serve(Client* client, const MountOptions& options, const std::function<void()>& ready);

}  // namespace cistern::fuse
