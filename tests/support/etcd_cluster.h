// Test support: a real etcd cluster (Debian's etcd-server) of `members`
// processes on 127.0.0.1, on free ports, with data under a directory of
// its own; members can be killed and restarted. Everything is stopped (and
// its data removed) on destruction.
#pragma once

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "kv/etcd_client.h"
#include "tests/support/netlab.h"

namespace cistern::testing {

// A port that was free a moment ago (bound to port 0, then closed).
inline int freeLoopbackPort() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  int port = 0;
  if (::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
    socklen_t len = sizeof a;
    ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  ::close(fd);
  return port;
}

class EtcdCluster {
 public:
  // Where a member runs: its address and network namespace (netlab.h).
  struct Host {
    std::string address;
    std::string netns;
  };

  // Starts the members and waits until the cluster answers; a start that
  // does not come up in 15 s (a port taken meanwhile by another process's
  // connection) is tried again on other ports, three times in all. Null
  // when etcd cannot be started (the reason on stderr). With `hosts` (one
  // per member), member i runs in hosts[i] on the usual ports 2379/2380.
  static std::unique_ptr<EtcdCluster> start(const std::string& dir, int members = 3,
                                            const std::vector<Host>& hosts = {}) {
    for (int attempt = 0; attempt < 3; ++attempt) {
      std::unique_ptr<EtcdCluster> c(new EtcdCluster);
      c->dir_ = dir;
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
      std::filesystem::create_directories(dir);
      std::set<int> ports;
      while (hosts.empty() && ports.size() < static_cast<size_t>(2 * members))
        ports.insert(freeLoopbackPort());
      auto next = ports.begin();
      for (int i = 0; i < members; ++i) {
        Member m;
        m.name = "m" + std::to_string(i);
        if (hosts.empty()) {
          m.client_port = *next++;
          m.peer_port = *next++;
        } else {
          m.address = hosts[static_cast<size_t>(i)].address;
          m.netns = hosts[static_cast<size_t>(i)].netns;
          m.client_port = 2379;
          m.peer_port = 2380;
        }
        c->members_.push_back(m);
      }
      for (size_t i = 0; i < c->members_.size(); ++i) {
        if (i > 0) c->initial_cluster_ += ",";
        c->initial_cluster_ += c->members_[i].name + "=http://" + c->members_[i].address + ":" +
                               std::to_string(c->members_[i].peer_port);
      }
      for (size_t i = 0; i < c->members_.size(); ++i) c->spawn(i, /*existing=*/false);
      if (c->waitHealthy(std::chrono::seconds(15))) return c;
      fprintf(stderr, "etcd cluster did not come up (attempt %d); trying other ports\n",
              attempt + 1);
    }
    return nullptr;
  }

  ~EtcdCluster() {
    for (size_t i = 0; i < members_.size(); ++i) kill(i);
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }

  std::vector<std::string> endpoints() const {
    std::vector<std::string> out;
    for (size_t i = 0; i < members_.size(); ++i) out.push_back(endpoint(i));
    return out;
  }
  size_t size() const { return members_.size(); }

  // SIGKILL of member `i` (no-op if it is not running).
  void kill(size_t i) {
    Member& m = members_[i];
    if (m.pid <= 0) return;
    ::kill(m.pid, SIGKILL);
    int status = 0;
    ::waitpid(m.pid, &status, 0);
    m.pid = 0;
  }
  // SIGSTOP / SIGCONT of member `i`: it holds its connections and answers nothing.
  // pause() returns once the member is stopped (its /proc state is 'T').
  void pause(size_t i) {
    ::kill(members_[i].pid, SIGSTOP);
    const std::string stat = "/proc/" + std::to_string(members_[i].pid) + "/stat";
    for (int tries = 0; tries < 1000; ++tries) {
      std::string text;
      if (FILE* f = fopen(stat.c_str(), "r")) {
        char buf[512];
        size_t n = fread(buf, 1, sizeof buf, f);
        text.assign(buf, n);
        fclose(f);
      }
      // "pid (comm) S ...": the state follows the last ')'.
      size_t close = text.rfind(')');
      if (close != std::string::npos && close + 2 < text.size() && text[close + 2] == 'T') return;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
  void resume(size_t i) { ::kill(members_[i].pid, SIGCONT); }
  std::string endpoint(size_t i) const {
    return members_[i].address + ":" + std::to_string(members_[i].client_port);
  }
  // Starts member `i` again on its data (it rejoins the cluster).
  void restart(size_t i) {
    kill(i);
    spawn(i, /*existing=*/true);
  }
  // Waits until a read through every running member's endpoint succeeds.
  bool waitHealthy(std::chrono::seconds budget) {
    auto deadline = std::chrono::steady_clock::now() + budget;
    for (size_t i = 0; i < members_.size(); ++i) {
      const Member& m = members_[i];
      if (m.pid <= 0) continue;
      kv::etcd::Client::Options o;
      o.endpoints = {endpoint(i)};
      o.timeout_ms = 1000;
      auto client = kv::etcd::Client::create(o);
      if (!client.ok()) return false;
      kv::etcd::RangeRequest r;
      r.key = "health";
      while (!(*client)->range(r).ok()) {
        if (std::chrono::steady_clock::now() > deadline) {
          fprintf(stderr, "etcd member %s did not answer in time; its log: %s\n", m.name.c_str(),
                  logOf(m).c_str());
          return false;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
    return true;
  }

 private:
  struct Member {
    std::string name;
    std::string address = "127.0.0.1";
    std::string netns;  // "": the test's own
    int client_port = 0;
    int peer_port = 0;
    pid_t pid = 0;
  };
  EtcdCluster() = default;

  std::string logOf(const Member& m) const {
    std::string path = dir_ + "/" + m.name + ".log", out;
    if (FILE* f = fopen(path.c_str(), "r")) {
      char buf[4096];
      size_t n;
      while ((n = fread(buf, 1, sizeof buf, f)) > 0) out.append(buf, n);
      fclose(f);
    }
    return out.size() > 4000 ? out.substr(out.size() - 4000) : out;
  }

  void spawn(size_t i, bool existing) {
    Member& m = members_[i];
    const std::string client = "http://" + m.address + ":" + std::to_string(m.client_port);
    const std::string peer = "http://" + m.address + ":" + std::to_string(m.peer_port);
    std::vector<std::string> args = {
        "etcd",
        "--name",
        m.name,
        "--data-dir",
        dir_ + "/" + m.name,
        "--listen-client-urls",
        client,
        "--advertise-client-urls",
        client,
        "--listen-peer-urls",
        peer,
        "--initial-advertise-peer-urls",
        peer,
        "--initial-cluster",
        initial_cluster_,
        "--initial-cluster-state",
        existing ? "existing" : "new",
        "--initial-cluster-token",
        "cistern-test",
        // Tests run many members on two cores: elections that tolerate it.
        "--heartbeat-interval",
        "100",
        "--election-timeout",
        "1000",
        "--log-level",
        "warn",
    };
    const std::string log = dir_ + "/" + m.name + ".log";
    pid_t pid = ::fork();
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the test
      if (!m.netns.empty() && !NetLab::enterHost(m.netns)) _exit(126);
      int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
      if (fd >= 0) {
        ::dup2(fd, STDOUT_FILENO);
        ::dup2(fd, STDERR_FILENO);
      }
      std::vector<char*> argv;
      for (auto& a : args) argv.push_back(a.data());
      argv.push_back(nullptr);
      ::execvp("etcd", argv.data());
      _exit(127);
    }
    m.pid = pid;
  }

  std::string dir_;
  std::string initial_cluster_;
  std::vector<Member> members_;
};

}  // namespace cistern::testing
