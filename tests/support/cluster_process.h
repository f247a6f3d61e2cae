// Test support: a `cistern up` child process on free loopback ports, and a
// helper that runs the `cistern` CLI and captures its output.
#pragma once

#include <fcntl.h>
#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "tests/support/netlab.h"

namespace cistern::testing {

struct CliResult {
  int exit_code = -1;
  std::string out, err;
};

// Runs `bin args...` with stdin from /dev/null; returns its exit code and output.
inline CliResult runProgram(const std::string& bin, const std::vector<std::string>& args,
                            const std::vector<std::string>& env = {}) {
  CliResult r;
  char out_tmpl[] = "/tmp/cistern-cli-out-XXXXXX";
  char err_tmpl[] = "/tmp/cistern-cli-err-XXXXXX";
  int out_fd = mkstemp(out_tmpl), err_fd = mkstemp(err_tmpl);
  pid_t pid = fork();
  if (pid == 0) {
    int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, STDIN_FILENO);
    dup2(out_fd, STDOUT_FILENO);
    dup2(err_fd, STDERR_FILENO);
    for (const auto& e : env) putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> argv{const_cast<char*>(bin.c_str())};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(bin.c_str(), argv.data());
    _exit(127);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  auto slurp = [](int fd) {
    std::string s;
    lseek(fd, 0, SEEK_SET);
    char buf[65536];
    ssize_t n;
    while ((n = read(fd, buf, sizeof buf)) > 0) s.append(buf, static_cast<size_t>(n));
    close(fd);
    return s;
  };
  r.out = slurp(out_fd);
  r.err = slurp(err_fd);
  unlink(out_tmpl);
  unlink(err_tmpl);
  return r;
}

// Starts `args` (args[0]: the program) with its stdout — and its stderr with
// `stderr_too` — into a pipe whose read end goes to `*out_fd`; `die_with_us`:
// the child is killed when this process dies; `netns`: it runs in that
// named network namespace (netlab.h). Returns the pid (-1: no pipe).
inline pid_t spawnPiped(std::vector<std::string> args, int* out_fd, bool stderr_too = false,
                        bool die_with_us = false, const std::string& netns = "") {
  int pipefd[2];
  if (pipe(pipefd) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    if (die_with_us) prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (!netns.empty() && !NetLab::enterHost(netns)) _exit(126);
    dup2(pipefd[1], STDOUT_FILENO);
    if (stderr_too) dup2(pipefd[1], STDERR_FILENO);
    close(pipefd[0]);
    close(pipefd[1]);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  close(pipefd[1]);
  *out_fd = pipefd[0];
  return pid;
}

// Appends what `fd` (a child's stdout) yields to `*log` until it contains
// `marker`, the stream ends or `timeout` passes; whether the marker came.
inline bool readUntil(int fd, std::string* log, std::string_view marker,
                      std::chrono::milliseconds timeout) {
  for (auto until = std::chrono::steady_clock::now() + timeout;
       log->find(marker) == std::string::npos && std::chrono::steady_clock::now() < until;) {
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    char buf[4096];
    ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) break;
    log->append(buf, static_cast<size_t>(n));
  }
  return log->find(marker) != std::string::npos;
}

// The cluster's chunk count, from `cistern status` ("..., N chunks, ...").
inline uint64_t clusterChunks(const std::string& bin, const std::string& cluster) {
  CliResult r = runProgram(bin, {"status", "--cluster", cluster});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  size_t at = r.out.find(" chunks,");
  EXPECT_NE(at, std::string::npos) << r.out;
  if (at == std::string::npos) return 0;
  size_t from = r.out.rfind(' ', at - 1) + 1;
  return std::stoull(r.out.substr(from, at - from));
}

// `cistern up` on 127.0.0.1 with free ports. start() waits for "ready".
class ClusterProcess {
 public:
  ClusterProcess(std::string bin, std::string data_dir, uint32_t targets)
      : bin_(std::move(bin)), data_(std::move(data_dir)), targets_(targets) {}
  ~ClusterProcess() { stop(); }

  // Also mounts at `mountpoint` (cistern up --mount) with these -o options;
  // start() then waits until the mount is up.
  void setMount(std::string mountpoint, std::string options = "") {
    mount_ = std::move(mountpoint);
    mount_options_ = std::move(options);
  }

  // From the next start(), commits are synced (no --no-sync): for tests of
  // what is durable when.
  void setSync(bool sync) { sync_ = sync; }

  // More arguments of `cistern up` for the next start(), e.g. {"--config", FILE}.
  void setExtraArgs(std::vector<std::string> args) { extra_args_ = std::move(args); }

  // Returns false (with a gtest failure) if it does not come up in 30 s.
  bool start() {
    log_.clear();
    std::vector<std::string> args{bin_,       "up",          "--data",    data_,
                                  "--listen", "127.0.0.1:0", "--targets", std::to_string(targets_)};
    if (!sync_) args.push_back("--no-sync");
    args.insert(args.end(), extra_args_.begin(), extra_args_.end());
    if (!mount_.empty()) {
      args.insert(args.end(), {"--mount", mount_});
      if (!mount_options_.empty()) args.insert(args.end(), {"-o", mount_options_});
    }
    pid_ = spawnPiped(std::move(args), &out_fd_);
    if (pid_ < 0) return false;
    if (readUntil(out_fd_, &log_, mount_.empty() ? "ready" : "mounted at",
                  std::chrono::seconds(30))) {
      cluster_ = field("cluster ", " ");
      std::string m = field("metrics http://", "/metrics");
      metrics_port_ = std::stoi(m.substr(m.rfind(':') + 1));
      return true;
    }
    ADD_FAILURE() << "cistern up did not start; its output:\n" << log_;
    stop();
    return false;
  }

  // SIGTERM, then waits; returns the exit status (0 = clean).
  int stop() {
    if (pid_ <= 0) return 0;
    kill(pid_, SIGTERM);
    int status = 0;
    for (int i = 0; i < 300; ++i) {
      if (waitpid(pid_, &status, WNOHANG) == pid_) {
        pid_ = -1;
        drain();
        return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    // What it was stuck in (its threads' stacks, while it still lives) and
    // what it said, for a hang seen once in make test.
    CliResult stacks = runProgram(
        "/usr/bin/timeout",
        {"20", "gdb", "-batch", "-p", std::to_string(pid_), "-ex", "thread apply all bt"});
    kill(pid_, SIGKILL);
    waitpid(pid_, &status, 0);
    pid_ = -1;
    drain();
    const size_t tail = log_.size() > 8000 ? log_.size() - 8000 : 0;
    ADD_FAILURE() << "cistern up did not stop within 30 s of SIGTERM; its threads:\n"
                  << stacks.out << stacks.err << "\nthe end of its output:\n"
                  << log_.substr(tail);
    return -1;
  }

  pid_t pid() const { return pid_; }
  const std::string& cluster() const { return cluster_; }
  int metricsPort() const { return metrics_port_; }
  const std::string& log() const { return log_; }

 private:
  std::string field(const std::string& after, const std::string& until) {
    size_t a = log_.find(after);
    if (a == std::string::npos) return "";
    a += after.size();
    return log_.substr(a, log_.find(until, a) - a);
  }
  void drain() {
    if (out_fd_ < 0) return;
    char buf[4096];
    ssize_t n;
    while ((n = read(out_fd_, buf, sizeof buf)) > 0) log_.append(buf, static_cast<size_t>(n));
    close(out_fd_);
    out_fd_ = -1;
  }

  std::string bin_, data_;
  uint32_t targets_;
  std::string mount_, mount_options_;
  std::vector<std::string> extra_args_;
  // Tests run without sync (fast, nothing here survives a power loss);
  // CISTERN_TEST_SYNC=1 syncs in every test's cluster, so that writes go
  // unsynced and fsync/close send Syncs (docs/client.md, "Durability").
  bool sync_ = std::getenv("CISTERN_TEST_SYNC") != nullptr;
  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::string log_, cluster_;
  int metrics_port_ = 0;
};

}  // namespace cistern::testing
