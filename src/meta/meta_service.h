// MetaService: serves a MetaStore over RPC (cistern.meta.MetaService in
// src/proto/meta.proto). KV transactions block, so every handler runs on a
// pool of `blocking_threads` threads, never on the RPC I/O threads; the pool
// size bounds how many transactions are in flight (and share a group commit).
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
  template <typename Req, typename Resp>
  void add(const char* method, std::function<Status(const Req&, Resp&)> fn);

  MetaStore& store_;
  net::RpcServer& server_;
  asio::thread_pool pool_;
};

}  // namespace cistern::meta
