// Real network partitions: every process of a cluster (cluster_harness.h)
// in a network namespace of its own (netlab.h), one of them cut off by
// nftables drop rules under a writer and readers (workload.h), then healed.
// The test process is the client, in the namespace that routes between the
// hosts: a cut-off host still reaches it, so the client can keep calling
// the cut-off side, the hardest case for split brain and stale reads.
//
// main() moves the process into a network namespace of its own first
// (root; CI runs as root).
#include <gtest/gtest.h>

#include "kv/etcd_client.h"
#include "meta.pb.h"
#include "tests/cluster/cluster_harness.h"
#include "tests/cluster/workload.h"

namespace cistern {
namespace {

using testing::Clock;
using testing::ClusterHarness;
using testing::NetLab;
using testing::Workload;

constexpr uint32_t kHeartbeatTimeoutMs = 2000;

ClusterHarness::Options labOptions(NetLab* lab) {
  ClusterHarness::Options o;
  o.lab = lab;
  o.name = "partition";
  o.heartbeat_timeout_ms = kHeartbeatTimeoutMs;
  return o;
}

uint32_t targetOf(const mgmt::Routing& r, const std::string& endpoint) {
  for (const auto& t : r.targets())
    if (t.endpoint() == endpoint) return t.id();
  return 0;
}

// One chunk on node n and its chain, read there directly (no failover):
// the read's error code (kOk: served).
struct Probe {
  ClusterHarness& h;
  int node;
  uint32_t chain = 0;
  uint64_t chain_version = 0;
  std::pair<uint64_t, uint32_t> chunk;
  net::RpcClient rpc{net::ClientOptions{}};
  std::vector<uint8_t> bytes = std::vector<uint8_t>(1 << 20);

  // Picks a chunk node n holds (false: none yet).
  bool pick() {
    const auto r = h.routing();
    const uint32_t target = targetOf(r, h.storageEndpoint(node));
    for (const auto& c : r.chains()) {
      bool member = false;
      for (uint32_t t : c.targets()) member |= t == target;
      if (!member) continue;
      auto chunks = h.chunksOn(node, c.id());
      if (chunks.empty()) continue;
      chain = c.id();
      chain_version = c.version();
      chunk = chunks.begin()->first;
      return true;
    }
    return false;
  }
  // kChunkNotCommitted (the workload writing that chunk right then) is an
  // answer of a serving target: asked again, for up to a second.
  ErrorCode read() {
    ErrorCode code = readOnce();
    for (int i = 0; i < 50 && code == ErrorCode::kChunkNotCommitted; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      code = readOnce();
    }
    return code;
  }
  ErrorCode readOnce() {
    storage::BatchReadReq req;
    auto* range = req.add_ranges();
    range->mutable_chunk()->set_inode(chunk.first);
    range->mutable_chunk()->set_index(chunk.second);
    range->set_length(1 << 20);
    range->set_chain(chain);
    range->set_chain_version(chain_version);
    storage::BatchReadResp resp;
    size_t got = 0;
    Status s = rpc.callSync(
        *net::Endpoint::parse(h.storageEndpoint(node)), testing::storageMethod("BatchRead"), req,
        &resp, {.timeout_ms = 1000, .response_payload = bytes, .response_payload_len = &got});
    if (!s.ok()) return s.code();
    return resp.codes_size() ? static_cast<ErrorCode>(resp.codes(0)) : ErrorCode::kInternal;
  }
};

// A storage node cut off from every other process (the client still
// reaches it) stops serving within half the heartbeat timeout; its chains
// go on without it; healed, it resyncs and serves again. The client, which
// keeps reaching it, never gets a stale byte or loses a write.
TEST(Partition, ACutOffStorageNodeStopsServingAndResyncsAfterHealing) {
  NetLab lab(ClusterHarness::storageHost(4));
  ASSERT_TRUE(lab.ok());
  ClusterHarness h(labOptions(&lab));
  ASSERT_TRUE(h.ok());
  Workload load(h.client(), /*readers=*/2);
  Probe probe{h, 2};
  ASSERT_TRUE(h.waitFor([&] { return probe.pick(); }, 20, "a chunk on node 2"));
  ASSERT_EQ(probe.read(), ErrorCode::kOk);

  ASSERT_TRUE(lab.cut(ClusterHarness::storageHost(2)));
  const auto cut_at = Clock::now();
  ErrorCode code = ErrorCode::kOk;
  while (code == ErrorCode::kOk && Clock::now() < cut_at + std::chrono::seconds(10)) {
    code = probe.read();
    if (code == ErrorCode::kOk) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const auto stopped_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - cut_at).count();
  EXPECT_EQ(code, ErrorCode::kNotServing);
  // The lease runs half the timeout from the last answered beat's sending,
  // before the cut; 200 ms for the measure itself (the 10 ms between probes
  // and one probe's round trip, slower on a loaded machine).
  EXPECT_LE(stopped_ms, kHeartbeatTimeoutMs / 2 + 200);
  std::fprintf(stderr, "node 2 stopped serving %lld ms after the cut\n",
               static_cast<long long>(stopped_ms));

  const uint32_t target2 = targetOf(h.routing(), h.storageEndpoint(2));
  ASSERT_TRUE(h.waitOutOfChains(target2, 10, "the cut-off node out of every chain"));
  // Writes go on without it; it serves nothing meanwhile.
  const size_t files = load.written().size();
  ASSERT_TRUE(
      h.waitFor([&] { return load.written().size() > files + 3; }, 20, "writes during the cut"));
  EXPECT_EQ(probe.read(), ErrorCode::kNotServing);

  ASSERT_TRUE(lab.heal(ClusterHarness::storageHost(2)));
  ASSERT_TRUE(h.waitHealthy(60));
  EXPECT_TRUE(h.waitFor([&] { return probe.pick() && probe.read() == ErrorCode::kOk; }, 20,
                        "node 2 serving again"));
  std::this_thread::sleep_for(std::chrono::seconds(1));  // reads from it again
  load.stop();
  EXPECT_EQ(load.failedWrites(), 0) << load.firstError();
  EXPECT_EQ(load.badReads(), 0) << load.firstError();
  EXPECT_GT(load.reads(), 10);
  EXPECT_EQ(load.verifyAll(), 0) << load.firstError();
  h.expectReplicasAgree();
}

// getattr of the root on meta server i, directly (no failover): its code.
ErrorCode metaGetattr(ClusterHarness& h, int i, int timeout_ms) {
  net::RpcClient rpc{net::ClientOptions{}};
  meta::GetattrReq req;
  req.set_ino(1);
  meta::InodeResp resp;
  return rpc
      .callSync(*net::Endpoint::parse(h.metaEndpoint(i)),
                net::Method::of("cistern.meta.MetaService.Getattr"), req, &resp,
                {.timeout_ms = static_cast<uint32_t>(timeout_ms)})
      .code();
}

// A meta server cut off from etcd (the client still reaches it) stops
// serving within half the heartbeat timeout, so the client moves to the
// other at once; healed, it serves again.
TEST(Partition, ACutOffMetaServerStopsServingAndTheClientMovesOn) {
  NetLab lab(ClusterHarness::storageHost(4));
  ASSERT_TRUE(lab.ok());
  ClusterHarness h(labOptions(&lab));
  ASSERT_TRUE(h.ok());
  Workload load(h.client(), /*readers=*/1);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  ASSERT_EQ(metaGetattr(h, 0, 2000), ErrorCode::kOk);
  ASSERT_TRUE(lab.cut(ClusterHarness::metaHost(0)));
  const auto cut_at = Clock::now();
  // Calls that began before the lease ran out wait on the KV (and time out
  // here: 200 ms each); the first call answered kNotServing tells when it
  // stopped serving.
  ErrorCode code = ErrorCode::kOk;
  while (code != ErrorCode::kNotServing && Clock::now() < cut_at + std::chrono::seconds(20)) {
    code = metaGetattr(h, 0, 200);
    if (code == ErrorCode::kOk) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  const auto stopped_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - cut_at).count();
  std::fprintf(stderr, "meta 0 answered %s %lld ms after the cut\n",
               std::string(errorCodeName(code)).c_str(), static_cast<long long>(stopped_ms));
  EXPECT_EQ(code, ErrorCode::kNotServing);
  // The lease ends at most meta.kv_lease_ms (half the heartbeat timeout)
  // after the last read that succeeded was sent, before the cut; a probe
  // sent just before it waits out its 200 ms.
  EXPECT_LE(stopped_ms, kHeartbeatTimeoutMs / 2 + 300);
  const size_t files = load.written().size();
  ASSERT_TRUE(
      h.waitFor([&] { return load.written().size() > files + 5; }, 30, "writes during the cut"));
  EXPECT_EQ(metaGetattr(h, 0, 2000), ErrorCode::kNotServing);
  ASSERT_TRUE(lab.heal(ClusterHarness::metaHost(0)));
  EXPECT_TRUE(h.waitFor([&] { return metaGetattr(h, 0, 2000) == ErrorCode::kOk; }, 20,
                        "meta 0 serving again"));
  load.stop();
  std::fprintf(stderr, "longest write %.2f s\n", load.longestWriteS());
  EXPECT_EQ(load.failedWrites(), 0) << load.firstError();
  EXPECT_EQ(load.badReads(), 0) << load.firstError();
  EXPECT_EQ(load.verifyAll(), 0) << load.firstError();
}

// A linearizable read of `key` through etcd member i alone: its status.
Result<kv::etcd::RangeResponse> readThrough(ClusterHarness& h, size_t i, const std::string& key,
                                            uint32_t timeout_ms) {
  kv::etcd::Client::Options o;
  o.endpoints = {h.etcd().endpoint(i)};
  o.timeout_ms = timeout_ms;
  ASSIGN_OR_RETURN(auto client, kv::etcd::Client::create(o));
  kv::etcd::RangeRequest r;
  r.key = key;
  return client->range(r);
}

// An etcd member cut off from the others and from every cistern process
// (the test still reaches it) answers no read while cut off — it cannot
// reach a quorum — and the cluster goes on with the other two: mgmtd keeps
// a primary, the workload's writes go on. Healed, the member has what was
// written meanwhile.
TEST(Partition, ACutOffEtcdMemberServesNothingAndTheClusterGoesOn) {
  NetLab lab(ClusterHarness::storageHost(4));
  ASSERT_TRUE(lab.ok());
  ClusterHarness h(labOptions(&lab));
  ASSERT_TRUE(h.ok());
  Workload load(h.client(), /*readers=*/1);
  std::this_thread::sleep_for(std::chrono::seconds(1));
  ASSERT_TRUE(readThrough(h, 0, "probe", 2000).ok());
  ASSERT_TRUE(lab.cut(ClusterHarness::etcdHost(0)));
  const auto cut_at = Clock::now();
  // No read through it succeeds once etcd's own check of its quorum has run
  // (an election timeout, 1 s here).
  std::this_thread::sleep_for(std::chrono::milliseconds(1200));
  for (int i = 0; i < 5; ++i) {
    auto r = readThrough(h, 0, "probe", 500);
    EXPECT_FALSE(r.ok())
        << "a read through the cut-off member succeeded "
        << std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - cut_at).count()
        << " ms after the cut";
  }
  const size_t files = load.written().size();
  ASSERT_TRUE(
      h.waitFor([&] { return load.written().size() > files + 5; }, 30, "writes during the cut"));
  EXPECT_GE(h.primary(), 0);
  // What the cluster wrote meanwhile (through the others)...
  const auto during = readThrough(h, 1, "probe", 2000);
  ASSERT_TRUE(during.ok());
  ASSERT_TRUE(lab.heal(ClusterHarness::etcdHost(0)));
  // ...the healed member has too (its reads see at least that revision).
  EXPECT_TRUE(h.waitFor(
      [&] {
        auto r = readThrough(h, 0, "probe", 1000);
        return r.ok() && r->revision >= during->revision;
      },
      20, "the healed member caught up"));
  load.stop();
  std::fprintf(stderr, "longest write %.2f s\n", load.longestWriteS());
  EXPECT_EQ(load.failedWrites(), 0) << load.firstError();
  EXPECT_EQ(load.badReads(), 0) << load.firstError();
  EXPECT_EQ(load.verifyAll(), 0) << load.firstError();
  EXPECT_TRUE(h.healthy(h.routing()));
}

}  // namespace
}  // namespace cistern

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::string why;
  if (!cistern::testing::NetLab::enterPrivateNetwork(&why)) {
    std::fprintf(stderr, "partition_test needs a network namespace of its own: %s\n", why.c_str());
    return 1;
  }
  return RUN_ALL_TESTS();
}
