#include "server/auth_options.h"

#include "common/config.h"

namespace cistern::server {

void AuthOptions::bind(ConfigBinder& b) {
  b.bind("auth.keys_file", &keys_file,
         "the cluster's key file (cistern token keygen; mode 600): every call then needs a token "
         "or capability (empty: no checks)");
  b.bind("auth.capability_ttl_s", &capability_ttl_s,
         "seconds a capability granted at open lives; a revoked token's clients lose storage "
         "access within it");
}

Status AuthOptions::validate() const {
  return checkOptionRange("auth.capability_ttl_s", capability_ttl_s, 5, 86'400);
}

Result<std::optional<auth::Keyring>> AuthOptions::keyring() const {
  if (keys_file.empty()) return std::optional<auth::Keyring>();
  ASSIGN_OR_RETURN(auth::Keyring k, auth::Keyring::load(keys_file));
  return std::optional<auth::Keyring>(std::move(k));
}

}  // namespace cistern::server
