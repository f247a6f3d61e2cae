// The `auth.*` keys every server binds (docs/security.md): the cluster's key
// file, which turns token and capability checks on, and how long a
// capability lives.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "auth/token.h"
#include "common/result.h"

namespace cistern {
class ConfigBinder;
}

namespace cistern::server {

struct AuthOptions {
  // The key file (auth::Keyring::load; mode 600). Empty: nothing is checked.
  std::string keys_file;
  // meta::AuthOptions::capability_ttl_s.
  uint32_t capability_ttl_s = 60;

  void bind(ConfigBinder& b);
  Status validate() const;
  // The keyring, or nullopt when no key file is set.
  Result<std::optional<auth::Keyring>> keyring() const;
};

}  // namespace cistern::server
