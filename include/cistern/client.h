// libcistern: the native client of the cistern file system.
//
//   cistern::Client::Options o;
//   o.cluster = "127.0.0.1:7420";            // or $CISTERN_CLUSTER
//   auto [client, err] = cistern::Client::connect(o);
//   if (err) { fprintf(stderr, "%s\n", err.message.c_str()); ... }
//   cistern::File* f = nullptr;
//   err = client->open("/data/a.bin", O_WRONLY | O_CREAT | O_TRUNC, 0644, &f);
//   size_t n;
//   err = f->pwrite(buf, len, 0, &n);
//   err = f->close();                         // flushes, records the length
//
// Every call returns an Error: `errno_value` is 0 on success, else an errno
// (ENOENT, EEXIST, ENOTDIR, EISDIR, EACCES, ENOSPC, EIO, ENOTCONN, ...), and
// `message` names the path and the problem, like coreutils does.
//
// Paths are absolute, '/'-separated, within the cluster's namespace. The
// client resolves them component by component with a small dentry cache
// (entries expire after `attr_cache_ms`; the client's own changes invalidate
// them). File bytes go straight to the storage targets: a read or write is
// split by chunk and the pieces for different chains run in parallel, at most
// `io_parallel_max` at a time. Small sequential writes are coalesced in a
// buffer of at most one chunk per open file, flushed when full, on fsync(),
// on close() and before a read of the same file. A buffer flushed because it
// is full is written behind: the caller goes on writing while up to
// `write_behind_bytes` of such buffers are on their way, and a failed one is
// reported by the next write, fsync() or close(). The file's length is sent
// to the metadata service on fsync() and close(). Sequential readers get
// read-ahead that grows up to `readahead_max_bytes`. Transient errors (a busy
// target, a dropped connection) are retried with backoff for up to
// `retry_ms`, then reported.
//
// Thread-safety: a Client may be used from many threads. A File may be used
// from many threads for pread/pwrite; its buffers are guarded.
// Memory: bounded by buffered_files_max × (two chunks of write buffer + the
// larger of write_behind_bytes and a chunk + two read-ahead windows): the
// handles of one inode share its buffers, and inodes past that many open
// read and write straight through. Lifetime: destroy every File before its
// Client.
#pragma once

#include <fcntl.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <vector>

namespace cistern {

struct Error {
  int errno_value = 0;
  std::string message;
  explicit operator bool() const { return errno_value != 0; }
};

struct FileInfo {
  uint64_t ino = 0;
  // Type bits (S_IFREG, S_IFDIR, S_IFLNK, S_IFIFO, S_IFSOCK, S_IFCHR,
  // S_IFBLK) | permission bits.
  uint32_t mode = 0;
  uint32_t nlink = 0;
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint64_t size = 0;
  int64_t mtime_ns = 0;
  int64_t ctime_ns = 0;
  int64_t atime_ns = 0;
  uint32_t chunk_size = 0;  // regular files
  uint64_t rdev = 0;        // character and block devices: makedev(major, minor)
  uint64_t parent = 0;      // directories: the directory holding it (the root: itself)
  bool isDir() const { return (mode & 0170000) == 0040000; }
  bool isRegular() const { return (mode & 0170000) == 0100000; }
};

struct DirEntry {
  std::string name;
  FileInfo info;
};

// Who a call of the inode API acts as (a FUSE request's caller, a Python
// process's user); the meta service checks every permission against it.
struct Credentials {
  uint32_t uid = 0;
  uint32_t gid = 0;
  std::vector<uint32_t> groups;  // supplementary groups
};

// What setattr() changes; unset fields stay as they are.
struct AttrChanges {
  std::optional<uint32_t> mode;  // permission bits (07777)
  std::optional<uint32_t> uid;
  std::optional<uint32_t> gid;
  std::optional<uint64_t> size;
  std::optional<int64_t> atime_ns;  // explicit times need the owner
  std::optional<int64_t> mtime_ns;
  bool atime_now = false;  // the current time: the owner or a writer
  bool mtime_now = false;
};

// One page of a directory listing, in name order.
struct DirPage {
  std::vector<DirEntry> entries;
  std::string next_cookie;  // pass back to continue; empty when the listing is done
};

struct SpaceInfo {
  uint64_t bytes_total = 0;
  uint64_t bytes_free = 0;
  uint64_t inodes_used = 0;
  uint64_t inodes_total = 0;  // a quota's limit on inodes; 0: not bounded
  bool capacity_known = false;
  uint32_t block_size = 4096;  // the unit statfs(2) counts blocks in
  uint32_t name_max = 255;     // the longest name
};

// A tenant (docs/security.md): its clients see `root` as /.
struct TenantInfo {
  std::string name;
  uint32_t id = 0;
  uint64_t root = 0;  // the directory's inode
  int64_t created_ns = 0;
};

// A quota on a directory's subtree (docs/quota.md); limits of 0: none.
struct QuotaInfo {
  uint64_t dir = 0;  // the directory's inode
  uint64_t bytes_max = 0;
  uint64_t inodes_max = 0;
  uint64_t bytes_used = 0;
  uint64_t inodes_used = 0;
};

// Who this client's token says it is (whoami); `checked` false: the
// cluster does not check tokens.
struct Identity {
  bool checked = false;
  std::string tenant;
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint32_t rights = 0;  // bits: 1 read, 2 write, 4 admin
  int64_t expires_unix_s = 0;
  uint64_t token_id = 0;
};

struct TargetInfo {
  uint32_t id = 0;
  uint32_t chain = 0;
  std::string endpoint;
  std::string path;
  bool failed = false;
  uint64_t fs_total_bytes = 0;
  uint64_t fs_free_bytes = 0;
  uint64_t chunks = 0;
  uint64_t data_bytes = 0;
  uint64_t kept_bytes = 0;  // freed slots holding their blocks for new chunks
  bool reachable = false;
};

// Outcome of a namespace check (cistern fsck).
struct CheckReport {
  uint64_t inodes = 0;
  uint64_t dentries = 0;
  uint64_t sessions = 0;               // files open for writing
  uint64_t gc_entries = 0;             // chunk ranges waiting for deletion
  uint64_t chunks = 0;                 // in storage
  uint64_t chunks_past_end = 0;        // bytes written past a file's recorded length
  uint64_t orphan_chunks = 0;          // of no file (also listed as problems)
  uint64_t orphan_chunks_removed = 0;  // with remove_orphan_chunks
  std::vector<std::string> problems;   // one sentence each; empty when clean
};

// One range of File::preadMany.
struct FileRange {
  void* buf = nullptr;
  size_t n = 0;
  uint64_t offset = 0;
  size_t done = 0;  // set as pread's *done
};

class File {
 public:
  virtual ~File() = default;
  // Reads up to n bytes at offset; *done is less than n only at the end of file.
  virtual Error pread(void* buf, size_t n, uint64_t offset, size_t* done) = 0;
  // Reads many ranges (a pack's samples). A file opened with O_DIRECT
  // sends the ranges that one storage server holds together, several per
  // request, read by it in parallel; otherwise one pread each. The first
  // error is returned (ranges after it may be unread).
  virtual Error preadMany(std::span<FileRange> ranges) {
    for (auto& r : ranges) {
      if (Error e = pread(r.buf, r.n, r.offset, &r.done)) return e;
    }
    return {};
  }
  virtual Error pwrite(const void* buf, size_t n, uint64_t offset, size_t* done) = 0;
  // Durable: buffered bytes are written to storage and synced there (with
  // every other write of this client to the same targets), the length is
  // recorded by meta.
  virtual Error fsync() = 0;
  // What close(2) of one of several descriptors does: this client's writes
  // of the file become visible to other clients (buffered bytes to storage,
  // synced, the length recorded) and a write error learnt since is
  // reported; the handle stays open. `end_session`: the caller means to
  // write no more through it (the FUSE mount's flush of an inode's only
  // handle), so its write session ends in the same commit; a write after
  // all still lands and is recorded at close(), but until then the file is
  // not held against another client's unlink.
  virtual Error flush(bool end_session = false) = 0;
  // fsync() and end the file's session. Further calls fail with EBADF.
  virtual Error close() = 0;
  // The length as this handle knows it (including its own buffered writes).
  virtual uint64_t size() const = 0;
  virtual uint64_t ino() const = 0;
  // The attributes as this client knows them: the open's (or, after
  // flush(), fsync() or close(), meta's answer to it), with this client's
  // own length and mode changes since.
  virtual FileInfo info() const = 0;
  // posix_fallocate(3) without reserving space (cistern allocates chunks as
  // they are written): the length becomes at least `end`, never less.
  virtual Error allocate(uint64_t end) = 0;
  // Handles of this file open through this client, this one included.
  virtual uint32_t openHandles() const = 0;
  // The whole file, when this handle already holds it in memory (a small
  // file's bytes kept in the KV come with its open): a mount hands them to
  // the kernel's page cache with the open, saving the read's round trip.
  // False when it does not.
  virtual bool wholeContents(std::string* out) const { return false; }
};

// Memory shared with the storage servers on this host (3FS's "iov"): a read
// of a File opened with O_DIRECT into it is filled by a same-host server
// itself, without a copy through a socket. Give it back by destroying it.
class SharedBuffer {
 public:
  virtual ~SharedBuffer() = default;
  virtual uint8_t* data() = 0;
  virtual size_t size() const = 0;
  // False when a read into it ended (an error, a timeout) while a server may
  // still write into it: its bytes cannot be trusted (read again into other
  // memory), and it is never lent again.
  virtual bool intact() = 0;
};

class Client {
 public:
  struct Options {
    // host:port of the cluster (mgmtd). Empty: $CISTERN_CLUSTER, else 127.0.0.1:7420.
    std::string cluster;
    // The tenant token its calls carry (docs/security.md; `cistern token
    // issue`). Empty: $CISTERN_TOKEN, else none (a cluster that checks
    // tokens then refuses every call with EACCES).
    std::string token;
    // Credentials of the calls; default: this process's.
    uint32_t uid = ~0u;
    uint32_t gid = ~0u;
    std::vector<uint32_t> groups;
    uint32_t attr_cache_ms = 1000;
    uint32_t io_parallel_max = 8;
    uint64_t readahead_max_bytes = 8ull << 20;
    // Full write buffers of one file being written to storage while its
    // writer goes on (at least one, whatever its size); 0: a full buffer is
    // written before the write that filled it returns.
    uint64_t write_behind_bytes = 8ull << 20;
    uint32_t retry_ms = 10000;  // transient errors are retried for this long
    uint32_t call_timeout_ms = 30000;
    // Shared memory lent to storage servers on this host, which read chunk
    // bytes straight into it and take written bytes from it instead of
    // moving them over a socket; 0: off.
    uint64_t shm_bytes = 64ull << 20;
    // Read-ahead windows (readahead_max_bytes each) in that memory besides:
    // servers on this host read straight into them, so sequential reads skip
    // a copy. Handles that find none free read ahead into the heap.
    uint32_t shm_readahead_windows = 8;
    // Reads of more than a small piece from storage servers on this host
    // that allow it read the chunk bytes from the servers' files themselves,
    // verified against the CRCs the server gives (docs/client.md,
    // "Short-circuit reads"); only a client that can open those files (the
    // servers' user, or root) can. false: always through the server.
    bool short_circuit_reads = true;
    // Chunk writes are acknowledged once they are on the storage servers'
    // disks (in the device's or the kernel's cache) and made durable by
    // fsync() and close() — one Sync per target this client wrote to — or
    // by the servers themselves within storage.sync_interval_ms
    // (docs/client.md, "Durability"). true: every write is durable when it
    // returns (the servers sync each batch of writes).
    bool sync_each_write = false;
    // Metadata calls to servers running in this same process (`cistern up
    // --mount`) run on the calling thread instead of over loopback TCP;
    // false: always over the socket, as from another process.
    bool local_calls = true;
    // A new file written whole by its creator and no larger than this is
    // handed to the metadata service at close, which may keep its bytes in
    // the KV instead of a chunk (one commit instead of two; reads need no
    // storage call). 0: never. The service has its own limit (8 KiB).
    uint32_t inline_max_bytes = 8u << 10;
    // How often the client tells the metadata service it is alive, which
    // keeps its files open for writing theirs: the service ends the write
    // sessions of a client silent for its session timeout (5 min) as a close
    // would, so a client that dies leaves no file held open. 0: never (for
    // clients that open no file for long).
    uint32_t session_renew_ms = 20000;
    // Inodes open through this client that get a write buffer and
    // read-ahead (docs/client.md, "Open files"); handles of the others read
    // and write straight through, which bounds the memory of a client with
    // many files open.
    uint32_t buffered_files_max = 256;
  };

  static std::pair<std::unique_ptr<Client>, Error> connect(const Options& options);
  virtual ~Client() = default;

  virtual Error stat(const std::string& path, FileInfo* out) = 0;
  virtual Error list(const std::string& path, std::vector<DirEntry>* out) = 0;
  // `parents`: like mkdir -p (existing directories are fine).
  virtual Error mkdir(const std::string& path, uint32_t mode, bool parents) = 0;
  virtual Error rename(const std::string& from, const std::string& to) = 0;
  virtual Error unlink(const std::string& path) = 0;
  virtual Error rmdir(const std::string& path) = 0;
  // mknod(2): a FIFO, socket or device node; `mode` holds its type
  // (S_IFIFO, S_IFSOCK, S_IFCHR, S_IFBLK; S_IFREG makes an empty regular
  // file) and permission bits. cistern keeps the node; its data is the
  // kernel's (open it through a mount: open() here fails with ENXIO).
  // Devices need root (EPERM); `rdev` is kept for devices only.
  virtual Error mknod(const std::string& path, uint32_t mode, uint64_t rdev) = 0;
  // symlink(2) and readlink(2). stat() does not follow a final symlink.
  virtual Error symlink(const std::string& target, const std::string& path) = 0;
  virtual Error readlink(const std::string& path, std::string* target) = 0;
  // Shrinking (and O_TRUNC) cuts every byte at and past `size` in storage,
  // also bytes other clients wrote there and have not closed yet, before the
  // new size is recorded: a truncate that fails part way leaves the old size
  // reading zeros from `size` on, never old bytes past a recorded end.
  virtual Error truncate(const std::string& path, uint64_t size) = 0;
  // flags: O_RDONLY / O_WRONLY / O_RDWR with O_CREAT, O_EXCL, O_TRUNC.
  // Regular files only: EISDIR for a directory, ENXIO for a FIFO, socket or
  // device, EINVAL for a symlink (resolve it with readlink()).
  virtual Error open(const std::string& path, int flags, uint32_t mode,
                     std::unique_ptr<File>* out) = 0;
  // A buffer of `n` bytes in the client's shared memory (SharedBuffer);
  // null when shared memory is off or none of that size is free.
  virtual std::unique_ptr<SharedBuffer> borrowSharedBuffer(size_t n) = 0;
  // The cluster's space, or, when directory `dir` (an inode; 0: the root)
  // lies under a quota, the nearest one's limits and use (docs/quota.md).
  virtual Error statfs(SpaceInfo* out, uint64_t dir = 0) = 0;
  // Every namespace change this client (or any) saw acknowledged is durable
  // when it returns: fsyncdir(2), syncfs(2). File::fsync() does it too, for
  // everything before it (docs/fuse.md, "Durability").
  virtual Error syncNamespace() = 0;
  // --- The inode API: the namespace by inode number, for the FUSE mount
  // and the Python module. Each call acts as `who`; errors are errnos as
  // the path calls give them. Inode 1 is the root.
  static constexpr uint64_t kRootIno = 1;
  virtual Error lookup(const Credentials& who, uint64_t parent, const std::string& name,
                       FileInfo* out) = 0;
  virtual Error getattr(uint64_t ino, FileInfo* out) = 0;
  // chmod, chown, utimens and truncate with Linux's permission rules; a
  // smaller size cuts storage before it is recorded (as truncate()).
  virtual Error setattr(const Credentials& who, uint64_t ino, const AttrChanges& changes,
                        FileInfo* out) = 0;
  virtual Error mkdirAt(const Credentials& who, uint64_t parent, const std::string& name,
                        uint32_t mode, FileInfo* out) = 0;
  // As mknod(): `mode` holds the type (S_IFIFO, S_IFSOCK, S_IFCHR, S_IFBLK).
  virtual Error mknodAt(const Credentials& who, uint64_t parent, const std::string& name,
                        uint32_t mode, uint64_t rdev, FileInfo* out) = 0;
  virtual Error symlinkAt(const Credentials& who, uint64_t parent, const std::string& name,
                          const std::string& target, FileInfo* out) = 0;
  virtual Error linkAt(const Credentials& who, uint64_t ino, uint64_t new_parent,
                       const std::string& new_name, FileInfo* out) = 0;
  virtual Error unlinkAt(const Credentials& who, uint64_t parent, const std::string& name) = 0;
  virtual Error rmdirAt(const Credentials& who, uint64_t parent, const std::string& name) = 0;
  // `flags`: RENAME_NOREPLACE, RENAME_EXCHANGE (renameat2(2)).
  virtual Error renameAt(const Credentials& who, uint64_t parent, const std::string& name,
                         uint64_t new_parent, const std::string& new_name, unsigned flags) = 0;
  virtual Error readlinkAt(uint64_t ino, std::string* target) = 0;
  // open(2) of regular file `ino` as `who`. flags: O_RDONLY / O_WRONLY /
  // O_RDWR with O_TRUNC, O_APPEND and O_DIRECT (no write buffer and no
  // read-ahead: parallel I/O straight to storage, as for fio's direct=1).
  // Every handle of one inode opened through one client shares its buffers,
  // so a read through one sees a write through another at once, and a file
  // unlinked or renamed over by this client while open here stays readable
  // until its last handle closes. `info`: the file's attributes.
  virtual Error openAt(const Credentials& who, uint64_t ino, int flags, std::unique_ptr<File>* out,
                       FileInfo* info = nullptr) = 0;
  // open(2) with O_CREAT of `name` in `parent` (`mode`: permission bits):
  // O_EXCL fails with EEXIST on an existing name, else an existing file is
  // opened as openAt() does. `created`: whether this call made the file.
  virtual Error createAt(const Credentials& who, uint64_t parent, const std::string& name,
                         uint32_t mode, int flags, std::unique_ptr<File>* out, FileInfo* info,
                         bool* created = nullptr) = 0;
  // access(2): `mask` of R_OK, W_OK, X_OK (0: exists).
  virtual Error access(const Credentials& who, uint64_t ino, int mask) = 0;
  // Up to `limit` entries (at most 1000) after `cookie` ("" first), with
  // their attributes when `attributes` (otherwise each entry's FileInfo has
  // only its ino and the type bits of its mode).
  virtual Error readdirAt(const Credentials& who, uint64_t ino, const std::string& cookie,
                          uint32_t limit, bool attributes, DirPage* out) = 0;
  // Extended attributes ("user.", "trusted.", "security."; values ≤ 64 KiB).
  // `flags`: XATTR_CREATE, XATTR_REPLACE (setxattr(2)).
  virtual Error setxattr(const Credentials& who, uint64_t ino, const std::string& name,
                         const std::string& value, int flags) = 0;
  virtual Error getxattr(const Credentials& who, uint64_t ino, const std::string& name,
                         std::string* value) = 0;
  virtual Error listxattr(const Credentials& who, uint64_t ino,
                          std::vector<std::string>* names) = 0;
  virtual Error removexattr(const Credentials& who, uint64_t ino, const std::string& name) = 0;

  // Targets, chains and their space (cistern status).
  virtual Error targets(std::vector<TargetInfo>* out) = 0;
  // Checks the namespace's invariants, and the chunks in storage against
  // it, on the server; read-only unless `remove_orphan_chunks`, which also
  // removes the chunks found to belong to no file.
  virtual Error fsck(CheckReport* out, bool remove_orphan_chunks = false) = 0;

  // Tenants and tokens (a token of tenant "cluster" with the admin right,
  // when the cluster checks tokens; EPERM otherwise). tenantCreate makes
  // the directory `dir` (its parent must exist, outside any tenant) owned
  // by uid:gid with `mode`, as the tenant's root.
  virtual Error tenantCreate(const std::string& name, const std::string& dir, uint32_t uid,
                             uint32_t gid, uint32_t mode, TenantInfo* out) = 0;
  virtual Error tenantList(std::vector<TenantInfo>* out) = 0;
  // Its tokens stop working; its directory and files stay.
  virtual Error tenantRemove(const std::string& name) = 0;
  // Token `id` is refused until it expires (within a second by meta, and
  // within one capability lifetime by storage).
  virtual Error revokeToken(uint64_t id, int64_t expires_unix_s) = 0;
  virtual Error whoami(Identity* out) = 0;

  // Quotas on directories (docs/quota.md), by the directory's inode
  // (FileInfo::ino). Setting needs an admin's token (a tenant's own within
  // its subtree); limits of 0 and 0 remove the quota. quotaGet: ENOENT when
  // the directory has none.
  virtual Error quotaSet(uint64_t dir, uint64_t bytes_max, uint64_t inodes_max, QuotaInfo* out) = 0;
  virtual Error quotaGet(uint64_t dir, QuotaInfo* out) = 0;
  virtual Error quotaList(std::vector<QuotaInfo>* out) = 0;
};

}  // namespace cistern
