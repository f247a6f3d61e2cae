// CapabilityGuard: what a storage server checks on every call when the
// cluster checks tokens (docs/security.md, "Capabilities"), with the shared
// key and no metadata lookup. Chunk I/O needs a capability (granted by meta
// at open) naming the inode of every chunk the request touches, with read
// rights (BatchRead, Query, Locate) or write rights (Write, Truncate,
// Remove), not expired. Calls between servers (Forward, Copy, List,
// PushRouting, and any method added later) need a token of the cluster
// tenant with the admin right, which also passes everywhere. Space,
// ShmAttach, ShmDetach and Sync take any valid credential. Refusals are
// counted in storage_auth_refusals_total{reason}. Thread-safe.
#pragma once

#include <string_view>

#include "auth/token.h"
#include "common/status.h"
#include "net/method.h"

namespace google::protobuf {
class Message;
}

namespace cistern::storage {

class CapabilityGuard {
 public:
  explicit CapabilityGuard(auth::Keyring keyring) : keyring_(std::move(keyring)) {}
  // The net::Guard of a storage server's RpcServer.
  Status check(const net::Method& method, std::string_view credential,
               const google::protobuf::Message& request) const;

 private:
  const auth::Keyring keyring_;
};

}  // namespace cistern::storage
