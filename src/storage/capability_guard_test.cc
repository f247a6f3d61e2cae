// CapabilityGuard (capability_guard.h): chunk I/O passes only with a
// capability for every inode it touches and the rights it needs; calls
// between servers only with the cluster's admin token; each refusal is its
// own code.
#include "storage/capability_guard.h"

#include <gtest/gtest.h>

#include <ctime>

#include "storage.pb.h"

namespace cistern::storage {
namespace {

constexpr char kKeys[] = "7 202122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f\n";
constexpr char kOther[] = "7 ff2122232425262728292a2b2c2d2e2f303132333435363738393a3b3c3d3e3f\n";

net::Method m(const char* name) {
  return net::Method::of(std::string("cistern.storage.StorageService.") + name);
}

class CapabilityGuardTest : public ::testing::Test {
 protected:
  std::string sign(auth::Kind kind, const std::string& tenant, uint32_t rights, uint64_t inode,
                   int64_t ttl = 60, const char* keys = kKeys) {
    auth::Token t;
    t.kind = kind;
    t.tenant = tenant;
    t.rights = rights;
    t.inode = inode;
    t.issued_unix_s = std::time(nullptr) - 10;
    t.expires_unix_s = t.issued_unix_s + ttl;
    return *auth::Keyring::parse(keys)->sign(t);
  }
  std::string cap(uint32_t rights, uint64_t inode) {
    return sign(auth::Kind::kCapability, "alpha", rights, inode);
  }
  CapabilityGuard guard_{*auth::Keyring::parse(kKeys)};
};

TEST_F(CapabilityGuardTest, ChunkIoNeedsACapabilityForItsInodeAndRights) {
  WriteReq w;
  w.mutable_chunk()->set_inode(42);
  BatchReadReq r;
  r.add_ranges()->mutable_chunk()->set_inode(42);
  EXPECT_TRUE(guard_.check(m("Write"), cap(auth::kRead | auth::kWrite, 42), w).ok());
  EXPECT_TRUE(guard_.check(m("BatchRead"), cap(auth::kRead, 42), r).ok());

  // Read rights do not write; another inode's capability covers nothing here.
  EXPECT_EQ(guard_.check(m("Write"), cap(auth::kRead, 42), w).code(),
            ErrorCode::kCapabilityRefused);
  EXPECT_EQ(guard_.check(m("BatchRead"), cap(auth::kRead, 43), r).code(),
            ErrorCode::kCapabilityRefused);
  // One range of another inode in a batch: refused whole.
  r.add_ranges()->mutable_chunk()->set_inode(99);
  Status s = guard_.check(m("BatchRead"), cap(auth::kRead, 42), r);
  EXPECT_EQ(s.code(), ErrorCode::kCapabilityRefused);
  EXPECT_NE(s.message().find("inode 99"), std::string::npos) << s.toString();
  RemoveReq rm;
  rm.mutable_from()->set_inode(7);
  EXPECT_EQ(guard_.check(m("Remove"), cap(auth::kWrite, 42), rm).code(),
            ErrorCode::kCapabilityRefused);
  EXPECT_TRUE(guard_.check(m("Remove"), cap(auth::kWrite, 7), rm).ok());

  // A tenant's token is not a capability; nothing at all; forged; expired.
  const std::string token = sign(auth::Kind::kToken, "alpha", auth::kAllRights, 0);
  EXPECT_EQ(guard_.check(m("Write"), token, w).code(), ErrorCode::kCapabilityRefused);
  EXPECT_EQ(guard_.check(m("Write"), "", w).code(), ErrorCode::kTokenMissing);
  EXPECT_EQ(guard_
                .check(m("Write"),
                       sign(auth::Kind::kCapability, "alpha", auth::kWrite, 42, 60, kOther), w)
                .code(),
            ErrorCode::kTokenInvalid);
  EXPECT_EQ(guard_.check(m("Write"), sign(auth::Kind::kCapability, "alpha", auth::kWrite, 42, 5), w)
                .code(),
            ErrorCode::kTokenExpired);
  // Chunk metadata reads (Query, Locate) need read rights alike.
  QueryReq q;
  q.mutable_chunk()->set_inode(42);
  EXPECT_TRUE(guard_.check(m("Query"), cap(auth::kRead, 42), q).ok());
  EXPECT_EQ(guard_.check(m("Query"), cap(auth::kRead, 41), q).code(),
            ErrorCode::kCapabilityRefused);
}

TEST_F(CapabilityGuardTest, CallsBetweenServersNeedTheClustersAdminToken) {
  const std::string service = sign(auth::Kind::kToken, "cluster", auth::kAllRights, 0);
  ForwardReq f;
  ListReq l;
  EXPECT_TRUE(guard_.check(m("Forward"), service, f).ok());
  EXPECT_TRUE(guard_.check(m("List"), service, l).ok());
  WriteReq w;
  w.mutable_chunk()->set_inode(5);
  EXPECT_TRUE(guard_.check(m("Write"), service, w).ok());  // the GC, a resync
  EXPECT_EQ(guard_.check(m("Forward"), cap(auth::kAllRights, 5), f).code(),
            ErrorCode::kTokenNotAdmin);
  EXPECT_EQ(
      guard_.check(m("List"), sign(auth::Kind::kToken, "alpha", auth::kAllRights, 0), l).code(),
      ErrorCode::kTokenNotAdmin);
  EXPECT_EQ(guard_.check(m("List"), sign(auth::Kind::kToken, "cluster", auth::kRead, 0), l).code(),
            ErrorCode::kTokenNotAdmin);
  // Space, shared memory and Sync take any valid credential.
  SpaceReq sp;
  EXPECT_TRUE(guard_.check(m("Space"), cap(auth::kRead, 1), sp).ok());
  EXPECT_TRUE(guard_.check(m("Space"), sign(auth::Kind::kToken, "beta", auth::kRead, 0), sp).ok());
  EXPECT_EQ(guard_.check(m("Space"), "", sp).code(), ErrorCode::kTokenMissing);
}

}  // namespace
}  // namespace cistern::storage
