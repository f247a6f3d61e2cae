#include "net/endpoint.h"

#include <fmt/format.h>

#include <charconv>

namespace cistern::net {

Result<Endpoint> Endpoint::parse(std::string_view text) {
  auto bad = [&](std::string_view why) {
    return Status(ErrorCode::kInvalidArgument, fmt::format("endpoint '{}': {}", text, why));
  };
  size_t colon = text.rfind(':');
  if (colon == std::string_view::npos) return bad("expected host:port");
  std::string_view host = text.substr(0, colon), port = text.substr(colon + 1);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']')
    host = host.substr(1, host.size() - 2);
  if (host.empty()) return bad("empty host");
  unsigned value = 0;
  auto [p, ec] = std::from_chars(port.data(), port.data() + port.size(), value);
  if (port.empty() || ec != std::errc() || p != port.data() + port.size() || value > 65535) {
    return bad("port must be a number in [0, 65535]");
  }
  return Endpoint{std::string(host), static_cast<uint16_t>(value)};
}

std::string Endpoint::toString() const {
  if (host.find(':') != std::string::npos) return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

}  // namespace cistern::net
