// The primary mgmtd's bookkeeping on a KV and a manual clock: registration
// keeps target ids, chains are laid out once, a node silent past the
// timeout leaves its chains within one tick and comes back through
// WAITING and SYNCING, heartbeats carry newer routing, and a new primary
// gives every target one timeout's grace.
#include "mgmtd/cluster_manager.h"

#include <gtest/gtest.h>

#include <functional>
#include <set>

#include "common/metrics.h"
#include "kv/cluster_keys.h"
#include "mgmtd/mgmt_service.h"
#include "mgmtd/routing_table.h"
#include "net/rpc_client.h"

namespace cistern::mgmtd {
namespace {

using namespace std::chrono_literals;

class ClusterManagerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    kv_ = kv::openMemEngine();
    mgr_ = std::make_unique<ClusterManager>(*kv_, clock_, ClusterManagerOptions{10000});
  }
  mgmt::RegisterNodeResp reg(int node, std::vector<std::string> paths = {"/d0"}) {
    mgmt::RegisterNodeReq r;
    r.set_name("node" + std::to_string(node));
    r.set_endpoint("10.0.0." + std::to_string(node) + ":7430");
    for (auto& p : paths) r.add_target_paths(p);
    auto resp = mgr_->registerNode(r);
    EXPECT_TRUE(resp.ok()) << resp.status().toString();
    return resp.ok() ? *resp : mgmt::RegisterNodeResp{};
  }
  mgmt::HeartbeatResp beat(int node, std::vector<uint32_t> alive,
                           std::vector<std::pair<uint32_t, uint32_t>> synced = {},
                           uint64_t known = 0) {
    mgmt::HeartbeatReq r;
    r.set_name("node" + std::to_string(node));
    for (uint32_t t : alive) r.add_alive_targets(t);
    for (auto [c, t] : synced) {
      auto* s = r.add_synced();
      s->set_chain(c);
      s->set_target(t);
    }
    r.set_routing_version(known);
    auto resp = mgr_->heartbeat(r);
    EXPECT_TRUE(resp.ok()) << resp.status().toString();
    return resp.ok() ? *resp : mgmt::HeartbeatResp{};
  }
  std::map<uint32_t, mgmt::Chain> chains() {
    auto r = loadRouting(*kv_);
    EXPECT_TRUE(r.ok()) << r.status().toString();
    std::map<uint32_t, mgmt::Chain> out;
    for (auto& c : r->chains()) out[c.id()] = c;
    return out;
  }
  // State of `target` in `chain`.
  mgmt::TargetState stateIn(const mgmt::Chain& chain, uint32_t target) {
    for (auto& m : chain.members())
      if (m.target() == target) return m.state();
    ADD_FAILURE() << "target " << target << " not in chain " << chain.id();
    return mgmt::OFFLINE;
  }

  static int64_t gauge(const char* name) { return metrics::Registry::global().gauge(name).value(); }

  ManualClock clock_;
  std::unique_ptr<kv::Engine> kv_;
  std::unique_ptr<ClusterManager> mgr_;
};

TEST_F(ClusterManagerTest, RegistrationGivesIdsAndKeepsThemForKnownPaths) {
  auto a = reg(1, {"/d0", "/d1"});
  EXPECT_EQ(std::vector<uint32_t>(a.target_ids().begin(), a.target_ids().end()),
            (std::vector<uint32_t>{1, 2}));
  EXPECT_EQ(a.heartbeat_timeout_ms(), 10000u);
  auto b = reg(2);
  EXPECT_EQ(b.target_ids(0), 3u);
  auto again = reg(1, {"/d1", "/d0", "/d2"});
  EXPECT_EQ(std::vector<uint32_t>(again.target_ids().begin(), again.target_ids().end()),
            (std::vector<uint32_t>{2, 1, 4}));
  auto same = reg(1, {"/d1", "/d0", "/d2"});
  EXPECT_EQ(same.routing_version(), again.routing_version()) << "nothing changed";
  mgmt::RegisterNodeReq bad;
  EXPECT_EQ(mgr_->registerNode(bad).code(), ErrorCode::kInvalidArgument);
  bad.set_name("x");
  EXPECT_EQ(mgr_->registerNode(bad).code(), ErrorCode::kInvalidArgument);
  mgmt::HeartbeatReq stranger;
  stranger.set_name("never-registered");
  EXPECT_EQ(mgr_->heartbeat(stranger).code(), ErrorCode::kNotFound);
  mgmt::HeartbeatReq wrong;
  wrong.set_name("node2");
  wrong.add_alive_targets(1);  // node1's
  EXPECT_EQ(mgr_->heartbeat(wrong).code(), ErrorCode::kInvalidArgument);
}

TEST_F(ClusterManagerTest, ChainsAreLaidOutOnceOverDistinctNodes) {
  for (int n = 1; n <= 4; ++n) reg(n);
  mgmt::CreateChainsReq req;
  req.set_replication(3);
  req.set_chains(8);
  auto made = mgr_->createChains(req);
  ASSERT_TRUE(made.ok()) << made.status().toString();
  ASSERT_EQ(made->chains_size(), 8);
  for (auto& c : made->chains()) {
    EXPECT_EQ(std::set<uint32_t>(c.targets().begin(), c.targets().end()).size(), 3u);
    EXPECT_EQ(c.members_size(), 3);
  }
  EXPECT_EQ(chains().size(), 8u);
  EXPECT_EQ(mgr_->createChains(req).code(), ErrorCode::kAlreadyExists);
  req.set_replication(5);
  EXPECT_EQ(mgr_->createChains(req).code(), ErrorCode::kAlreadyExists);
}

TEST_F(ClusterManagerTest, ASilentNodeLeavesItsChainsAndComesBackThroughASync) {
  for (int n = 1; n <= 4; ++n) reg(n);
  mgmt::CreateChainsReq req;
  req.set_replication(3);
  req.set_chains(4);
  ASSERT_TRUE(mgr_->createChains(req).ok());
  auto v0 = mgr_->tick();
  ASSERT_TRUE(v0.ok());
  // Nodes 1-3 beat every 3 s; node 4 (target 4) stops.
  for (int s = 0; s < 4; ++s) {
    clock_.advance(3s);
    for (int n = 1; n <= 3; ++n) beat(n, {static_cast<uint32_t>(n)});
  }
  auto v1 = mgr_->tick();
  ASSERT_TRUE(v1.ok());
  EXPECT_GT(*v1, *v0) << "routing moved";
  // The step's gauges: 3 of the 4 chains hold target 4, which is silent.
  EXPECT_EQ(gauge("mgmtd_chains"), 4);
  EXPECT_EQ(gauge("mgmtd_chains_degraded"), 3);
  EXPECT_EQ(gauge("mgmtd_chains_unavailable"), 0);
  EXPECT_EQ(gauge("mgmtd_targets_silent"), 1);
  for (auto& [id, c] : chains()) {
    for (uint32_t t : c.targets()) EXPECT_NE(t, 4u) << "chain " << id << " still routes to 4";
    bool had4 = false;
    for (auto& m : c.members()) had4 |= m.target() == 4;
    if (had4) {
      EXPECT_EQ(stateIn(c, 4), mgmt::OFFLINE);
      EXPECT_EQ(c.members(c.members_size() - 1).target(), 4u) << "offline goes last";
      EXPECT_EQ(c.version(), 2u);
    }
  }
  // A node holding an older routing version gets the table with the beat.
  auto hb = beat(1, {1}, {}, *v0);
  EXPECT_EQ(hb.routing_version(), *v1);
  EXPECT_TRUE(hb.has_routing());
  EXPECT_FALSE(beat(1, {1}, {}, *v1).has_routing());

  // Back: WAITING, then SYNCING, then (synced) SERVING at the tail.
  beat(4, {4});
  ASSERT_TRUE(mgr_->tick().ok());
  std::vector<uint32_t> with4;
  for (auto& [id, c] : chains()) {
    for (auto& m : c.members())
      if (m.target() == 4) with4.push_back(id);
  }
  ASSERT_FALSE(with4.empty());
  for (uint32_t id : with4) EXPECT_EQ(stateIn(chains()[id], 4), mgmt::WAITING);
  ASSERT_TRUE(mgr_->tick().ok());
  for (uint32_t id : with4) EXPECT_EQ(stateIn(chains()[id], 4), mgmt::SYNCING);
  std::vector<std::pair<uint32_t, uint32_t>> synced;
  for (uint32_t id : with4) synced.push_back({id, 4});
  beat(4, {4}, synced);
  for (int n = 1; n <= 3; ++n) beat(n, {static_cast<uint32_t>(n)});
  ASSERT_TRUE(mgr_->tick().ok());
  for (uint32_t id : with4) {
    auto c = chains()[id];
    EXPECT_EQ(stateIn(c, 4), mgmt::SERVING);
    EXPECT_EQ(c.targets(c.targets_size() - 1), 4u) << "joins at the tail";
    EXPECT_EQ(c.targets_size(), 3);
  }
  EXPECT_EQ(gauge("mgmtd_chains_degraded"), 0);
  EXPECT_EQ(gauge("mgmtd_targets_silent"), 0);
}

// A storage process that restarts within the heartbeat timeout registers
// again: it may have lost uncommitted versions it held in memory, so its
// target leaves its chains at the next tick and comes back through a sync.
// Registering before any chain exists takes nothing out.
TEST_F(ClusterManagerTest, ANodeThatRegistersAgainLeavesItsChainsAndSyncsBack) {
  for (int n = 1; n <= 3; ++n) reg(n);
  mgmt::CreateChainsReq req;
  req.set_replication(3);
  req.set_chains(3);
  ASSERT_TRUE(mgr_->createChains(req).ok());
  ASSERT_TRUE(mgr_->tick().ok());
  for (auto& [id, c] : chains()) EXPECT_EQ(c.targets_size(), 3) << "first registrations";
  clock_.advance(1s);
  reg(2);  // restarted, well within the timeout
  ASSERT_TRUE(mgr_->tick().ok());
  for (auto& [id, c] : chains()) {
    EXPECT_EQ(c.targets_size(), 2) << "chain " << id;
    EXPECT_EQ(stateIn(c, 2), mgmt::OFFLINE);
  }
  beat(2, {2});
  ASSERT_TRUE(mgr_->tick().ok());
  for (auto& [id, c] : chains()) EXPECT_EQ(stateIn(c, 2), mgmt::WAITING) << "alive again";
}

// A node registers again and the primary dies before its next step: the
// new primary still takes the restarted target out (the mark is in the KV,
// not in the old primary's memory). Found by the simulation: the chain
// stayed with a member that, behind its restart fence, refused every
// change.
TEST_F(ClusterManagerTest, ARestartSeenByAPrimaryThatDiedIsNotLost) {
  for (int n = 1; n <= 3; ++n) reg(n);
  mgmt::CreateChainsReq req;
  req.set_replication(3);
  req.set_chains(2);
  ASSERT_TRUE(mgr_->createChains(req).ok());
  ASSERT_TRUE(mgr_->tick().ok());
  clock_.advance(1s);
  reg(3);  // restarted; then the primary dies before it steps
  mgr_ = std::make_unique<ClusterManager>(*kv_, clock_, ClusterManagerOptions{10000});
  ASSERT_TRUE(mgr_->tick().ok());
  for (auto& [id, c] : chains()) {
    EXPECT_EQ(stateIn(c, 3), mgmt::OFFLINE) << "chain " << id;
    EXPECT_EQ(c.targets_size(), 2);
  }
  // The mark was cleared: alive, it comes back (not taken out again).
  ASSERT_TRUE(mgr_->tick().ok());
  for (auto& [id, c] : chains()) EXPECT_EQ(stateIn(c, 3), mgmt::WAITING) << "chain " << id;
  auto routing = loadRouting(*kv_);
  ASSERT_TRUE(routing.ok());
  for (const auto& t : routing->targets()) EXPECT_FALSE(t.restarted()) << t.id();
}

TEST_F(ClusterManagerTest, ANewPrimaryGivesEveryTargetOneTimeoutOfGrace) {
  for (int n = 1; n <= 3; ++n) reg(n);
  mgmt::CreateChainsReq req;
  req.set_replication(3);
  req.set_chains(3);
  ASSERT_TRUE(mgr_->createChains(req).ok());
  clock_.advance(60s);  // the old primary heard nothing for a minute, then died
  mgr_ = std::make_unique<ClusterManager>(*kv_, clock_, ClusterManagerOptions{10000});
  auto v = mgr_->tick();
  ASSERT_TRUE(v.ok());
  for (auto& [id, c] : chains()) EXPECT_EQ(c.targets_size(), 3) << "chain " << id;
  clock_.advance(5s);
  beat(1, {1});
  beat(2, {2});
  clock_.advance(6s);
  ASSERT_TRUE(mgr_->tick().ok());
  for (auto& [id, c] : chains()) {
    EXPECT_EQ(c.targets_size(), 2) << "chain " << id;
    EXPECT_EQ(stateIn(c, 3), mgmt::OFFLINE);
  }
}

// Re-replication: a member silent past the grace period is replaced by a
// target on a node the chain does not use, which joins as WAITING, syncs
// and serves at the tail; the chain is back to three with no operator.
// A chain whose only holder of the newest data is LASTSRV waits for it.
TEST_F(ClusterManagerTest, AMemberSilentPastTheGraceIsReplacedAndTheChainIsWholeAgain) {
  mgr_ = std::make_unique<ClusterManager>(*kv_, clock_, ClusterManagerOptions{10000, 60000});
  for (int n = 1; n <= 5; ++n) reg(n);
  mgmt::CreateChainsReq req;
  req.set_replication(3);
  req.set_chains(5);
  ASSERT_TRUE(mgr_->createChains(req).ok());
  std::vector<uint32_t> with5;
  for (auto& [id, c] : chains()) {
    for (uint32_t t : c.targets())
      if (t == 5) with5.push_back(id);
  }
  ASSERT_FALSE(with5.empty());
  const auto beatAllBut5 = [&] {
    for (int n = 1; n <= 4; ++n) beat(n, {static_cast<uint32_t>(n)});
  };
  for (int s = 0; s < 4; ++s) {  // 20 s: OFFLINE, not replaced yet
    clock_.advance(5s);
    beatAllBut5();
    ASSERT_TRUE(mgr_->tick().ok());
  }
  for (uint32_t id : with5) EXPECT_EQ(stateIn(chains()[id], 5), mgmt::OFFLINE);
  for (int s = 0; s < 8; ++s) {  // 60 s: gone
    clock_.advance(5s);
    beatAllBut5();
    ASSERT_TRUE(mgr_->tick().ok());
  }
  std::map<uint32_t, uint32_t> added;  // chain -> its new member
  for (uint32_t id : with5) {
    auto c = chains()[id];
    std::set<uint32_t> members;
    for (auto& m : c.members()) {
      EXPECT_NE(m.target(), 5u) << "chain " << id << " still lists the lost target";
      members.insert(m.target());
      if (m.state() == mgmt::SYNCING || m.state() == mgmt::WAITING) added[id] = m.target();
    }
    EXPECT_EQ(members.size(), 3u) << "chain " << id;
    ASSERT_TRUE(added.count(id)) << "chain " << id << " got no replacement";
    EXPECT_EQ(c.targets_size(), 2) << "the newcomer is not read before it synced";
  }
  ASSERT_TRUE(mgr_->tick().ok());
  std::vector<std::pair<uint32_t, uint32_t>> synced;
  for (auto [id, t] : added) {
    EXPECT_EQ(stateIn(chains()[id], t), mgmt::SYNCING) << "chain " << id;
    synced.push_back({id, t});
  }
  for (auto [id, t] : synced) beat(static_cast<int>(t), {t}, {{id, t}});
  beatAllBut5();
  ASSERT_TRUE(mgr_->tick().ok());
  for (uint32_t id : with5) {
    auto c = chains()[id];
    EXPECT_EQ(c.targets_size(), 3) << "chain " << id << " whole again";
    EXPECT_EQ(c.targets(2), added[id]) << "the newcomer serves at the tail";
  }
  // Node 5 coming back now is in no chain: nothing moves for it.
  auto before = chains();
  beat(5, {5});
  ASSERT_TRUE(mgr_->tick().ok());
  for (auto& [id, c] : chains()) EXPECT_EQ(c.version(), before[id].version()) << "chain " << id;
}

// Steps until no chain has a member syncing or waiting, reporting each
// SYNCING member synced, and checks at every step that no chain has fewer
// than `rf` SERVING members (a move adds before it removes).
void settleMoves(
    ClusterManager& mgr, int nodes, int rf, std::function<std::map<uint32_t, mgmt::Chain>()> chains,
    std::function<void(int, std::vector<uint32_t>, std::vector<std::pair<uint32_t, uint32_t>>)>
        beat) {
  for (int step = 0; step < 20; ++step) {
    std::map<uint32_t, std::vector<std::pair<uint32_t, uint32_t>>> synced;  // node -> syncs
    bool busy = false;
    for (auto& [id, c] : chains()) {
      EXPECT_GE(c.targets_size(), rf) << "chain " << id << " at step " << step;
      for (auto& m : c.members()) {
        if (m.state() == mgmt::SYNCING) synced[m.target()].push_back({id, m.target()});
        busy |= m.state() != mgmt::SERVING || c.leaving() != 0;
      }
    }
    if (!busy) return;
    for (int n = 1; n <= nodes; ++n)
      beat(n, {static_cast<uint32_t>(n)}, synced[static_cast<uint32_t>(n)]);
    ASSERT_TRUE(mgr.tick().ok());
  }
  ADD_FAILURE() << "moves did not finish in 20 steps";
}

// A node joins: rebalance --dry-run shows a plan and changes nothing; the
// rebalance adds each new replica, which syncs, before the old one leaves
// (never fewer than three SERVING); afterwards the targets are within the
// spread. Draining a node moves every replica off it; an unknown node is
// refused.
TEST_F(ClusterManagerTest, ARebalanceFillsANewNodeAndADrainEmptiesOne) {
  for (int n = 1; n <= 4; ++n) reg(n);
  mgmt::CreateChainsReq create;
  create.set_replication(3);
  create.set_chains(8);
  ASSERT_TRUE(mgr_->createChains(create).ok());
  reg(5);
  auto chainsFn = [this] { return chains(); };
  auto beatFn = [this](int n, std::vector<uint32_t> alive,
                       std::vector<std::pair<uint32_t, uint32_t>> synced) {
    beat(n, std::move(alive), std::move(synced));
  };
  for (int n = 1; n <= 5; ++n) beat(n, {static_cast<uint32_t>(n)});
  ASSERT_TRUE(mgr_->tick().ok());
  auto before = chains();
  mgmt::RebalanceReq req;
  req.set_spread(1);
  req.set_dry_run(true);
  auto plan = mgr_->rebalance(req);
  ASSERT_TRUE(plan.ok()) << plan.status().toString();
  ASSERT_GT(plan->moves_size(), 0);
  for (auto& [id, c] : chains()) EXPECT_EQ(c.version(), before[id].version()) << "dry run";
  req.set_dry_run(false);
  auto started = mgr_->rebalance(req);
  ASSERT_TRUE(started.ok());
  EXPECT_EQ(started->moves_size(), plan->moves_size());
  settleMoves(*mgr_, 5, 3, chainsFn, beatFn);
  std::map<uint32_t, int> uses;
  for (auto& [id, c] : chains()) {
    EXPECT_EQ(c.members_size(), 3) << "chain " << id;
    EXPECT_EQ(c.leaving(), 0u);
    for (uint32_t t : c.targets()) ++uses[t];
  }
  int lo = 100, hi = 0;
  for (uint32_t t = 1; t <= 5; ++t) {
    lo = std::min(lo, uses[t]);
    hi = std::max(hi, uses[t]);
  }
  EXPECT_LE(hi - lo, 1) << "24 replicas on 5 targets";
  // Drain node 2.
  mgmt::RebalanceReq drain;
  drain.set_spread(100);
  drain.add_drain("node2");
  auto drained = mgr_->rebalance(drain);
  ASSERT_TRUE(drained.ok());
  EXPECT_EQ(drained->moves_size(), uses[2]);
  settleMoves(*mgr_, 5, 3, chainsFn, beatFn);
  for (auto& [id, c] : chains())
    for (auto& m : c.members()) EXPECT_NE(m.target(), 2u) << "chain " << id << " still on node2";
  mgmt::RebalanceReq unknown;
  unknown.add_drain("node9");
  EXPECT_EQ(mgr_->rebalance(unknown).status().code(), ErrorCode::kNotFound);
}

// mgmtd keeps each chain's versions as it committed them (ChainHistory):
// a node's restarts show step by step, and only each chain's last 64.
TEST_F(ClusterManagerTest, TheChainHistoryKeepsEachChainsLastVersions) {
  for (int n = 1; n <= 3; ++n) reg(n);
  mgmt::CreateChainsReq create;
  create.set_replication(3);
  create.set_chains(1);
  ASSERT_TRUE(mgr_->createChains(create).ok());
  ASSERT_TRUE(mgr_->tick().ok());
  for (int round = 0; round < 30; ++round) {
    reg(3);  // a restart: out at the next step, back through a sync
    for (int step = 0; step < 4; ++step) {
      for (int n = 1; n <= 2; ++n) beat(n, {static_cast<uint32_t>(n)});
      beat(3, {3}, {{1, 3}});
      ASSERT_TRUE(mgr_->tick().ok());
    }
  }
  const mgmt::Chain now = chains()[1];
  ASSERT_GT(now.version(), kv::kChainHistoryKept);
  auto h = mgr_->chainHistory({});
  ASSERT_TRUE(h.ok()) << h.status().toString();
  ASSERT_EQ(h->events_size(), static_cast<int>(kv::kChainHistoryKept));
  EXPECT_EQ(h->events(0).chain().version(), now.version() - kv::kChainHistoryKept + 1);
  const auto& last = h->events(h->events_size() - 1);
  EXPECT_EQ(last.chain().SerializeAsString(), now.SerializeAsString());
  std::set<mgmt::TargetState> seen;
  for (int i = 0; i < h->events_size(); ++i) {
    const auto& e = h->events(i);
    EXPECT_GT(e.unix_ms(), 0);
    if (i > 0) {
      EXPECT_EQ(e.chain().version(), h->events(i - 1).chain().version() + 1);
    }
    for (const auto& m : e.chain().members()) seen.insert(m.state());
  }
  EXPECT_TRUE(seen.count(mgmt::OFFLINE) && seen.count(mgmt::SYNCING)) << "the restarts' steps";
  mgmt::ChainHistoryReq other;
  other.set_chain(2);
  EXPECT_EQ(mgr_->chainHistory(other)->events_size(), 0);
}

TEST_F(ClusterManagerTest, AChainWaitingForItsLastServingMemberIsNotReplaced) {
  mgr_ = std::make_unique<ClusterManager>(*kv_, clock_, ClusterManagerOptions{10000, 30000});
  for (int n = 1; n <= 4; ++n) reg(n);
  mgmt::CreateChainsReq req;
  req.set_replication(2);
  req.set_chains(1);
  ASSERT_TRUE(mgr_->createChains(req).ok());
  auto chain = chains()[1];
  std::set<uint32_t> members(chain.targets().begin(), chain.targets().end());
  // Both members go silent; the two other nodes keep beating.
  for (int s = 0; s < 12; ++s) {
    clock_.advance(5s);
    for (uint32_t n = 1; n <= 4; ++n)
      if (!members.count(n)) beat(static_cast<int>(n), {n});
    ASSERT_TRUE(mgr_->tick().ok());
  }
  auto c = chains()[1];
  int lastsrv = 0;
  for (auto& m : c.members()) {
    EXPECT_TRUE(members.count(m.target())) << "target " << m.target() << " put in";
    lastsrv += m.state() == mgmt::LASTSRV;
  }
  EXPECT_EQ(lastsrv, 1);
}

}  // namespace
}  // namespace cistern::mgmtd

namespace cistern::mgmtd {
namespace {

// The same calls over mgmtd's RPC service; a one-machine mgmtd (no cluster
// manager) refuses them with kNotSupported.
TEST(MgmtServiceCluster, NodesRegisterAndBeatOverRpc) {
  auto kv = kv::openMemEngine();
  ManualClock clock;
  ClusterManager manager(*kv, clock);
  net::ServerOptions so;
  so.threads = 1;
  net::RpcServer server(so);
  MgmtService service(*kv, server, MgmtHooks{.cluster = &manager});
  net::RpcServer plain_server(so);
  MgmtService plain(*kv, plain_server, MgmtHooks{});
  ASSERT_TRUE(server.start().ok());
  ASSERT_TRUE(plain_server.start().ok());
  net::RpcClient client(net::ClientOptions{});
  mgmt::RegisterNodeReq reg;
  reg.set_name("n1");
  reg.set_endpoint("127.0.0.1:1");
  reg.add_target_paths("/d");
  mgmt::RegisterNodeResp resp;
  const auto kRegister = net::Method::of("cistern.mgmt.MgmtService.RegisterNode");
  ASSERT_TRUE(client.callSync(server.endpoint(), kRegister, reg, &resp).ok());
  EXPECT_EQ(resp.target_ids_size(), 1);
  mgmt::HeartbeatReq hb;
  hb.set_name("n1");
  hb.add_alive_targets(resp.target_ids(0));
  mgmt::HeartbeatResp hb_resp;
  ASSERT_TRUE(client
                  .callSync(server.endpoint(),
                            net::Method::of("cistern.mgmt.MgmtService.Heartbeat"), hb, &hb_resp)
                  .ok());
  EXPECT_EQ(hb_resp.routing_version(), resp.routing_version());
  EXPECT_TRUE(hb_resp.has_routing());
  EXPECT_EQ(client.callSync(plain_server.endpoint(), kRegister, reg, &resp).code(),
            ErrorCode::kNotSupported);
  server.stop();
  plain_server.stop();
}

}  // namespace
}  // namespace cistern::mgmtd
