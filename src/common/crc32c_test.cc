#include "common/crc32c.h"

#include <gtest/gtest.h>

#include <string>

namespace cistern {
namespace {

TEST(Crc32c, KnownVectors) {
  EXPECT_EQ(crc32c("123456789"), 0xE3069283u);
  EXPECT_EQ(crc32c(""), 0u);
  std::string zeros(32, '\0');
  EXPECT_EQ(crc32c(zeros), 0x8A9136AAu);  // RFC 3720 B.4
  std::string ones(32, '\xff');
  EXPECT_EQ(crc32c(ones), 0x62A8AB43u);
}

TEST(Crc32c, ExtendEqualsWhole) {
  std::string s = "the quick brown fox jumps over the lazy dog";
  for (size_t cut = 0; cut <= s.size(); ++cut) {
    uint32_t a = crc32c(s.data(), cut);
    EXPECT_EQ(crc32cExtend(a, s.data() + cut, s.size() - cut), crc32c(s));
  }
}

TEST(Crc32c, DetectsSingleBitFlip) {
  std::string s(4096, 'x');
  uint32_t base = crc32c(s);
  for (size_t i = 0; i < s.size(); i += 97) {
    std::string t = s;
    t[i] ^= 0x10;
    EXPECT_NE(crc32c(t), base);
  }
}

}  // namespace
}  // namespace cistern
