// The cluster dies under a mounted reader: the reader gets an error within
// the mount's timeout (no hung process), and the mount still unmounts cleanly.
#include <poll.h>
#include <sys/mount.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "tests/fuse/mount_env.h"
#include "tests/support/cluster_process.h"
#include "tests/support/http_get.h"

namespace cistern::testing {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int kTimeoutMs = 2000;  // cistern mount --timeout-ms
constexpr int kBoundMs = 15000;   // the timeout plus generous slack for a loaded machine

// Reads the file with O_DIRECT (every read reaches the mount) until a read
// fails; writes one byte to `progress` per good read; exits with the errno.
[[noreturn]] void reader(const std::string& path, int progress) {
  int fd = ::open(path.c_str(), O_RDONLY | O_DIRECT);
  if (fd < 0) _exit(200);
  void* buf = nullptr;
  if (posix_memalign(&buf, 4096, 1 << 20) != 0) _exit(201);
  for (uint64_t i = 0;; ++i) {
    ssize_t n = ::pread(fd, buf, 1 << 20, static_cast<off_t>((i % 4) << 20));
    if (n != 1 << 20) _exit(n < 0 ? errno : 202);
    if (::write(progress, "r", 1) != 1) _exit(203);
  }
}

TEST(KillServer, MountedReaderGetsAnErrorInBoundedTimeAndTheMountUnmounts) {
  char tmpl[] = "/tmp/cistern-fuse-kill-XXXXXX";
  ASSERT_NE(::mkdtemp(tmpl), nullptr);
  const std::string root = tmpl, mnt = root + "/mnt";
  ASSERT_EQ(::mkdir(mnt.c_str(), 0755), 0);
  // Whatever assertion ends the test, no mount, mount process or reader is
  // left behind (a failed run used to leave its mount in /tmp).
  pid_t mount_pid = -1, reader_pid = -1;
  struct Cleanup {
    const std::string& root;
    const std::string& mnt;
    pid_t& mount_pid;
    pid_t& reader_pid;
    ~Cleanup() {
      // The mount first: its death aborts any FUSE request a reader waits in.
      for (pid_t* pid : {&mount_pid, &reader_pid}) {
        if (*pid <= 0) continue;
        int st = 0;
        if (waitpid(*pid, &st, WNOHANG) == 0) {
          kill(*pid, SIGKILL);
          waitpid(*pid, &st, 0);
        }
      }
      if (mounted(mnt)) (void)::umount2(mnt.c_str(), MNT_DETACH);
      std::error_code ec;
      std::filesystem::remove_all(root, ec);
    }
  } cleanup{root, mnt, mount_pid, reader_pid};
  ClusterProcess server(CISTERN_BIN, root + "/data", 1);
  ASSERT_TRUE(server.start());

  // `cistern mount` as its own process.
  int out[2];
  ASSERT_EQ(pipe(out), 0);
  mount_pid = fork();
  if (mount_pid == 0) {
    dup2(out[1], STDOUT_FILENO);
    close(out[0]);
    execl(CISTERN_BIN, CISTERN_BIN, "mount", "--cluster", server.cluster().c_str(), "--timeout-ms",
          std::to_string(kTimeoutMs).c_str(), "--metrics-port", "0", mnt.c_str(), nullptr);
    _exit(127);
  }
  close(out[1]);
  std::string log;
  ASSERT_TRUE(readUntil(out[0], &log, "mounted at", std::chrono::seconds(30))) << log;

  const std::string file = mnt + "/data.bin";
  {
    std::string data(4 << 20, 'k');
    int fd = ::open(file.c_str(), O_CREAT | O_WRONLY, 0644);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::write(fd, data.data(), data.size()), static_cast<ssize_t>(data.size()));
    ASSERT_EQ(::close(fd), 0);
  }

  // The standalone mount serves its own /metrics.
  size_t at = log.find("metrics http://127.0.0.1:");
  ASSERT_NE(at, std::string::npos) << log;
  int metrics_port = std::stoi(log.substr(at + 25));
  EXPECT_NE(httpGet(metrics_port, "/metrics").find("fuse_requests_total{op=\"write\"}"),
            std::string::npos);

  int progress[2];
  ASSERT_EQ(pipe(progress), 0);
  reader_pid = fork();
  if (reader_pid == 0) {
    close(progress[0]);
    reader(file, progress[1]);
  }
  close(progress[1]);
  // Let it read a few MiB, then kill the whole cluster.
  char c;
  for (int i = 0; i < 5; ++i) ASSERT_EQ(read(progress[0], &c, 1), 1);
  auto killed = Clock::now();
  ASSERT_EQ(kill(server.pid(), SIGKILL), 0);
  (void)server.stop();

  int status = 0;
  bool exited = false;
  while (Clock::now() - killed < std::chrono::milliseconds(3 * kBoundMs)) {
    if (waitpid(reader_pid, &status, WNOHANG) == reader_pid) {
      exited = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  auto waited =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - killed).count();
  if (!exited) {
    kill(reader_pid, SIGKILL);
    waitpid(reader_pid, &status, 0);
  }
  reader_pid = -1;  // reaped
  ASSERT_TRUE(exited) << "the reader still hangs " << waited << " ms after the kill";
  EXPECT_LT(waited, kBoundMs);
  ASSERT_TRUE(WIFEXITED(status));
  int err = WEXITSTATUS(status);
  EXPECT_TRUE(err == EIO || err == ENOTCONN || err == ECONNRESET || err == ETIMEDOUT ||
              err == ECONNREFUSED)
      << "reader ended with " << err << " (" << std::strerror(err) << ")";

  // Metadata calls fail in bounded time too.
  auto t0 = Clock::now();
  struct stat st;
  EXPECT_NE(::stat((mnt + "/other").c_str(), &st), 0);
  EXPECT_LT(std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count(),
            kBoundMs);

  // And the mount goes away cleanly on SIGTERM.
  ASSERT_EQ(kill(mount_pid, SIGTERM), 0);
  exited = false;
  for (auto until = Clock::now() + std::chrono::milliseconds(kBoundMs); Clock::now() < until;) {
    if (waitpid(mount_pid, &status, WNOHANG) == mount_pid) {
      exited = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  if (!exited) {
    kill(mount_pid, SIGKILL);
    waitpid(mount_pid, &status, 0);
    ::umount2(mnt.c_str(), MNT_DETACH);
  }
  mount_pid = -1;  // reaped
  EXPECT_TRUE(exited) << "cistern mount did not exit after SIGTERM";
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << status;
  EXPECT_FALSE(mounted(mnt));
  close(progress[0]);
  close(out[0]);
}

}  // namespace
}  // namespace cistern::testing

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
