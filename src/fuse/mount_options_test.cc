// `cistern mount -o` text and the mount's config file keys: every option
// they document, and a clear error for anything else (the mount is then not
// attempted).
#include <gtest/gtest.h>

#include "common/config.h"
#include "fuse/mount_options.h"

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
  EXPECT_TRUE(o.devices);
  EXPECT_TRUE(o.setuid);
  ASSERT_TRUE(parseMountOptions("nodev,nosuid", &o).ok());
  EXPECT_FALSE(o.devices);
  EXPECT_FALSE(o.setuid);
  ASSERT_TRUE(parseMountOptions("dev,suid", &o).ok());
  EXPECT_TRUE(o.devices);
  EXPECT_TRUE(o.setuid);
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

// Loads `toml` into a fresh MountConfig and validates it, as
// `cistern mount --config` does.
Status loadAndValidate(const std::string& toml, MountConfig* out) {
  ConfigBinder b;
  out->bind(b);
  RETURN_ON_ERROR(b.loadString(toml, "mount.toml"));
  return out->validate();
}

TEST(MountConfig, TheDefaultsAreTheMountsOwnAndValid) {
  MountConfig c;
  EXPECT_TRUE(c.validate().ok());
  EXPECT_EQ(c.client.readahead_max_bytes, 4u << 20);
  EXPECT_EQ(c.client.write_behind_bytes, 4u << 20);
  EXPECT_EQ(c.client.uid, 0u);  // every request carries its caller's credentials
  EXPECT_EQ(c.timeout_ms, 10000u);
  // What `cistern config --defaults --mount` prints loads back unchanged.
  ConfigBinder b;
  c.bind(b);
  MountConfig again;
  ASSERT_TRUE(loadAndValidate(b.describe(), &again).ok()) << b.describe();
  EXPECT_EQ(again.client.shm_bytes, c.client.shm_bytes);
  EXPECT_DOUBLE_EQ(again.mount.attr_timeout_s, c.mount.attr_timeout_s);
}

TEST(MountConfig, AFileSetsEveryKeyAndTheClientGetsItsTimeouts) {
  MountConfig c;
  ASSERT_TRUE(loadAndValidate(R"(
    [mount]
    allow_other = true
    writeback = true
    attr_timeout = 2.5
    entry_timeout = 0
    negative_timeout = 30
    socket_calls = true
    buffered_files_max = 8
    max_idle_threads = 4
    timeout_ms = 2500
    [client]
    io_parallel_max = 3
    readahead_max_bytes = 1048576
    write_behind_bytes = 0
    shm_bytes = 0
    shm_readahead_windows = 2
    inline_max_bytes = 0
    session_renew_ms = 5000
  )",
                              &c)
                  .ok());
  EXPECT_TRUE(c.mount.allow_other);
  EXPECT_TRUE(c.mount.writeback_cache);
  EXPECT_DOUBLE_EQ(c.mount.attr_timeout_s, 2.5);
  EXPECT_DOUBLE_EQ(c.mount.entry_timeout_s, 0);
  EXPECT_DOUBLE_EQ(c.mount.negative_timeout_s, 30);
  EXPECT_EQ(c.mount.buffered_files_max, 8u);
  EXPECT_EQ(c.clientOptions("127.0.0.1:9").buffered_files_max, 8u);
  EXPECT_EQ(c.mount.max_idle_threads, 4u);
  Client::Options co = c.clientOptions("127.0.0.1:9");
  EXPECT_EQ(co.cluster, "127.0.0.1:9");
  EXPECT_EQ(co.retry_ms, 2500u);
  EXPECT_EQ(co.call_timeout_ms, 2500u);
  EXPECT_FALSE(co.local_calls);  // mount.socket_calls
  EXPECT_EQ(co.io_parallel_max, 3u);
  EXPECT_EQ(co.readahead_max_bytes, 1u << 20);
  EXPECT_EQ(co.write_behind_bytes, 0u);
  EXPECT_EQ(co.shm_bytes, 0u);
  EXPECT_EQ(co.shm_readahead_windows, 2u);
  EXPECT_EQ(co.inline_max_bytes, 0u);
  EXPECT_EQ(co.session_renew_ms, 5000u);
  // A short timeout still gives a call a second to answer.
  c.timeout_ms = 100;
  EXPECT_EQ(c.clientOptions("127.0.0.1:9").call_timeout_ms, 1000u);
}

TEST(MountConfig, OptionsOnTheCommandLineWinOverTheFile) {
  MountConfig c;
  ASSERT_TRUE(loadAndValidate("mount.attr_timeout = 9\nmount.negative_timeout = 7\n", &c).ok());
  ASSERT_TRUE(parseMountOptions("attr_timeout=2,writeback", &c.mount).ok());
  EXPECT_DOUBLE_EQ(c.mount.attr_timeout_s, 2);
  EXPECT_DOUBLE_EQ(c.mount.negative_timeout_s, 7);  // not on the command line: the file's
  EXPECT_TRUE(c.mount.writeback_cache);
}

TEST(MountConfig, ValuesThatCannotWorkAreRefusedNamingTheKey) {
  struct Case {
    const char* toml;
    const char* named;  // the error message names this
  };
  for (const Case& c : {
           Case{"client.io_parallel_max = 0", "client.io_parallel_max"},
           Case{"client.readahead_max_bytes = 4096", "client.readahead_max_bytes"},
           Case{"client.readahead_max_bytes = 1073741824", "client.readahead_max_bytes"},
           Case{"client.write_behind_bytes = 4294967296", "client.write_behind_bytes"},
           Case{"client.shm_bytes = 8589934592", "client.shm_bytes"},
           Case{"client.shm_readahead_windows = 1000", "client.shm_readahead_windows"},
           Case{"client.inline_max_bytes = 1048576", "client.inline_max_bytes"},
           Case{"client.session_renew_ms = 600000", "client.session_renew_ms"},
           Case{"client.io_parallel_max = -1", "client.io_parallel_max"},
           Case{"mount.attr_timeout = -1.0", "mount.attr_timeout"},
           Case{"mount.entry_timeout = 1e9", "mount.entry_timeout"},
           Case{"mount.negative_timeout = nan", "mount.negative_timeout"},
           Case{"mount.buffered_files_max = 0", "mount.buffered_files_max"},
           Case{"mount.max_idle_threads = 0", "mount.max_idle_threads"},
           Case{"mount.timeout_ms = 50", "mount.timeout_ms"},
           Case{"mount.writeback = 1", "mount.writeback"},
           Case{"mount.bogus = true", "mount.bogus"},
           // A server's key is not a mount's.
           Case{"storage.io_engine = \"psync\"", "storage.io_engine"},
           Case{"client.attr_cache_ms = 5", "client.attr_cache_ms"},
       }) {
    SCOPED_TRACE(c.toml);
    MountConfig m;
    Status s = loadAndValidate(c.toml, &m);
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find(c.named), std::string::npos) << s.toString();
  }
}

}  // namespace
}  // namespace cistern::fuse
