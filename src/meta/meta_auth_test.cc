// Meta's token checks (authorizer.h) over RPC and as local calls: every
// refusal has its own code and is counted; a tenant's calls stay inside
// its subtree, whose root it sees as inode 1; root is squashed; open grants
// a capability storage can check.
#include <gtest/gtest.h>

#include <ctime>

#include "auth/token.h"
#include "common/metrics.h"
#include "kv/kv_test_util.h"
#include "meta/authorizer.h"
#include "meta/meta_service.h"
#include "meta/schema.h"
#include "net/rpc_client.h"
#include "tests/support/both_callers.h"

namespace cistern::meta {
namespace {

constexpr char kKeys[] = "1 000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n";
constexpr char kOtherKeys[] =
    "1 ff0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n";

uint64_t refusals(const char* reason) {
  return metrics::Registry::global()
      .counter("meta_auth_refusals_total", {{"reason", reason}})
      .value();
}

class MetaAuthTest : public ::testing::Test {
 protected:
  void SetUp() override {
    engine_ = kv::openMemEngine();
    ASSERT_TRUE(kv::runTransaction(*engine_, [](kv::Transaction& t) {
                  t.set(chainKey(1), "");
                  return Status::OK();
                }).ok());
    store_ = std::make_unique<MetaStore>(*engine_);
    ASSERT_TRUE(store_->init().ok());
    keys_ = *auth::Keyring::parse(kKeys);
    authz_ = std::make_unique<Authorizer>(*store_, keys_, AuthOptions{.refresh_ms = 60'000});
    server_ = std::make_unique<net::RpcServer>(net::ServerOptions{.threads = 1});
    service_ = std::make_unique<MetaService>(*store_, *server_, 4);
    service_->setAuthorizer(authz_.get());
    ASSERT_TRUE(server_->start().ok());
    admin_ = token("cluster", 0, 0, auth::kAllRights);
  }
  void TearDown() override {
    client_.reset();
    server_->stop();
    service_.reset();
    server_.reset();
    authz_.reset();
    store_.reset();
    engine_.reset();
  }

  std::string token(const std::string& tenant, uint32_t uid, uint32_t gid, uint32_t rights,
                    int64_t ttl = 3600, const auth::Keyring* keys = nullptr) {
    auth::Token t;
    t.tenant = tenant;
    t.uid = uid;
    t.gid = gid;
    t.rights = rights;
    t.issued_unix_s = std::time(nullptr);
    t.expires_unix_s = t.issued_unix_s + ttl;
    return *(keys ? keys : &keys_)->sign(t);
  }

  template <typename Req, typename Resp>
  Status call(const std::string& cred, const char* method, const Req& req, Resp* resp) {
    return client_->callSync(server_->endpoint(),
                             net::Method::of(std::string("cistern.meta.MetaService.") + method),
                             req, resp, {.timeout_ms = 5000, .credential = cred});
  }

  Tenant makeTenant(const std::string& name, uint32_t uid) {
    TenantCreateReq r;
    r.set_parent(kRootIno);
    r.set_name(name);
    r.set_tenant(name);
    r.set_mode(0755);
    r.set_uid(uid);
    r.set_gid(uid);
    TenantResp out;
    Status s = call(admin_, "TenantCreate", r, &out);
    EXPECT_TRUE(s.ok()) << s.toString();
    return out.tenant();
  }

  Result<Inode> create(const std::string& cred, uint64_t parent, const std::string& name,
                       uint32_t uid = 0) {
    CreateReq c;
    c.mutable_caller()->set_uid(uid);
    c.mutable_caller()->set_gid(uid);
    c.set_parent(parent);
    c.set_name(name);
    c.set_mode(0644);
    InodeResp out;
    RETURN_ON_ERROR(call(cred, "Create", c, &out));
    return out.inode();
  }

  Status getattr(const std::string& cred, uint64_t ino, Inode* out = nullptr) {
    GetattrReq g;
    g.set_ino(ino);
    InodeResp r;
    Status s = call(cred, "Getattr", g, &r);
    if (out) *out = r.inode();
    return s;
  }

  std::unique_ptr<kv::Engine> engine_;
  std::unique_ptr<MetaStore> store_;
  auth::Keyring keys_;
  std::unique_ptr<Authorizer> authz_;
  std::unique_ptr<net::RpcServer> server_;
  std::unique_ptr<MetaService> service_;
  std::unique_ptr<net::RpcClient> client_ = std::make_unique<net::RpcClient>();
  std::string admin_;
};

using MetaAuthCallers = testing::BothCallers<MetaAuthTest>;
INSTANTIATE_TEST_SUITE_P(From, MetaAuthCallers, ::testing::Bool(), testing::callerName);

TEST_P(MetaAuthCallers, EveryBadCredentialIsRefusedWithItsOwnCodeAndCounted) {
  makeTenant("alpha", 1000);
  const std::string good = token("alpha", 1000, 1000, auth::kRead | auth::kWrite);
  ASSERT_TRUE(getattr(good, kRootIno).ok());

  struct Case {
    std::string cred;
    ErrorCode code;
    const char* reason;
  };
  std::string forged = good;
  forged[forged.size() - 3] = forged[forged.size() - 3] == 'A' ? 'B' : 'A';
  std::string tampered = good;  // a byte of the body (uid) changed: the MAC no longer matches
  tampered[12] = tampered[12] == 'A' ? 'B' : 'A';
  auth::Keyring other = *auth::Keyring::parse(kOtherKeys);
  const std::vector<Case> cases = {
      {"", ErrorCode::kTokenMissing, "missing"},
      {"cst1.garbage", ErrorCode::kTokenInvalid, "invalid"},
      {forged, ErrorCode::kTokenInvalid, "invalid"},
      {tampered, ErrorCode::kTokenInvalid, "invalid"},
      {token("alpha", 1000, 1000, auth::kRead, 3600, &other), ErrorCode::kTokenInvalid, "invalid"},
      {token("nosuch", 1000, 1000, auth::kRead), ErrorCode::kTokenInvalid, "invalid"},
  };
  for (const auto& c : cases) {
    const uint64_t before = refusals(c.reason);
    Status s = getattr(c.cred, kRootIno);
    EXPECT_EQ(s.code(), c.code) << c.cred << ": " << s.toString();
    EXPECT_EQ(refusals(c.reason), before + 1) << c.reason;
  }

  // A tenant a token named while it did not exist, created since on this
  // meta server: its tokens work at once.
  makeTenant("nosuch", 3000);
  EXPECT_TRUE(getattr(token("nosuch", 3000, 3000, auth::kRead), kRootIno).ok());

  // Expired: signed an hour ago for a minute.
  auth::Token old;
  old.tenant = "alpha";
  old.rights = auth::kRead;
  old.issued_unix_s = std::time(nullptr) - 3600;
  old.expires_unix_s = old.issued_unix_s + 60;
  uint64_t before = refusals("expired");
  EXPECT_EQ(getattr(*keys_.sign(old), kRootIno).code(), ErrorCode::kTokenExpired);
  EXPECT_EQ(refusals("expired"), before + 1);

  // Read-only writes; a tenant's admin token is not the cluster's.
  const std::string reader = token("alpha", 1000, 1000, auth::kRead);
  before = refusals("read_only");
  EXPECT_EQ(create(reader, kRootIno, "f").code(), ErrorCode::kTokenReadOnly);
  EXPECT_EQ(refusals("read_only"), before + 1);
  TenantCreateReq tc;
  tc.set_parent(kRootIno);
  tc.set_name("x");
  tc.set_tenant("x");
  TenantResp tr;
  before = refusals("not_admin");
  EXPECT_EQ(call(token("alpha", 0, 0, auth::kAllRights), "TenantCreate", tc, &tr).code(),
            ErrorCode::kTokenNotAdmin);
  EXPECT_EQ(
      call(token("cluster", 0, 0, auth::kRead | auth::kWrite), "TenantCreate", tc, &tr).code(),
      ErrorCode::kTokenNotAdmin);
  EXPECT_EQ(refusals("not_admin"), before + 2);

  // Revoked: refused once meta has re-read the list, by id.
  Inode probe;
  ASSERT_TRUE(getattr(good, kRootIno, &probe).ok());
  auto parsed = keys_.verify(good, std::time(nullptr));
  ASSERT_TRUE(parsed.ok());
  RevokeReq rv;
  rv.set_token_id(parsed->id);
  rv.set_expires_unix_s(parsed->expires_unix_s);
  Empty e;
  EXPECT_EQ(call(good, "RevokeToken", rv, &e).code(), ErrorCode::kTokenNotAdmin);
  ASSERT_TRUE(call(admin_, "RevokeToken", rv, &e).ok());
  ASSERT_TRUE(authz_->refresh().ok());
  before = refusals("revoked");
  EXPECT_EQ(getattr(good, kRootIno).code(), ErrorCode::kTokenRevoked);
  EXPECT_EQ(refusals("revoked"), before + 1);
  // Another token of the same tenant still works.
  EXPECT_TRUE(getattr(reader, kRootIno).ok());
}

TEST_P(MetaAuthCallers, ATenantSeesOnlyItsSubtreeWithItsRootAsOne) {
  Tenant alpha = makeTenant("alpha", 1000);
  Tenant beta = makeTenant("beta", 2000);
  ASSERT_NE(alpha.id(), beta.id());
  const std::string a = token("alpha", 1000, 1000, auth::kRead | auth::kWrite);
  const std::string b = token("beta", 2000, 2000, auth::kRead | auth::kWrite);

  // alpha's "/" is its root directory.
  Inode root;
  ASSERT_TRUE(getattr(a, kRootIno, &root).ok());
  EXPECT_EQ(root.ino(), kRootIno);
  EXPECT_EQ(root.uid(), 1000u);
  auto f = create(a, kRootIno, "mine", 1000);
  ASSERT_TRUE(f.ok()) << f.status().toString();
  EXPECT_EQ(f->parent(), kRootIno);  // its directory, as the tenant sees it
  EXPECT_EQ(f->tenant(), alpha.id());
  // The admin sees it where it is: /alpha/mine.
  auto seen = store_->lookup(Caller(), alpha.root(), "mine");
  ASSERT_TRUE(seen.ok());
  EXPECT_EQ(seen->ino(), f->ino());
  EXPECT_EQ(seen->tenant(), alpha.id());

  // beta reaches none of it, by any number.
  auto bf = create(b, kRootIno, "theirs", 2000);
  ASSERT_TRUE(bf.ok());
  const uint64_t before = refusals("wrong_tenant");
  EXPECT_EQ(getattr(b, f->ino()).code(), ErrorCode::kWrongTenant);
  EXPECT_EQ(getattr(a, bf->ino()).code(), ErrorCode::kWrongTenant);
  EXPECT_EQ(getattr(a, alpha.root()).code(), ErrorCode::kOk);  // its own root by number too
  EXPECT_EQ(getattr(a, beta.root()).code(), ErrorCode::kWrongTenant);
  ReaddirReq rd;
  rd.set_ino(beta.root());
  rd.set_limit(100);
  ReaddirResp rr;
  EXPECT_EQ(call(a, "Readdir", rd, &rr).code(), ErrorCode::kWrongTenant);
  LookupReq lk;
  lk.set_parent(beta.root());
  lk.set_name("theirs");
  InodeResp lr;
  EXPECT_EQ(call(a, "Lookup", lk, &lr).code(), ErrorCode::kWrongTenant);
  OpenReq op;
  op.set_ino(bf->ino());
  op.set_read(true);
  OpenResp or_;
  EXPECT_EQ(call(a, "Open", op, &or_).code(), ErrorCode::kWrongTenant);
  RenameReq rn;
  rn.set_src_parent(kRootIno);
  rn.set_src_name("mine");
  rn.set_dst_parent(beta.root());
  rn.set_dst_name("stolen");
  Empty e;
  EXPECT_EQ(call(a, "Rename", rn, &e).code(), ErrorCode::kWrongTenant);
  // The cluster tenant (no root: directory 1 itself) may not find a path out
  // of "/" either: the tenant root is inode 1 and its ".." is itself.
  EXPECT_EQ(getattr(a, 1).code(), ErrorCode::kOk);
  lk.set_parent(kRootIno);
  lk.set_name("..");
  ASSERT_TRUE(call(a, "Lookup", lk, &lr).ok());
  EXPECT_EQ(lr.inode().ino(), kRootIno);
  EXPECT_EQ(lr.inode().uid(), 1000u);  // alpha's root, not the cluster's
  EXPECT_EQ(refusals("wrong_tenant"), before + 7);

  // alpha's readdir of "/" lists its own.
  rd.set_ino(kRootIno);
  ASSERT_TRUE(call(a, "Readdir", rd, &rr).ok());
  ASSERT_EQ(rr.names_size(), 1);
  EXPECT_EQ(rr.names(0), "mine");

  // The cluster's admin sees everything, but cannot move across tenants either.
  rn.set_src_parent(alpha.root());
  rn.set_dst_parent(beta.root());
  EXPECT_EQ(call(admin_, "Rename", rn, &e).code(), ErrorCode::kCrossTenant);
  LinkReq ln;
  ln.set_ino(f->ino());
  ln.set_new_parent(beta.root());
  ln.set_new_name("hard");
  EXPECT_EQ(call(admin_, "Link", ln, &lr).code(), ErrorCode::kCrossTenant);
  EXPECT_TRUE(getattr(admin_, f->ino()).ok());
}

TEST_P(MetaAuthCallers, RootIsSquashedToTheTokensIdentity) {
  makeTenant("alpha", 1000);
  const std::string a = token("alpha", 1000, 1001, auth::kRead | auth::kWrite);
  auto f = create(a, kRootIno, "by-root", /*uid=*/0);
  ASSERT_TRUE(f.ok()) << f.status().toString();
  EXPECT_EQ(f->uid(), 1000u);
  EXPECT_EQ(f->gid(), 1001u);
  // Another uid of the tenant keeps its own (its subtree, its users)...
  MkdirReq mk;
  mk.mutable_caller()->set_uid(1000);
  mk.mutable_caller()->set_gid(1000);
  mk.set_parent(kRootIno);
  mk.set_name("shared");
  mk.set_mode(0777);
  InodeResp d;
  ASSERT_TRUE(call(a, "Mkdir", mk, &d).ok());
  auto g = create(a, d.inode().ino(), "by-1234", 1234);
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->uid(), 1234u);
  // ...and the cluster's admin keeps root.
  auto h = create(admin_, kRootIno, "by-admin", 0);
  ASSERT_TRUE(h.ok());
  EXPECT_EQ(h->uid(), 0u);
  // A squashed root cannot chown to root.
  SetattrReq sa;
  sa.mutable_caller()->set_uid(0);
  sa.set_ino(f->ino());
  sa.set_uid(0);
  InodeResp out;
  EXPECT_EQ(call(a, "Setattr", sa, &out).code(), ErrorCode::kNotPermitted);
}

TEST_P(MetaAuthCallers, OpenGrantsACapabilityOverTheFilesChunks) {
  Tenant alpha = makeTenant("alpha", 1000);
  const std::string a = token("alpha", 1000, 1000, auth::kRead | auth::kWrite, 30);
  auto f = create(a, kRootIno, "data", 1000);
  ASSERT_TRUE(f.ok());
  OpenReq op;
  op.mutable_caller()->set_uid(1000);
  op.set_ino(f->ino());
  op.set_read(true);
  OpenResp out;
  ASSERT_TRUE(call(a, "Open", op, &out).ok());
  auto cap = keys_.verify(out.capability(), std::time(nullptr));
  ASSERT_TRUE(cap.ok()) << cap.status().toString();
  EXPECT_EQ(cap->kind, auth::Kind::kCapability);
  EXPECT_EQ(cap->inode, f->ino());
  EXPECT_EQ(cap->rights, auth::kRead);
  EXPECT_EQ(cap->tenant, "alpha");
  EXPECT_LE(cap->expires_unix_s, std::time(nullptr) + 30);  // never past its token
  op.set_write(true);
  op.set_client("c1");
  ASSERT_TRUE(call(a, "Open", op, &out).ok());
  cap = keys_.verify(out.capability(), std::time(nullptr));
  ASSERT_TRUE(cap.ok());
  EXPECT_EQ(cap->rights, auth::kRead | auth::kWrite);
  // A write open needs a token that writes.
  EXPECT_EQ(call(token("alpha", 1000, 1000, auth::kRead), "Open", op, &out).code(),
            ErrorCode::kTokenReadOnly);

  WhoAmIResp who;
  ASSERT_TRUE(call(a, "WhoAmI", Empty(), &who).ok());
  EXPECT_TRUE(who.auth());
  EXPECT_EQ(who.tenant(), "alpha");
  EXPECT_EQ(who.uid(), 1000u);
  TenantListResp tl;
  ASSERT_TRUE(call(admin_, "TenantList", Empty(), &tl).ok());
  ASSERT_EQ(tl.tenants_size(), 1);
  EXPECT_EQ(tl.tenants(0).root(), alpha.root());
  // Removing the tenant ends its tokens (unknown tenant) once meta re-reads.
  TenantReq rm;
  rm.set_tenant("alpha");
  Empty e;
  ASSERT_TRUE(call(admin_, "TenantRemove", rm, &e).ok());
  ASSERT_TRUE(authz_->refresh().ok());
  EXPECT_EQ(getattr(a, kRootIno).code(), ErrorCode::kTokenInvalid);
  EXPECT_EQ(call(admin_, "TenantRemove", rm, &e).code(), ErrorCode::kNotFound);
}

TEST_P(MetaAuthCallers, TenantNamesAndPlacesAreChecked) {
  makeTenant("alpha", 1000);
  TenantCreateReq r;
  r.set_parent(kRootIno);
  r.set_mode(0755);
  TenantResp out;
  r.set_name("dup");
  r.set_tenant("alpha");
  EXPECT_EQ(call(admin_, "TenantCreate", r, &out).code(), ErrorCode::kAlreadyExists);
  r.set_tenant("Bad Name");
  EXPECT_EQ(call(admin_, "TenantCreate", r, &out).code(), ErrorCode::kInvalidArgument);
  r.set_tenant("cluster");
  EXPECT_EQ(call(admin_, "TenantCreate", r, &out).code(), ErrorCode::kInvalidArgument);
  r.set_tenant("gamma");
  r.set_name("alpha");  // the name is taken by alpha's root
  EXPECT_EQ(call(admin_, "TenantCreate", r, &out).code(), ErrorCode::kAlreadyExists);
  auto alpha = store_->findTenant("alpha");
  ASSERT_TRUE(alpha.ok() && *alpha);
  r.set_parent((*alpha)->root());  // inside another tenant
  r.set_name("nested");
  EXPECT_EQ(call(admin_, "TenantCreate", r, &out).code(), ErrorCode::kCrossTenant);
}

}  // namespace
}  // namespace cistern::meta
