#include "mgmtd/mgmt_guard.h"

#include <fmt/format.h>

#include <ctime>

#include "common/metrics.h"

namespace cistern::mgmtd {
namespace {

constexpr std::string_view kService = "cistern.mgmt.MgmtService.";

Status refuse(ErrorCode code, const char* reason, std::string text) {
  metrics::Registry::global()
      .counter("mgmtd_auth_refusals_total", {{"reason", reason}},
               "calls mgmtd refused for their credential, by reason")
      .inc();
  return Status(code, std::move(text));
}

}  // namespace

Status MgmtGuard::check(const net::Method& method, std::string_view credential) const {
  std::string_view name = method.name;
  if (name.substr(0, kService.size()) != kService) return Status::OK();
  name.remove_prefix(kService.size());
  if (credential.empty()) {
    return refuse(
        ErrorCode::kTokenMissing, "missing",
        fmt::format("{}: this cluster checks tokens and the call carried none", method.name));
  }
  auto t = keyring_.verify(credential, static_cast<int64_t>(std::time(nullptr)));
  if (!t.ok()) {
    return refuse(t.code(), auth::refusalReason(t.code()),
                  fmt::format("{}: {}", method.name, t.status().message()));
  }
  if (name == "GetRouting" || name == "ChainHistory") return Status::OK();
  if (t->kind == auth::Kind::kToken && t->tenant == auth::kClusterTenant &&
      (t->rights & auth::kAdmin)) {
    return Status::OK();
  }
  return refuse(
      ErrorCode::kTokenNotAdmin, "not_admin",
      fmt::format("{} needs a token of tenant {} with right a", method.name, auth::kClusterTenant));
}

}  // namespace cistern::mgmtd
