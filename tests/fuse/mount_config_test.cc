// `cistern mount --config FILE` and `cistern up --mount --config FILE`: the
// file's mount.* and client.* keys reach the mount, and a file that cannot
// work stops the command, with a message naming the key, before it mounts.
#include <sys/mount.h>

#include <filesystem>
#include <fstream>

#include "tests/fuse/mount_env.h"
#include "tests/support/cluster_process.h"

namespace cistern::testing {
namespace {

// A directory for one test; on the way out no mount is left in it.
struct TestRoot {
  std::string root, mnt;
  TestRoot() {
    char tmpl[] = "/tmp/cistern-fuse-config-XXXXXX";
    EXPECT_NE(::mkdtemp(tmpl), nullptr);
    root = tmpl;
    EXPECT_EQ(::chmod(root.c_str(), 0755), 0);  // the other user passes through
    mnt = root + "/mnt";
    EXPECT_EQ(::mkdir(mnt.c_str(), 0755), 0);
  }
  ~TestRoot() {
    if (mounted(mnt)) (void)::umount2(mnt.c_str(), MNT_DETACH);
    std::error_code ec;
    std::filesystem::remove_all(root, ec);
  }
  std::string file(const std::string& name, const std::string& text) const {
    std::string path = root + "/" + name;
    std::ofstream(path) << text;
    return path;
  }
};

// `cistern mount ARGS... MNT` as a child process until stop().
class MountProcess {
 public:
  ~MountProcess() {
    if (pid_ > 0) {
      kill(pid_, SIGKILL);
      waitpid(pid_, nullptr, 0);
    }
    if (out_ >= 0) close(out_);
  }
  // Waits up to 30 s for "mounted at"; false (with the output) if not.
  bool start(const std::string& cluster, std::vector<std::string> args, const std::string& mnt) {
    int out[2];
    if (pipe(out) != 0) return false;
    pid_ = fork();
    if (pid_ == 0) {
      dup2(out[1], STDOUT_FILENO);
      dup2(out[1], STDERR_FILENO);
      close(out[0]);
      std::vector<std::string> all{CISTERN_BIN, "mount", "--cluster", cluster};
      all.insert(all.end(), args.begin(), args.end());
      all.push_back(mnt);
      std::vector<char*> argv;
      for (auto& a : all) argv.push_back(a.data());
      argv.push_back(nullptr);
      execv(CISTERN_BIN, argv.data());
      _exit(127);
    }
    close(out[1]);
    out_ = out[0];  // open until stop(): the mount still writes when it stops
    bool up = readUntil(out_, &log_, "mounted at", std::chrono::seconds(30));
    EXPECT_TRUE(up) << log_;
    return up;
  }
  // SIGTERM (a clean unmount); the exit status.
  int stop() {
    if (pid_ <= 0) return -1;
    kill(pid_, SIGTERM);
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    char b[512];
    for (ssize_t n; (n = read(out_, b, sizeof b)) > 0;) log_.append(b, static_cast<size_t>(n));
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  }
  const std::string& log() const { return log_; }

 private:
  pid_t pid_ = -1;
  int out_ = -1;
  std::string log_;
};

uint64_t chunks(const std::string& cluster) { return clusterChunks(CISTERN_BIN, cluster); }

// 0 when another user may stat `path`, else the errno.
int statAsOther(const std::string& path) {
  return asUser(kUser, kUserGroup, [&] {
    struct stat st;
    return errnoOf(::stat(path.c_str(), &st));
  });
}

// mount.allow_other and client.inline_max_bytes are seen from outside the
// mount: another user's stat, and whether a small file takes a chunk.
constexpr const char* kConfig =
    "log.level = \"warn\"\n"
    "[mount]\nallow_other = true\ntimeout_ms = 3000\n"
    "[client]\ninline_max_bytes = 0\n";

TEST(MountConfigFile, CisternMountTakesTheMountsAndTheClientsOptionsFromIt) {
  TestRoot t;
  ClusterProcess server(CISTERN_BIN, t.root + "/data", 1);
  ASSERT_TRUE(server.start());
  const std::string config = t.file("mount.toml", kConfig);
  const std::string small(100, 's');

  const uint64_t before = chunks(server.cluster());
  {
    MountProcess m;
    ASSERT_TRUE(m.start(server.cluster(), {"--config", config}, t.mnt));
    ASSERT_TRUE(writeFile(t.mnt + "/configured", small));
    EXPECT_EQ(readFile(t.mnt + "/configured"), small);
    EXPECT_EQ(statAsOther(t.mnt + "/configured"), 0);  // allow_other
    EXPECT_EQ(chunks(server.cluster()), before + 1);   // not inline: in a chunk
    EXPECT_EQ(m.stop(), 0) << m.log();
    EXPECT_FALSE(mounted(t.mnt));
  }
  {
    // The same mount without the file: the defaults.
    MountProcess m;
    ASSERT_TRUE(m.start(server.cluster(), {}, t.mnt));
    ASSERT_TRUE(writeFile(t.mnt + "/plain", small));
    EXPECT_EQ(readFile(t.mnt + "/configured"), small);
    EXPECT_EQ(statAsOther(t.mnt + "/plain"), EACCES);  // only the mounting user
    EXPECT_EQ(chunks(server.cluster()), before + 1);   // inline: no new chunk
    EXPECT_EQ(m.stop(), 0) << m.log();
  }
}

TEST(MountConfigFile, CisternUpMountTakesItsMountKeysFromTheSameFile) {
  TestRoot t;
  const std::string config =
      t.file("up.toml", std::string(kConfig) + "[storage]\nio_engine = \"psync\"\n");
  ClusterProcess up(CISTERN_BIN, t.root + "/data", 1);
  up.setMount(t.mnt);
  up.setExtraArgs({"--config", config});
  ASSERT_TRUE(up.start());
  const uint64_t before = chunks(up.cluster());
  ASSERT_TRUE(writeFile(t.mnt + "/f", "up"));
  EXPECT_EQ(readFile(t.mnt + "/f"), "up");
  EXPECT_EQ(statAsOther(t.mnt + "/f"), 0);
  EXPECT_EQ(chunks(up.cluster()), before + 1);
  EXPECT_EQ(up.stop(), 0) << up.log();
}

TEST(MountConfigFile, AFileThatCannotWorkStopsCisternMountBeforeItMounts) {
  TestRoot t;
  ClusterProcess server(CISTERN_BIN, t.root + "/data", 1);
  ASSERT_TRUE(server.start());
  struct Case {
    std::string toml;   // empty: no such file
    std::string named;  // the message names this
  };
  std::vector<Case> cases = {
      {"", "no-such.toml"},
      {"client.io_parallel_max = 0\n", "client.io_parallel_max"},
      {"client.readahead_max_bytes = 1073741824\n", "client.readahead_max_bytes"},
      {"mount.attr_timeout = -1.0\n", "mount.attr_timeout"},
      {"mount.timeout_ms = 5\n", "mount.timeout_ms"},
      {"mount.allow_other = \"yes\"\n", "mount.allow_other"},
      {"storage.io_engine = \"psync\"\n", "storage.io_engine"},  // a server's key
      {"[mount\nallow_other = true\n", "mount.toml"},
      {"log.level = \"loud\"\n", "loud"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.toml);
    std::string path = c.toml.empty() ? t.root + "/no-such.toml" : t.file("mount.toml", c.toml);
    CliResult r =
        runProgram(CISTERN_BIN, {"mount", "--cluster", server.cluster(), "--config", path, t.mnt});
    EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
    EXPECT_NE(r.err.find(c.named), std::string::npos) << r.err;
    EXPECT_EQ(r.out.find("mounted at"), std::string::npos) << r.out;
    EXPECT_FALSE(mounted(t.mnt));
    // `cistern config --check --mount` finds the same.
    CliResult check = runProgram(CISTERN_BIN, {"config", "--mount", "--check", path});
    EXPECT_EQ(check.exit_code, 1) << check.out;
    EXPECT_NE(check.err.find(c.named), std::string::npos) << check.err;
  }
  // --timeout-ms on the command line is held to the same bounds.
  CliResult r =
      runProgram(CISTERN_BIN, {"mount", "--cluster", server.cluster(), "--timeout-ms", "5", t.mnt});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("timeout"), std::string::npos) << r.err;
  EXPECT_FALSE(mounted(t.mnt));
  // What `cistern config --defaults --mount` prints is itself a valid file.
  CliResult defaults = runProgram(CISTERN_BIN, {"config", "--defaults", "--mount"});
  ASSERT_EQ(defaults.exit_code, 0);
  EXPECT_NE(defaults.out.find("mount.allow_other = false"), std::string::npos) << defaults.out;
  EXPECT_EQ(defaults.out.find("storage."), std::string::npos) << defaults.out;
  std::string path = t.file("defaults.toml", defaults.out);
  CliResult check = runProgram(CISTERN_BIN, {"config", "--mount", "--check", path});
  EXPECT_EQ(check.exit_code, 0) << check.err;
}

}  // namespace
}  // namespace cistern::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
