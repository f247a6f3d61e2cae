// Test support: `cistern serve --role ROLE --config FILE` as a child process;
// start() waits for its "ready" line.
#pragma once

#include "tests/support/cluster_process.h"

namespace cistern::testing {

class ServeProcess {
 public:
  ServeProcess(std::string bin, std::string role, std::string config)
      : bin_(std::move(bin)), role_(std::move(role)), config_(std::move(config)) {}
  ~ServeProcess() { kill(SIGKILL); }

  bool start() {
    log_.clear();
    pid_ = spawnPiped({bin_, "serve", "--role", role_, "--config", config_}, &out_fd_,
                      /*stderr_too=*/true, /*die_with_us=*/true);
    if (pid_ < 0) return false;
    if (readUntil(out_fd_, &log_, "ready", std::chrono::seconds(30))) return true;
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
    if (out_fd_ >= 0) {
      close(out_fd_);
      out_fd_ = -1;
    }
  }
  const std::string& log() const { return log_; }
  pid_t pid() const { return pid_; }

 private:
  std::string bin_, role_, config_;
  pid_t pid_ = -1;
  int out_fd_ = -1;
  std::string log_;
};

}  // namespace cistern::testing
