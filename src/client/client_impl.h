// Internals of libcistern (include/cistern/client.h): the Client and File
// implementations and the chunk I/O they share.
//
// Threads: public calls block their own thread. Chunk I/O of one call is cut
// into pieces (one per chunk) that run as coroutines on the client's driver
// thread, at most `io_parallel_max` in flight per call; the RPC client's I/O
// threads do the socket work. Metadata calls are synchronous RPCs.
#pragma once

#include <asio/awaitable.hpp>
#include <asio/thread_pool.hpp>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "cistern/client.h"
#include "client/shm_slots.h"
#include "client/short_circuit.h"
#include "common/result.h"
#include "meta.pb.h"
#include "net/endpoint.h"
#include "net/rpc_client.h"

namespace cistern::storage {
class LocatedRange;
class LocateResp;
class WriteResp;
}  // namespace cistern::storage

namespace cistern::client {

// How far apart the wall clocks of the services and clients may be (NTP
// keeps them far closer): storage calls fenced by a time (an inline file's
// conversion lease, a call's attempt) stop this long before it.
inline constexpr int64_t kClockSkewNs = 2'000'000'000;

// One chunk's share of a read or write.
struct Piece {
  uint32_t index = 0;   // chunk index in the file
  uint32_t chain = 0;   // chain id serving it
  uint32_t offset = 0;  // within the chunk
  uint32_t length = 0;
  uint8_t* data = nullptr;
  // A write's update id (with the client's), the same for every attempt: a
  // retry of a write the chain committed is not applied again.
  uint64_t update_seq = 0;
  // A read on a replicated chain: failed attempts so far (each moves to
  // the next replica), and whether a replica said the chunk has an
  // uncommitted version (then the tail is asked).
  uint32_t attempts = 0;
  bool to_tail = false;
  uint32_t corrupt = 0;  // replicas whose copy failed verification
};

class ClientImpl;
class OpenFiles;
struct OpenInode;

// Chunk I/O in flight: the pieces run on the client's driver thread. The
// destructor waits for them (the buffers they use must outlive it).
struct PendingIo {
  ClientImpl* client = nullptr;
  bool write = false;
  meta::Inode inode;
  std::vector<Piece> pieces;
  std::atomic<size_t> next{0};
  std::mutex mu;
  std::condition_variable cv;
  size_t running = 0;
  Status error;
  std::vector<uint8_t> done;  // per piece: read or written
  // Short-circuit reads: each piece's Locate answer, asked for all pieces
  // at once before the workers start (null: the piece asks for its own).
  std::vector<const storage::LocatedRange*> located;
  std::vector<std::unique_ptr<storage::LocateResp>> located_resps;

  Status wait();
  bool finished();  // wait() would not block
  // Waits until the pieces that hold [p, p + n) of the call's buffer are
  // done; false when one of them will not be (a piece failed: wait() says
  // how).
  bool waitRange(const uint8_t* p, size_t n);
  ~PendingIo();
};

class ClientImpl final : public Client {
 public:
  ClientImpl() = default;
  ~ClientImpl() override;

  // Fetches routing from the cluster; fails with kConnectionFailed when it is
  // unreachable within min(retry_ms, connect_budget_ms).
  Status init(const Options& options);

  Error stat(const std::string& path, FileInfo* out) override;
  Error list(const std::string& path, std::vector<DirEntry>* out) override;
  Error mkdir(const std::string& path, uint32_t mode, bool parents) override;
  Error rename(const std::string& from, const std::string& to) override;
  Error unlink(const std::string& path) override;
  Error rmdir(const std::string& path) override;
  Error truncate(const std::string& path, uint64_t size) override;
  Error mknod(const std::string& path, uint32_t mode, uint64_t rdev) override;
  Error symlink(const std::string& target, const std::string& path) override;
  Error readlink(const std::string& path, std::string* target) override;
  Error open(const std::string& path, int flags, uint32_t mode,
             std::unique_ptr<File>* out) override;
  std::unique_ptr<SharedBuffer> borrowSharedBuffer(size_t n) override;
  Error openAt(const Credentials& who, uint64_t ino, int flags, std::unique_ptr<File>* out,
               FileInfo* info) override;
  Error createAt(const Credentials& who, uint64_t parent, const std::string& name, uint32_t mode,
                 int flags, std::unique_ptr<File>* out, FileInfo* info, bool* created) override;
  Error lookup(const Credentials& who, uint64_t parent, const std::string& name,
               FileInfo* out) override;
  Error getattr(uint64_t ino, FileInfo* out) override;
  Error setattr(const Credentials& who, uint64_t ino, const AttrChanges& changes,
                FileInfo* out) override;
  Error mkdirAt(const Credentials& who, uint64_t parent, const std::string& name, uint32_t mode,
                FileInfo* out) override;
  Error mknodAt(const Credentials& who, uint64_t parent, const std::string& name, uint32_t mode,
                uint64_t rdev, FileInfo* out) override;
  Error symlinkAt(const Credentials& who, uint64_t parent, const std::string& name,
                  const std::string& target, FileInfo* out) override;
  Error linkAt(const Credentials& who, uint64_t ino, uint64_t new_parent,
               const std::string& new_name, FileInfo* out) override;
  Error unlinkAt(const Credentials& who, uint64_t parent, const std::string& name) override;
  Error rmdirAt(const Credentials& who, uint64_t parent, const std::string& name) override;
  Error renameAt(const Credentials& who, uint64_t parent, const std::string& name,
                 uint64_t new_parent, const std::string& new_name, unsigned flags) override;
  Error readlinkAt(uint64_t ino, std::string* target) override;
  Error access(const Credentials& who, uint64_t ino, int mask) override;
  Error readdirAt(const Credentials& who, uint64_t ino, const std::string& cookie, uint32_t limit,
                  bool attributes, DirPage* out) override;
  Error setxattr(const Credentials& who, uint64_t ino, const std::string& name,
                 const std::string& value, int flags) override;
  Error getxattr(const Credentials& who, uint64_t ino, const std::string& name,
                 std::string* value) override;
  Error listxattr(const Credentials& who, uint64_t ino, std::vector<std::string>* names) override;
  Error removexattr(const Credentials& who, uint64_t ino, const std::string& name) override;
  Error statfs(SpaceInfo* out, uint64_t dir) override;
  Error syncNamespace() override;
  Error targets(std::vector<TargetInfo>* out) override;
  Error fsck(CheckReport* out, bool remove_orphan_chunks) override;
  Error tenantCreate(const std::string& name, const std::string& dir, uint32_t uid, uint32_t gid,
                     uint32_t mode, TenantInfo* out) override;
  Error tenantList(std::vector<TenantInfo>* out) override;
  Error tenantRemove(const std::string& name) override;
  Error revokeToken(uint64_t id, int64_t expires_unix_s) override;
  Error whoami(Identity* out) override;
  Error quotaSet(uint64_t dir, uint64_t bytes_max, uint64_t inodes_max, QuotaInfo* out) override;
  Error quotaGet(uint64_t dir, QuotaInfo* out) override;
  Error quotaList(std::vector<QuotaInfo>* out) override;

  // --- used by FileImpl ---
  // Reads [offset, offset + n) of the file into `out`; holes and bytes past
  // a chunk's end read as zeros. The caller clips n to the file's length.
  Status readData(const meta::Inode& inode, uint64_t offset, size_t n, uint8_t* out);
  // Many ranges of one file: their pieces grouped by the server they
  // route to, up to kManyRangesMax ranges and kManyBytesMax bytes per
  // BatchRead — what a storage server reads in parallel on its io_uring
  // (StorageServiceOptions::loop_read_bytes_max). Larger pieces, a
  // request that fails and a range answered with an error go to
  // runPieces (in parallel, short-circuit reads on this host, retries).
  struct ReadSpan {
    uint64_t offset;
    size_t n;
    uint8_t* out;
  };
  Status readMany(const meta::Inode& inode, std::span<const ReadSpan> spans);
  static constexpr size_t kManyRangesMax = 8;
  static constexpr size_t kManyBytesMax = 64 << 10;
  Status writeData(const meta::Inode& inode, uint64_t offset, size_t n, const uint8_t* in);
  // Makes the chunk writes acknowledged so far durable: one Sync to each
  // chain this client wrote to unsynced since its last sync (none with
  // Options::sync_each_write). kIOError if a target's host booted in
  // between (those writes may be lost).
  Status syncWrites();
  // The first step of a truncate of `ino` by `caller` to `new_size` (0 for
  // O_TRUNC): gets the inode as meta has it now, provided the caller may
  // access it so (`mask`: R_OK | W_OK, as for access(2)), and when new_size
  // is no larger than the file (meta's size, or `local_size`, a length this
  // process has not recorded yet), every byte at or past it leaves storage —
  // the chunks wholly past it (those a writer has not yet made part of the
  // length too), then the tail of the chunk holding it — before the caller
  // commits the new size in meta (docs/client.md, "Truncate"). An inline
  // file's bytes are cut in the KV by the commit itself. Returns the inode.
  // The credential of chunk I/O on `ino` (docs/security.md): the
  // capability meta granted at open, or a fresh one asked of it once less
  // than a quarter of its life is left; empty when this client has no
  // token. noteCapability keeps one from an Open or Create answer.
  Result<std::string> capability(uint64_t ino, bool write);
  void noteCapability(uint64_t ino, const std::string& text);
  // Quotas (docs/quota.md): what an open or create said of a file (under a
  // quota, reserved up to), and before a write that ends at `end` past
  // what is reserved, a reservation from meta (kQuotaExceeded: EDQUOT).
  void noteReservation(uint64_t ino, bool under_quota, uint64_t reserve_to);
  Status reserveTo(uint64_t ino, uint64_t end);
  // capability() into `*out` (for coroutines, which GCC 12 miscompiles
  // around Result temporaries).
  Status capabilityInto(uint64_t ino, bool write, std::string* out);
  Result<meta::Inode> cutForTruncate(const meta::Caller& caller, uint64_t ino, int mask,
                                     uint64_t new_size, uint64_t local_size = 0);
  // An inline file's conversion: chunk 0 becomes exactly `bytes` (written,
  // then cut to their length), each storage call refused with kLeaseExpired
  // past `not_after_ns` (wall clock; see convertInline()).
  Status moveInlineBytes(const meta::Inode& inode, const std::string& bytes, int64_t not_after_ns);
  // Starts reading [offset, offset + n) into `out` (read-ahead); wait() on the result.
  std::unique_ptr<PendingIo> startRead(const meta::Inode& inode, uint64_t offset, size_t n,
                                       uint8_t* out);
  // Writes from `in`, which must stay valid until the PendingIo is done.
  std::unique_ptr<PendingIo> startWrite(const meta::Inode& inode, uint64_t offset, size_t n,
                                        const uint8_t* in);
  // A meta Close: ends `session` (0: none) and raises the length to `length`.
  // With `inline_data` (the whole file) the service may keep the bytes
  // instead of chunks; kInlineRefused leaves the session open.
  // A meta Sync: every namespace change acknowledged so far durable.
  Status metaSync();
  // `durable` (fsync): meta makes it durable, with every change before it.
  Result<meta::Inode> metaClose(uint64_t ino, uint64_t session, uint64_t length, bool wrote,
                                const std::string* inline_data = nullptr, bool durable = false);
  // Moves the bytes of inode `ino`, if inline, into chunk 0 (docs/client.md,
  // "Inline files"); the file is an ordinary one when this returns OK.
  // Writers and growing truncates call it first.
  Status convertInline(uint64_t ino);
  // After a meta Open for writing: an inline file's bytes move to chunks
  // (resp's inode says so then); on failure the open's session is closed.
  Status prepareWrites(meta::OpenResp* resp);
  // A meta Setattr with a size; an inline file grown past the service's
  // inline limit has its bytes moved to chunks first and is asked again.
  Status setattrSize(meta::SetattrReq* req, meta::InodeResp* resp);
  void forgetAttrs(uint64_t ino);
  const Options& options() const { return options_; }
  ShmSlots* shm() const { return shm_.get(); }  // null: off
  // Where read-ahead windows may be borrowed: none while short-circuit
  // reads may fill them (they land fastest in heap memory in 2 MiB pages,
  // HeapBuffer), the shared memory once a server refused them.
  ShmSlots* windowShm() const {
    return short_circuit_ && !short_circuit_->anyRefused() ? nullptr : shm_.get();
  }

  // --- open files (open_files.cc) ---
  OpenFiles& openFiles() { return *open_files_; }
  // One handle of `node` closes, ending its `session` (0: none); the last
  // one records what this client has not and ends the inode's hold.
  Error releaseHandle(OpenInode& node, uint64_t session);
  // The attributes of `inode` with this client's unrecorded length if it is
  // open here.
  FileInfo infoOf(const meta::Inode& inode);

  // setattr() as `who`. A truncate of a file open here writes its buffered
  // bytes first, and the cut reaches past the length this client has not
  // recorded yet. Returns the inode.
  Result<meta::Inode> setattrAs(const meta::Caller& who, uint64_t ino, const AttrChanges& changes);
  // A metadata RPC with retries of transient errors (mutations carry (client, seq)).
  Status metaCall(const net::Method& method, const google::protobuf::Message& req,
                  google::protobuf::Message* resp);
  meta::Caller caller() const { return caller_; }
  uint64_t nextSeq() { return seq_.fetch_add(1) + 1; }
  // The (client, seq) of a mutation: a retry after a lost reply returns the
  // first outcome instead of acting twice.
  template <typename Req>
  void stamp(Req* r) {
    r->set_client(client_id_);
    r->set_seq(nextSeq());
  }
  const std::string& clientId() const { return client_id_; }

  // Runs one piece (with retries); public for the coroutine worker.
  asio::awaitable<Status> runPiece(bool write, const meta::Inode& inode, Piece& piece);
  // runPiece() from a blocking caller, over the socket (or as a local call).
  Status runPieceBlocking(bool write, const meta::Inode& inode, Piece& piece);
  // A read piece from a blocking caller, read from the server's files
  // themselves where it allows (short-circuit), else over the socket.
  // `located`: the piece's Locate answer, if asked for already (locateAll).
  Status runPieceShortCircuit(const meta::Inode& inode, Piece& piece,
                              const storage::LocatedRange* located);
  // Asks each server of a short-circuit run's pieces where they lie, in one
  // Locate per server (PendingIo::located).
  void locateAll(PendingIo& run);

 private:
  struct ChainRoute {
    net::Endpoint endpoint;  // the head: writes (and reads, on one machine)
    uint64_t version = 0;
    // A replicated chain's serving replicas, head to tail (empty: one).
    std::vector<net::Endpoint> replicas;
    bool replicated() const { return replicas.size() > 1; }
    // No replica serves (its last one is away: LASTSRV): route() answers
    // kNotServing, which callers wait out like any refusal.
    bool down = false;
  };
  // The replica a read of `p` (chunk `p.index` of `ino`) goes to on a
  // replicated chain: spread over the serving replicas by chunk, the next
  // one after each failed attempt, the tail once a replica said the chunk
  // had an uncommitted version. `r` itself on one machine.
  static ChainRoute readRoute(ChainRoute r, uint64_t ino, const Piece& p);
  // Where an attempt at `p` goes: the head for a write (which gets its
  // update id), readRoute() for a read.
  Result<ChainRoute> pieceRoute(bool write, uint64_t ino, Piece& p);
  // After a read attempt of `p` on `route` failed with `s`: where the next
  // one goes, and the status to go on with — a replica whose copy failed
  // verification (kCorruption) sends the read to the next replica, as a
  // retry, until every replica was tried (docs/chain_protocol.md, "Repair").
  static Status afterReadAttempt(Piece& p, const Status& s, const Result<ChainRoute>& route);
  // A write piece's update id, given once.
  void giveUpdateId(Piece& p) {
    if (p.update_seq == 0) p.update_seq = next_update_seq_.fetch_add(1);
  }
  struct Dentry {
    uint64_t ino = 0;
    std::chrono::steady_clock::time_point expires;
  };
  struct CachedInode {
    meta::Inode inode;
    std::chrono::steady_clock::time_point expires;
  };

  class SocketPiece;
  // Pieces up to this size, alone in a blocking call, run on the calling thread.
  static constexpr uint32_t kBlockingPieceMax = 64 << 10;

  Status refreshRouting();
  void renewLoop();
  // cutForTruncate()'s storage part, for a chunked regular file.
  Status cutData(const meta::Inode& inode, uint64_t new_size);
  // Sets chunk `index` of `inode` to `length` bytes, retried like a piece;
  // `fence`: TruncateReq.not_after_unix_ns (0: none).
  Status truncateChunk(const meta::Inode& inode, uint64_t index, uint64_t length, uint64_t fence);
  Result<ChainRoute> route(uint32_t chain);
  static std::string pieceName(bool write, const meta::Inode& inode, const Piece& piece);
  // After a failed attempt at a piece: the error to return, or nullopt to try
  // again after `backoff` (the routing refreshed if it was stale). `fenced`:
  // the attempt carried attemptFence(), so a refusal for being late
  // (kLeaseExpired) is tried again too, with a new fence.
  std::optional<Status> giveUp(const Status& s, std::chrono::steady_clock::time_point deadline,
                               std::chrono::steady_clock::duration backoff, bool fenced = false);
  // The not_after_unix_ns of one attempt of a storage call that changes a
  // chunk (write, truncate, remove), sent now: when this client stops
  // waiting for its answer (call_timeout_ms), less a margin for the storage
  // server's clock to run ahead of ours (kClockSkewNs, at most a quarter of
  // the timeout). A server that reaches the chunk later refuses the call
  // (kLeaseExpired), so an attempt given up on — timed out and tried again,
  // or reported as failed — cannot land after the calls that followed it
  // and undo acknowledged bytes (docs/client.md, "Late calls").
  uint64_t attemptFence() const;
  // The fence of a blocking call of `method` to `to` sent now: `lease` (0:
  // none) or attemptFence(), whichever comes first; attemptFence() is left
  // out when the call runs in this process (it cannot be left behind, and
  // the fence would only refuse a call that waits long for the chunk's
  // lock). 0: no fence.
  uint64_t blockingFence(const net::Endpoint& to, const net::Method& method,
                         uint64_t lease = 0) const;
  // One storage call `once(route)` on chain `chain` from this thread, tried
  // again with backoff as a piece is (giveUp) until retry_ms; `what()` names
  // the work in the error. Defined in chunk_io.h.
  // `fenced`: each attempt carries its own attemptFence() (giveUp).
  template <typename Once, typename What>
  Status retryBlocking(uint32_t chain, const Once& once, const What& what, bool fenced = false);
  // A server of this process serves the chain's reads (or writes) as local calls.
  bool servedHere(bool write, uint32_t chain);
  // Threads that run pieces served by this process (io_parallel_max, started on first use).
  asio::thread_pool& localPool();
  // The handle under which `route`'s server maps our shared memory (attaching
  // on first use); 0 when it cannot (another host, an attach in progress).
  asio::awaitable<uint64_t> shmHandle(const ChainRoute& route);
  // Read or write the piece through shared memory when its server is on
  // this host; nullopt when they cannot (another host, no free slot, a
  // piece longer than a slot, memory the server dropped): use the socket.
  asio::awaitable<std::optional<Status>> shmRead(const ChainRoute& route, const meta::Inode& inode,
                                                 Piece& piece);
  asio::awaitable<std::optional<Status>> shmWrite(const ChainRoute& route, const meta::Inode& inode,
                                                  Piece& piece);

  // One short-circuit attempt at a read piece: nullopt when it cannot be
  // (the server refused, the bytes changed since the Locate): the caller
  // reads over the socket.
  std::optional<Status> shortCircuitRead(const ChainRoute& route, const meta::Inode& inode,
                                         Piece& piece, const storage::LocatedRange* located);
  // Reads from `server` go through it from now on (logged once).
  void refuseShortCircuit(const net::Endpoint& server, const Status& why);
  // Whether all of `pieces` are read pieces whose servers may serve them short-circuit.
  bool shortCircuits(const std::vector<Piece>& pieces);

  // Path handling: absolute, '.', '..' and repeated '/' folded lexically.
  Result<std::vector<std::string>> split(const std::string& path) const;
  Result<meta::Inode> lookup(uint64_t parent, const std::string& name);
  Result<meta::Inode> resolve(const std::vector<std::string>& parts, size_t count);
  Result<meta::Inode> resolvePath(const std::string& path);
  // The directory holding the last component of `parts` (parts not empty).
  Result<meta::Inode> resolveParent(const std::vector<std::string>& parts);
  Result<meta::Inode> getattr(uint64_t ino);
  void remember(uint64_t parent, const std::string& name, const meta::Inode& inode);
  void forget(uint64_t parent, const std::string& name);

  Error removeName(const std::string& path, bool dir);
  // The answer of an inode API call: `out`, when given, becomes the
  // inode's attributes (infoOf).
  Error answer(const Status& s, const meta::InodeResp& resp, FileInfo* out,
               const std::string& what);
  Error answer(const Result<meta::Inode>& r, FileInfo* out, const std::string& what);
  // Opens the regular file `inode` as `who` for `flags` (a meta Open; O_TRUNC
  // cuts storage first): a handle on the inode's entry in open_files_.
  // `name` names the file in errors. `type_unknown` (a read open of an
  // inode number alone): the type is checked on meta's answer.
  Error openInode(const meta::Caller& who, const meta::Inode& inode, int flags,
                  const std::string& name, std::unique_ptr<File>* out, FileInfo* info,
                  bool type_unknown = false);
  // open(2) with O_CREAT of `entry` in `parent`.
  Error createIn(const meta::Caller& who, uint64_t parent, const std::string& entry, uint32_t mode,
                 int flags, const std::string& name, std::unique_ptr<File>* out, FileInfo* info,
                 bool* created);
  // A new handle on `inode`, opened with `session` (`fresh`: made by this open).
  Error attachHandle(const meta::Inode& inode, uint64_t session, int flags, bool fresh,
                     std::string inline_data, const std::string& name, std::unique_ptr<File>* out,
                     FileInfo* info);
  // Before this client removes or replaces `name` in `parent`: if that file
  // is open here, it takes a hold (a session) so it stays readable until its
  // last handle closes.
  void holdIfOpen(uint64_t parent, const std::string& name);
  // One meta mutation each, shared by the path calls and the inode API
  // (inode_calls.cc): the request stamped with (client, seq), the caches
  // dropping the names it changes.
  Result<meta::Inode> metaMkdir(const meta::Caller& who, uint64_t parent, const std::string& name,
                                uint32_t mode);
  // FIFOs, sockets, devices (`mode` with its S_IF* type), and regular
  // files (created exclusively, not opened).
  Result<meta::Inode> metaMknod(const meta::Caller& who, uint64_t parent, const std::string& name,
                                uint32_t mode, uint64_t rdev);
  Result<meta::Inode> metaSymlink(const meta::Caller& who, uint64_t parent, const std::string& name,
                                  const std::string& target);
  Status metaRemove(const meta::Caller& who, uint64_t parent, const std::string& name, bool dir);
  // The call of `method` that makes `name` in `parent` (`req` holds the
  // rest): caller, names and (client, seq) set, the dentry cache dropped.
  template <typename Req>
  Result<meta::Inode> makeName(const net::Method& method, const meta::Caller& who, uint64_t parent,
                               const std::string& name, Req* req);
  Status metaRename(const meta::Caller& who, uint64_t parent, const std::string& name,
                    uint64_t new_parent, const std::string& new_name, uint32_t flags);
  // One page of a listing as `who`, for list() and readdirAt().
  Result<DirPage> readdirAs(const meta::Caller& who, uint64_t ino, const std::string& cookie,
                            uint32_t limit, bool attributes);
  Status runPieces(bool write, const meta::Inode& inode, std::vector<Piece>& pieces);
  std::unique_ptr<PendingIo> start(bool write, const meta::Inode& inode, std::vector<Piece> pieces);
  std::vector<Piece> cut(const meta::Inode& inode, uint64_t offset, size_t n, uint8_t* data) const;
  Status listTargets(std::vector<TargetInfo>* out);

  Options options_;
  // The mgmtd asked for routing: one of `mgmtds_`, the next after a failure.
  std::vector<net::Endpoint> mgmtds_;
  std::mutex mgmtd_mu_;
  size_t mgmtd_at_ = 0;
  net::Endpoint cluster_;  // guarded by mgmtd_mu_
  meta::Caller caller_;
  std::string token_;  // Options::token or $CISTERN_TOKEN
  struct Capability {
    std::string text;
    uint32_t rights = 0;
    int64_t issued_unix_s = 0;
    int64_t expires_unix_s = 0;
  };
  std::mutex caps_mu_;
  std::unordered_map<uint64_t, Capability> caps_;  // at most kCapabilitiesMax
  struct Reserved {
    bool under_quota = false;
    uint64_t to = 0;
  };
  std::mutex reserved_mu_;
  std::unordered_map<uint64_t, Reserved> reserved_;  // at most kReservationsMax
  std::string client_id_;
  std::atomic<uint64_t> seq_{0};
  std::unique_ptr<net::RpcClient> rpc_;
  std::unique_ptr<asio::thread_pool> driver_;
  // Renews this client's lease every session_renew_ms (renewLoop).
  std::thread renewer_;
  std::mutex renew_mu_;
  std::condition_variable renew_cv_;
  bool stopping_ = false;
  // Cancels a renewal in flight when the client goes (a partitioned cluster
  // must not hold up a close or an unmount).
  std::shared_ptr<net::CancelToken> renew_cancel_ = std::make_shared<net::CancelToken>();
  std::once_flag local_pool_once_;
  std::unique_ptr<asio::thread_pool> local_pool_;
  std::unique_ptr<ShmSlots> shm_;                // null: off
  std::unique_ptr<ShortCircuit> short_circuit_;  // null: off
  std::unique_ptr<OpenFiles> open_files_;
  // Chains written unsynced (syncWrites): written/synced count
  // acknowledged writes and how many of them a finished Sync covers.
  struct UnsyncedChain {
    std::string host_boot_id;  // of the target's host, as its last write said
    uint64_t written = 0;
    uint64_t synced = 0;
    bool lost = false;  // the host booted with writes unsynced
  };
  // After a write to `chain` succeeded: counts it if it is unsynced.
  void noteWritten(uint32_t chain, const storage::WriteResp& resp);
  std::mutex unsynced_mu_;
  std::unordered_map<uint32_t, UnsyncedChain> unsynced_;  // by chain

  std::shared_mutex routing_mu_;
  net::Endpoint meta_endpoint_;
  // A cluster's meta servers; metaCall() moves to the next when one fails.
  std::vector<net::Endpoint> meta_endpoints_;
  size_t meta_at_ = 0;
  // Update ids of writes: this client's (random) and the next sequence.
  uint64_t update_client_ = 0;
  std::atomic<uint64_t> next_update_seq_{1};
  std::map<uint32_t, ChainRoute> chains_;
  std::vector<TargetInfo> targets_;

  std::mutex cache_mu_;
  std::map<std::pair<uint64_t, std::string>, Dentry> dentries_;
  std::unordered_map<uint64_t, CachedInode> inodes_;
};

// Converts a Status to the public Error: "<path>: <strerror>", with the
// detail for errors whose errno alone does not say what happened.
Error toError(const Status& s, const std::string& path);
// The public attributes of an inode (FileInfo).
FileInfo toInfo(const meta::Inode& inode);
// Credentials as the meta service takes them.
meta::Caller callerOf(const Credentials& who);

// Worth another try after a backoff: unreachable or busy peers, lost
// transaction races, a server shutting down.
bool transient(const Status& s);

}  // namespace cistern::client
