#include "common/status.h"

#include <gtest/gtest.h>

#include "common/result.h"

namespace cistern {
namespace {

Result<int> parsePositive(int x) {
  if (x <= 0) return Status(ErrorCode::kInvalidArgument, "not positive");
  return x;
}

Status useAssign(int x, int* out) {
  ASSIGN_OR_RETURN(int v, parsePositive(x));
  *out = v * 2;
  return Status::OK();
}

TEST(Status, OkIsCheapAndEmpty) {
  Status s;
  EXPECT_TRUE(s.ok());
  EXPECT_EQ(s.code(), ErrorCode::kOk);
  EXPECT_EQ(s.message(), "");
  EXPECT_EQ(s.toString(), "kOk");
}

TEST(Status, CarriesCodeMessageAndErrno) {
  Status s(ErrorCode::kNotFound, "/a/b");
  EXPECT_FALSE(s.ok());
  EXPECT_EQ(s.toErrno(), ENOENT);
  EXPECT_EQ(s.toString(), "kNotFound: /a/b");
  EXPECT_EQ(s.withContext("lookup").toString(), "kNotFound: lookup: /a/b");
  EXPECT_TRUE(s == ErrorCode::kNotFound);
}

TEST(Status, EveryCodeHasANameAndErrnoAndIsKnown) {
#define CISTERN_X(name, value, err, desc)            \
  EXPECT_EQ(errorCodeName(ErrorCode::name), #name);  \
  EXPECT_EQ(errorCodeToErrno(ErrorCode::name), err); \
  EXPECT_TRUE(isKnownErrorCode(value));
  CISTERN_ERROR_CODES(CISTERN_X)
#undef CISTERN_X
  EXPECT_FALSE(isKnownErrorCode(9999));
  EXPECT_FALSE(isKnownErrorCode(99));
}

TEST(Result, HoldsValueOrStatusAndPropagates) {
  int out = 0;
  EXPECT_TRUE(useAssign(21, &out).ok());
  EXPECT_EQ(out, 42);
  Status s = useAssign(-1, &out);
  EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(out, 42);
  Result<std::string> r(ErrorCode::kTimeout, "slow");
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.code(), ErrorCode::kTimeout);
}

TEST(ResultDeathTest, ValueOfErrorAborts) {
  Result<int> r(ErrorCode::kNotFound, "x");
  EXPECT_DEATH((void)r.value(), "Result::value\\(\\) on error");
}

TEST(AssertDeathTest, CheckAbortsWithMessage) {
  EXPECT_DEATH(CISTERN_CHECK(1 + 1 == 3, "math is broken"), "math is broken");
}

}  // namespace
}  // namespace cistern
