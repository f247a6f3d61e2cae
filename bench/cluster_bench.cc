// bench/run cluster [MIB] — a cluster of real processes on this machine
// (tests/cluster/cluster_harness.h: 3 etcd, 2 mgmtd, 2 meta, 4 storage
// servers, heartbeat timeout 1.5 s) through a storage server's death and
// return, and its replication's write cost. Three rounds; each round:
//
//   1. one file of MIB (256) MiB written sequentially (8 MiB writes, then
//      close) on a replication-3 cluster and on a replication-1 cluster
//      started beside it, alternating which goes first;
//   2. a writer (4 MiB writes) and a reader (1 MiB reads) run on the
//      replication-3 cluster; a storage process is SIGKILLed: the time until
//      mgmtd's routing no longer routes to it, and the longest call of
//      either client across it;
//   3. while it is down another MIB MiB file is written; it restarts: the
//      bytes its target gained over the time from the first of its chains
//      streaming to it (SYNCING) until every chain serves on all three
//      replicas again, against fio writing as many bytes sequentially
//      (O_DIRECT, 1 MiB) into the same file system.
//
// Figures (medians of the rounds; each round's values in `rounds` lines):
//   cluster_failover_s, cluster_stall_s, cluster_resync_vs_disk (x),
//   cluster_rf3_write_vs_rf1 (x; all replicas share one disk here, so 1/3
//   is the physical limit), and the MB/s behind the ratios; then the peak
//   RSS of the cistern processes.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <fstream>
#include <optional>

#include "bench/bench_util.h"
#include "common/log.h"
#include "common/metrics.h"
#include "tests/cluster/cluster_harness.h"

using namespace cistern;
using cistern::testing::ClusterHarness;

namespace {

using Clock = std::chrono::steady_clock;
using metrics::median;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "cluster bench: %s\n", what.c_str());
  std::exit(1);
}

// MB/s of writing `mib` MiB to `path` (8 MiB writes, then close).
double seqWrite(Client& c, const std::string& path, uint64_t mib) {
  static const auto buf = cistern::testing::patternBytes(8 << 20, 5);
  std::unique_ptr<File> f;
  if (Error e = c.open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644, &f)) die(path + ": " + e.message);
  const auto t0 = Clock::now();
  for (uint64_t at = 0; at < (mib << 20); at += buf.size()) {
    size_t done = 0;
    if (Error e = f->pwrite(buf.data(), buf.size(), at, &done)) die(path + ": " + e.message);
  }
  if (Error e = f->close()) die(path + ": close: " + e.message);
  return static_cast<double>(mib << 20) / 1e6 / bench::secondsSince(t0);
}

// A writer and a reader on `c`, recording their longest call that was in
// flight at `mark` or started after it.
class Load {
 public:
  explicit Load(Client& c) : c_(c) {
    (void)c_.mkdir("/load", 0755, true);
    seqWrite(c_, "/load/read", 64);
    threads_.emplace_back([this] { run(true); });
    threads_.emplace_back([this] { run(false); });
  }
  ~Load() { stop(); }
  void mark() { mark_ns_ = Clock::now().time_since_epoch().count(); }
  void stop() {
    stop_ = true;
    for (auto& t : threads_)
      if (t.joinable()) t.join();
  }
  double longestS() const { return static_cast<double>(longest_ns_) / 1e9; }
  int errors() const { return errors_; }

 private:
  void run(bool write) {
    static const auto buf = cistern::testing::patternBytes(4 << 20, 9);
    std::vector<uint8_t> in(1 << 20);
    std::unique_ptr<File> f;
    Error e = write ? c_.open("/load/write", O_CREAT | O_WRONLY | O_TRUNC, 0644, &f)
                    : c_.open("/load/read", O_RDONLY, 0, &f);
    if (e) die("load: " + e.message);
    for (uint64_t i = 0; !stop_; ++i) {
      const auto t0 = Clock::now();
      size_t done = 0;
      if (write) {
        e = f->pwrite(buf.data(), buf.size(), (i % 64) * buf.size(), &done);
        if (!e) e = f->fsync();
      } else {
        e = f->pread(in.data(), in.size(), (i % 64) << 20, &done);
      }
      if (e) ++errors_;
      const auto t1 = Clock::now();
      if (mark_ns_ != 0 && t1.time_since_epoch().count() >= mark_ns_) {
        const int64_t ns = (t1 - t0).count();
        int64_t cur = longest_ns_;
        while (ns > cur && !longest_ns_.compare_exchange_weak(cur, ns)) {
        }
      }
    }
    (void)f->close();
  }

  Client& c_;
  std::atomic<bool> stop_{false};
  std::atomic<int64_t> mark_ns_{0}, longest_ns_{0};
  std::atomic<int> errors_{0};
  std::vector<std::thread> threads_;
};

uint32_t targetOf(ClusterHarness& h, int node) {
  const auto r = h.routing();
  for (const auto& t : r.targets())
    if (t.endpoint() == h.storageEndpoint(node)) return t.id();
  die("no target for node " + std::to_string(node));
}

uint64_t dataBytes(ClusterHarness& h, int node) {
  net::RpcClient rpc{net::ClientOptions{}};
  storage::SpaceResp resp;
  Status s = rpc.callSync(*net::Endpoint::parse(h.storageEndpoint(node)),
                          cistern::testing::storageMethod("Space"), storage::SpaceReq(), &resp);
  if (!s.ok()) die("Space: " + s.toString());
  return resp.data_bytes();
}

// fio's sequential O_DIRECT write of `bytes` into `dir`, MB/s.
double fioWrite(const std::string& dir, uint64_t bytes) {
  const std::string cmd =
      "fio --name=disk --directory=" + dir +
      " --filename=fio.data --size=" + std::to_string(std::max<uint64_t>(bytes >> 20, 1)) +
      "M --rw=write --bs=1M --direct=1 --ioengine=libaio --iodepth=8 --end_fsync=1 "
      "--output-format=json 2>/dev/null | /usr/bin/python3 -c 'import json,sys; "
      "print(json.load(sys.stdin)[\"jobs\"][0][\"write\"][\"bw_bytes\"]/1e6)'";
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) die("fio");
  double mbps = 0;
  if (std::fscanf(p, "%lf", &mbps) != 1) mbps = 0;
  ::pclose(p);
  std::filesystem::remove(dir + "/fio.data");
  if (mbps <= 0) die("fio gave no figure (is fio installed?)");
  return mbps;
}

}  // namespace

int main(int argc, char** argv) {
  log::setLevel(log::Level::kWarn);
  const uint64_t mib = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 256;
  const std::string base =
      std::filesystem::absolute("build/bench-cluster-" + std::to_string(getpid())).string();
  std::filesystem::create_directories(base);
  ::setenv("TMPDIR", base.c_str(), 1);  // the clusters' data: this disk, not a tmpfs
  ClusterHarness::Options o3;
  o3.name = "rf3";
  ClusterHarness rf3(o3);
  ClusterHarness::Options o1;
  o1.name = "rf1";
  o1.replication = 1;
  ClusterHarness rf1(o1);
  if (!rf3.ok() || !rf1.ok()) die("a cluster did not start");
  std::vector<double> failover, stall, resync_ratio, resync_mbps, disk_mbps, rf_ratio, rf3_mbps,
      rf1_mbps;
  for (int round = 0; round < 3; ++round) {
    const std::string name = "/seq" + std::to_string(round);
    double w3, w1;
    if (round % 2 == 0) {
      w3 = seqWrite(rf3.client(), name, mib);
      w1 = seqWrite(rf1.client(), name, mib);
    } else {
      w1 = seqWrite(rf1.client(), name, mib);
      w3 = seqWrite(rf3.client(), name, mib);
    }
    rf3_mbps.push_back(w3);
    rf1_mbps.push_back(w1);
    rf_ratio.push_back(w3 / w1);

    const int node = 1 + round % rf3.storageNodes();
    const uint32_t target = targetOf(rf3, node);
    double failed_over;
    {
      Load load(rf3.client());
      std::this_thread::sleep_for(std::chrono::seconds(1));
      load.mark();
      const auto killed = Clock::now();
      rf3.storage(node).kill(SIGKILL);
      while (ClusterHarness::routesTo(rf3.routing(), target)) {
        if (bench::secondsSince(killed) > 30) die("the killed node is still routed after 30 s");
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
      failed_over = bench::secondsSince(killed);
      std::this_thread::sleep_for(std::chrono::seconds(2));
      load.stop();
      if (load.errors() > 0) die(std::to_string(load.errors()) + " client calls failed");
      failover.push_back(failed_over);
      stall.push_back(load.longestS());
    }
    seqWrite(rf3.client(), "/missed" + std::to_string(round), mib);
    if (!rf3.restartStorage(node)) die("restart");
    const uint64_t before = dataBytes(rf3, node);
    // From the first chain that streams to it (SYNCING) until every chain
    // serves on all replicas again: the copy, and the report of its end
    // (a heartbeat and a tick), not the steps before it.
    std::optional<Clock::time_point> syncing;
    for (auto until = Clock::now() + std::chrono::seconds(600);;) {
      const auto r = rf3.routing();
      if (!syncing) {
        for (const auto& c : r.chains())
          for (const auto& m : c.members())
            if (m.target() == target && m.state() == mgmt::SYNCING) syncing = Clock::now();
      }
      if (syncing && rf3.healthy(r)) break;
      if (Clock::now() > until) die("no resync within 600 s");
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const double took = bench::secondsSince(*syncing);
    // The predecessors' own account of the copies (storage logs).
    for (int n = 1; n <= rf3.storageNodes(); ++n) {
      const std::string log = rf3.storage(n).log();
      for (size_t at = log.find("synced ("); at != std::string::npos;
           at = log.find("synced (", at + 1)) {
        const size_t line = log.rfind('\n', at) + 1;
        if (round == 0 || log.find("round-mark", line) == std::string::npos)
          std::printf("  node %d: %s\n", n, log.substr(line, log.find('\n', at) - line).c_str());
      }
    }
    const uint64_t gained = dataBytes(rf3, node) - before;
    const double r_mbps = static_cast<double>(gained) / 1e6 / took;
    const double d_mbps = fioWrite(base, gained);
    resync_mbps.push_back(r_mbps);
    disk_mbps.push_back(d_mbps);
    resync_ratio.push_back(r_mbps / d_mbps);
    std::printf(
        "round %d: write rf3 %.0f MB/s rf1 %.0f MB/s; node %d: routed around in %.2f s, longest "
        "call %.2f s; resync %.0f MiB in %.2f s (%.0f MB/s), disk %.0f MB/s\n",
        round + 1, w3, w1, node, failed_over, stall.back(), static_cast<double>(gained) / 1048576,
        took, r_mbps, d_mbps);
    std::fflush(stdout);
  }
  bench::rounds("cluster_rf3_write_mb_s", rf3_mbps);
  bench::rounds("cluster_rf1_write_mb_s", rf1_mbps);
  bench::rounds("cluster_rf3_write_vs_rf1", rf_ratio);
  bench::rounds("cluster_failover_s", failover);
  bench::rounds("cluster_stall_s", stall);
  bench::rounds("cluster_resync_mb_s", resync_mbps);
  bench::rounds("cluster_disk_write_mb_s", disk_mbps);
  bench::rounds("cluster_resync_vs_disk", resync_ratio);
  std::vector<pid_t> pids = rf3.cisternPids();
  for (pid_t p : rf1.cisternPids()) pids.push_back(p);
  const double rss = bench::peakRssMiB(pids);
  bench::figure("cluster_rf3_write_mb_s", median(rf3_mbps), "MB/s");
  bench::figure("cluster_rf1_write_mb_s", median(rf1_mbps), "MB/s");
  bench::figure("cluster_resync_mb_s", median(resync_mbps), "MB/s");
  bench::figure("cluster_disk_write_mb_s", median(disk_mbps), "MB/s");
  bench::figure("cluster_failover_s", median(failover), "s");
  bench::figure("cluster_stall_s", median(stall), "s");
  bench::figure("cluster_resync_vs_disk", median(resync_ratio), "x");
  bench::figure("cluster_rf3_write_vs_rf1", median(rf_ratio), "x");
  bench::figure("cluster_peak_rss_mib", rss, "MiB");
  std::filesystem::remove_all(base);
  return 0;
}
