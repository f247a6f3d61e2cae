#include "meta/authorizer.h"

#include <fmt/format.h>

#include <ctime>

#include "common/log.h"
#include "common/metrics.h"

namespace cistern::meta {
namespace {

int64_t nowUnix() { return static_cast<int64_t>(std::time(nullptr)); }

}  // namespace

void Authorizer::countRefusal(ErrorCode code) {
  metrics::Registry::global()
      .counter("meta_auth_refusals_total", {{"reason", auth::refusalReason(code)}},
               "calls meta refused for their credential, by reason")
      .inc();
}

Authorizer::Authorizer(MetaStore& store, auth::Keyring keyring, const AuthOptions& options)
    : store_(store),
      keyring_(std::move(keyring)),
      options_(options),
      cache_(std::make_unique<Slot[]>(kCacheSlots)) {
  if (Status s = refresh(); !s.ok())
    CLOG_WARN("auth", "reading the revocation list and tenants: {}", s.toString());
  thread_ = std::thread([this] { loop(); });
}

Authorizer::~Authorizer() {
  {
    std::lock_guard lock(loop_mu_);
    stop_ = true;
  }
  loop_cv_.notify_all();
  thread_.join();
}

void Authorizer::loop() {
  std::unique_lock lock(loop_mu_);
  while (!stop_) {
    loop_cv_.wait_for(lock, std::chrono::milliseconds(options_.refresh_ms));
    if (stop_) break;
    lock.unlock();
    if (Status s = refresh(); !s.ok())
      CLOG_WARN("auth", "reading the revocation list and tenants: {}", s.toString());
    lock.lock();
  }
}

Status Authorizer::refresh() {
  ASSIGN_OR_RETURN(auto revoked, store_.revokedTokens(nowUnix()));
  ASSIGN_OR_RETURN(auto tenants, store_.listTenants());
  std::map<std::string, Tenant, std::less<>> by_name;
  for (auto& t : tenants) by_name.emplace(t.name(), std::move(t));
  std::lock_guard lock(mu_);
  revoked_ = std::make_shared<const std::set<uint64_t>>(std::move(revoked));
  tenants_ = std::move(by_name);
  missing_.clear();
  return Status::OK();
}

void Authorizer::tenantCreated(const Tenant& t) {
  std::lock_guard lock(mu_);
  missing_.erase(t.name());
  tenants_.emplace(t.name(), t);
}

Result<Principal> Authorizer::authenticate(std::string_view credential, Need need) {
  auto fail = [](Status s) -> Result<Principal> {
    countRefusal(s.code());
    return s;
  };
  if (credential.empty()) {
    return fail(
        Status(ErrorCode::kTokenMissing, "this cluster checks tokens and the call carried none"));
  }
  std::shared_ptr<const std::set<uint64_t>> revoked;
  {
    std::lock_guard lock(mu_);
    revoked = revoked_;
  }
  Result<auth::Token> t = keyring_.verify(credential, nowUnix(), revoked.get());
  if (!t.ok()) return fail(t.status());
  if (t->kind != auth::Kind::kToken) {
    return fail(Status(ErrorCode::kTokenInvalid, "a capability is not a token"));
  }
  Principal p;
  p.tenant = t->tenant;
  p.uid = t->uid;
  p.gid = t->gid;
  p.rights = t->rights;
  p.token_id = t->id;
  p.expires_unix_s = t->expires_unix_s;
  if (t->tenant != auth::kClusterTenant) {
    std::optional<Tenant> known;
    bool missing = false;  // looked up since the last refresh, and absent
    {
      std::lock_guard lock(mu_);
      if (auto it = tenants_.find(t->tenant); it != tenants_.end()) known = it->second;
      missing = !known && missing_.count(t->tenant) > 0;
    }
    if (!known && !missing) {
      // Created since the last refresh, perhaps through another meta server.
      ASSIGN_OR_RETURN(known, store_.findTenant(t->tenant));
      std::lock_guard lock(mu_);
      if (known) {
        tenants_.emplace(known->name(), *known);
      } else {
        // Not looked up again until the next refresh: a stream of calls
        // naming no tenant costs no KV read each.
        if (missing_.size() >= kMissingMax) missing_.clear();
        missing_.insert(t->tenant);
      }
    }
    if (!known) {
      return fail(Status(
          ErrorCode::kTokenInvalid,
          fmt::format("token {:016x} names tenant {}, which does not exist", t->id, t->tenant)));
    }
    p.tenant_id = known->id();
    p.root = known->root();
  }
  if (need == Need::kWrite && !(p.rights & auth::kWrite)) {
    return fail(Status(ErrorCode::kTokenReadOnly,
                       fmt::format("token {:016x} of tenant {} has rights '{}', not w", p.token_id,
                                   p.tenant, auth::rightsText(p.rights))));
  }
  if (need == Need::kRead && !(p.rights & (auth::kRead | auth::kWrite))) {
    return fail(Status(ErrorCode::kTokenReadOnly,
                       fmt::format("token {:016x} of tenant {} has rights '{}', not r", p.token_id,
                                   p.tenant, auth::rightsText(p.rights))));
  }
  if (need == Need::kAdmin && (p.confined() || !(p.rights & auth::kAdmin))) {
    return fail(Status(
        ErrorCode::kTokenNotAdmin,
        fmt::format("token {:016x} of tenant {} (rights '{}'): only a token of "
                    "tenant {} with right a may",
                    p.token_id, p.tenant, auth::rightsText(p.rights), auth::kClusterTenant)));
  }
  if (need == Need::kTenantAdmin && !(p.rights & auth::kAdmin)) {
    return fail(Status(ErrorCode::kTokenNotAdmin,
                       fmt::format("token {:016x} of tenant {} has rights '{}', not a", p.token_id,
                                   p.tenant, auth::rightsText(p.rights))));
  }
  return p;
}

Result<uint32_t> Authorizer::tenantOf(uint64_t ino) {
  const size_t slot = ino % kCacheSlots;
  {
    std::lock_guard lock(stripes_[slot % kStripes]);
    if (cache_[slot].ino == ino && ino != 0) return cache_[slot].tenant;
  }
  ASSIGN_OR_RETURN(Inode n, store_.getattr(ino));
  std::lock_guard lock(stripes_[slot % kStripes]);
  cache_[slot] = {ino, n.tenant()};
  return n.tenant();
}

Result<uint64_t> Authorizer::inodeIn(const Principal& p, uint64_t ino) {
  if (!p.confined()) return ino;
  if (ino == 1) return p.root;
  Result<uint32_t> tenant = tenantOf(ino);
  // An inode that does not exist passes: the call answers kNotFound, as it
  // would in the tenant's own subtree (numbers are given out in order, so
  // that says nothing another tenant's files would not).
  if (!tenant.ok())
    return tenant.code() == ErrorCode::kNotFound ? Result<uint64_t>(ino) : tenant.status();
  if (*tenant != p.tenant_id) {
    countRefusal(ErrorCode::kWrongTenant);
    return Status(ErrorCode::kWrongTenant,
                  fmt::format("inode {} is not in tenant {}'s subtree", ino, p.tenant));
  }
  return ino;
}

bool Authorizer::owns(const Principal& p, uint64_t real_ino) {
  if (!p.confined()) return true;
  Result<uint32_t> tenant = tenantOf(real_ino);
  return tenant.ok() && *tenant == p.tenant_id;
}

void Authorizer::mapCaller(const Principal& p, Caller* c) const {
  if (!p.confined() && (p.rights & auth::kAdmin)) return;
  if (c->uid() == 0) {
    c->set_uid(p.uid);
    c->set_gid(p.gid);
    c->clear_groups();
  }
  if (c->gid() == 0) c->set_gid(p.gid);
  for (auto& g : *c->mutable_groups()) {
    if (g == 0) g = p.gid;
  }
}

Result<std::string> Authorizer::capability(const Principal& p, uint64_t ino,
                                           uint32_t rights) const {
  auth::Token c;
  c.kind = auth::Kind::kCapability;
  c.issued_unix_s = nowUnix();
  c.expires_unix_s =
      std::min<int64_t>(c.issued_unix_s + options_.capability_ttl_s, p.expires_unix_s);
  c.uid = p.uid;
  c.gid = p.gid;
  c.rights = rights;
  c.inode = ino;
  c.tenant = p.tenant;
  return keyring_.sign(c);
}

}  // namespace cistern::meta
