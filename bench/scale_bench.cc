// bench/run scale [MIB_PER_NODE] — scale-out over capped links. Every
// process of each cluster runs in a network namespace of its own
// (tests/support/netlab.h), and every storage node's link is capped by tc
// tbf at SCALE_LINK_MBPS (default 32) MB/s each way, so that the links, not
// this machine's two cores or its disk, bound the data path.
//
// Three clusters side by side, with 1, 2 and 4 storage nodes, replication 1
// and one chain per node (the nodes' links are what scales; replication is
// the recovery part's). Each round, on each cluster in turn (the order
// rotates between rounds): 8 client threads write a file each, MIB_PER_NODE
// (96) MiB x nodes in all, 8 MiB writes; then read them back. Aggregate MB/s
// of each; figures scale_read_4_vs_1 and scale_write_4_vs_1 (linear: 4.0).
//
// Recovery, on a fourth cluster (4 nodes, replication 3, 4 chains,
// mgmtd.replace_after_s 2): each round adds a fresh node, writes 4 x
// MIB_PER_NODE MiB more, kills one node for good (SIGKILL, its data
// wiped) and times the re-replication: from the first replacement joining
// a chain until every chain has 3 SERVING replicas again. The fresh node is
// the least used target, so every replacement lands on it and the copies
// share its one capped link: scale_recovery_vs_link is the lost node's data
// over that time, against the cap (1.0: the link full all the time).
//
// Needs root (a network namespace of its own, veth, nftables, tc).
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
#include "tests/support/netlab.h"

using namespace cistern;
using cistern::testing::ClusterHarness;
using cistern::testing::NetLab;

namespace {

using Clock = std::chrono::steady_clock;
using metrics::median;

[[noreturn]] void die(const std::string& what) {
  std::fprintf(stderr, "scale bench: %s\n", what.c_str());
  std::exit(1);
}

constexpr int kThreads = 8;
constexpr size_t kIo = 8 << 20;

// Aggregate MB/s of kThreads threads each writing (or reading back) its own
// file of `mib_each` MiB under `dir`.
double parallelIo(Client& c, const std::string& dir, uint64_t mib_each, bool write) {
  static const auto buf = cistern::testing::patternBytes(kIo, 5);
  std::atomic<int> errors{0};
  std::string first_error;
  std::mutex mu;
  const auto t0 = Clock::now();
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      const std::string path = dir + "/f" + std::to_string(t);
      std::unique_ptr<File> f;
      Error e = write ? c.open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644, &f)
                      : c.open(path, O_RDONLY, 0, &f);
      std::vector<uint8_t> in(write ? 0 : kIo);
      const uint64_t size = mib_each << 20;
      for (uint64_t at = 0; !e && at < size; at += kIo) {
        const size_t n = std::min<uint64_t>(kIo, size - at);
        size_t done = 0;
        e = write ? f->pwrite(buf.data(), n, at, &done) : f->pread(in.data(), n, at, &done);
        if (!e && !write && (done != n || std::memcmp(in.data(), buf.data(), n) != 0))
          e = Error{EIO, path + ": read other bytes than were written"};
      }
      if (!e) e = f->close();
      if (e) {
        std::lock_guard lock(mu);
        if (errors++ == 0) first_error = path + ": " + e.message;
      }
    });
  }
  for (auto& t : threads) t.join();
  if (errors) die(first_error);
  return static_cast<double>(kThreads * (mib_each << 20)) / 1e6 / bench::secondsSince(t0);
}

uint64_t dataBytes(ClusterHarness& h, int node) {
  net::RpcClient rpc{net::ClientOptions{}};
  storage::SpaceResp resp;
  Status s = rpc.callSync(*net::Endpoint::parse(h.storageEndpoint(node)),
                          cistern::testing::storageMethod("Space"), storage::SpaceReq(), &resp);
  if (!s.ok()) die("Space: " + s.toString());
  return resp.data_bytes();
}

uint32_t targetOf(const mgmt::Routing& r, const std::string& endpoint) {
  for (const auto& t : r.targets())
    if (t.endpoint() == endpoint) return t.id();
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  log::setLevel(log::Level::kWarn);
  std::string why;
  if (!NetLab::enterPrivateNetwork(&why)) die("needs a network namespace of its own: " + why);
  const uint64_t mib_per_node = argc > 1 ? std::strtoull(argv[1], nullptr, 10) : 96;
  const char* cap_env = std::getenv("SCALE_LINK_MBPS");
  const double cap_mbps = cap_env ? std::atof(cap_env) : 32;
  const std::string base =
      std::filesystem::absolute("build/bench-scale-" + std::to_string(getpid())).string();
  std::filesystem::create_directories(base);
  ::setenv("TMPDIR", base.c_str(), 1);  // the clusters' data: this disk, not a tmpfs

  // Hosts: three scale clusters (7 + N each), then the recovery cluster
  // (7 + 4, and a fresh node per round).
  const int sizes[3] = {1, 2, 4};
  int first[4], next_host = 1;
  for (int i = 0; i < 3; ++i) {
    first[i] = next_host;
    next_host += 7 + sizes[i];
  }
  first[3] = next_host;
  next_host += 7 + 4 + 3;
  NetLab lab(next_host - 1);
  if (!lab.ok()) die("the network namespaces did not come up");
  const auto cap = static_cast<uint64_t>(cap_mbps * 1e6);

  std::vector<std::unique_ptr<ClusterHarness>> scale;
  for (int i = 0; i < 3; ++i) {
    ClusterHarness::Options o;
    o.lab = &lab;
    o.first_host = first[i];
    o.name = "scale" + std::to_string(sizes[i]);
    o.storage_nodes = sizes[i];
    o.replication = 1;
    o.chains = sizes[i];
    scale.push_back(std::make_unique<ClusterHarness>(o));
    if (!scale.back()->ok()) die("cluster " + o.name + " did not start");
    for (int n = 1; n <= sizes[i]; ++n)
      if (!lab.capLink(ClusterHarness::storageHost(n, first[i]), cap)) die("tc tbf");
  }
  ClusterHarness::Options ro;
  ro.lab = &lab;
  ro.first_host = first[3];
  ro.name = "recovery";
  ro.replace_after_s = 2;
  ClusterHarness rec(ro);
  if (!rec.ok()) die("the recovery cluster did not start");
  for (int n = 1; n <= 4; ++n)
    if (!lab.capLink(ClusterHarness::storageHost(n, first[3]), cap)) die("tc tbf");

  std::vector<double> write_mbps[3], read_mbps[3], write_ratio, read_ratio, recovery_ratio,
      recovery_mbps;
  for (int round = 0; round < 3; ++round) {
    for (int k = 0; k < 3; ++k) {
      const int i = (round + k) % 3;
      Client& c = scale[static_cast<size_t>(i)]->client();
      const std::string dir = "/r" + std::to_string(round);
      (void)c.mkdir(dir, 0755, true);
      const uint64_t each = mib_per_node * static_cast<uint64_t>(sizes[i]) / kThreads;
      write_mbps[i].push_back(parallelIo(c, dir, each, true));
      read_mbps[i].push_back(parallelIo(c, dir, each, false));
      std::printf("round %d: %d node(s): write %.1f MB/s, read %.1f MB/s\n", round + 1, sizes[i],
                  write_mbps[i].back(), read_mbps[i].back());
      std::fflush(stdout);
    }
    write_ratio.push_back(write_mbps[2].back() / write_mbps[0].back());
    read_ratio.push_back(read_mbps[2].back() / read_mbps[0].back());

    // Recovery: a fresh node, more data, a node lost for good.
    const int fresh = rec.addStorageNode();
    if (fresh == 0) die("a fresh node did not start");
    if (!lab.capLink(rec.storageHostHere(fresh), cap)) die("tc tbf");
    const std::string rdir = "/rec" + std::to_string(round);
    (void)rec.client().mkdir(rdir, 0755, true);
    parallelIo(rec.client(), rdir, 4 * mib_per_node / kThreads, true);
    const auto before = rec.routing();
    // A node that holds data (not the fresh one, not one lost before).
    int victim = 0;
    for (int n = 1; n < fresh && !victim; ++n) {
      const uint32_t t = targetOf(before, rec.storageEndpoint(n));
      for (const auto& ch : before.chains())
        for (uint32_t m : ch.targets())
          if (m == t && t != 0) victim = n;
    }
    if (!victim) die("no node with data to lose");
    const uint32_t victim_target = targetOf(before, rec.storageEndpoint(victim));
    const uint64_t lost = dataBytes(rec, victim);
    rec.storage(victim).kill(SIGKILL);
    std::filesystem::remove_all(rec.dir() + "/target" + std::to_string(victim));
    const uint32_t fresh_target = targetOf(before, rec.storageEndpoint(fresh));
    std::optional<Clock::time_point> joined;
    for (auto until = Clock::now() + std::chrono::seconds(600);;) {
      const auto r = rec.routing();
      bool victim_gone = true;
      for (const auto& ch : r.chains()) {
        for (const auto& m : ch.members()) {
          if (m.target() == victim_target) victim_gone = false;
          if (!joined && m.target() == fresh_target) joined = Clock::now();
        }
      }
      if (joined && victim_gone && rec.healthy(r)) break;
      if (Clock::now() > until) die("no re-replication within 600 s");
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    const double took = bench::secondsSince(*joined);
    const double mbps = static_cast<double>(lost) / 1e6 / took;
    recovery_mbps.push_back(mbps);
    recovery_ratio.push_back(mbps / cap_mbps);
    std::printf(
        "round %d: 4 vs 1 nodes: write %.2fx, read %.2fx; recovery: node %d's %.0f MiB onto node "
        "%d in %.2f s (%.1f MB/s, link %.0f MB/s)\n",
        round + 1, write_ratio.back(), read_ratio.back(), victim,
        static_cast<double>(lost) / 1048576, fresh, took, mbps, cap_mbps);
    std::fflush(stdout);
  }
  for (int i = 0; i < 3; ++i) {
    bench::rounds("scale_write_" + std::to_string(sizes[i]) + "_mb_s", write_mbps[i]);
    bench::rounds("scale_read_" + std::to_string(sizes[i]) + "_mb_s", read_mbps[i]);
  }
  bench::rounds("scale_recovery_mb_s", recovery_mbps);
  bench::rounds("scale_write_4_vs_1", write_ratio);
  bench::rounds("scale_read_4_vs_1", read_ratio);
  bench::rounds("scale_recovery_vs_link", recovery_ratio);
  std::vector<pid_t> pids = rec.cisternPids();
  for (auto& h : scale)
    for (pid_t p : h->cisternPids()) pids.push_back(p);
  const double rss = bench::peakRssMiB(pids);
  bench::figure("scale_link_mb_s", cap_mbps, "MB/s");
  for (int i = 0; i < 3; ++i) {
    bench::figure("scale_write_" + std::to_string(sizes[i]) + "_mb_s", median(write_mbps[i]),
                  "MB/s");
    bench::figure("scale_read_" + std::to_string(sizes[i]) + "_mb_s", median(read_mbps[i]), "MB/s");
  }
  bench::figure("scale_recovery_mb_s", median(recovery_mbps), "MB/s");
  bench::figure("scale_write_4_vs_1", median(write_ratio), "x");
  bench::figure("scale_read_4_vs_1", median(read_ratio), "x");
  bench::figure("scale_recovery_vs_link", median(recovery_ratio), "x");
  bench::figure("scale_peak_rss_mib", rss, "MiB");
  scale.clear();
  std::filesystem::remove_all(base);
  return 0;
}
