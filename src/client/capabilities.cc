// libcistern's capabilities (docs/security.md): chunk I/O on a cluster that
// checks tokens carries a capability meta signed for the file; the client
// keeps one per inode it does I/O on and asks meta for a fresh one before
// the old one runs out.
#include <fmt/format.h>

#include <ctime>

#include "auth/token.h"
#include "client/client_impl.h"
#include "client/methods.h"

namespace cistern::client {
namespace {

// Capabilities kept; past it the expired go, and if that is not enough, all.
constexpr size_t kCapabilitiesMax = 4096;

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

}  // namespace cistern::client
