// What mgmtd checks on every call when the cluster checks tokens
// (docs/security.md): changes to the cluster (CreateChains, Rebalance —
// drains too — and Fsck) and the servers' own calls (RegisterNode,
// Heartbeat) need a token of the cluster tenant with right a (an admin's,
// or a server's auth::ServiceCredential); reads of the routing (GetRouting,
// ChainHistory) take any valid token or capability. Calls to other
// services of the same RPC server (meta on `cistern up`'s) pass: they
// check their own. Refusals are counted in mgmtd_auth_refusals_total{reason}.
#pragma once

#include <string_view>

#include "auth/token.h"
#include "common/status.h"
#include "net/method.h"

namespace cistern::mgmtd {

class MgmtGuard {
 public:
  explicit MgmtGuard(auth::Keyring keyring) : keyring_(std::move(keyring)) {}
  // The net::Guard of an RpcServer that serves MgmtService.
  Status check(const net::Method& method, std::string_view credential) const;

 private:
  const auth::Keyring keyring_;
};

}  // namespace cistern::mgmtd
