// The RPC server options of a `cistern serve` role listening on "host:port"
// (its config's `<role>.listen`), with `threads` I/O threads.
#pragma once

#include <string>

#include "common/result.h"
#include "net/rpc_server.h"

namespace cistern::server {

inline Result<net::ServerOptions> listenOn(const std::string& host_port, uint32_t threads) {
  ASSIGN_OR_RETURN(net::Endpoint ep, net::Endpoint::parse(host_port));
  net::ServerOptions so;
  so.listen_host = ep.host;
  so.listen_port = ep.port;
  so.threads = threads;
  return so;
}

}  // namespace cistern::server
