// MetaService: serves a MetaStore over RPC (cistern.meta.MetaService in
// src/proto/meta.proto). Mutations wait for a synced commit, so they run on a
// pool of `blocking_threads` threads, never on the RPC I/O threads; the pool
// size bounds how many are in flight (and share a group commit). Reads
// (lookup, getattr, readdir, ..., and opens for reading only) run inline on
// the I/O thread: they touch only the KV's cache or one disk read, and two
// thread hops would cost more. Callers in the same process (RpcClient's
// local calls, net/local_call.h) run every method on their own thread.
#pragma once

#include <asio/thread_pool.hpp>

#include "meta/meta_store.h"
#include "net/rpc_server.h"

namespace cistern::meta {

class MetaService {
 public:
  // Registers the methods on `server` (before server.start()). Default: 16 threads.
  MetaService(MetaStore& store, net::RpcServer& server, uint32_t blocking_threads = 16);
  ~MetaService();  // stop the RpcServer first

 private:
  // `inline_if`: requests for which `fn` only reads run on the I/O thread.
  template <typename Req, typename Resp>
  void add(const char* method, std::function<Status(const Req&, Resp&)> fn,
           std::function<bool(const Req&)> inline_if = nullptr);
  template <typename Req, typename Resp>
  void addRead(const char* method, std::function<Status(const Req&, Resp&)> fn);

  MetaStore& store_;
  net::RpcServer& server_;
  asio::thread_pool pool_;
};

}  // namespace cistern::meta
