// Tokens: a signed token verifies with its fields; forged, expired,
// revoked and missing ones are refused, each with its own code; keys
// rotate with two live; key files and bodies that are wrong are clear
// errors.
#include "auth/token.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <filesystem>
#include <fstream>

#include "common/base64.h"

namespace cistern::auth {
namespace {

const char* kKey1 = "1 000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f\n";
const char* kKey2 = "2 f0e0d0c0b0a090807060504030201000f1e1d1c1b1a191817161514131211100\n";

Keyring ring(const std::string& text) {
  auto k = Keyring::parse(text);
  EXPECT_TRUE(k.ok()) << k.status().toString();
  return *k;
}

Token sample() {
  Token t;
  t.tenant = "team-a";
  t.uid = 1000;
  t.gid = 100;
  t.rights = kRead | kWrite;
  t.issued_unix_s = 1'000'000;
  t.expires_unix_s = 1'003'600;
  return t;
}

TEST(Token, ASignedTokenVerifiesWithItsFields) {
  const Keyring k = ring(kKey1);
  auto text = k.sign(sample());
  ASSERT_TRUE(text.ok()) << text.status().toString();
  EXPECT_EQ(text->rfind("cst1.", 0), 0u);
  auto t = k.verify(*text, 1'000'010);
  ASSERT_TRUE(t.ok()) << t.status().toString();
  EXPECT_EQ(t->tenant, "team-a");
  EXPECT_EQ(t->uid, 1000u);
  EXPECT_EQ(t->gid, 100u);
  EXPECT_EQ(t->rights, kRead | kWrite);
  EXPECT_EQ(t->key_id, 1u);
  EXPECT_NE(t->id, 0u) << "a random id, for revocation";
  EXPECT_EQ(t->kind, Kind::kToken);
  // Two tokens of the same fields differ (their ids).
  EXPECT_NE(*k.sign(sample()), *text);
}

TEST(Token, EachRefusalHasItsOwnCode) {
  const Keyring k = ring(kKey1);
  const std::string text = *k.sign(sample());
  EXPECT_EQ(k.verify("", 1'000'010).status().code(), ErrorCode::kTokenMissing);
  EXPECT_EQ(k.verify(text, 1'003'600).status().code(), ErrorCode::kTokenExpired);
  const uint64_t id = k.verify(text, 1'000'010)->id;
  std::set<uint64_t> revoked{id};
  EXPECT_EQ(k.verify(text, 1'000'010, &revoked).status().code(), ErrorCode::kTokenRevoked);

  // Forged: the body changed (more rights, another tenant) under the old MAC.
  const size_t dot = text.find('.', 5);
  Token more = k.verify(text, 1'000'010).value();
  more.rights = kAllRights;
  const std::string forged = "cst1." + base64Encode(encodeBody(more)) + text.substr(dot);
  auto f = k.verify(forged, 1'000'010);
  EXPECT_EQ(f.status().code(), ErrorCode::kTokenInvalid);
  EXPECT_NE(f.status().message().find("MAC is wrong"), std::string::npos) << f.status().toString();
  // Signed by another key of the same id.
  const Keyring other = ring("1 " + std::string(64, 'a'));
  EXPECT_EQ(k.verify(*other.sign(sample()), 1'000'010).status().code(), ErrorCode::kTokenInvalid);
  // Malformed text.
  for (const std::string& bad :
       std::vector<std::string>{"cst1.", "cst2." + text.substr(5), text.substr(0, dot), "x",
                                text + "A", std::string(600, 'a')}) {
    EXPECT_EQ(k.verify(bad, 1'000'010).status().code(), ErrorCode::kTokenInvalid) << bad;
  }
}

TEST(Token, KeysRotateWithTwoLive) {
  const Keyring old_ring = ring(kKey1);
  const Keyring both = ring(std::string(kKey2) + kKey1);  // 2 signs, 1 still verifies
  const std::string from_old = *old_ring.sign(sample());
  const std::string from_new = *both.sign(sample());
  EXPECT_TRUE(both.verify(from_old, 1'000'010).ok());
  EXPECT_EQ(both.verify(from_new, 1'000'010)->key_id, 2u);
  auto unknown = old_ring.verify(from_new, 1'000'010);
  EXPECT_EQ(unknown.status().code(), ErrorCode::kTokenInvalid);
  EXPECT_NE(unknown.status().message().find("key 2"), std::string::npos);
}

TEST(Token, CapabilitiesNameAnInode) {
  const Keyring k = ring(kKey1);
  Token cap = sample();
  cap.kind = Kind::kCapability;
  EXPECT_EQ(k.sign(cap).status().code(), ErrorCode::kInvalidArgument) << "no inode";
  cap.inode = 77;
  auto t = k.verify(*k.sign(cap), 1'000'010);
  ASSERT_TRUE(t.ok());
  EXPECT_EQ(t->kind, Kind::kCapability);
  EXPECT_EQ(t->inode, 77u);
  Token tok = sample();
  tok.inode = 5;
  EXPECT_FALSE(k.sign(tok).ok()) << "a token names no inode";
}

TEST(Token, BodiesAreCheckedFieldByField) {
  const std::string good = encodeBody(sample());
  ASSERT_TRUE(decodeBody(good).ok());
  EXPECT_FALSE(decodeBody(good + "x").ok()) << "trailing bytes";
  EXPECT_FALSE(decodeBody(good.substr(0, good.size() - 1)).ok()) << "short";
  EXPECT_FALSE(decodeBody("").ok());
  auto with = [&](auto change) {
    Token t = sample();
    change(t);
    return decodeBody(encodeBody(t)).status().code();
  };
  EXPECT_EQ(with([](Token& t) { t.kind = static_cast<Kind>(3); }), ErrorCode::kTokenInvalid);
  EXPECT_EQ(with([](Token& t) { t.rights = 0; }), ErrorCode::kTokenInvalid);
  EXPECT_EQ(with([](Token& t) { t.rights = 8; }), ErrorCode::kTokenInvalid);
  EXPECT_EQ(with([](Token& t) { t.tenant = "Team A"; }), ErrorCode::kTokenInvalid);
  EXPECT_EQ(with([](Token& t) { t.tenant = ""; }), ErrorCode::kTokenInvalid);
  EXPECT_EQ(with([](Token& t) { t.expires_unix_s = t.issued_unix_s; }), ErrorCode::kTokenInvalid);
}

TEST(Token, RightsAndTenantNames) {
  EXPECT_EQ(*parseRights("rw"), kRead | kWrite);
  EXPECT_EQ(*parseRights("rwa"), kAllRights);
  EXPECT_EQ(parseRights("rx").status().code(), ErrorCode::kInvalidArgument);
  EXPECT_FALSE(parseRights("").ok());
  EXPECT_EQ(rightsText(kRead | kAdmin), "ra");
  EXPECT_TRUE(checkTenantName("ml-infra.team_2").ok());
  EXPECT_FALSE(checkTenantName(std::string(65, 'a')).ok());
  EXPECT_FALSE(checkTenantName("a/b").ok());
}

TEST(Keyring, KeyFilesAreCheckedLineByLine) {
  auto err = [](const std::string& text) {
    return std::string(Keyring::parse(text).status().message());
  };
  EXPECT_NE(err("").find("no key"), std::string::npos);
  EXPECT_NE(err("1 abc").find("64"), std::string::npos);
  EXPECT_NE(err("1 " + std::string(64, 'g')).find("not hex"), std::string::npos);
  EXPECT_NE(err("x " + std::string(64, 'a')).find("id 'x'"), std::string::npos);
  EXPECT_NE(err(std::string(kKey1) + kKey1).find("twice"), std::string::npos);
  EXPECT_NE(err(std::string(kKey1) + kKey2 + "3 " + std::string(64, 'a')).find("third"),
            std::string::npos);
  EXPECT_TRUE(Keyring::parse("# keys\n\n" + std::string(kKey1) + "  # the only one\n").ok());
  auto fresh = Keyring::parse(Keyring::generateLine(9));
  ASSERT_TRUE(fresh.ok());
  EXPECT_EQ(fresh->keys()[0].id, 9u);
  EXPECT_NE(Keyring::generateLine(9), Keyring::generateLine(9));

  const std::string path = ::testing::TempDir() + "/cistern-keys-" + std::to_string(getpid());
  std::ofstream(path) << kKey1;
  ::chmod(path.c_str(), 0644);
  auto open = Keyring::load(path);
  EXPECT_EQ(open.status().code(), ErrorCode::kConfigInvalid);
  EXPECT_NE(open.status().message().find("chmod 600"), std::string::npos);
  ::chmod(path.c_str(), 0600);
  EXPECT_TRUE(Keyring::load(path).ok());
  std::filesystem::remove(path);
  EXPECT_FALSE(Keyring::load(path).ok());
}

}  // namespace
}  // namespace cistern::auth
