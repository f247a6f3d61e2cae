// MetaStore: the POSIX namespace on the transactional KV (DESIGN.md §2–3).
//
// Each operation runs as one serializable KV transaction (retried on
// conflict), so it is atomic and isolated from every other operation, on this
// process or any other meta server sharing the KV: meta servers are
// stateless. Operations take directory inode numbers plus names, as FUSE
// lowlevel does; the caller resolves paths one component at a time with
// lookup(), which checks search permission on the directory.
//
// Mutations take a RequestId. When its client id is set, the outcome is
// recorded in the same transaction, and a retry of the same id (a client that
// lost the reply) returns the recorded outcome instead of acting again.
//
// Directory mtime/ctime are not updated by entry creation and removal: that
// would make every create in a directory conflict with every other one. This
// is a documented deviation from POSIX (docs/meta_kv_schema.md).
// Thread-safe; one MetaStore per process is enough.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "common/clock.h"
#include "common/result.h"
#include "kv/engine.h"
#include "meta.pb.h"
#include "meta/inode_allocator.h"

namespace cistern::meta {

class StoredEnd;

struct MetaOptions {
  // Chunk size of new files when no directory sets one. Default: 1 MiB.
  uint32_t chunk_size_default = 1u << 20;
  // Chains a new file is striped over; 0 = all chains. Default: 0.
  uint32_t stripe_width_default = 0;
  // Inode numbers leased per allocator transaction. Default: 1024.
  uint32_t inode_alloc_block = 1024;
  // Most entries one readdir call returns. Default: 1000.
  uint32_t readdir_limit_max = 1000;
  // Files up to this size may keep their bytes in the KV instead of chunks
  // (close() with inline data); 0 turns that off. At most 64 KiB (the
  // smallest chunk; larger values are cut to that). Default: 8 KiB.
  uint32_t inline_max_bytes = 8u << 10;
  // How long a client converting an inline file holds it. Default: 10 s.
  uint32_t inline_convert_lease_ms = 10000;
  // A client's write sessions end this long after it last renewed them (or
  // opened them) when reapSessions() runs; clients renew every 20 s by
  // default, so only one paused or cut off for minutes loses them.
  // Default: 5 min.
  uint32_t session_timeout_ms = 300000;
  // Every namespace change durable before it is acknowledged. Off (the
  // default), changes are committed unsynced (kv::Durability::kLazy) and
  // become durable at the next fsync of any file or directory (close with
  // `durable`, sync()), or within the KV's lazy sync delay (1 s): a crash
  // of the machine may lose the last of them, always a suffix, never part
  // of one (docs/fuse.md, "Durability"). A crash of the process loses none.
  bool sync_namespace = false;
};

struct RequestId {
  std::string client;  // empty: not idempotent (the request is not retried)
  uint64_t seq = 0;
};

struct DirListing {
  struct Entry {
    std::string name;
    DirEntry entry;
    Inode inode;  // filled by readdirplus only
  };
  std::vector<Entry> entries;
  // Pass back as `cookie` to continue after the last entry; empty when done.
  std::string next_cookie;
};

// Changes made by setattr(); unset fields stay as they are.
struct SetAttr {
  std::optional<uint32_t> mode;
  std::optional<uint32_t> uid;
  std::optional<uint32_t> gid;
  std::optional<uint64_t> size;
  std::optional<int64_t> atime_ns;  // explicit time (needs ownership)
  std::optional<int64_t> mtime_ns;
  bool atime_now = false;  // the current time (ownership or write permission)
  bool mtime_now = false;
};

struct StatFs {
  uint64_t inodes_used = 0;
  uint64_t inodes_total = 0;  // a quota's limit; 0: not bounded
  uint64_t bytes_total = 0;  // from the storage capacity source; 0 when unknown
  uint64_t bytes_free = 0;
  bool capacity_known = false;
  uint32_t block_size = 4096;
  uint32_t name_max = 255;
};

// Flags of setxattr(), as setxattr(2).
inline constexpr uint32_t kXattrCreate = 1;
inline constexpr uint32_t kXattrReplace = 2;

// Flags of rename(), as renameat2(2).
inline constexpr uint32_t kRenameNoReplace = 1;
inline constexpr uint32_t kRenameExchange = 2;

class MetaStore {
 public:
  MetaStore(kv::Engine& engine, const MetaOptions& options = {},
            Clock& clock = SystemClock::instance());

  // Creates the root directory (inode 1, mode 0755, owned by root) if absent.
  Status init();

  Result<Inode> lookup(const Caller& c, uint64_t parent, std::string_view name);
  Result<Inode> getattr(uint64_t ino);
  Result<Inode> mkdir(const Caller& c, uint64_t parent, std::string_view name, uint32_t mode,
                      const RequestId& rid = {});
  // Creates a regular file; with `exclusive` false an existing regular file is
  // returned as is (O_CREAT without O_EXCL).
  Result<Inode> create(const Caller& c, uint64_t parent, std::string_view name, uint32_t mode,
                       bool exclusive, const RequestId& rid = {});
  struct Opened {
    Inode inode;
    uint64_t session = 0;     // 0 for read-only opens
    std::string inline_data;  // the bytes of a data_inline file
    bool created = false;     // create: this call made the file
  };
  // create() that also opens a file it creates for writing, in the same
  // transaction: `session` is 0 when the file already existed (open it).
  // create() that says whether it made the file (Opened::created; no session).
  Result<Opened> createFile(const Caller& c, uint64_t parent, std::string_view name, uint32_t mode,
                            bool exclusive, const RequestId& rid = {});
  Result<Opened> createOpen(const Caller& c, uint64_t parent, std::string_view name, uint32_t mode,
                            bool exclusive, std::string_view client, const RequestId& rid = {});
  Status unlink(const Caller& c, uint64_t parent, std::string_view name, const RequestId& rid = {});
  Status rmdir(const Caller& c, uint64_t parent, std::string_view name, const RequestId& rid = {});
  Status rename(const Caller& c, uint64_t src_parent, std::string_view src_name,
                uint64_t dst_parent, std::string_view dst_name, uint32_t flags = 0,
                const RequestId& rid = {});
  // chmod, chown, truncate and utimens with POSIX permission rules. A
  // truncate only records the size: the client cut the chunks past a smaller
  // one before it called (docs/client.md, "Truncate").
  Result<Inode> setattr(const Caller& c, uint64_t ino, const SetAttr& attr,
                        const RequestId& rid = {});
  // A new name for a non-directory (kNotPermitted for directories).
  Result<Inode> link(const Caller& c, uint64_t ino, uint64_t new_parent, std::string_view new_name,
                     const RequestId& rid = {});
  Result<Inode> symlink(const Caller& c, uint64_t parent, std::string_view name,
                        std::string_view target, const RequestId& rid = {});
  Result<std::string> readlink(uint64_t ino);
  // A FIFO, socket, character or block device (kInvalidArgument for other
  // types: regular files are create()'s). Devices need root (kNotPermitted);
  // `rdev` is kept for devices only.
  Result<Inode> mknod(const Caller& c, uint64_t parent, std::string_view name, FileType type,
                      uint32_t mode, uint64_t rdev, const RequestId& rid = {});
  // access(2): ok when `c` may access `ino` with `mask` (kMayRead|kMayWrite|kMayExec; 0 = exists).
  Status access(const Caller& c, uint64_t ino, int mask);
  // getattr of many inodes in one snapshot; a missing one is reported in its slot.
  std::vector<Result<Inode>> batchGetattr(const std::vector<uint64_t>& inos);

  // open: checks permission for the access mode; `write` opens get a session
  // (kept until close) so that an unlinked file stays until its last writer
  // closes; `truncate` (O_TRUNC) sets the length to 0. `hold`: a read open
  // that takes a session too (the file survives an unlink until it closes).
  Result<Opened> open(const Caller& c, uint64_t ino, bool read, bool write, bool truncate,
                      std::string_view client, const RequestId& rid = {}, bool hold = false);
  // close: ends a write session, raising the length to `length` when larger
  // and setting mtime when `wrote`. The last close of an unlinked file removes it.
  // With `inline_data` (the whole file, `length` bytes, nothing of it in
  // chunks) the bytes are kept in the KV if the inode is still inline_ok and
  // they fit inline_max_bytes; otherwise kInlineRefused and the session stays.
  // `durable` (fsync): the close is durable when it returns, and with it
  // every change committed before it.
  Result<Inode> close(uint64_t ino, uint64_t session, uint64_t length, bool wrote,
                      const RequestId& rid = {},
                      const std::optional<std::string>& inline_data = std::nullopt,
                      bool durable = false);
  // fsync of a file with nothing to record, fsyncdir, syncfs: every change
  // committed before the call is durable when it returns.
  Status sync();

  // Tenants (docs/security.md, "Tenants"). createTenant makes the new
  // directory `dir_name` in `parent` (a directory of no tenant), owned by
  // uid:gid, as the root of tenant `tenant` (a new id tags it and all that
  // is created under it). kAlreadyExists if the tenant or the name exists,
  // kInvalidArgument for a bad tenant name, kCrossTenant when `parent`
  // belongs to a tenant.
  Result<Tenant> createTenant(const Caller& c, uint64_t parent, std::string_view dir_name,
                              std::string_view tenant, uint32_t mode, uint32_t uid,
                              uint32_t gid);
  Result<std::vector<Tenant>> listTenants();
  // nullopt when there is no such tenant.
  Result<std::optional<Tenant>> findTenant(std::string_view tenant);
  // Removes the tenant and its root directory, which must be empty
  // (kNotEmpty naming it otherwise). kNotFound when there is no such tenant.
  Status removeTenant(std::string_view tenant);
  // Quotas (docs/quota.md). setQuota on a directory without one sums its
  // subtree first (not atomic with writes under it meanwhile); limits of
  // 0 and 0 remove it. kNotDirectory, kNotFound.
  struct QuotaInfo {
    uint64_t dir = 0;
    Quota quota;
    int64_t bytes_used = 0;
    int64_t inodes_used = 0;
  };
  Result<QuotaInfo> setQuota(uint64_t dir, uint64_t bytes_max, uint64_t inodes_max);
  Result<QuotaInfo> getQuota(uint64_t dir);  // kNotFound: no quota there
  Result<std::vector<QuotaInfo>> listQuotas();
  // Whether a quota applies to regular file `ino`, and up to where its
  // writers may write without reserve().
  struct Reservation {
    bool under_quota = false;
    uint64_t reserve_to = 0;
  };
  Result<Reservation> reservation(uint64_t ino);
  // A writer of `ino` (write session `session`; 0: any, one must be open)
  // will write up to `end`:
  // charged now, checked against every quota above it (kQuotaExceeded).
  Result<Reservation> reserve(uint64_t ino, uint64_t session, uint64_t end);

  // Puts token `token_id` on the revocation list until it expires.
  Status revokeToken(uint64_t token_id, int64_t expires_unix_s);
  // The ids of revoked tokens that have not expired at `now_unix_s`; drops
  // from the KV at most 100 entries that have.
  Result<std::set<uint64_t>> revokedTokens(int64_t now_unix_s);
  // A client renews all its write sessions at once (Client::Options::
  // session_renew_ms), so that a client that dies leaves none behind.
  Status renewClient(std::string_view client);
  // Ends the write sessions of clients that neither renewed nor opened them
  // within session_timeout_ms, as their close would (an unlinked file whose
  // last session this was goes to the GC), and forgets those clients. At
  // most `max` sessions; returns how many it ended. The GC loop of whoever
  // serves meta runs it. With `stored`, a file's length grows to the end of
  // the bytes its writers put in storage past it (what the dead client
  // wrote and never recorded), unless the file changed since that was
  // asked; sessions that need storage while it does not answer wait for a
  // later pass (one wait per pass). Without `stored` the length stays. A
  // client that was only slow closes its files later all the same (close()
  // records the length).
  Result<size_t> reapSessions(size_t max = 1000, StoredEnd* stored = nullptr);
  // Moving a data_inline file's bytes into chunks, in two calls around the
  // caller's chunk write (it needs write permission). begin (token 0) takes the inode for
  // inline_convert_lease_ms (kInodeBusy while another holder's lease runs)
  // and returns the bytes; the caller writes them to chunk 0, cuts chunk 0 to
  // their length, then calls finish with the token, which clears data_inline
  // (kInlineRefused when the lease was lost: begin again). Writers, truncates
  // past inline_max_bytes and O_TRUNC opens wait for a holder to finish.
  struct Uninlined {
    bool was_inline = false;
    std::string data;
    uint64_t token = 0;
    Inode inode;
  };
  Result<Uninlined> uninline(const Caller& c, uint64_t ino, uint64_t token,
                             const RequestId& rid = {});

  // Extended attributes. Names need a namespace ("user.", "trusted.",
  // "security."; others are kNotSupported); values are at most 64 KiB.
  Status setxattr(const Caller& c, uint64_t ino, std::string_view name, std::string_view value,
                  uint32_t flags, const RequestId& rid = {});
  Result<std::string> getxattr(const Caller& c, uint64_t ino, std::string_view name);
  Result<std::vector<std::string>> listxattr(const Caller& c, uint64_t ino);
  Status removexattr(const Caller& c, uint64_t ino, std::string_view name,
                     const RequestId& rid = {});

  // Entries after `cookie` in name order; at most min(limit, readdir_limit_max).
  Result<DirListing> readdir(const Caller& c, uint64_t ino, std::string_view cookie, uint32_t limit,
                             bool plus = false);

  // Inodes in use (an atomically added counter, so creates do not conflict
  // on it) and, when a capacity source is set, the storage capacity.
  // `dir` (0: the root): the nearest quota above it, if any, bounds the
  // answer (docs/quota.md).
  Result<StatFs> statfs(uint64_t dir = 0);
  // Where statfs() gets (total, free) bytes: the storage targets' space
  // reports, wired in by whoever composes the services. Not thread-safe: set
  // it before serving.
  void setCapacitySource(std::function<Result<std::pair<uint64_t, uint64_t>>()> fn) {
    capacity_ = std::move(fn);
  }

  kv::Engine& engine() { return engine_; }
  const MetaOptions& options() const { return options_; }

  // Internal helpers shared by the operation files (src/meta/ops/*.cc).
  int64_t nowNs() const { return clock_.wallMicros() * 1000; }
  InodeAllocator& allocator() { return allocator_; }
  // Runs `body` in a retried transaction; with a request id, returns the
  // recorded result of an earlier commit of the same id instead. `body`
  // returns the serialized result to record (may be empty). The commit is
  // unsynced unless `durable` or MetaOptions::sync_namespace.
  Result<std::string> mutate(const RequestId& rid,
                             const std::function<Result<std::string>(kv::Transaction&)>& body,
                             bool durable = false);

 private:
  Result<Opened> createImpl(const Caller& c, uint64_t parent, std::string_view name, uint32_t mode,
                            bool exclusive, const std::string_view* client, const RequestId& rid);
  // close()'s transaction; returns the serialized inode.
  Result<std::string> closeIn(kv::Transaction& t, uint64_t ino, uint64_t session, uint64_t length,
                              bool wrote, const std::optional<std::string>& inline_data);
  kv::Engine& engine_;
  MetaOptions options_;
  Clock& clock_;
  InodeAllocator allocator_;
  std::function<Result<std::pair<uint64_t, uint64_t>>()> capacity_;
};

}  // namespace cistern::meta
