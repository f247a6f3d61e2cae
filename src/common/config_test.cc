#include "common/config.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>

namespace cistern {
namespace {

struct Opts {
  uint32_t threads = 0;
  int64_t offset = -5;
  bool sync = true;
  double ratio = 0.5;
  std::string name = "default";
  std::vector<std::string> peers{"a"};
  void bind(ConfigBinder& b) {
    b.bind("rpc.threads", &threads, "I/O threads; 0 = one per core");
    b.bind("offset", &offset, "an offset");
    b.bind("kv.sync", &sync, "fsync commits");
    b.bind("ratio", &ratio, "a ratio");
    b.bind("name", &name, "a name");
    b.bind("peers", &peers, "peer list");
  }
};

TEST(Config, DefaultsStayWhenKeysAbsent) {
  Opts o;
  ConfigBinder b;
  o.bind(b);
  ASSERT_TRUE(b.loadString("").ok());
  EXPECT_EQ(o.threads, 0u);
  EXPECT_EQ(o.name, "default");
}

TEST(Config, LoadsEveryTypeFromTablesAndDottedKeys) {
  Opts o;
  ConfigBinder b;
  o.bind(b);
  Status s = b.loadString(R"(
offset = -7
ratio = 2
name = "x"
peers = ["p1", "p2"]
kv.sync = false
[rpc]
threads = 8
)");
  ASSERT_TRUE(s.ok()) << s.toString();
  EXPECT_EQ(o.threads, 8u);
  EXPECT_EQ(o.offset, -7);
  EXPECT_FALSE(o.sync);
  EXPECT_DOUBLE_EQ(o.ratio, 2.0);
  EXPECT_EQ(o.name, "x");
  EXPECT_EQ(o.peers, (std::vector<std::string>{"p1", "p2"}));
}

TEST(Config, UnknownKeyIsRejectedNamingKeyAndFile) {
  Opts o;
  ConfigBinder b;
  o.bind(b);
  Status s = b.loadString("[rpc]\nthreadz = 3\n", "node.toml");
  EXPECT_EQ(s.code(), ErrorCode::kConfigInvalid);
  EXPECT_NE(s.message().find("node.toml"), std::string::npos) << s.toString();
  EXPECT_NE(s.message().find("rpc.threadz"), std::string::npos) << s.toString();
}

TEST(Config, WrongTypeIsRejectedAndNothingChanges) {
  Opts o;
  ConfigBinder b;
  o.bind(b);
  Status s = b.loadString("name = \"changed\"\n[rpc]\nthreads = \"eight\"\n", "f.toml");
  EXPECT_EQ(s.code(), ErrorCode::kConfigInvalid);
  EXPECT_NE(s.message().find("rpc.threads"), std::string::npos);
  EXPECT_NE(s.message().find("expected integer, got string"), std::string::npos) << s.toString();
  EXPECT_EQ(o.name, "default");  // all-or-nothing
}

TEST(Config, OutOfRangeAndNegativeUnsignedAreRejected) {
  Opts o;
  ConfigBinder b;
  o.bind(b);
  EXPECT_EQ(b.loadString("rpc.threads = -1").code(), ErrorCode::kConfigInvalid);
  EXPECT_EQ(b.loadString("rpc.threads = 5000000000").code(), ErrorCode::kConfigInvalid);
  EXPECT_EQ(b.loadString("peers = [1]").code(), ErrorCode::kConfigInvalid);
  EXPECT_EQ(o.threads, 0u);
}

TEST(Config, SyntaxErrorNamesFileAndLine) {
  Opts o;
  ConfigBinder b;
  o.bind(b);
  Status s = b.loadString("a = \n", "bad.toml");
  EXPECT_EQ(s.code(), ErrorCode::kConfigInvalid);
  EXPECT_NE(s.message().find("bad.toml:1"), std::string::npos) << s.toString();
}

// Regression: tests/fuzz/config_fuzz found toml++ 3.3 reaching
// __builtin_unreachable on code points such as U+FEBF, U+037B and U+2EBE.
TEST(Config, CodePointsTomlppMishandlesAreRejectedWithAnEscapeHint) {
  Opts o;
  ConfigBinder b;
  o.bind(b);
  for (const char* bad : {"name .\xef\xba\xbf = 1\n", "name = \"caf\xc3\xa9\"\n",
                          "\"\"\"'a.b \\\xef\xbb\x86\n", "# \xcd\xbb\n"}) {
    Status s = b.loadString(bad, "u.toml");
    EXPECT_EQ(s.code(), ErrorCode::kConfigInvalid) << bad;
    EXPECT_NE(s.message().find("u.toml:1: character U+"), std::string::npos) << s.toString();
  }
  // Other non-ASCII text, and escapes of the rejected characters, load fine.
  ASSERT_TRUE(
      b.loadString("name = \"\xe6\x97\xa5\xe6\x9c\xac caf\\u00E9\"  # \xe2\x82\xac\n").ok());
  EXPECT_EQ(o.name, "\xe6\x97\xa5\xe6\x9c\xac caf\xc3\xa9");
}

// The edges of the ranges toml++ 3.3 mishandles (every code point in them
// reaches its __builtin_unreachable; see config.cc), in a comment.
TEST(Config, TheRejectedRangesEndWhereTomlppStopsMishandling) {
  Opts o;
  ConfigBinder b;
  o.bind(b);
  struct Case {
    const char* utf8;
    bool rejected;
  };
  for (Case c : {Case{"\xc2\xa0", false},         // U+00A0
                 Case{"\xc2\xa1", true},          // U+00A1
                 Case{"\xd2\x99", true},          // U+0499
                 Case{"\xd2\x9a", false},         // U+049A
                 Case{"\xe2\xb1\x9d", false},     // U+2C5D
                 Case{"\xe2\xb1\x9e", true},      // U+2C5E
                 Case{"\xe2\xba\xbe", true},      // U+2EBE (the fuzzer's find)
                 Case{"\xe2\xbf\xbf", true},      // U+2FFF
                 Case{"\xe3\x80\x80", false},     // U+3000
                 Case{"\xe3\x80\x81", true},      // U+3001
                 Case{"\xe3\x81\x97", true},      // U+3057
                 Case{"\xe3\x81\x98", false},     // U+3058
                 Case{"\xef\xac\xa5", false},     // U+FB25
                 Case{"\xef\xac\xa6", true},      // U+FB26
                 Case{"\xef\xbb\xbe", true},      // U+FEFE
                 Case{"\xef\xbb\xbf", false}}) {  // U+FEFF
    Status s = b.loadString(std::string("# ") + c.utf8 + "\nname = \"x\"\n", "r.toml");
    EXPECT_EQ(!s.ok(), c.rejected) << s.toString();
    if (c.rejected) {
      EXPECT_EQ(s.code(), ErrorCode::kConfigInvalid);
    }
  }
}

TEST(Config, LoadFileAndMissingFile) {
  std::string path = ::testing::TempDir() + "/cistern_config_test.toml";
  {
    std::ofstream f(path);
    f << "name = \"fromfile\"\n";
  }
  Opts o;
  ConfigBinder b;
  o.bind(b);
  ASSERT_TRUE(b.loadFile(path).ok());
  EXPECT_EQ(o.name, "fromfile");
  std::remove(path.c_str());
  Status s = b.loadFile(path);
  EXPECT_EQ(s.code(), ErrorCode::kConfigInvalid);
  EXPECT_NE(s.message().find(path), std::string::npos);
}

TEST(Config, DescribeListsDefaultsAsParsableToml) {
  Opts o;
  ConfigBinder b;
  o.bind(b);
  std::string d = b.describe();
  EXPECT_NE(d.find("rpc.threads = 0  # I/O threads"), std::string::npos) << d;
  EXPECT_NE(d.find("name = \"default\""), std::string::npos) << d;
  // The description itself loads back without error.
  Opts o2;
  ConfigBinder b2;
  o2.bind(b2);
  EXPECT_TRUE(b2.loadString(d).ok()) << b2.loadString(d).toString();
}

}  // namespace
}  // namespace cistern
