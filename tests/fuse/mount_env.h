// Test support for the FUSE tests: one `cistern up --mount` child for the
// whole test binary (a gtest Environment), a fresh directory per test, and
// helpers to run a step as an unprivileged user in a child process.
#pragma once

#include <fcntl.h>
#include <grp.h>
#include <gtest/gtest.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <functional>
#include <string>

#include "tests/support/cluster_process.h"

namespace cistern::testing {

class MountEnv : public ::testing::Environment {
 public:
  // allow_other: the permission cases run as other users.
  // $CISTERN_FUSE_OPTIONS replaces the options (e.g. "allow_other,writeback").
  explicit MountEnv(std::string options = "allow_other") : options_(std::move(options)) {
    if (const char* env = std::getenv("CISTERN_FUSE_OPTIONS"); env && *env) options_ = env;
  }

  void SetUp() override {
    char tmpl[] = "/tmp/cistern-fuse-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    root_ = tmpl;
    ASSERT_EQ(::chmod(root_.c_str(), 0755), 0);  // unprivileged test users pass through
    mnt_ = root_ + "/mnt";
    ASSERT_EQ(::mkdir(mnt_.c_str(), 0755), 0);
    cluster_ = std::make_unique<ClusterProcess>(CISTERN_BIN, root_ + "/data", 2);
    cluster_->setMount(mnt_, options_);
    ASSERT_TRUE(cluster_->start());
    instance_ = this;
  }

  void TearDown() override {
    if (cluster_) {
      int rc = cluster_->stop();
      EXPECT_EQ(rc, 0) << "cistern up --mount did not stop cleanly:\n" << cluster_->log();
    }
    // A crashed mount leaves its mount point behind ("Transport endpoint is
    // not connected"): detach it so the next run and rm -rf are not stuck.
    (void)::umount2(mnt_.c_str(), MNT_DETACH);
    std::string cmd = "rm -rf " + root_;
    (void)std::system(cmd.c_str());
  }

  static MountEnv& get() { return *instance_; }
  const std::string& mnt() const { return mnt_; }
  const std::string& options() const { return options_; }
  ClusterProcess& cluster() { return *cluster_; }

 private:
  std::string options_, root_, mnt_;
  std::unique_ptr<ClusterProcess> cluster_;
  static inline MountEnv* instance_ = nullptr;
};

// A fresh directory on the mount (mode 0777) named after the running test.
inline std::string testDir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  std::string name = std::string(info->test_suite_name()) + "." + info->name();
  for (char& c : name)
    if (c == '/') c = '_';
  std::string dir = MountEnv::get().mnt() + "/" + name;
  EXPECT_EQ(::mkdir(dir.c_str(), 0777), 0) << dir << ": " << std::strerror(errno);
  EXPECT_EQ(::chmod(dir.c_str(), 0777), 0);
  return dir;
}

// Whether /proc/mounts lists a mount at `mnt`.
inline bool mounted(const std::string& mnt) {
  std::ifstream in("/proc/mounts");
  std::string line;
  while (std::getline(in, line))
    if (line.find(" " + mnt + " ") != std::string::npos) return true;
  return false;
}

inline constexpr uid_t kUser = 1000;
inline constexpr gid_t kUserGroup = 1000;
inline constexpr uid_t kOther = 1001;
inline constexpr gid_t kOtherGroup = 1001;

// Runs `step` in a child process with the given uid/gid (no supplementary
// groups but `extra_group` when set); returns what `step` returned: 0 or an errno.
inline int asUser(uid_t uid, gid_t gid, const std::function<int()>& step, gid_t extra_group = 0) {
  pid_t pid = fork();
  if (pid == 0) {
    gid_t groups[1] = {extra_group};
    if (setgroups(extra_group ? 1 : 0, groups) != 0 || setgid(gid) != 0 || setuid(uid) != 0)
      _exit(250);
    _exit(step() & 0xff);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 255;
}

// 0 when `rc` is not -1, else errno: for steps in asUser.
inline int errnoOf(long rc) { return rc == -1 ? errno : 0; }

inline bool writeFile(const std::string& path, const std::string& data, mode_t mode = 0644) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, mode);
  if (fd < 0) return false;
  bool ok = ::write(fd, data.data(), data.size()) == static_cast<ssize_t>(data.size());
  return ::close(fd) == 0 && ok;
}

inline std::string readFile(const std::string& path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) return "<" + std::string(std::strerror(errno)) + ">";
  std::string out;
  char buf[65536];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

}  // namespace cistern::testing

// main() of a FUSE test binary: one mount for all its tests.
#define CISTERN_FUSE_TEST_MAIN()                                           \
  int main(int argc, char** argv) {                                        \
    ::testing::InitGoogleTest(&argc, argv);                                \
    ::testing::AddGlobalTestEnvironment(new cistern::testing::MountEnv()); \
    return RUN_ALL_TESTS();                                                \
  }

// The call fails with exactly this errno.
#define EXPECT_ERRNO(expr, err)                                                       \
  do {                                                                                \
    errno = 0;                                                                        \
    long rc_ = static_cast<long>(expr);                                               \
    int saved_ = errno;                                                               \
    EXPECT_EQ(rc_, -1) << #expr;                                                      \
    EXPECT_EQ(saved_, err) << #expr << ": got " << std::strerror(saved_) << ", want " \
                           << std::strerror(err);                                     \
  } while (0)

#define EXPECT_OK(expr)                                          \
  do {                                                           \
    errno = 0;                                                   \
    long rc_ = static_cast<long>(expr);                          \
    EXPECT_NE(rc_, -1) << #expr << ": " << std::strerror(errno); \
  } while (0)

#define ASSERT_OK(expr)                                          \
  do {                                                           \
    errno = 0;                                                   \
    long rc_ = static_cast<long>(expr);                          \
    ASSERT_NE(rc_, -1) << #expr << ": " << std::strerror(errno); \
  } while (0)
