// RemoteChunkRemover: removes a file's chunks over the storage RPC. Clients
// cut a file with it before a truncate commits; the meta GC reaches storage
// through it (server/gc_remover.h adapts it to meta's interfaces, so that
// libcistern depends on no part of meta).
//
// Chunk i of a file lives on chain layout.chains(i % stripe_width); `route`
// maps a chain id to the storage endpoint serving it (from mgmtd's routing
// table; one target per chain while replication is 1). Each chain of the
// layout gets Remove calls in range form (every chunk of the inode from an
// index on that its target holds, so chunks a writer wrote past the file's
// recorded length go too), the chains side by side (8 at a time), at most
// `batch` chunks per call, with the
// background QoS class so that GC never crowds out application I/O (a
// client's truncate uses the foreground one). A target
// that is busy (kTargetBusy) is retried with exponential backoff up to
// `busy_retries` times; any other failure is returned and the GC entry stays
// queued, so nothing is lost. Removing chunks that are already gone succeeds.
// It also tells the session reaper how far a file's bytes reach in storage
// (storedEnd, List calls). Thread-safe if `route` is.
#pragma once

#include <functional>

#include "common/result.h"
#include "meta.pb.h"
#include "net/rpc_client.h"

namespace cistern::client {

class RemoteChunkRemover {
 public:
  using Route = std::function<Result<net::Endpoint>(uint32_t chain)>;
  struct Options {
    // RemoveReq.not_after_unix_ns for each call to an endpoint (a client's
    // attempt fence; null or 0: none); a call refused for it (kLeaseExpired)
    // is retried like a busy target.
    std::function<uint64_t(const net::Endpoint&)> fence;
    // The foreground QoS class instead of the background one: a client's
    // truncate, which its caller waits for.
    bool foreground = false;
    uint32_t batch = 1024;
    uint32_t busy_retries = 8;
    // A cluster's replicated chains (docs/chain_protocol.md): the version
    // of a chain as routed now, sent with each Remove (to the chain's head,
    // which forwards it down the chain); and what to do when a call finds
    // the routing moved (kStaleChainVersion, kNotServing) or the server
    // gone: refresh it, then the call is retried like a busy one. Null:
    // one machine.
    std::function<uint64_t(uint32_t chain)> chain_version;
    std::function<void()> refresh;
    // The calls' credential (a client's capability for the inode); empty:
    // the RpcClient's own (a server's service token).
    std::string credential;
  };
  RemoteChunkRemover(net::RpcClient& client, Route route, Options options)
      : client_(client), route_(std::move(route)), options_(std::move(options)) {}
  RemoteChunkRemover(net::RpcClient& client, Route route)
      : RemoteChunkRemover(client, std::move(route), Options()) {}

  // Removes every chunk of inode `ino` with index >= `first`, placed by
  // `layout`, including any past the file's recorded length.
  Status removeFrom(uint64_t ino, const meta::Layout& layout, uint64_t first);
  // The end, as a file offset, of the last chunk of `ino` with index >=
  // `first` (0: none there). List calls on each chain, one after the other.
  Result<uint64_t> storedEnd(uint64_t ino, const meta::Layout& layout, uint64_t first);

 private:
  Status removeOnChain(uint64_t ino, uint32_t first, uint32_t chain);
  // `once` again while the target is busy (or refused a fenced call, or
  // the routing moved and `refresh` is set), with
  // backoff, up to busy_retries times.
  Status retried(const std::function<Status()>& once);

  net::RpcClient& client_;
  Route route_;
  Options options_;
};

}  // namespace cistern::client
