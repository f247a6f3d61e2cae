// `cistern serve --role mgmtd` on a real 3-member etcd cluster, with storage
// nodes played by the test over mgmtd's RPC: chains are laid out over four
// nodes, a node that stops beating is routed around within the heartbeat
// timeout plus a tick, the state survives a SIGKILL of mgmtd (it is in
// etcd), and the node comes back through WAITING and SYNCING.
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <thread>

#include "kv/etcd_client.h"
#include "mgmt.pb.h"
#include "net/rpc_client.h"
#include "tests/support/etcd_cluster.h"
#include "tests/support/serve_process.h"

namespace cistern {
namespace {

using Clock = std::chrono::steady_clock;

const net::Method& method(const char* name) {
  static std::map<std::string, net::Method> methods;
  static std::mutex mu;
  std::lock_guard lock(mu);
  auto it = methods.find(name);
  if (it == methods.end())
    it = methods.emplace(name, net::Method::of(std::string("cistern.mgmt.MgmtService.") + name))
             .first;
  return it->second;
}

class MgmtdCluster : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ::testing::TempDir() + "/cistern-mgmtd-" + std::to_string(getpid());
    etcd_ = testing::EtcdCluster::start(dir_ + "/etcd", 3);
    ASSERT_NE(etcd_, nullptr);
    port_ = testing::freeLoopbackPort();
    config_ = writeConfig("mgmtd", port_);
    mgmtd_ = std::make_unique<testing::ServeProcess>(CISTERN_BIN, "mgmtd", config_);
    ASSERT_TRUE(mgmtd_->start());
    mgmtd_ep_ = endpointAt(port_);
    // The only mgmtd becomes primary within a lease round.
    for (auto until = Clock::now() + std::chrono::seconds(10);;) {
      mgmt::RegisterNodeReq probe;
      mgmt::RegisterNodeResp resp;
      Status s = call("RegisterNode", probe, &resp);
      if (s.code() != ErrorCode::kNotPrimary && s.code() != ErrorCode::kConnectionFailed) break;
      ASSERT_LT(Clock::now(), until) << "no primary mgmtd: " << s.toString();
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
  // A config of one mgmtd on `port`, sharing this test's etcd prefix.
  std::string writeConfig(const std::string& name, int port) {
    std::string path = dir_ + "/" + name + ".toml";
    std::ofstream f(path);
    f << "mgmtd.listen = \"127.0.0.1:" << port << "\"\n"
      << "mgmtd.heartbeat_timeout_ms = 1500\nmgmtd.tick_ms = 200\nmgmtd.lease_ms = 2000\n"
      << "mgmtd.compact_interval_s = 1\n"
      << "kv.backend = \"etcd\"\nkv.etcd.prefix = \"test-" << getpid() << "/\"\n"
      << "kv.etcd.endpoints = [";
    for (size_t i = 0; i < etcd_->size(); ++i)
      f << (i ? ", " : "") << "\"" << etcd_->endpoint(i) << "\"";
    f << "]\n";
    return path;
  }
  static net::Endpoint endpointAt(int port) {
    return *net::Endpoint::parse("127.0.0.1:" + std::to_string(port));
  }
  void TearDown() override {
    stop_beats_ = true;
    for (auto& t : beaters_) t.join();
    mgmtd_.reset();
    etcd_.reset();
  }

  template <typename Req, typename Resp>
  Status call(const char* name, const Req& req, Resp* resp) {
    return callAt(mgmtd_ep_, name, req, resp);
  }
  template <typename Req, typename Resp>
  Status callAt(const net::Endpoint& ep, const char* name, const Req& req, Resp* resp) {
    return client_.callSync(ep, method(name), req, resp, {.timeout_ms = 3000});
  }
  // The routing table; tried again for up to 5 s (a restarted mgmtd: the
  // first call finds the old connection closed).
  mgmt::Routing routing() {
    mgmt::GetRoutingReq req;
    mgmt::Routing r;
    Status s;
    for (auto until = Clock::now() + std::chrono::seconds(5); Clock::now() < until;) {
      if ((s = call("GetRouting", req, &r)).ok()) return r;
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    ADD_FAILURE() << "GetRouting: " << s.toString();
    return r;
  }
  // Whether any chain routes to `target`, and its state in each chain.
  bool routed(const mgmt::Routing& r, uint32_t target) {
    for (auto& c : r.chains())
      for (uint32_t t : c.targets())
        if (t == target) return true;
    return false;
  }
  std::vector<mgmt::TargetState> statesOf(const mgmt::Routing& r, uint32_t target) {
    std::vector<mgmt::TargetState> out;
    for (auto& c : r.chains())
      for (auto& m : c.members())
        if (m.target() == target) out.push_back(m.state());
    return out;
  }
  // Node `n` beats every 300 ms while `alive[n]`.
  void beatWhile(int n, uint32_t target, std::atomic<bool>* alive, std::vector<uint32_t>* synced) {
    beaters_.emplace_back([this, n, target, alive, synced] {
      net::RpcClient c(net::ClientOptions{});
      while (!stop_beats_) {
        if (alive->load()) {
          mgmt::HeartbeatReq hb;
          hb.set_name("node" + std::to_string(n));
          hb.add_alive_targets(target);
          if (synced) {
            std::lock_guard lock(synced_mu_);
            for (uint32_t chain : *synced) {
              auto* s = hb.add_synced();
              s->set_chain(chain);
              s->set_target(target);
            }
          }
          mgmt::HeartbeatResp resp;
          (void)c.callSync(mgmtd_ep_, method("Heartbeat"), hb, &resp, {.timeout_ms = 2000});
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(300));
      }
    });
  }

  std::string dir_, config_;
  int port_ = 0;
  std::unique_ptr<testing::EtcdCluster> etcd_;
  std::unique_ptr<testing::ServeProcess> mgmtd_;
  net::Endpoint mgmtd_ep_;
  net::RpcClient client_{net::ClientOptions{}};
  std::atomic<bool> stop_beats_{false};
  std::vector<std::thread> beaters_;
  std::mutex synced_mu_;
};

// The primary compacts etcd's history every interval (1 s here), keeping
// one interval: a read at an early revision is refused as compacted.
TEST_F(MgmtdCluster, ThePrimaryCompactsEtcdsHistory) {
  kv::etcd::Client::Options co;
  co.endpoints = {etcd_->endpoint(0)};
  auto etcd = kv::etcd::Client::create(co);
  ASSERT_TRUE(etcd.ok()) << etcd.status().toString();
  for (int n = 1; n <= 2; ++n) {  // writes: the revision moves past 2
    mgmt::RegisterNodeReq reg;
    reg.set_name("node" + std::to_string(n));
    reg.set_endpoint("127.0.0.1:" + std::to_string(20000 + n));
    reg.add_target_paths("/data/t0");
    mgmt::RegisterNodeResp resp;
    ASSERT_TRUE(call("RegisterNode", reg, &resp).ok());
  }
  kv::etcd::RangeRequest old;
  old.key = "x";
  old.revision = 2;
  Status s;
  for (auto until = Clock::now() + std::chrono::seconds(15); Clock::now() < until;) {
    s = (*etcd)->range(old).status();
    if (s.code() == ErrorCode::kTxnTooOld) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
  EXPECT_EQ(s.code(), ErrorCode::kTxnTooOld) << "revision 2 still readable: " << s.toString();
}

TEST_F(MgmtdCluster, ASilentNodeIsRoutedAroundAndComesBackThroughASync) {
  std::atomic<bool> alive[5];
  uint32_t target_of[5] = {};
  for (int n = 1; n <= 4; ++n) {
    mgmt::RegisterNodeReq reg;
    reg.set_name("node" + std::to_string(n));
    reg.set_endpoint("127.0.0.1:" + std::to_string(20000 + n));
    reg.add_target_paths("/data/t0");
    mgmt::RegisterNodeResp resp;
    ASSERT_TRUE(call("RegisterNode", reg, &resp).ok());
    ASSERT_EQ(resp.target_ids_size(), 1);
    target_of[n] = resp.target_ids(0);
    alive[n] = true;
  }
  mgmt::CreateChainsReq create;
  create.set_replication(3);
  create.set_chains(4);
  mgmt::CreateChainsResp chains;
  ASSERT_TRUE(call("CreateChains", create, &chains).ok());
  std::vector<uint32_t> synced4;
  for (int n = 1; n <= 4; ++n) beatWhile(n, target_of[n], &alive[n], n == 4 ? &synced4 : nullptr);
  std::this_thread::sleep_for(std::chrono::seconds(2));
  ASSERT_TRUE(routed(routing(), target_of[4])) << "all nodes beat: nothing changes";

  // Node 4 stops: out of every chain within the timeout and a tick or two.
  alive[4] = false;
  const auto stopped = Clock::now();
  while (routed(routing(), target_of[4])) {
    ASSERT_LT(Clock::now() - stopped, std::chrono::seconds(10)) << "node 4 still routed";
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const double routed_around_s = std::chrono::duration<double>(Clock::now() - stopped).count();
  EXPECT_LT(routed_around_s, 3.0) << "the goal: routing updated within 3 s";
  std::fprintf(stderr, "node 4 routed around after %.2f s (timeout 1.5 s, tick 0.2 s)\n",
               routed_around_s);
  for (auto s : statesOf(routing(), target_of[4])) EXPECT_EQ(s, mgmt::OFFLINE);

  // mgmtd dies and comes back: the chains are in etcd.
  const uint64_t version = routing().version();
  mgmtd_->kill(SIGKILL);
  mgmtd_ = std::make_unique<testing::ServeProcess>(CISTERN_BIN, "mgmtd", config_);
  ASSERT_TRUE(mgmtd_->start());
  auto after = routing();
  EXPECT_GE(after.version(), version);
  EXPECT_FALSE(routed(after, target_of[4]));
  EXPECT_EQ(after.chains_size(), 4);

  // Node 4 beats again: it waits, then syncs (one chain at a time per
  // chain), then, its syncs reported, serves at the tails.
  alive[4] = true;
  std::vector<uint32_t> chains_of4;
  for (auto& c : after.chains())
    for (auto& m : c.members())
      if (m.target() == target_of[4]) chains_of4.push_back(c.id());
  ASSERT_FALSE(chains_of4.empty());
  auto deadline = Clock::now() + std::chrono::seconds(10);
  for (;;) {
    auto states = statesOf(routing(), target_of[4]);
    if (std::all_of(states.begin(), states.end(), [](auto s) { return s == mgmt::SYNCING; })) break;
    ASSERT_LT(Clock::now(), deadline) << "node 4 never syncing";
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  {
    std::lock_guard lock(synced_mu_);
    synced4 = chains_of4;
  }
  deadline = Clock::now() + std::chrono::seconds(10);
  while (!routed(routing(), target_of[4])) {
    ASSERT_LT(Clock::now(), deadline) << "node 4 never serving again";
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const mgmt::Routing final_routing = routing();
  for (auto& c : final_routing.chains()) {
    for (auto& m : c.members()) {
      if (m.target() != target_of[4]) continue;
      EXPECT_EQ(m.state(), mgmt::SERVING);
      EXPECT_EQ(c.targets(c.targets_size() - 1), target_of[4]) << "chain " << c.id();
    }
  }
}

// Two mgmtd on one etcd: one is primary (the other answers kNotPrimary,
// naming it); SIGKILL of the primary hands the cluster to the other within
// its lease, and the chains are as they were.
TEST_F(MgmtdCluster, TheStandbyTakesOverWhenThePrimaryDies) {
  const int port2 = testing::freeLoopbackPort();
  testing::ServeProcess second(CISTERN_BIN, "mgmtd", writeConfig("mgmtd2", port2));
  ASSERT_TRUE(second.start());
  const net::Endpoint ep2 = endpointAt(port2);
  mgmt::RegisterNodeReq reg;
  reg.set_endpoint("127.0.0.1:30000");
  reg.add_target_paths("/t");
  mgmt::RegisterNodeResp resp;
  for (int n = 1; n <= 3; ++n) {
    reg.set_name("node" + std::to_string(n));
    ASSERT_TRUE(call("RegisterNode", reg, &resp).ok());
  }
  Status standby = callAt(ep2, "RegisterNode", reg, &resp);
  EXPECT_EQ(standby.code(), ErrorCode::kNotPrimary) << standby.toString();
  EXPECT_NE(standby.message().find(mgmtd_ep_.toString()), std::string::npos)
      << "names the primary: " << standby.toString();
  mgmt::CreateChainsReq create;
  create.set_replication(3);
  create.set_chains(3);
  mgmt::CreateChainsResp chains;
  ASSERT_TRUE(call("CreateChains", create, &chains).ok());

  mgmtd_->kill(SIGKILL);
  const auto killed = Clock::now();
  Status s;
  reg.set_name("node1");
  while (!(s = callAt(ep2, "RegisterNode", reg, &resp)).ok()) {
    ASSERT_LT(Clock::now() - killed, std::chrono::seconds(15)) << "no takeover: " << s.toString();
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  const double took = std::chrono::duration<double>(Clock::now() - killed).count();
  std::fprintf(stderr, "the standby took over %.2f s after the primary's SIGKILL (lease 2 s)\n",
               took);
  EXPECT_LT(took, 5.0);
  mgmt::GetRoutingReq get;
  mgmt::Routing routing;
  ASSERT_TRUE(callAt(ep2, "GetRouting", get, &routing).ok());
  EXPECT_EQ(routing.chains_size(), 3);
  for (auto& c : routing.chains()) EXPECT_EQ(c.targets_size(), 3) << "a takeover takes no one out";
}

}  // namespace
}  // namespace cistern
