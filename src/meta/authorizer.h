// Authorizer: what meta checks on every call when the cluster checks tokens
// (docs/security.md). A call's credential is verified against the keyring
// and the revocation list; the tenant it names confines the call to that
// tenant's subtree (every inode the request names must carry the tenant's
// tag; inode 1 means the tenant's root), and the caller's uid/gid are
// mapped (root squashed to the token's uid:gid). The revocation list and
// the tenants are re-read from the KV every `refresh_ms` by a thread of its
// own, so a check costs an HMAC and a few hash lookups.
//
// Refusals, each counted in meta_auth_refusals_total{reason}: kTokenMissing,
// kTokenInvalid (also a tenant that does not exist), kTokenExpired,
// kTokenRevoked, kWrongTenant, kTokenReadOnly, kTokenNotAdmin.
// Thread-safe.
#pragma once

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>

#include "auth/token.h"
#include "meta/meta_store.h"

namespace cistern::meta {

struct AuthOptions {
  // How long a capability that open grants lives; a revoked token's
  // clients lose storage access within it. Default: 60 s.
  uint32_t capability_ttl_s = 60;
  // How often the revocation list and the tenants are re-read. Default: 1000 ms.
  uint32_t refresh_ms = 1000;
};

// Who a verified credential says the caller is.
struct Principal {
  std::string tenant;
  uint32_t tenant_id = 0;  // 0: the cluster tenant (not confined)
  uint64_t root = 1;       // the directory the caller sees as /
  uint32_t uid = 0;
  uint32_t gid = 0;
  uint32_t rights = 0;
  uint64_t token_id = 0;
  int64_t expires_unix_s = 0;

  bool confined() const { return tenant_id != 0; }
};

// What a call needs of its token: kAdmin, a token of the cluster tenant
// with right a; kTenantAdmin, right a (a tenant's own, within its subtree).
enum class Need : uint8_t { kRead, kWrite, kAdmin, kTenantAdmin };

class Authorizer {
 public:
  Authorizer(MetaStore& store, auth::Keyring keyring, const AuthOptions& options = {});
  ~Authorizer();
  Authorizer(const Authorizer&) = delete;
  Authorizer& operator=(const Authorizer&) = delete;

  // The principal of `credential` if it may make a call that needs `need`.
  Result<Principal> authenticate(std::string_view credential, Need need);
  // kWrongTenant unless `ino` (the caller's view: 1 = its root) lies in the
  // principal's subtree; otherwise the inode's real number.
  Result<uint64_t> inodeIn(const Principal& p, uint64_t ino);
  // Whether inode `real_ino` lies in the principal's subtree (no refusal
  // counted: for filtering lists).
  bool owns(const Principal& p, uint64_t real_ino);
  // The caller a request acts as: root squashed to the token's uid:gid
  // unless the principal is a cluster admin.
  void mapCaller(const Principal& p, Caller* c) const;
  // A capability over `ino`'s chunks for `rights` (auth::kRead/kWrite),
  // signed for storage to check, valid capability_ttl_s.
  Result<std::string> capability(const Principal& p, uint64_t ino, uint32_t rights) const;
  // Counts a refusal of `code` (one of the auth codes).
  static void countRefusal(ErrorCode code);

  // A tenant this meta server just created: its tokens work at once here
  // (on other meta servers, within refresh_ms).
  void tenantCreated(const Tenant& t);

  // Re-reads the revocation list and the tenants now (tests; the thread
  // does it every refresh_ms).
  Status refresh();

 private:
  Result<uint32_t> tenantOf(uint64_t ino);
  void loop();

  MetaStore& store_;
  const auth::Keyring keyring_;
  const AuthOptions options_;

  mutable std::mutex mu_;
  std::shared_ptr<const std::set<uint64_t>> revoked_;
  std::map<std::string, Tenant, std::less<>> tenants_;
  // Tenants that tokens named and the KV did not have, until the next refresh.
  static constexpr size_t kMissingMax = 1024;
  std::set<std::string, std::less<>> missing_;

  // ino -> tenant, direct-mapped (tags never change; numbers are not reused).
  static constexpr size_t kCacheSlots = 1 << 16;
  struct Slot {
    uint64_t ino = 0;
    uint32_t tenant = 0;
  };
  std::unique_ptr<Slot[]> cache_;
  static constexpr size_t kStripes = 64;
  std::mutex stripes_[kStripes];

  std::mutex loop_mu_;
  std::condition_variable loop_cv_;
  bool stop_ = false;
  std::thread thread_;
};

}  // namespace cistern::meta
