#include "common/fault.h"

#include <gtest/gtest.h>

namespace cistern {
namespace {

Status guarded() {
  RETURN_ON_ERROR(CISTERN_FAULT("test.point"));
  return Status::OK();
}

class FaultTest : public ::testing::Test {
 protected:
  void TearDown() override { fault::disableAll(); }
};

TEST_F(FaultTest, OffByDefault) {
  EXPECT_TRUE(guarded().ok());
  EXPECT_EQ(fault::g_enabled_count.load(), 0);
}

TEST_F(FaultTest, ErrorWithSkipAndTimes) {
  fault::Spec spec;
  spec.code = ErrorCode::kIOError;
  spec.skip = 2;
  spec.times = 1;
  fault::enable("test.point", spec);
  EXPECT_TRUE(guarded().ok());
  EXPECT_TRUE(guarded().ok());
  EXPECT_EQ(guarded().code(), ErrorCode::kIOError);
  EXPECT_TRUE(guarded().ok());
  EXPECT_EQ(fault::fired("test.point"), 1u);
  fault::disable("test.point");
  EXPECT_EQ(fault::g_enabled_count.load(), 0);
}

TEST_F(FaultTest, OtherNamesAreUnaffected) {
  fault::enable("other.point", fault::Spec{});
  EXPECT_TRUE(guarded().ok());
}

TEST_F(FaultTest, ParsesSpecStrings) {
  ASSERT_TRUE(fault::enableFromString("test.point=error:kNoSpace@times=2;x=delay:1ms").ok());
  EXPECT_EQ(guarded().code(), ErrorCode::kNoSpace);
  EXPECT_EQ(guarded().code(), ErrorCode::kNoSpace);
  EXPECT_TRUE(guarded().ok());
  EXPECT_TRUE(CISTERN_FAULT("x").ok());
  EXPECT_EQ(fault::fired("x"), 1u);
}

TEST_F(FaultTest, BadSpecsAreRejectedAndEnableNothing) {
  for (const char* bad : {"noequals", "a=explode", "a=error:kNope", "a=delay:5min", "a=delay:ms",
                          "a=error@skip=x", "a=error@p=2", "a=error@bogus=1"}) {
    Status s = fault::enableFromString(std::string("ok.point=error;") + bad);
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument) << bad;
    EXPECT_NE(s.message().find("fault spec"), std::string::npos);
  }
  EXPECT_EQ(fault::g_enabled_count.load(), 0);
}

TEST_F(FaultTest, ProbabilityZeroNeverFires) {
  fault::Spec spec;
  spec.probability = 0.0;
  fault::enable("test.point", spec);
  for (int i = 0; i < 1000; ++i) ASSERT_TRUE(guarded().ok());
}

TEST(FaultDeathTest, CrashKillsTheProcess) {
  EXPECT_EXIT(
      {
        fault::Spec spec;
        spec.action = fault::Action::kCrash;
        fault::enable("test.point", spec);
        (void)guarded();
      },
      ::testing::KilledBySignal(SIGKILL), "");
}

}  // namespace
}  // namespace cistern
