#include "kv/key_codec.h"

#include <gtest/gtest.h>

#include <set>

#include "common/random.h"

namespace cistern::kv {
namespace {

TEST(KeyCodec, RoundTripsComponents) {
  std::string nul("a\0b\0", 4);
  std::string k = KeyWriter(Prefix::kDentry).u64(42).bytes(nul).bytes("").u64(~0ull).key();
  KeyReader r(k);
  EXPECT_EQ(*r.prefix(), Prefix::kDentry);
  EXPECT_EQ(*r.u64(), 42u);
  EXPECT_EQ(*r.bytes(), nul);
  EXPECT_EQ(*r.bytes(), "");
  EXPECT_EQ(*r.u64(), ~0ull);
  EXPECT_TRUE(r.done());
}

TEST(KeyCodec, OrderOfKeysIsOrderOfTuples) {
  Xoshiro256 rng(1);
  std::vector<std::pair<uint64_t, std::string>> tuples;
  for (int i = 0; i < 2000; ++i) {
    std::string s;
    for (uint64_t n = rng.uniform(5); n > 0; --n)
      s.push_back(static_cast<char>(rng.uniform(4) == 0 ? 0 : rng.uniform(256)));
    tuples.emplace_back(rng.uniform(4), s);
  }
  for (auto& a : tuples) {
    for (int j = 0; j < 10; ++j) {
      auto& b = tuples[rng.uniform(tuples.size())];
      std::string ka = KeyWriter(Prefix::kTest).u64(a.first).bytes(a.second).key();
      std::string kb = KeyWriter(Prefix::kTest).u64(b.first).bytes(b.second).key();
      EXPECT_EQ(a < b, ka < kb);
      EXPECT_EQ(a == b, ka == kb);
    }
  }
}

TEST(KeyCodec, MalformedKeysAreRejected) {
  EXPECT_EQ(KeyReader("").prefix().code(), ErrorCode::kKeyDecode);
  EXPECT_EQ(KeyReader("\xee").prefix().code(), ErrorCode::kKeyDecode);
  EXPECT_EQ(KeyReader("\x15\x00\x01").u64().code(), ErrorCode::kKeyDecode);  // short u64
  EXPECT_EQ(KeyReader(std::string("\x01"
                                  "abc",
                                  4))
                .bytes()
                .code(),
            ErrorCode::kKeyDecode);  // unterminated
  EXPECT_EQ(KeyReader(std::string("\x02x\0", 3)).bytes().code(),
            ErrorCode::kKeyDecode);  // wrong type
  EXPECT_EQ(KeyReader(std::string("\x01\0", 2)).u64().code(), ErrorCode::kKeyDecode);
}

TEST(KeyCodec, StrincGivesPrefixUpperBound) {
  EXPECT_EQ(strinc("ab"), "ac");
  EXPECT_EQ(strinc(std::string("a\xff", 2)), "b");
  EXPECT_EQ(strinc("\xff\xff"), "");
  std::string p = KeyWriter(Prefix::kDentry).u64(7).key();
  std::string child = KeyWriter(Prefix::kDentry).u64(7).bytes("zzz").key();
  EXPECT_LT(p, child);
  EXPECT_LT(child, strinc(p));
}

TEST(KeyPrefixes, AreUniqueAndNamed) {
  std::set<int> seen;
#define CISTERN_X(name, value, desc)               \
  EXPECT_TRUE(seen.insert(value).second) << #name; \
  EXPECT_EQ(prefixName(Prefix::name), #name);
  CISTERN_KV_PREFIXES(CISTERN_X)
#undef CISTERN_X
}

}  // namespace
}  // namespace cistern::kv
