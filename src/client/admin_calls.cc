// libcistern's tenant and token administration (docs/security.md): thin
// calls to meta, which checks that the token is a cluster admin's.
#include "client/client_impl.h"
#include "client/methods.h"

namespace cistern::client {
namespace {

TenantInfo tenantInfo(const meta::Tenant& t) {
  return TenantInfo{t.name(), t.id(), t.root(), t.created_ns()};
}

QuotaInfo quotaInfo(const meta::QuotaResp& q) {
  return QuotaInfo{q.ino(), q.quota().bytes_max(), q.quota().inodes_max(), q.bytes_used(),
                   q.inodes_used()};
}

}  // namespace

Error ClientImpl::quotaSet(uint64_t dir, uint64_t bytes_max, uint64_t inodes_max, QuotaInfo* out) {
  meta::QuotaSetReq req;
  req.set_ino(dir);
  req.set_bytes_max(bytes_max);
  req.set_inodes_max(inodes_max);
  meta::QuotaResp resp;
  Status s = metaCall(kQuotaSet(), req, &resp);
  if (!s.ok()) return toError(s, "quota of inode " + std::to_string(dir));
  // Files this client has open may be under it now: ask again at their next write.
  {
    std::lock_guard lock(reserved_mu_);
    reserved_.clear();
  }
  if (out) *out = quotaInfo(resp);
  return {};
}

Error ClientImpl::quotaGet(uint64_t dir, QuotaInfo* out) {
  meta::QuotaReq req;
  req.set_ino(dir);
  meta::QuotaResp resp;
  Status s = metaCall(kQuotaGet(), req, &resp);
  if (!s.ok()) return toError(s, "quota of inode " + std::to_string(dir));
  *out = quotaInfo(resp);
  return {};
}

Error ClientImpl::quotaList(std::vector<QuotaInfo>* out) {
  meta::Empty req;
  meta::QuotaListResp resp;
  if (Status s = metaCall(kQuotaList(), req, &resp); !s.ok()) return toError(s, "quotas");
  out->clear();
  for (const auto& q : resp.quotas()) out->push_back(quotaInfo(q));
  return {};
}

Error ClientImpl::tenantCreate(const std::string& name, const std::string& dir, uint32_t uid,
                               uint32_t gid, uint32_t mode, TenantInfo* out) {
  auto parts = split(dir);
  if (!parts.ok()) return toError(parts.status(), dir);
  if (parts->empty()) return toError(Status(ErrorCode::kAlreadyExists, "/"), dir);
  auto parent = resolveParent(*parts);
  if (!parent.ok()) return toError(parent.status(), dir);
  meta::TenantCreateReq req;
  *req.mutable_caller() = caller_;
  req.set_parent(parent->ino());
  req.set_name(parts->back());
  req.set_tenant(name);
  req.set_mode(mode & 07777);
  req.set_uid(uid);
  req.set_gid(gid);
  meta::TenantResp resp;
  Status s = metaCall(kTenantCreate(), req, &resp);
  forget(parent->ino(), parts->back());
  if (!s.ok()) return toError(s, "tenant " + name);
  if (out) *out = tenantInfo(resp.tenant());
  return {};
}

Error ClientImpl::tenantList(std::vector<TenantInfo>* out) {
  meta::Empty req;
  meta::TenantListResp resp;
  if (Status s = metaCall(kTenantList(), req, &resp); !s.ok()) return toError(s, "tenants");
  out->clear();
  for (const auto& t : resp.tenants()) out->push_back(tenantInfo(t));
  return {};
}

Error ClientImpl::tenantRemove(const std::string& name) {
  meta::TenantReq req;
  req.set_tenant(name);
  meta::Empty resp;
  return toError(metaCall(kTenantRemove(), req, &resp), "tenant " + name);
}

Error ClientImpl::revokeToken(uint64_t id, int64_t expires_unix_s) {
  meta::RevokeReq req;
  req.set_token_id(id);
  req.set_expires_unix_s(expires_unix_s);
  meta::Empty resp;
  return toError(metaCall(kRevokeToken(), req, &resp), "revoking a token");
}

Error ClientImpl::whoami(Identity* out) {
  meta::Empty req;
  meta::WhoAmIResp resp;
  if (Status s = metaCall(kWhoAmI(), req, &resp); !s.ok())
    return toError(s, "cluster " + options_.cluster);
  *out = Identity{resp.auth(),   resp.tenant(),         resp.uid(),     resp.gid(),
                  resp.rights(), resp.expires_unix_s(), resp.token_id()};
  return {};
}

}  // namespace cistern::client
