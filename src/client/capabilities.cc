// libcistern's capabilities (docs/security.md): chunk I/O on a cluster that
// checks tokens carries a capability meta signed for the file; the client
// keeps one per inode it does I/O on and asks meta for a fresh one before
// the old one runs out. And its quota reservations (docs/quota.md): bytes
// past what meta charged a file are reserved before they are written.
#include <fmt/format.h>

#include <ctime>

#include "auth/token.h"
#include "client/client_impl.h"
#include "client/methods.h"

namespace cistern::client {
namespace {

// Capabilities kept; past it the expired go, and if that is not enough, all.
constexpr size_t kCapabilitiesMax = 4096;
// Files whose reservation is kept; past it, all are forgotten (each is
// asked of meta again at its next write).
constexpr size_t kReservationsMax = 4096;
// A reservation's step: fewer calls, at the price of EDQUOT coming this
// much early per writer (docs/quota.md).
constexpr uint64_t kReserveStep = 4ull << 20;

int64_t nowUnix() { return static_cast<int64_t>(std::time(nullptr)); }

}  // namespace

void ClientImpl::noteCapability(uint64_t ino, const std::string& text) {
  if (text.empty()) return;
  auto t = auth::peek(text);
  if (!t.ok() || t->kind != auth::Kind::kCapability || t->inode == 0) return;
  std::lock_guard lock(caps_mu_);
  if (caps_.size() >= kCapabilitiesMax && !caps_.count(ino)) {
    const int64_t now = nowUnix();
    std::erase_if(caps_, [now](const auto& kv) { return kv.second.expires_unix_s <= now; });
    if (caps_.size() >= kCapabilitiesMax) caps_.clear();
  }
  caps_[ino] = {text, t->rights, t->issued_unix_s, t->expires_unix_s};
}

Status ClientImpl::capabilityInto(uint64_t ino, bool write, std::string* out) {
  ASSIGN_OR_RETURN(*out, capability(ino, write));
  return Status::OK();
}

Result<std::string> ClientImpl::capability(uint64_t ino, bool write) {
  if (token_.empty()) return std::string();
  const uint32_t need = write ? auth::kWrite : auth::kRead;
  {
    std::lock_guard lock(caps_mu_);
    auto it = caps_.find(ino);
    if (it != caps_.end()) {
      const Capability& c = it->second;
      const int64_t left = c.expires_unix_s - nowUnix();
      if ((c.rights & need) && left > (c.expires_unix_s - c.issued_unix_s) / 4) return c.text;
    }
  }
  meta::CapabilityReq req;
  *req.mutable_caller() = caller_;
  req.set_ino(ino);
  req.set_write(write);
  meta::CapabilityResp resp;
  RETURN_ON_ERROR(metaCall(kCapability(), req, &resp)
                      .withContext(fmt::format("a capability for inode {}", ino)));
  if (resp.capability().empty()) return std::string();  // the cluster does not check
  noteCapability(ino, resp.capability());
  return resp.capability();
}

void ClientImpl::noteReservation(uint64_t ino, bool under_quota, uint64_t reserve_to) {
  std::lock_guard lock(reserved_mu_);
  if (reserved_.size() >= kReservationsMax && !reserved_.count(ino)) reserved_.clear();
  Reserved& r = reserved_[ino];
  r.under_quota = under_quota;
  r.to = std::max(r.to, reserve_to);
}

Status ClientImpl::reserveTo(uint64_t ino, uint64_t end) {
  {
    std::lock_guard lock(reserved_mu_);
    auto it = reserved_.find(ino);
    if (it != reserved_.end() && (!it->second.under_quota || end <= it->second.to))
      return Status::OK();
  }
  // A step further, unless only the exact end still fits.
  const uint64_t ahead = (end + kReserveStep - 1) / kReserveStep * kReserveStep;
  for (uint64_t want : {ahead, end}) {
    meta::ReserveReq req;
    req.set_ino(ino);
    req.set_end(want);
    meta::ReserveResp resp;
    Status s = metaCall(kReserve(), req, &resp);
    if (s.code() == ErrorCode::kQuotaExceeded && want != end) continue;
    RETURN_ON_ERROR(s);
    noteReservation(ino, resp.under_quota(), resp.reserve_to());
    return Status::OK();
  }
  return Status::OK();  // not reached
}

}  // namespace cistern::client
