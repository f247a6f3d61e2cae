// `cistern mount -o` text: every option it documents, and a clear error for
// anything else (the mount is then not attempted).
#include <gtest/gtest.h>

#include "fuse/fuse_fs.h"

namespace cistern::fuse {
namespace {

TEST(MountOptions, EveryDocumentedOptionIsTaken) {
  MountOptions o;
  ASSERT_TRUE(parseMountOptions("allow_other,writeback,debug,socket_calls,attr_timeout=2.5,"
                                "entry_timeout=0,negative_timeout=86400",
                                &o)
                  .ok());
  EXPECT_TRUE(o.allow_other);
  EXPECT_TRUE(o.writeback_cache);
  EXPECT_TRUE(o.debug);
  EXPECT_TRUE(o.socket_calls);
  EXPECT_DOUBLE_EQ(o.attr_timeout_s, 2.5);
  EXPECT_DOUBLE_EQ(o.entry_timeout_s, 0);
  EXPECT_DOUBLE_EQ(o.negative_timeout_s, 86400);
}

TEST(MountOptions, NothingAndEmptyItemsKeepTheDefaults) {
  MountOptions o;
  ASSERT_TRUE(parseMountOptions("", &o).ok());
  ASSERT_TRUE(parseMountOptions(",,", &o).ok());
  EXPECT_FALSE(o.allow_other);
  EXPECT_FALSE(o.writeback_cache);
  EXPECT_FALSE(o.socket_calls);
  EXPECT_DOUBLE_EQ(o.attr_timeout_s, 1.0);
}

TEST(MountOptions, BadOptionsAreRefusedByName) {
  struct Case {
    const char* text;
    const char* named;  // the error message names this
  };
  for (const Case& c :
       {Case{"allow_others", "allow_others"}, Case{"socket_calls=1", "socket_calls=1"},
        Case{"attr_timeout=", "attr_timeout"}, Case{"attr_timeout=abc", "abc"},
        Case{"entry_timeout=-1", "-1"}, Case{"negative_timeout=1e9", "1e9"},
        Case{"attr_timeout=nan", "nan"}, Case{"writeback,bogus", "bogus"}}) {
    SCOPED_TRACE(c.text);
    MountOptions o;
    Status s = parseMountOptions(c.text, &o);
    EXPECT_EQ(s.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(s.message().find(c.named), std::string::npos) << s.toString();
  }
}

}  // namespace
}  // namespace cistern::fuse
