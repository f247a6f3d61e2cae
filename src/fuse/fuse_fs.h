// The FUSE mount: cistern as a POSIX file system (docs/fuse.md).
//
// The kernel speaks inodes; cistern inode numbers are used as FUSE node ids
// (the root is 1 in both). Every request is answered by calls to the meta
// service with the caller's credentials (uid, gid, supplementary groups from
// the request), and the meta service checks every permission. Names,
// attributes, directories and xattrs go through libcistern's public inode
// API (include/cistern/client.h); open files still use its internals
// (FileImpl, sessions) until that API has handles. The kernel
// checks mode bits too (default_permissions), also on the paths it walks
// from its dentry cache without asking us. File
// bytes go through libcistern's FileImpl: one per open inode, shared by all
// of the kernel's handles of that inode, so a read through one descriptor
// sees a write through another at once.
//
// Sessions: a write open holds a meta write session per handle (its length
// and mtime are recorded on flush and release). A file open only for reading
// takes a session ("hold") only when this mount unlinks or renames over it,
// so that it stays readable until the last close — the common case costs no
// commit. Memory: at most `buffered_files_max` open inodes get a write buffer
// and read-ahead; the rest read and write straight through.
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

#include "client/client_impl.h"
#include "client/file_impl.h"
#include "fuse/mount_options.h"

namespace cistern::fuse {

// An inode open through the mount: one FileImpl for all its kernel handles.
struct OpenInode {
  uint64_t ino = 0;
  std::unique_ptr<client::FileImpl> file;
  uint32_t handles = 0;
  uint32_t writers = 0;
  uint64_t hold_session = 0;  // taken before this mount unlinks the file
  bool buffered = false;
  // The mode as this mount last saw it (open, setattr): a write through a
  // handle the kernel sends past its page cache clears S_ISUID/S_ISGID from
  // it here, as the kernel's own privilege check would (Handle::kernel_direct).
  std::atomic<uint32_t> mode{0};
  // The kernel asks for security.capability before every write through its
  // page cache (to drop file capabilities), and the mount before every write
  // past it; while the inode is open here, meta's "none" is remembered for
  // attr_timeout (FuseFs::noteNoCaps, knownNoCaps).
  // xattr_gen counts this mount's xattr changes of the inode (bumped before
  // and after each); no_caps_at is gen + 1 of the getxattr that found none,
  // and holds only while xattr_gen is still that gen.
  std::atomic<uint64_t> xattr_gen{0};
  std::atomic<uint64_t> no_caps_at{0};
  std::atomic<int64_t> no_caps_until_ns{0};  // steady clock
};

// fi->fh of an open file.
struct Handle {
  std::shared_ptr<OpenInode> node;
  std::atomic<uint64_t> session = 0;  // this handle's write session (0: none or ended)
  bool write = false;
  bool direct = false;  // O_DIRECT: parallel I/O past the page cache and read-ahead
  // The kernel sends this handle's writes past its page cache
  // (FOPEN_DIRECT_IO: O_DIRECT or write-only, see attach in ops_file.cc), so they skip
  // the kernel's removal of setuid/setgid and file capabilities, which the
  // mount does itself.
  bool kernel_direct = false;
};

class FuseFs {
 public:
  FuseFs(client::ClientImpl* client, MountOptions options);
  ~FuseFs();

  static const fuse_lowlevel_ops& ops();
  const MountOptions& options() const { return options_; }
  client::ClientImpl& client() { return *client_; }

  // Credentials of the request (groups read from /proc for non-root callers).
  Credentials who(fuse_req_t req) const;
  meta::Caller caller(fuse_req_t req) const;
  // A meta call by short method name ("Lookup").
  Status meta(const char* method, const google::protobuf::Message& in,
              google::protobuf::Message* out);
  // A meta call whose status is the reply on error; true when it succeeded.
  bool call(fuse_req_t req, const char* method, const google::protobuf::Message& in,
            google::protobuf::Message* out);
  // The kernel's entry for an inode (a lookup reply, create, readdirplus).
  fuse_entry_param entryOf(const FileInfo& info);
  void replyEntry(fuse_req_t req, const FileInfo& info);
  void replyAttr(fuse_req_t req, const FileInfo& info);
  void fillStat(const FileInfo& info, struct stat* st);
  // The reply of an inode API call: the attributes, or its errno as the reply.
  bool answered(fuse_req_t req, const Error& e);

  // Open-inode table.
  std::shared_ptr<OpenInode> findOpen(uint64_t ino);
  bool anyOpen();
  // Kernel handles open on the inode of `node`.
  uint32_t handles(const OpenInode& node);
  std::shared_ptr<OpenInode> acquire(const meta::Inode& inode, bool write);
  // Drops one handle; the last one flushes, records the length and frees the file.
  Status release(Handle* h);
  // Before a truncate of `ino`: if it is open here (`node`), its buffered
  // bytes go to storage and `local_size` becomes the length this mount has
  // not recorded yet (0 otherwise). Returns 0 or the errno to reply.
  int flushForTruncate(uint64_t ino, std::shared_ptr<OpenInode>* node, uint64_t* local_size);
  // Before a truncate of `ino` to `new_size` by `caller` (who must have
  // `mask`, R_OK | W_OK, on it): writes this mount's buffered bytes, then
  // cuts storage first (ClientImpl::cutForTruncate, with this mount's
  // unrecorded length too); the caller commits the size. `node`: the file
  // if open here. Returns 0 or the errno to reply.
  int prepareTruncate(uint64_t ino, const meta::Caller& caller, int mask, uint64_t new_size,
                      std::shared_ptr<OpenInode>* node);
  // Before this mount unlinks or replaces `ino`: readers open here take a hold.
  void holdIfOpen(fuse_req_t req, uint64_t ino);
  // Close-to-open: true when the inode is unchanged since this mount last saw it.
  bool unchangedSinceLastSeen(const meta::Inode& inode);
  void remember(const meta::Inode& inode);
  // Tells the kernel its cached attributes of `ino` are stale (attributes
  // only: safe inside an open of that inode).
  void invalidateAttrs(uint64_t ino);
  void setSession(fuse_session* se) { session_ = se; }

  // A file this mount just created has no extended attributes: for
  // attr_timeout its getxattr and listxattr are answered here (the kernel
  // asks for security.capability before the first write of every file),
  // unless this mount sets one meanwhile. Another client's setxattr shows
  // after that time, like its attribute changes. A fixed table of
  // kNoXattrSlots entries; a colliding entry is overwritten (then the meta
  // service answers).
  void noteNoXattrs(uint64_t ino);
  // An open inode's "no security.capability" from meta, read when its
  // xattr_gen was `gen`: answered here for attr_timeout, unless this mount
  // changes its xattrs meanwhile. Another client's setxattr shows after
  // that time, as its attribute changes do.
  void noteNoCaps(OpenInode& node, uint64_t gen);
  bool knownNoCaps(const OpenInode& node) const;
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

 private:
  client::ClientImpl* const client_;
  const MountOptions options_;
  std::unordered_map<std::string, net::Method> methods_;  // meta methods by short name
  std::mutex open_mu_;
  std::unordered_map<uint64_t, std::shared_ptr<OpenInode>> open_;
  uint32_t buffered_open_ = 0;
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
};

// Fills `st` from an inode's attributes (exposed for tests).
void infoToStat(const FileInfo& info, struct stat* st);
// The errno a status becomes in a FUSE reply.
int replyErrno(const Status& s);

// Mounts and serves until SIGINT/SIGTERM (blocked in every thread by the
// caller, taken here with sigwait), then unmounts. `ready` runs once mounted.
Status serve(client::ClientImpl* client, const MountOptions& options,
             const std::function<void()>& ready);

}  // namespace cistern::fuse
