#include "storage/capability_guard.h"

#include <fmt/format.h>

#include <ctime>

#include "common/metrics.h"
#include "storage.pb.h"

namespace cistern::storage {
namespace {

enum class Need { kRead, kWrite, kAny, kService };

Need needOf(std::string_view name) {
  constexpr std::string_view kPrefix = "cistern.storage.StorageService.";
  if (name.substr(0, kPrefix.size()) == kPrefix) name.remove_prefix(kPrefix.size());
  if (name == "BatchRead" || name == "Query" || name == "Locate") return Need::kRead;
  if (name == "Write" || name == "Truncate" || name == "Remove") return Need::kWrite;
  if (name == "Space" || name == "ShmAttach" || name == "ShmDetach" || name == "Sync")
    return Need::kAny;
  return Need::kService;
}

Status refuse(ErrorCode code, const char* reason, std::string text) {
  metrics::Registry::global()
      .counter("storage_auth_refusals_total", {{"reason", reason}},
               "calls storage refused for their credential, by reason")
      .inc();
  return Status(code, std::move(text));
}

// Calls `f` with the inode of every chunk the request names.
template <typename F>
void eachInode(std::string_view method, const google::protobuf::Message& m, F f) {
  if (method.ends_with(".Write")) {
    f(static_cast<const WriteReq&>(m).chunk().inode());
  } else if (method.ends_with(".Truncate")) {
    f(static_cast<const TruncateReq&>(m).chunk().inode());
  } else if (method.ends_with(".Query")) {
    f(static_cast<const QueryReq&>(m).chunk().inode());
  } else if (method.ends_with(".Remove")) {
    const auto& r = static_cast<const RemoveReq&>(m);
    for (const auto& c : r.chunks()) f(c.inode());
    if (r.has_from()) f(r.from().inode());
  } else if (method.ends_with(".BatchRead")) {
    for (const auto& r : static_cast<const BatchReadReq&>(m).ranges()) f(r.chunk().inode());
  } else if (method.ends_with(".Locate")) {
    for (const auto& r : static_cast<const LocateReq&>(m).ranges()) f(r.chunk().inode());
  }
}

}  // namespace

Status CapabilityGuard::check(const net::Method& method, std::string_view credential,
                              const google::protobuf::Message& request) const {
  const Need need = needOf(method.name);
  if (credential.empty()) {
    return refuse(
        ErrorCode::kTokenMissing, "missing",
        fmt::format("{}: this cluster checks capabilities and the call carried none", method.name));
  }
  auto t = keyring_.verify(credential, static_cast<int64_t>(std::time(nullptr)));
  if (!t.ok()) {
    return refuse(t.code(), auth::refusalReason(t.code()),
                  fmt::format("{}: {}", method.name, t.status().message()));
  }
  const bool service = t->kind == auth::Kind::kToken && t->tenant == auth::kClusterTenant &&
                       (t->rights & auth::kAdmin);
  if (service || need == Need::kAny) return Status::OK();
  if (need == Need::kService) {
    return refuse(ErrorCode::kTokenNotAdmin, "not_service",
                  fmt::format("{} is for the cluster's servers (tenant {}, right a)", method.name,
                              auth::kClusterTenant));
  }
  if (t->kind != auth::Kind::kCapability) {
    return refuse(
        ErrorCode::kCapabilityRefused, "not_capability",
        fmt::format("{}: chunk I/O needs a capability from open, not a token", method.name));
  }
  const uint32_t rights = need == Need::kWrite ? auth::kWrite : auth::kRead;
  if (!(t->rights & rights)) {
    return refuse(ErrorCode::kCapabilityRefused, "rights",
                  fmt::format("{}: capability for inode {} has rights '{}'", method.name, t->inode,
                              auth::rightsText(t->rights)));
  }
  uint64_t stray = 0;
  eachInode(method.name, request, [&](uint64_t ino) {
    if (ino != t->inode && stray == 0) stray = ino;
  });
  if (stray != 0) {
    return refuse(ErrorCode::kCapabilityRefused, "wrong_inode",
                  fmt::format("{}: a chunk of inode {} under a capability for inode {}",
                              method.name, stray, t->inode));
  }
  return Status::OK();
}

}  // namespace cistern::storage
