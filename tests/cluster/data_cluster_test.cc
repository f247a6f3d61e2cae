// A whole cluster of real processes (cluster_harness.h: 3 etcd, 2 mgmtd, 2
// meta, 4 storage, replication 3) under a writer that records every write
// it was answered for and readers that check every byte they get against
// that record, while storage processes are killed and restarted, stopped
// and resumed, and mgmtd and meta processes die.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <atomic>
#include <ctime>
#include <fstream>
#include <mutex>
#include <random>
#include <thread>

#include "auth/token.h"
#include "common/metrics.h"
#include "net/rpc_client.h"
#include "storage.pb.h"
#include "tests/cluster/cluster_harness.h"
#include "tests/cluster/workload.h"
#include "tests/support/flip_bytes.h"
#include "tests/support/http_get.h"

namespace cistern {
namespace {

using testing::ClusterHarness;
using testing::patternBytes;
using testing::Workload;

// Replication 1 with the client on the storage servers' host: reads go
// through shared memory (no copy over the socket), each range naming its
// chain and version like any read; eight threads write and read back
// files at once. (Reads through shared memory once named no chain, and a
// cluster's server, which checks that it serves the chain, refused every
// one: found by bench/run scale.)
TEST(DataCluster, AReplicationOneClusterReadsThroughSharedMemory) {
  ClusterHarness::Options o;
  o.name = "rf1";
  o.storage_nodes = 2;
  o.replication = 1;
  o.chains = 2;
  ClusterHarness h(o);
  ASSERT_TRUE(h.ok());
  // A reader without short-circuit reads (a cluster's servers refuse them;
  // reads racing that refusal would go over the socket): its reads go
  // through shared memory once it is attached to each server.
  Client::Options ro;
  ro.cluster = h.mgmtdList();
  ro.short_circuit_reads = false;
  auto [reader, connect_error] = Client::connect(ro);
  ASSERT_FALSE(connect_error) << connect_error.message;
  auto& shm_read =
      metrics::Registry::global().counter("client_read_bytes_total", {{"path", "shm"}}, "");
  const uint64_t shm_before = shm_read.value();
  // Writes, then two passes of reads (the first attaches).
  for (int pass = 0; pass < 3; ++pass) {
    const bool write = pass == 0;
    Client& c = write ? h.client() : *reader;
    std::vector<std::thread> threads;
    for (int t = 0; t < 8; ++t) {
      threads.emplace_back([&, t] {
        const std::string path = "/f" + std::to_string(t);
        const auto want = patternBytes((3 << 20) + 1000 * t, 40 + t);
        std::unique_ptr<File> f;
        Error e = write ? c.open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644, &f)
                        : c.open(path, O_RDONLY, 0, &f);
        std::vector<uint8_t> got(want.size() + 1);
        size_t done = 0;
        if (!e)
          e = write ? f->pwrite(want.data(), want.size(), 0, &done)
                    : f->pread(got.data(), got.size(), 0, &done);
        if (!e) e = f->close();
        ASSERT_FALSE(e) << (write ? "write " : "read ") << path << ": " << e.message;
        if (!write) {
          got.resize(done);
          EXPECT_EQ(got, want) << path;
        }
      });
    }
    for (auto& th : threads) th.join();
  }
  EXPECT_GT(shm_read.value(), shm_before) << "no read went through shared memory";
}

int killRounds() {
  const char* env = std::getenv("CISTERN_KILL_ROUNDS");
  return env ? std::atoi(env) : 20;
}

// A random storage process is SIGKILLed and restarted, round after round,
// under a writer and a reader: no acknowledged write is lost, no read ever
// returns other bytes, and every chain is back to three SERVING replicas
// holding the same chunks at the end.
TEST(DataCluster, KillRoundsLoseNoAcknowledgedWrite) {
  ClusterHarness h({});
  ASSERT_TRUE(h.ok());
  Workload load(h.client());
  load.on_bad = [&](uint64_t ino) {
    const auto r = h.routing();
    std::string text =
        "DIAG inode " + std::to_string(ino) + " routing v" + std::to_string(r.version()) + ":";
    for (const auto& c : r.chains()) {
      text += " chain " + std::to_string(c.id()) + " v" + std::to_string(c.version()) + " [";
      for (const auto& m : c.members())
        text += std::to_string(m.target()) + ":" + std::to_string(m.state()) + " ";
      text += "]";
    }
    for (int n = 1; n <= h.storageNodes(); ++n) {
      for (uint32_t idx = 0; idx < 3; ++idx) {
        storage::QueryReq q;
        q.mutable_chunk()->set_inode(ino);
        q.mutable_chunk()->set_index(idx);
        storage::QueryResp resp;
        net::RpcClient rpc{net::ClientOptions{}};
        Status st =
            rpc.callSync(*net::Endpoint::parse(h.storageEndpoint(n)),
                         cistern::testing::storageMethod("Query"), q, &resp, {.timeout_ms = 1000});
        text += "\n  node " + std::to_string(n) + " chunk " + std::to_string(idx) + ": " +
                (st.ok() ? (resp.exists() ? "v" + std::to_string(resp.info().chunk_version()) +
                                                "." + std::to_string(resp.info().chain_version()) +
                                                " chain " + std::to_string(resp.info().chain())
                                          : std::string("none"))
                         : st.toString());
      }
    }
    std::fprintf(stderr, "%s\n", text.c_str());
  };
  std::mt19937 rng(11);
  const int rounds = killRounds();
  for (int round = 0; round < rounds; ++round) {
    const int n = 1 + static_cast<int>(rng() % static_cast<unsigned>(h.storageNodes()));
    std::this_thread::sleep_for(std::chrono::milliseconds(200 + rng() % 600));
    h.storage(n).kill(SIGKILL);
    std::this_thread::sleep_for(std::chrono::milliseconds(rng() % 500));
    ASSERT_TRUE(h.restartStorage(n)) << "round " << round;
    ASSERT_TRUE(h.waitHealthy(60)) << "round " << round << ": node " << n << " did not sync back";
  }
  load.stop();
  std::fprintf(stderr,
               "%d kill rounds: %zu files written, %d reads checked, longest write %.2f s\n",
               rounds, load.written().size(), load.reads(), load.longestWriteS());
  EXPECT_EQ(load.failedWrites(), 0) << load.firstError();
  EXPECT_EQ(load.badReads(), 0) << load.firstError();
  EXPECT_GT(load.written().size(), 10u);
  EXPECT_EQ(load.verifyAll(), 0) << load.firstError();
  h.expectReplicasAgree();
}

// A storage process stopped (SIGSTOP) past the heartbeat timeout is taken
// out of its chains; resumed, it stops serving until mgmtd answers it,
// comes back as SYNCING, catches up and serves again. Readers spread over
// the replicas never get a stale byte.
TEST(DataCluster, AStoppedNodeIsTakenOutAndCatchesUpWithoutStaleReads) {
  ClusterHarness h({});
  ASSERT_TRUE(h.ok());
  Workload load(h.client(), /*readers=*/2);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  auto before = h.routing();
  h.storage(2).kill(SIGSTOP);
  const uint32_t target2 = [&] {
    for (const auto& t : before.targets())
      if (t.endpoint() == h.storageEndpoint(2)) return t.id();
    return 0u;
  }();
  ASSERT_NE(target2, 0u);
  ASSERT_TRUE(h.waitOutOfChains(target2, 10, "the stopped node out of every chain"));
  std::this_thread::sleep_for(std::chrono::seconds(1));  // writes go on without it
  h.storage(2).kill(SIGCONT);
  ASSERT_TRUE(h.waitHealthy(60));
  std::this_thread::sleep_for(std::chrono::seconds(1));  // and reads from it again
  load.stop();
  EXPECT_EQ(load.failedWrites(), 0) << load.firstError();
  EXPECT_EQ(load.badReads(), 0) << load.firstError();
  EXPECT_EQ(load.verifyAll(), 0) << load.firstError();
  h.expectReplicasAgree();
}

// The primary mgmtd dies: the standby takes over and the workload goes on
// (a stall while no mgmtd answers the storage servers' beats). A meta
// server dies: the client moves to the other.
TEST(DataCluster, ThePrimaryMgmtdAndAMetaServerDieAndTheWorkloadGoesOn) {
  ClusterHarness h({});
  ASSERT_TRUE(h.ok());
  Workload load(h.client());
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const int primary = h.primary();
  ASSERT_GE(primary, 0);
  h.mgmtd(primary).kill(SIGKILL);
  ASSERT_TRUE(h.waitFor([&] { return h.primary() == 1 - primary; }, 10, "the standby primary"));
  const size_t files = load.written().size();
  ASSERT_TRUE(h.waitFor([&] { return load.written().size() > files + 3; }, 20,
                        "writes after the takeover"));
  h.meta(0).kill(SIGKILL);
  const size_t files2 = load.written().size();
  ASSERT_TRUE(h.waitFor([&] { return load.written().size() > files2 + 3; }, 20,
                        "writes after a meta server died"));
  load.stop();
  EXPECT_EQ(load.failedWrites(), 0) << load.firstError();
  EXPECT_EQ(load.badReads(), 0) << load.firstError();
  EXPECT_EQ(load.verifyAll(), 0) << load.firstError();
  EXPECT_TRUE(h.healthy(h.routing()));
}

// Node 1 dies as the head of a chain right after the rest of the chain
// committed a write, before answering it. The client's retry reaches the
// next head, which knows the update: every chunk (each file is one chunk,
// written once) is at version 1 on every replica — applied exactly once —
// and holds the bytes written.
TEST(DataCluster, TheHeadDyingAfterForwardingLeavesEachWriteAppliedOnce) {
  ClusterHarness::Options o;
  o.storage_faults[1] = "storage.head.after_forward=crash";
  ClusterHarness h(o);
  ASSERT_TRUE(h.ok());
  Client& c = h.client();
  ASSERT_FALSE(c.mkdir("/once", 0755, true));
  std::vector<std::pair<std::string, uint64_t>> files;
  for (int i = 0; i < 24; ++i) {
    const std::string path = "/once/f" + std::to_string(i);
    auto bytes = patternBytes(200000, 1000 + static_cast<uint64_t>(i));
    std::unique_ptr<File> f;
    ASSERT_FALSE(c.open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644, &f));
    size_t done = 0;
    Error e = f->pwrite(bytes.data(), bytes.size(), 0, &done);
    if (!e) e = f->close();
    ASSERT_FALSE(e) << path << ": " << e.message;
    files.push_back({path, 1000 + static_cast<uint64_t>(i)});
  }
  // Node 1 crashed at its fault, heading a chain: out of the routing.
  const auto routing = h.routing();
  auto target1 = [&] {
    for (const auto& t : routing.targets())
      if (t.endpoint() == h.storageEndpoint(1)) return t.id();
    return 0u;
  }();
  ASSERT_TRUE(h.waitFor(
      [&] {
        const auto r = h.routing();
        for (const auto& chain : r.chains())
          for (uint32_t t : chain.targets())
            if (t == target1) return false;
        return true;
      },
      10, "node 1 (crashed as a head) out of every chain"));
  h.clearFaults(1);
  ASSERT_TRUE(h.restartStorage(1));
  ASSERT_TRUE(h.waitHealthy(60));
  for (const auto& [path, seed] : files) {
    std::unique_ptr<File> f;
    ASSERT_FALSE(c.open(path, O_RDONLY, 0, &f));
    std::vector<uint8_t> got(200000);
    size_t done = 0;
    ASSERT_FALSE(f->pread(got.data(), got.size(), 0, &done));
    EXPECT_EQ(got, patternBytes(200000, seed)) << path;
  }
  auto r = h.routing();
  for (const auto& chain : r.chains()) {
    for (uint32_t t : chain.targets()) {
      for (const auto& [chunk, versions] : h.chunksOn(h.nodeOf(r, t), chain.id())) {
        EXPECT_EQ(versions.first, 1u) << "chunk " << chunk.first << ":" << chunk.second
                                      << " on target " << t << " of chain " << chain.id();
      }
    }
  }
  h.expectReplicasAgree();
}

// A storage node lost for good (killed, its disk wiped, never back):
// past the grace period mgmtd puts another target in its place in every
// chain it was in; each newcomer syncs from the chain and serves, with no
// operator action. The writer and readers run throughout: nothing
// acknowledged is lost, no read returns other bytes, replicas agree.
TEST(DataCluster, ALostNodeIsReplacedAndEveryChainIsWholeAgain) {
  ClusterHarness h({.replace_after_s = 3});
  ASSERT_TRUE(h.ok());
  Workload load(h.client());
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const auto before = h.routing();
  uint32_t lost = 0;
  for (const auto& t : before.targets())
    if (t.endpoint() == h.storageEndpoint(4)) lost = t.id();
  ASSERT_NE(lost, 0u);
  int chains_with_lost = 0;
  for (const auto& c : before.chains())
    for (uint32_t t : c.targets()) chains_with_lost += t == lost;
  ASSERT_GT(chains_with_lost, 0);
  h.storage(4).kill(SIGKILL);
  std::filesystem::remove_all(h.dir() + "/target4");
  ASSERT_TRUE(h.waitFor(
      [&] {
        const auto r = h.routing();
        if (!h.healthy(r)) return false;
        for (const auto& c : r.chains())
          for (const auto& m : c.members())
            if (m.target() == lost) return false;
        return true;
      },
      60, "every chain back to 3 SERVING replicas without the lost node"));
  std::this_thread::sleep_for(std::chrono::seconds(1));  // reads from the newcomers too
  load.stop();
  EXPECT_EQ(load.failedWrites(), 0) << load.firstError();
  EXPECT_EQ(load.badReads(), 0) << load.firstError();
  EXPECT_GT(load.written().size(), 5u);
  EXPECT_EQ(load.verifyAll(), 0) << load.firstError();
  h.expectReplicasAgree();
}

// Bits flipped on one replica's disk (its process stopped, the bytes
// changed, the process back: it rejoins with the same chunk versions, so
// its resync copies nothing). No read returns the bad bytes: a replica
// whose copy fails verification answers kCorruption and the client reads
// another replica; that replica repairs its copy from a peer's, so every
// chunk read there directly comes back good.
TEST(DataCluster, ACorruptReplicaIsNeverReadAndIsRepairedFromAPeer) {
  ClusterHarness h({});
  ASSERT_TRUE(h.ok());
  Client& c = h.client();
  ASSERT_FALSE(c.mkdir("/flip", 0755, true));
  std::vector<std::vector<uint8_t>> want;
  for (int i = 0; i < 12; ++i) {
    want.push_back(patternBytes(300000 + 1000 * i, 500 + i));
    std::unique_ptr<File> f;
    ASSERT_FALSE(c.open("/flip/f" + std::to_string(i), O_CREAT | O_WRONLY, 0644, &f));
    size_t done = 0;
    ASSERT_FALSE(f->pwrite(want.back().data(), want.back().size(), 0, &done));
    ASSERT_FALSE(f->close());
  }
  const uint64_t before_kill = h.routing().version();
  h.storage(2).kill(SIGKILL);
  const int flipped = testing::flipBytesEvery4K(h.dir() + "/target2");
  ASSERT_GT(flipped, 0);
  ASSERT_TRUE(h.restartStorage(2));
  // Back in its chains once mgmtd has taken the restarted target out and
  // it synced (copying nothing: its versions are the chain's).
  ASSERT_TRUE(h.waitFor(
      [&] {
        const auto r = h.routing();
        if (r.version() <= before_kill || !h.healthy(r)) return false;
        for (const auto& t : r.targets())
          if (t.restarted()) return false;
        return true;
      },
      60, "node 2 restarted, taken out and back"));
  // Every file, read through the client several times (each piece's first
  // replica is spread by chunk): the right bytes every time.
  for (int round = 0; round < 3; ++round) {
    for (int i = 0; i < 12; ++i) {
      std::unique_ptr<File> f;
      ASSERT_FALSE(c.open("/flip/f" + std::to_string(i), O_RDONLY, 0, &f));
      std::vector<uint8_t> got(want[static_cast<size_t>(i)].size());
      size_t done = 0;
      ASSERT_FALSE(f->pread(got.data(), got.size(), 0, &done)) << "file " << i;
      EXPECT_EQ(got, want[static_cast<size_t>(i)]) << "file " << i << " round " << round;
    }
  }
  // Node 2's own copies, read there directly: each answers kCorruption
  // (never bad bytes) until repaired, then the good bytes.
  const auto r = h.routing();
  uint32_t target2 = 0;
  for (const auto& t : r.targets())
    if (t.endpoint() == h.storageEndpoint(2)) target2 = t.id();
  int chunks = 0, corrupt_seen = 0;
  net::RpcClient rpc{net::ClientOptions{}};
  for (const auto& chain : r.chains()) {
    bool member = false;
    for (uint32_t t : chain.targets()) member |= t == target2;
    if (!member) continue;
    for (const auto& [key, versions] : h.chunksOn(2, chain.id())) {
      ++chunks;
      bool good = false;
      for (int attempt = 0; attempt < 100 && !good; ++attempt) {
        storage::BatchReadReq req;
        auto* range = req.add_ranges();
        range->mutable_chunk()->set_inode(key.first);
        range->mutable_chunk()->set_index(key.second);
        range->set_length(1 << 20);
        range->set_chain(chain.id());
        range->set_chain_version(chain.version());
        storage::BatchReadResp resp;
        std::vector<uint8_t> bytes(1 << 20);
        size_t got = 0;
        ASSERT_TRUE(
            rpc.callSync(
                   *net::Endpoint::parse(h.storageEndpoint(2)),
                   cistern::testing::storageMethod("BatchRead"), req, &resp,
                   {.timeout_ms = 5000, .response_payload = bytes, .response_payload_len = &got})
                .ok());
        const auto code = static_cast<ErrorCode>(resp.codes(0));
        if (code == ErrorCode::kCorruption) {
          ++corrupt_seen;
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          continue;
        }
        ASSERT_EQ(code, ErrorCode::kOk) << "chunk " << key.first << ":" << key.second;
        good = true;
      }
      EXPECT_TRUE(good) << "chunk " << key.first << ":" << key.second << " never repaired";
    }
  }
  EXPECT_GT(chunks, 0) << "target " << target2 << "; routing:\n" << r.DebugString();
  std::fprintf(stderr, "%d chunks on node 2; %d reads there met a bad copy before its repair\n",
               chunks, corrupt_seen);
  h.expectReplicasAgree();
}

// A fifth storage node joins a cluster of four under a writer and readers:
// the rebalance moves replicas onto it until the targets are within one
// chain of each other, each new replica synced before the old one leaves
// (no routing sampled meanwhile shows a chain with fewer than three
// SERVING); nothing acknowledged is lost, no read returns other bytes, the
// replicas agree. Draining that node moves them all off again.
TEST(DataCluster, ANewNodeGetsItsShareAndADrainedOneGivesItBack) {
  ClusterHarness h({});
  ASSERT_TRUE(h.ok());
  Workload load(h.client());
  std::this_thread::sleep_for(std::chrono::seconds(1));
  const int added = h.addStorageNode();
  ASSERT_EQ(added, 5);
  ASSERT_TRUE(h.waitFor([&] { return h.routing().targets_size() == 5; }, 15, "node 5 registered"));
  uint32_t t5 = 0;
  const auto joined = h.routing();
  for (const auto& t : joined.targets())
    if (t.endpoint() == h.storageEndpoint(5)) t5 = t.id();
  ASSERT_NE(t5, 0u);
  int fewest = 3;  // SERVING replicas of any chain in any routing sampled
  int moves = 0;
  const auto moveAndWait = [&](const mgmt::RebalanceReq& req, const char* what) {
    mgmt::RebalanceResp resp;
    Status s = h.callPrimary("Rebalance", req, &resp);
    EXPECT_TRUE(s.ok()) << s.toString();
    moves += resp.moves_size();
    EXPECT_GT(resp.moves_size(), 0) << what;
    return h.waitFor(
        [&] {
          const auto r = h.routing();
          for (const auto& c : r.chains()) fewest = std::min(fewest, c.targets_size());
          if (!h.healthy(r)) return false;
          for (const auto& c : r.chains())
            if (c.leaving() != 0) return false;
          return true;
        },
        60, what);
  };
  // The CLI's plan changes nothing; an unknown node is a clear error.
  const auto plan =
      testing::runProgram(CISTERN_BIN, {"rebalance", "--dry-run", "--cluster", h.mgmtdList()});
  EXPECT_EQ(plan.exit_code, 0) << plan.err;
  EXPECT_NE(plan.out.find("planned (dry run: nothing changed)"), std::string::npos) << plan.out;
  EXPECT_NE(plan.out.find("-> target " + std::to_string(t5)), std::string::npos) << plan.out;
  const auto unknown =
      testing::runProgram(CISTERN_BIN, {"drain", "node9", "--cluster", h.mgmtdList()});
  EXPECT_EQ(unknown.exit_code, 1);
  EXPECT_NE(unknown.err.find("node9"), std::string::npos) << unknown.err;
  const auto after_plan = h.routing();
  for (const auto& c : after_plan.chains()) EXPECT_EQ(c.leaving(), 0u) << "a dry run moved";
  mgmt::RebalanceReq spread;
  spread.set_spread(1);
  ASSERT_TRUE(moveAndWait(spread, "the rebalance onto node 5"));
  std::map<uint32_t, int> uses;
  const auto balanced = h.routing();
  for (const auto& c : balanced.chains())
    for (uint32_t t : c.targets()) ++uses[t];
  EXPECT_GE(uses[t5], 2) << "12 replicas over 5 targets";
  int lo = 100, hi = 0;
  for (const auto& [t, n] : uses) {
    lo = std::min(lo, n);
    hi = std::max(hi, n);
  }
  EXPECT_LE(hi - lo, 1);
  mgmt::RebalanceReq drain;
  drain.set_spread(UINT32_MAX);
  drain.add_drain("node5");
  ASSERT_TRUE(moveAndWait(drain, "the drain of node 5"));
  const auto drained = h.routing();
  for (const auto& c : drained.chains())
    for (const auto& m : c.members()) EXPECT_NE(m.target(), t5) << "chain " << c.id();
  load.stop();
  EXPECT_EQ(fewest, 3) << "a chain had fewer SERVING replicas during a move";
  // mgmtd's own record of every chain version it committed (the last 64
  // each; this test makes fewer): none with fewer than 3 SERVING, and each
  // move's add-then-remove in it.
  mgmt::ChainHistoryResp history;
  ASSERT_TRUE(h.callPrimary("ChainHistory", mgmt::ChainHistoryReq(), &history).ok());
  int versions = 0, with_leaving = 0;
  for (const auto& e : history.events()) {
    ++versions;
    with_leaving += e.chain().leaving() != 0;
    EXPECT_GE(e.chain().targets_size(), 3)
        << "chain " << e.chain().id() << " version " << e.chain().version() << ": "
        << e.chain().ShortDebugString();
  }
  EXPECT_GT(with_leaving, 0) << "no move in mgmtd's history";
  // Every process serves its metrics (`cistern serve --metrics`): the
  // primary mgmtd counted the moves; the storage servers and meta servers
  // their calls.
  const int primary = h.primary();
  ASSERT_GE(primary, 0);
  const std::string mgmtd_metrics = testing::httpGet(h.mgmtd(primary).metricsPort(), "/metrics");
  EXPECT_NE(mgmtd_metrics.find("mgmtd_replicas_moved_total " + std::to_string(moves)),
            std::string::npos)
      << mgmtd_metrics.substr(0, 2000);
  for (int n = 1; n <= h.storageNodes(); ++n)
    EXPECT_NE(
        testing::httpGet(h.storage(n).metricsPort(), "/metrics").find("rpc_server_calls_total"),
        std::string::npos)
        << "storage " << n;
  EXPECT_NE(testing::httpGet(h.meta(0).metricsPort(), "/healthz").find("ok"), std::string::npos);
  const auto listed =
      testing::runProgram(CISTERN_BIN, {"chains", "history", "--cluster", h.mgmtdList()});
  EXPECT_EQ(listed.exit_code, 0) << listed.err;
  EXPECT_NE(listed.out.find("leaving)"), std::string::npos) << listed.out;
  EXPECT_NE(listed.out.find(":SYNCING"), std::string::npos) << listed.out;
  EXPECT_GE(versions, balanced.chains_size() + with_leaving);
  EXPECT_EQ(load.failedWrites(), 0) << load.firstError();
  EXPECT_EQ(load.badReads(), 0) << load.firstError();
  EXPECT_EQ(load.verifyAll(), 0) << load.firstError();
  h.expectReplicasAgree();
}

// Every storage process dies at once: each chain keeps its last serving
// replica as LASTSRV and serves nothing. A write meanwhile waits (the
// client retries a chain with no serving replica) and completes once the
// processes are back, with the bytes written before the outage intact.
TEST(DataCluster, AChainWithNoServingReplicaIsWaitedFor) {
  ClusterHarness h({});
  ASSERT_TRUE(h.ok());
  Client& c = h.client();
  auto before = patternBytes(300000, 1);
  {
    std::unique_ptr<File> f;
    ASSERT_FALSE(c.open("/before", O_CREAT | O_WRONLY, 0644, &f));
    size_t done = 0;
    ASSERT_FALSE(f->pwrite(before.data(), before.size(), 0, &done));
    ASSERT_FALSE(f->close());
  }
  for (int n = 1; n <= h.storageNodes(); ++n) h.storage(n).kill(SIGKILL);
  ASSERT_TRUE(h.waitFor(
      [&] {
        const auto r = h.routing();
        for (const auto& chain : r.chains())
          if (chain.targets_size() > 0) return false;
        return r.chains_size() > 0;
      },
      15, "no chain with a serving replica"));
  // The primary mgmtd's gauges say so.
  ASSERT_TRUE(h.waitFor(
      [&] {
        const int p = h.primary();
        return p >= 0 && testing::httpGet(h.mgmtd(p).metricsPort(), "/metrics")
                                 .find("mgmtd_chains_unavailable 4\n") != std::string::npos;
      },
      10, "mgmtd_chains_unavailable 4"));
  auto during = patternBytes(300000, 2);
  std::atomic<bool> written{false};
  Error write_error;
  std::thread writer([&] {
    std::unique_ptr<File> f;
    write_error = c.open("/during", O_CREAT | O_WRONLY, 0644, &f);
    size_t done = 0;
    if (!write_error) write_error = f->pwrite(during.data(), during.size(), 0, &done);
    if (!write_error) write_error = f->close();
    written = true;
  });
  std::this_thread::sleep_for(std::chrono::seconds(2));
  EXPECT_FALSE(written.load()) << "a write completed with no storage process running";
  for (int n = 1; n <= h.storageNodes(); ++n) ASSERT_TRUE(h.restartStorage(n));
  writer.join();
  ASSERT_FALSE(write_error) << write_error.message;
  ASSERT_TRUE(h.waitHealthy(60));
  for (auto [path, want] : {std::pair{"/before", &before}, std::pair{"/during", &during}}) {
    std::unique_ptr<File> f;
    ASSERT_FALSE(c.open(path, O_RDONLY, 0, &f));
    std::vector<uint8_t> got(want->size());
    size_t done = 0;
    ASSERT_FALSE(f->pread(got.data(), got.size(), 0, &done));
    EXPECT_EQ(got, *want) << path;
  }
  h.expectReplicasAgree();
}

}  // namespace
}  // namespace cistern

namespace cistern {
namespace {

// A cluster that checks tokens (docs/security.md): a tenant's client writes
// and reads through replicated chains while a node is stopped and resumed
// (forwards and resyncs carry the servers' own tokens); a client without a
// token is refused; storage refuses a token where a capability is needed;
// a revoked token stops working within seconds.
TEST(DataCluster, ATenantsClientWorksThroughChainsWhenTheClusterChecksTokens) {
  const std::string keys = ::testing::TempDir() + "/cistern-auth-keys-" + std::to_string(getpid());
  std::ofstream(keys) << auth::Keyring::generateLine(1) << "\n";
  ::chmod(keys.c_str(), 0600);
  auto ring = auth::Keyring::load(keys);
  ASSERT_TRUE(ring.ok()) << ring.status().toString();
  auto sign = [&](const std::string& tenant, uint32_t uid, uint32_t rights) {
    auth::Token t;
    t.tenant = tenant;
    t.uid = t.gid = uid;
    t.rights = rights;
    t.issued_unix_s = std::time(nullptr);
    t.expires_unix_s = t.issued_unix_s + 3600;
    return *ring->sign(t);
  };
  ClusterHarness h({.storage_nodes = 3,
                    .chains = 2,
                    .name = "auth",
                    .auth_keys = keys,
                    .client_token = sign("cluster", 0, auth::kAllRights)});
  ASSERT_TRUE(h.ok());
  TenantInfo alpha;
  ASSERT_FALSE(h.client().tenantCreate("alpha", "/alpha", 1000, 1000, 0755, &alpha));

  const std::string alpha_token = sign("alpha", 1000, auth::kRead | auth::kWrite);
  Client::Options co;
  co.cluster = h.mgmtdList();
  co.retry_ms = 30000;
  co.call_timeout_ms = 5000;
  co.token = alpha_token;
  auto [tenant, err] = Client::connect(co);
  ASSERT_FALSE(err) << err.message;
  {
    Workload load(*tenant, /*readers=*/2);
    std::this_thread::sleep_for(std::chrono::seconds(1));
    auto before = h.routing();
    uint32_t target2 = 0;
    for (const auto& t : before.targets())
      if (t.endpoint() == h.storageEndpoint(2)) target2 = t.id();
    h.storage(2).kill(SIGSTOP);
    ASSERT_TRUE(h.waitOutOfChains(target2, 10, "the stopped node out of every chain"));
    std::this_thread::sleep_for(std::chrono::seconds(1));
    h.storage(2).kill(SIGCONT);
    ASSERT_TRUE(h.waitHealthy(60));  // resynced: Copy calls with the servers' tokens
    load.stop();
    EXPECT_EQ(load.failedWrites(), 0) << load.firstError();
    EXPECT_EQ(load.badReads(), 0) << load.firstError();
    EXPECT_EQ(load.verifyAll(), 0) << load.firstError();
  }
  h.expectReplicasAgree();
  // What the tenant wrote is under /alpha for the admin; its / is that.
  std::vector<DirEntry> mine, admins;
  ASSERT_FALSE(tenant->list("/", &mine));
  ASSERT_FALSE(h.client().list("/alpha", &admins));
  ASSERT_FALSE(mine.empty());
  EXPECT_EQ(mine.size(), admins.size());

  // No token: refused at once (mgmtd's routing), naming why.
  co.token.clear();
  ::unsetenv("CISTERN_TOKEN");
  auto [anonymous, e] = Client::connect(co);
  EXPECT_EQ(e.errno_value, EACCES) << e.message;
  EXPECT_NE(e.message.find("carried none"), std::string::npos) << e.message;
  FileInfo info;

  // Storage: a token is not a capability (the refusal is counted there).
  storage::WriteReq w;
  w.mutable_chunk()->set_inode(alpha.root);
  storage::WriteResp wr;
  net::RpcClient raw;
  const std::string payload(4096, 'x');
  Status s = raw.callSync(
      *net::Endpoint::parse(h.storageEndpoint(1)),
      net::Method::of("cistern.storage.StorageService.Write"), w, &wr,
      {.request_payload = std::span(reinterpret_cast<const uint8_t*>(payload.data()), 4096),
       .credential = alpha_token});
  EXPECT_EQ(s.code(), ErrorCode::kCapabilityRefused) << s.toString();
  const std::string metrics = testing::httpGet(h.storage(1).metricsPort(), "/metrics");
  EXPECT_NE(metrics.find("storage_auth_refusals_total{reason=\"not_capability\"} 1"),
            std::string::npos)
      << metrics.substr(0, 2000);

  // mgmtd: a tenant may read the routing, not change the cluster; no token
  // reads nothing (the harness's calls and the servers' carry their own).
  mgmt::RebalanceReq rb;
  rb.set_dry_run(true);
  mgmt::RebalanceResp rbr;
  const auto mgmtd0 = *net::Endpoint::parse(h.mgmtdList().substr(0, h.mgmtdList().find(',')));
  EXPECT_EQ(raw.callSync(mgmtd0, testing::mgmtMethod("Rebalance"), rb, &rbr,
                         {.credential = alpha_token})
                .code(),
            ErrorCode::kTokenNotAdmin);
  mgmt::Routing routing;
  EXPECT_EQ(raw.callSync(mgmtd0, testing::mgmtMethod("GetRouting"), mgmt::GetRoutingReq(),
                         &routing)
                .code(),
            ErrorCode::kTokenMissing);
  EXPECT_TRUE(raw.callSync(mgmtd0, testing::mgmtMethod("GetRouting"), mgmt::GetRoutingReq(),
                           &routing, {.credential = alpha_token})
                  .ok());

  // Revoked: the tenant's calls are refused within a few seconds.
  auto parsed = auth::peek(alpha_token);
  ASSERT_TRUE(parsed.ok());
  ASSERT_FALSE(h.client().revokeToken(parsed->id, parsed->expires_unix_s));
  ASSERT_TRUE(h.waitFor([&] { return tenant->stat("/", &info).errno_value == EKEYREVOKED; }, 5,
                        "the revocation"));
}

}  // namespace
}  // namespace cistern
