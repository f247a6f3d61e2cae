// A TCP endpoint "host:port". Host is an IPv4/IPv6 literal or a name.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "common/result.h"

namespace cistern::net {

struct Endpoint {
  std::string host;
  uint16_t port = 0;

  // Parses "127.0.0.1:9000" or "[::1]:9000"; rejects a missing or bad port.
  static Result<Endpoint> parse(std::string_view text);
  std::string toString() const;
  bool operator==(const Endpoint&) const = default;
};

}  // namespace cistern::net
