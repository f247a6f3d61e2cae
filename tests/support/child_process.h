// Test support: runs a helper program as a child process, kills it with
// SIGKILL after a while, and returns everything it wrote to stdout. Used by
// the crash tests that check what survives a process dying mid-write.
#pragma once

#include <gtest/gtest.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

namespace cistern::testing {

// Starts `path args...`, sleeps `run_ms`, kills it with SIGKILL and returns its
// stdout. Fails the test if the child exited on its own (it should run until killed).
// `after_first_output`: the `run_ms` start when the child first writes to
// stdout (waiting up to 30 s for it), so that a slow start — a sanitizer
// build, a busy machine — does not leave a round without any output.
inline std::string runAndKill(const std::string& path, const std::vector<std::string>& args,
                              int run_ms, bool after_first_output = false) {
  int pipefd[2];
  EXPECT_EQ(pipe(pipefd), 0);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(pipefd[1], STDOUT_FILENO);
    close(pipefd[0]);
    close(pipefd[1]);
    std::vector<char*> argv{const_cast<char*>(path.c_str())};
    for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execv(path.c_str(), argv.data());
    _exit(127);
  }
  close(pipefd[1]);
  if (after_first_output) {
    pollfd p{pipefd[0], POLLIN, 0};
    EXPECT_EQ(poll(&p, 1, 30'000), 1) << path << " wrote nothing in 30 s";
  }
  usleep(static_cast<useconds_t>(run_ms) * 1000);
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status)) << path << " exited early with status " << status;
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(pipefd[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  close(pipefd[0]);
  return out;
}

// The complete lines of `out` (a partial last line was cut by the kill: not an acknowledgement).
inline std::vector<std::string> completeLines(const std::string& out) {
  std::vector<std::string> lines;
  size_t pos = 0;
  while (true) {
    size_t nl = out.find('\n', pos);
    if (nl == std::string::npos) return lines;
    lines.push_back(out.substr(pos, nl - pos));
    pos = nl + 1;
  }
}

}  // namespace cistern::testing
