// Test support: `cistern serve --role ROLE --config FILE` as a child process;
// start() waits for its "ready" line, then a thread keeps reading its output
// (a pipe nobody reads would stop a chatty process once it fills), keeping
// the last 256 KiB for log().
#pragma once

#include <cerrno>
#include <mutex>
#include <thread>

#include "tests/support/cluster_process.h"

namespace cistern::testing {

class ServeProcess {
 public:
  // `netns`: started in that network namespace (netlab.h; "": this one);
  // `metrics`: host:port of its /metrics (`cistern serve --metrics`; port 0:
  // a free one, metricsPort() tells which).
  ServeProcess(std::string bin, std::string role, std::string config, std::string netns = "",
               std::string metrics = "")
      : bin_(std::move(bin)),
        role_(std::move(role)),
        config_(std::move(config)),
        netns_(std::move(netns)),
        metrics_(std::move(metrics)) {}
  ~ServeProcess() { kill(SIGKILL); }

  bool start() {
    log_.clear();
    std::vector<std::string> args{bin_, "serve", "--role", role_, "--config", config_};
    if (!metrics_.empty()) args.insert(args.end(), {"--metrics", metrics_});
    pid_ = spawnPiped(std::move(args), &out_fd_,
                      /*stderr_too=*/true, /*die_with_us=*/true, netns_);
    if (pid_ < 0) return false;
    std::string first;
    if (readUntil(out_fd_, &first, "ready", std::chrono::seconds(30))) {
      if (size_t at = first.find("metrics http://"); at != std::string::npos) {
        const size_t colon = first.find(':', at + 15);
        if (colon != std::string::npos) metrics_port_ = std::atoi(first.c_str() + colon + 1);
      }
      log_ = std::move(first);
      drainer_ = std::thread([this] { drain(); });
      return true;
    }
    log_ = std::move(first);
    ADD_FAILURE() << "cistern serve --role " << role_ << " did not start; its output:\n" << log_;
    kill(SIGKILL);
    return false;
  }
  // Sends `sig` and waits for the process (SIGSTOP/SIGCONT: no wait).
  void kill(int sig) {
    if (pid_ <= 0) return;
    ::kill(pid_, sig);
    if (sig == SIGSTOP || sig == SIGCONT) return;
    int status = 0;
    waitpid(pid_, &status, 0);
    pid_ = -1;
    if (drainer_.joinable()) drainer_.join();  // the pipe's end: the process is gone
    if (out_fd_ >= 0) {
      close(out_fd_);
      out_fd_ = -1;
    }
  }
  std::string log() const {
    std::lock_guard lock(mu_);
    return log_;
  }
  pid_t pid() const { return pid_; }
  // The port of its /metrics, from its "ready" line (0: none).
  int metricsPort() const { return metrics_port_; }

 private:
  void drain() {
    char buf[4096];
    for (;;) {
      ssize_t n = read(out_fd_, buf, sizeof buf);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) return;
      std::lock_guard lock(mu_);
      log_.append(buf, static_cast<size_t>(n));
      constexpr size_t kKept = 256 << 10;
      if (log_.size() > 2 * kKept) log_.erase(0, log_.size() - kKept);
    }
  }

  std::string bin_, role_, config_, netns_, metrics_;
  pid_t pid_ = -1;
  int out_fd_ = -1;
  int metrics_port_ = 0;
  mutable std::mutex mu_;
  std::string log_;
  std::thread drainer_;
};

}  // namespace cistern::testing
