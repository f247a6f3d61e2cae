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

#include "meta/authorizer.h"
#include "meta/meta_store.h"
#include "net/rpc_server.h"

namespace cistern::meta {

class MetaService {
 public:
  // Registers the methods on `server` (before server.start()). Default: 16
  // threads. `inline_reads` false: reads go to the pool too (a KV across the
  // network, whose reads would hold the I/O threads for a round trip, or
  // for a timeout when the KV is cut off).
  MetaService(MetaStore& store, net::RpcServer& server, uint32_t blocking_threads = 16,
              bool inline_reads = true);
  ~MetaService();  // stop the RpcServer first

  // Checked before every remote call (not a same-process one): a call it
  // fails is answered with its status and not run. Set before the server
  // starts. MetaServer's KV lease (meta_server.h).
  void setGate(std::function<Status()> gate) { gate_ = std::move(gate); }
  // Checks every call's token (local calls too) and confines it to its
  // tenant (authorizer.h); null: no checks. Set before the server starts;
  // `authorizer` outlives the service.
  void setAuthorizer(Authorizer* authorizer) { authz_ = authorizer; }

 private:
  // `need`: what the call needs of its token (Open and Close decide by
  // their request); `inline_if`: requests for which `fn` only reads run on
  // the I/O thread.
  template <typename Req, typename Resp>
  void add(const char* method, Need need, std::function<Status(const Req&, Resp&)> fn,
           std::function<bool(const Req&)> inline_if = nullptr);
  template <typename Req, typename Resp>
  void addRead(const char* method, std::function<Status(const Req&, Resp&)> fn);
  void addAdmin();  // tenants, revocation, WhoAmI
  // Runs `fn` for a caller whose credential is `credential`.
  template <typename Req, typename Resp>
  Status authorized(std::string_view credential, Need need,
                    const std::function<Status(const Req&, Resp&)>& fn, const Req& req,
                    Resp& resp);

  MetaStore& store_;
  net::RpcServer& server_;
  asio::thread_pool pool_;
  bool inline_reads_;
  std::function<Status()> gate_;
  Authorizer* authz_ = nullptr;
};

}  // namespace cistern::meta
