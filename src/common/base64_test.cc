#include "common/base64.h"

#include <gtest/gtest.h>

namespace cistern {
namespace {

TEST(Base64, RoundTripsEveryLengthAndByte) {
  EXPECT_EQ(base64Encode(""), "");
  EXPECT_EQ(base64Encode("f"), "Zg==");
  EXPECT_EQ(base64Encode("fo"), "Zm8=");
  EXPECT_EQ(base64Encode("foo"), "Zm9v");
  EXPECT_EQ(base64Encode("foobar"), "Zm9vYmFy");
  std::string all;
  for (int i = 0; i < 256; ++i) all.push_back(static_cast<char>(i));
  for (size_t n = 0; n <= all.size(); ++n) {
    std::string in = all.substr(0, n);
    auto back = base64Decode(base64Encode(in));
    ASSERT_TRUE(back.has_value()) << n;
    EXPECT_EQ(*back, in) << n;
  }
}

// Also non-canonical texts, whose padded group drops bits that are not zero
// ("M22=" and "M20=" would both be "3m"; the fuzz target found it).
TEST(Base64, RefusesWhatIsNotPaddedCanonicalStandardBase64) {
  for (const char* bad : {"Z", "Zg=", "Zg", "Z===", "=Zg=", "Zg==Zg==", "Zm9v!A==", "Zm-v", "Zm_v",
                          "Zg=a", "M22=", "Zh=="}) {
    EXPECT_FALSE(base64Decode(bad).has_value()) << bad;
  }
}

}  // namespace
}  // namespace cistern
