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
  ErrorCode read() {
    storage::BatchReadReq req;
    auto* range = req.add_ranges();
    range->mutable_chunk()->set_inode(chunk.first);
    range->mutable_chunk()->set_index(chunk.second);
    range->set_length(1 << 20);
    range->set_chain(chain);
    range->set_chain_version(chain_version);
    storage::BatchReadResp resp;
    size_t got = 0;
    Status s = rpc.callSync(*net::Endpoint::parse(h.storageEndpoint(node)),
                            testing::storageMethod("BatchRead"), req, &resp,
                            {.timeout_ms = 1000, .response_payload = bytes,
                             .response_payload_len = &got});
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
  // before the cut; 100 ms for the probe's own round trips.
  EXPECT_LE(stopped_ms, kHeartbeatTimeoutMs / 2 + 100);
  std::fprintf(stderr, "node 2 stopped serving %lld ms after the cut\n",
               static_cast<long long>(stopped_ms));

  const uint32_t target2 = targetOf(h.routing(), h.storageEndpoint(2));
  ASSERT_TRUE(h.waitFor(
      [&] {
        const auto r = h.routing();
        for (const auto& c : r.chains())
          for (uint32_t t : c.targets())
            if (t == target2) return false;
        return true;
      },
      10, "the cut-off node out of every chain"));
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

}  // namespace
}  // namespace cistern

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  std::string why;
  if (!cistern::testing::NetLab::enterPrivateNetwork(&why)) {
    std::fprintf(stderr, "partition_test needs a network namespace of its own: %s\n",
                 why.c_str());
    return 1;
  }
  return RUN_ALL_TESTS();
}
