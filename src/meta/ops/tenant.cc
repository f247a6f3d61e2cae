// Tenants and the revocation list (docs/security.md): a tenant is a name, an
// id that tags every inode of its subtree (Inode.tenant) and the directory
// its clients see as /. Revoked tokens are listed by id until they expire.
#include <fmt/format.h>

#include "auth/token.h"
#include "kv/key_codec.h"
#include "meta/meta_store.h"
#include "meta/ops/new_inode.h"
#include "meta/permission.h"
#include "meta/schema.h"

namespace cistern::meta {
namespace {

Result<Tenant> parseTenant(std::string_view bytes) {
  Tenant t;
  if (!t.ParseFromArray(bytes.data(), static_cast<int>(bytes.size())))
    return Status(ErrorCode::kCorruption, "tenant record does not parse");
  return t;
}

}  // namespace

Result<Tenant> MetaStore::createTenant(const Caller& c, uint64_t parent, std::string_view dir_name,
                                       std::string_view tenant, uint32_t mode, uint32_t uid,
                                       uint32_t gid) {
  RETURN_ON_ERROR(auth::checkTenantName(tenant));
  if (tenant == auth::kClusterTenant) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("tenant name '{}' is reserved for the cluster's admins", tenant));
  }
  RETURN_ON_ERROR(checkName(dir_name));
  if (isDotOrDotDot(dir_name)) return Status(ErrorCode::kAlreadyExists, dir_name);
  ASSIGN_OR_RETURN(uint64_t ino, allocator_.next());
  ASSIGN_OR_RETURN(std::string bytes, mutate({}, [&](kv::Transaction& t) -> Result<std::string> {
                     ASSIGN_OR_RETURN(auto existing, t.get(tenantKey(tenant)));
                     if (existing) {
                       return Status(ErrorCode::kAlreadyExists, fmt::format("tenant {}", tenant));
                     }
                     ASSIGN_OR_RETURN(Inode dir, dirForNewName(t, c, parent, dir_name));
                     if (dir.tenant() != 0) {
                       return Status(ErrorCode::kCrossTenant,
                                     fmt::format("a tenant's root cannot be inside tenant {}'s "
                                                 "subtree",
                                                 dir.tenant()));
                     }
                     ASSIGN_OR_RETURN(auto last, t.get(tenantIdCounterKey()));
                     const int64_t id = (last ? kv::decodeCounter(*last) : 0) + 1;
                     t.set(tenantIdCounterKey(), kv::encodeCounter(id));
                     Inode n = newInode(ino, DIRECTORY, mode, c, dir, nowNs());
                     n.set_uid(uid);
                     n.set_gid(gid);
                     n.set_parent(parent);
                     n.set_tenant(static_cast<uint32_t>(id));
                     if (dir.has_dir_layout()) *n.mutable_dir_layout() = dir.dir_layout();
                     RETURN_ON_ERROR(insertNewInode(t, parent, dir_name, n));
                     Tenant rec;
                     rec.set_id(static_cast<uint32_t>(id));
                     rec.set_name(std::string(tenant));
                     rec.set_root(ino);
                     rec.set_created_ns(nowNs());
                     t.set(tenantKey(tenant), rec.SerializeAsString());
                     return rec.SerializeAsString();
                   }));
  return parseTenant(bytes);
}

Result<std::vector<Tenant>> MetaStore::listTenants() {
  std::vector<Tenant> out;
  RETURN_ON_ERROR(kv::runReadTransaction(engine_, [&](kv::ReadTransaction& t) -> Status {
    out.clear();
    return scanRange(t, tenantBegin(), tenantEnd(), [&](const kv::KeyValue& row) -> Status {
      ASSIGN_OR_RETURN(Tenant rec, parseTenant(row.value));
      out.push_back(std::move(rec));
      return Status::OK();
    });
  }));
  return out;
}

Result<std::optional<Tenant>> MetaStore::findTenant(std::string_view tenant) {
  std::optional<Tenant> out;
  RETURN_ON_ERROR(kv::runReadTransaction(engine_, [&](kv::ReadTransaction& t) -> Status {
    out.reset();
    ASSIGN_OR_RETURN(auto raw, t.get(tenantKey(tenant)));
    if (!raw) return Status::OK();
    ASSIGN_OR_RETURN(out, parseTenant(*raw));
    return Status::OK();
  }));
  return out;
}

Status MetaStore::removeTenant(std::string_view tenant) {
  return mutate({},
                [&](kv::Transaction& t) -> Result<std::string> {
                  ASSIGN_OR_RETURN(auto raw, t.get(tenantKey(tenant)));
                  if (!raw) return Status(ErrorCode::kNotFound, fmt::format("tenant {}", tenant));
                  t.clear(tenantKey(tenant));
                  return std::string();
                })
      .status();
}

Status MetaStore::revokeToken(uint64_t token_id, int64_t expires_unix_s) {
  Revoked r;
  r.set_expires_unix_s(expires_unix_s);
  r.set_revoked_ns(nowNs());
  return mutate(
             {},
             [&](kv::Transaction& t) -> Result<std::string> {
               t.set(revokedKey(token_id), r.SerializeAsString());
               return std::string();
             },
             /*durable=*/true)
      .status();
}

Result<std::set<uint64_t>> MetaStore::revokedTokens(int64_t now_unix_s) {
  std::set<uint64_t> live;
  std::vector<std::string> expired;
  RETURN_ON_ERROR(kv::runReadTransaction(engine_, [&](kv::ReadTransaction& t) -> Status {
    live.clear();
    expired.clear();
    return scanRange(
        t, revokedBegin(), revokedEnd(),
        [&](const kv::KeyValue& row) -> Status {
          kv::KeyReader kr(row.key);
          ASSIGN_OR_RETURN(kv::Prefix p, kr.prefix());
          ASSIGN_OR_RETURN(uint64_t id, kr.u64());
          Revoked r;
          if (p != kv::Prefix::kRevoked || !r.ParseFromString(row.value))
            return Status(ErrorCode::kCorruption, "revocation record does not parse");
          if (r.expires_unix_s() > now_unix_s) {
            live.insert(id);
          } else if (expired.size() < 100) {
            expired.push_back(row.key);
          }
          return Status::OK();
        },
        /*snapshot=*/true);
  }));
  if (!expired.empty()) {
    // An expired token is refused as expired; its entry is no longer needed.
    RETURN_ON_ERROR(mutate({}, [&](kv::Transaction& t) -> Result<std::string> {
                      for (const auto& k : expired) t.clear(k);
                      return std::string();
                    }).status());
  }
  return live;
}

}  // namespace cistern::meta
