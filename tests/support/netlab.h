// Test support: hosts in network namespaces, for tests of what crosses a
// network (partitions, capped links). The test process first moves into a
// network namespace of its own (enterPrivateNetwork(), in main() before any
// thread starts); that namespace routes between the hosts and holds the
// nftables rules and tbf qdiscs, so nothing of the machine's own network
// changes and all of it goes when the test ends.
//
// Host h (1-based) is a named namespace "cst<pid>h<h>" with one veth link to
// the test's namespace: 10.77.h.2 on the host's side, 10.77.h.1 on ours.
// Processes are started inside a host by setns() in the child before exec
// (enterHost()); the test's own calls reach every host by the routes.
#pragma once

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

namespace cistern::testing {

class NetLab {
 public:
  // Moves the calling thread (call it before any other thread exists) into
  // a new network namespace with loopback up and forwarding on. False with
  // the reason in *why (not root, no `ip` or `nft`).
  static bool enterPrivateNetwork(std::string* why) {
    if (::unshare(CLONE_NEWNET) != 0) {
      *why = std::string("unshare(CLONE_NEWNET): ") + std::strerror(errno) + " (run as root)";
      return false;
    }
    for (const char* cmd :
         {"ip link set lo up", "sysctl -qw net.ipv4.ip_forward=1", "nft add table inet lab",
          "nft add set inet lab cut '{ type ipv4_addr; }'",
          "nft add set inet lab isolated '{ type ipv4_addr; }'",
          "nft add chain inet lab forward "
          "'{ type filter hook forward priority 0; }'",
          "nft add rule inet lab forward ip saddr @cut drop",
          "nft add rule inet lab forward ip daddr @cut drop",
          "nft add chain inet lab input '{ type filter hook input priority 0; }'",
          "nft add rule inet lab input ip saddr @isolated drop",
          "nft add chain inet lab output "
          "'{ type filter hook output priority 0; }'",
          "nft add rule inet lab output ip daddr @isolated drop"}) {
      if (!run(cmd)) {
        *why = std::string("'") + cmd + "' failed";
        return false;
      }
    }
    return true;
  }

  // Creates `hosts` hosts; ok() tells whether all came up.
  explicit NetLab(int hosts) {
    removeStale();
    for (int h = 1; h <= hosts; ++h) {
      const std::string ns = netns(h), a = std::to_string(h);
      if (!run("ip netns add " + ns)) return;
      hosts_ = h;  // the destructor removes it
      if (!run("ip link add cv" + a + " type veth peer name eth0 netns " + ns) ||
          !run("ip addr add 10.77." + a + ".1/24 dev cv" + a) ||
          !run("ip link set cv" + a + " up") ||
          !run("ip -n " + ns + " addr add " + address(h) + "/24 dev eth0") ||
          !run("ip -n " + ns + " link set eth0 up") || !run("ip -n " + ns + " link set lo up") ||
          !run("ip -n " + ns + " route add default via 10.77." + a + ".1"))
        return;
    }
    ok_ = true;
  }
  ~NetLab() {
    // The link first: a namespace's devices go when the kernel frees it,
    // later; the next lab of this process reuses the names.
    for (int h = 1; h <= hosts_; ++h) {
      run("ip link del cv" + std::to_string(h), /*quiet=*/true);
      run("ip netns del " + netns(h));
    }
  }
  NetLab(const NetLab&) = delete;
  NetLab& operator=(const NetLab&) = delete;

  bool ok() const { return ok_; }
  int hosts() const { return hosts_; }
  static std::string address(int h) { return "10.77." + std::to_string(h) + ".2"; }
  static std::string netns(int h) {
    return "cst" + std::to_string(::getpid()) + "h" + std::to_string(h);
  }

  // Host h's packets to and from every other host are dropped; the test's
  // own namespace still reaches it (a client on the cut-off side).
  bool cut(int h) { return run("nft add element inet lab cut '{ " + address(h) + " }'"); }
  // Also from the test's own namespace: nobody reaches host h.
  bool isolate(int h) {
    return cut(h) && run("nft add element inet lab isolated '{ " + address(h) + " }'");
  }
  // Undoes cut() and isolate().
  bool heal(int h) {
    run("nft delete element inet lab isolated '{ " + address(h) + " }'", /*quiet=*/true);
    return run("nft delete element inet lab cut '{ " + address(h) + " }'");
  }
  // Caps host h's link at `bytes_per_s` each way (tbf on both veth ends).
  bool capLink(int h, uint64_t bytes_per_s) {
    const std::string rate = std::to_string(bytes_per_s * 8 / 1000) + "kbit";
    const std::string tbf = " root tbf rate " + rate + " burst 256kb latency 100ms";
    return run("tc qdisc replace dev cv" + std::to_string(h) + tbf) &&
           run("tc -n " + netns(h) + " qdisc replace dev eth0" + tbf);
  }

  // In a child after fork(): joins host h's namespace (false: it cannot).
  static bool enterHost(const std::string& netns_name) {
    int fd = ::open(("/run/netns/" + netns_name).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    bool ok = ::setns(fd, CLONE_NEWNET) == 0;
    ::close(fd);
    return ok;
  }

 private:
  static bool run(const std::string& cmd, bool quiet = false) {
    const std::string line = cmd + (quiet ? " >/dev/null 2>&1" : "");
    if (std::system(line.c_str()) == 0) return true;
    if (!quiet) std::fprintf(stderr, "netlab: '%s' failed\n", cmd.c_str());
    return false;
  }
  // Namespaces left by a test that died (its pid gone).
  static void removeStale() {
    std::error_code ec;
    for (const auto& e : std::filesystem::directory_iterator("/run/netns", ec)) {
      const std::string name = e.path().filename();
      if (name.rfind("cst", 0) != 0) continue;
      const pid_t pid = std::atoi(name.c_str() + 3);
      if (pid > 0 && ::kill(pid, 0) != 0 && errno == ESRCH) run("ip netns del " + name, true);
    }
  }

  int hosts_ = 0;
  bool ok_ = false;
};

}  // namespace cistern::testing
