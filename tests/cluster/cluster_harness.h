// Test support: a whole cistern cluster of real processes on loopback —
// 3 etcd members, 2 mgmtd, 2 meta servers and `storage_nodes` storage
// servers (one target each), replication 3 — and a libcistern client of it.
// Started and stopped by the test; everything in one temporary directory.
#pragma once

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fcntl.h>

#include <fstream>
#include <set>
#include <thread>

#include "auth/token.h"
#include "cistern/client.h"
#include "common/random.h"
#include "mgmt.pb.h"
#include "net/rpc_client.h"
#include "storage.pb.h"
#include "tests/support/etcd_cluster.h"
#include "tests/support/serve_process.h"

namespace cistern::testing {

using Clock = std::chrono::steady_clock;

inline net::Method mgmtMethod(const char* name) {
  return net::Method::of(std::string("cistern.mgmt.MgmtService.") + name);
}
inline net::Method storageMethod(const char* name) {
  return net::Method::of(std::string("cistern.storage.StorageService.") + name);
}

inline std::vector<uint8_t> patternBytes(size_t n, uint64_t seed) {
  Xoshiro256 rng(seed);
  std::vector<uint8_t> v(n);
  for (size_t i = 0; i < n; i += 8) {
    uint64_t x = rng.next();
    std::memcpy(v.data() + i, &x, std::min<size_t>(8, n - i));
  }
  return v;
}

class ClusterHarness {
 public:
  struct Options {
    int storage_nodes = 4;
    int replication = 3;
    int chains = 4;
    uint32_t heartbeat_timeout_ms = 1500;
    // mgmtd.replace_after_s (0: mgmtd's default, 600 s).
    uint32_t replace_after_s = 0;
    // Extra environment of storage node i (1-based), e.g. CISTERN_FAULTS.
    std::map<int, std::string> storage_faults;
    // Where under TMPDIR (several clusters at once need their own).
    std::string name = "cluster";
    // Client options besides the cluster's address.
    uint32_t client_retry_ms = 30000;
    // Every process in a host of its own (netlab.h), on fixed ports, from
    // host `first_host` on: etcd members in the first 3, then 2 mgmtd, 2
    // meta, and storage node n (storageHost()). Null: all on 127.0.0.1
    // with free ports.
    NetLab* lab = nullptr;
    int first_host = 1;
    // A key file (auth.keys_file of every process: the cluster checks
    // tokens, docs/security.md) and the token of the harness's client.
    // The harness's own calls carry an admin token signed with it.
    std::string auth_keys;
    std::string client_token;
  };
  static int etcdHost(int i, int first = 1) { return first + i; }
  static int mgmtdHost(int i, int first = 1) { return first + 3 + i; }
  static int metaHost(int i, int first = 1) { return first + 5 + i; }
  static int storageHost(int n, int first = 1) { return first + 6 + n; }
  // This cluster's hosts.
  int mgmtdHostHere(int i) const { return mgmtdHost(i, o_.first_host); }
  int metaHostHere(int i) const { return metaHost(i, o_.first_host); }
  int storageHostHere(int n) const { return storageHost(n, o_.first_host); }

  // Starts everything; check ok() after.
  explicit ClusterHarness(Options o) : o_(std::move(o)) {
    if (!o_.auth_keys.empty()) {
      auto keys = auth::Keyring::load(o_.auth_keys);
      if (!keys.ok()) {
        ADD_FAILURE() << keys.status().toString();
        return;
      }
      auto service = std::make_shared<auth::ServiceCredential>(*keys);
      rpc_.setCredential([service] { return service->get(); });
    }
    dir_ = ::testing::TempDir() + "/cistern-" + o_.name + "-" + std::to_string(getpid());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    std::vector<EtcdCluster::Host> etcd_hosts;
    for (int h = 1; o_.lab && h <= 3; ++h)
      etcd_hosts.push_back({NetLab::address(h), NetLab::netns(h)});
    etcd_ = EtcdCluster::start(dir_ + "/etcd", 3, etcd_hosts);
    if (!etcd_) return;
    for (int i = 0; i < 2; ++i) {
      mgmtd_eps_.push_back(endpointOf(mgmtdHostHere(i)));
      mgmtd_.push_back(startProcess("mgmtd", mgmtdConfig(i), mgmtdHostHere(i)));
      if (!mgmtd_.back()) return;
    }
    if (!waitPrimary()) return;
    for (int n = 1; n <= o_.storage_nodes; ++n) {
      storage_eps_.push_back(endpointOf(storageHostHere(n)));
      storage_.push_back(nullptr);
      if (!restartStorage(n)) return;
    }
    if (!waitFor([&] { return routing().targets_size() == o_.storage_nodes; }, 15, "nodes")) return;
    mgmt::CreateChainsReq create;
    create.set_replication(static_cast<uint32_t>(o_.replication));
    create.set_chains(static_cast<uint32_t>(o_.chains));
    mgmt::CreateChainsResp created;
    if (Status s = callPrimary("CreateChains", create, &created); !s.ok()) {
      ADD_FAILURE() << "CreateChains: " << s.toString();
      return;
    }
    for (int i = 0; i < 2; ++i) {
      meta_eps_.push_back(endpointOf(metaHostHere(i)));
      meta_.push_back(startProcess("meta", metaConfig(i), metaHostHere(i)));
      if (!meta_.back()) return;
    }
    if (!waitFor([&] { return routing().meta_endpoints_size() == 2; }, 10, "meta servers")) return;
    if (!waitHealthy(10)) return;
    Client::Options co;
    co.cluster = mgmtdList();
    co.retry_ms = o_.client_retry_ms;
    co.call_timeout_ms = 5000;
    co.token = o_.client_token;
    if (o_.lab) {  // the servers are on other hosts: no shared memory, no reads of their files
      co.shm_bytes = 0;
      co.short_circuit_reads = false;
    }
    auto [c, err] = Client::connect(co);
    if (err) {
      ADD_FAILURE() << "connect: " << err.message;
      return;
    }
    client_ = std::move(c);
    ok_ = true;
  }
  ~ClusterHarness() {
    client_.reset();
    if (::testing::Test::HasFailure()) {  // the processes' logs, beside their data
      for (size_t i = 0; i < storage_.size(); ++i)
        if (storage_[i])
          std::ofstream(dir_ + "/storage" + std::to_string(i + 1) + ".log") << storage_[i]->log();
      for (size_t i = 0; i < mgmtd_.size(); ++i)
        if (mgmtd_[i])
          std::ofstream(dir_ + "/mgmtd" + std::to_string(i) + ".log") << mgmtd_[i]->log();
      std::fprintf(stderr, "cluster logs and data kept in %s\n", dir_.c_str());
    }
    meta_.clear();
    storage_.clear();
    mgmtd_.clear();
    etcd_.reset();
    if (!::testing::Test::HasFailure()) std::filesystem::remove_all(dir_);
  }
  bool ok() const { return ok_; }
  Client& client() { return *client_; }
  const std::string& dir() const { return dir_; }

  // "host:port,host:port" of the mgmtd.
  std::string mgmtdList() const {
    std::string out;
    for (const auto& e : mgmtd_eps_) out += (out.empty() ? "" : ",") + e;
    return out;
  }

  ServeProcess& storage(int n) { return *storage_[static_cast<size_t>(n - 1)]; }
  // Every process of the cluster but etcd (for their peak RSS).
  std::vector<pid_t> cisternPids() const {
    std::vector<pid_t> out;
    for (const auto* v : {&mgmtd_, &meta_, &storage_})
      for (const auto& p : *v)
        if (p && p->pid() > 0) out.push_back(p->pid());
    return out;
  }
  ServeProcess& meta(int i) { return *meta_[static_cast<size_t>(i)]; }
  ServeProcess& mgmtd(int i) { return *mgmtd_[static_cast<size_t>(i)]; }
  int storageNodes() const { return o_.storage_nodes; }
  std::string storageEndpoint(int n) const { return storage_eps_[static_cast<size_t>(n - 1)]; }
  std::string metaEndpoint(int i) const { return meta_eps_[static_cast<size_t>(i)]; }
  EtcdCluster& etcd() { return *etcd_; }

  // (Re)starts storage node n (its process, same port and target).
  bool restartStorage(int n) {
    auto& slot = storage_[static_cast<size_t>(n - 1)];
    slot.reset();
    auto it = o_.storage_faults.find(n);
    if (it != o_.storage_faults.end()) ::setenv("CISTERN_FAULTS", it->second.c_str(), 1);
    slot = startProcess("storage", storageConfig(n), storageHostHere(n));
    ::unsetenv("CISTERN_FAULTS");
    return slot != nullptr;
  }
  // Starts one more storage node (it registers; no chain uses it until a
  // rebalance); returns its number.
  int addStorageNode() {
    storage_eps_.push_back(endpointOf(storageHostHere(o_.storage_nodes + 1)));
    storage_.push_back(nullptr);
    ++o_.storage_nodes;
    return restartStorage(o_.storage_nodes) ? o_.storage_nodes : 0;
  }
  // Drops node n's fault spec for later restarts.
  void clearFaults(int n) { o_.storage_faults.erase(n); }
  bool restartMgmtd(int i) {
    mgmtd_[static_cast<size_t>(i)] = startProcess("mgmtd", mgmtdConfig(i), mgmtdHostHere(i));
    return mgmtd_[static_cast<size_t>(i)] != nullptr;
  }

  // The routing table from whichever mgmtd answers (empty if none).
  mgmt::Routing routing() {
    mgmt::GetRoutingReq req;
    mgmt::Routing r;
    for (const auto& e : mgmtd_eps_) {
      r.Clear();
      if (rpc_.callSync(*net::Endpoint::parse(e), mgmtMethod("GetRouting"), req, &r,
                        {.timeout_ms = 2000})
              .ok())
        return r;
    }
    return mgmt::Routing();
  }
  // Every chain has `replication` SERVING members.
  bool healthy(const mgmt::Routing& r) const {
    if (r.chains_size() != o_.chains) return false;
    for (const auto& c : r.chains()) {
      if (c.targets_size() != o_.replication || c.members_size() != o_.replication) return false;
    }
    return true;
  }
  bool waitHealthy(int seconds) {
    return waitFor([&] { return healthy(routing()); }, seconds,
                   "every chain SERVING on all replicas");
  }
  template <typename F>
  bool waitFor(F f, int seconds, const char* what) {
    for (auto until = Clock::now() + std::chrono::seconds(seconds);;) {
      if (f()) return true;
      if (Clock::now() > until) {
        ADD_FAILURE() << "waited " << seconds << " s for " << what << "; routing:\n"
                      << routing().DebugString();
        return false;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }

  // Whether any chain of `r` routes to (has SERVING) `target`.
  static bool routesTo(const mgmt::Routing& r, uint32_t target) {
    for (const auto& c : r.chains())
      for (uint32_t t : c.targets())
        if (t == target) return true;
    return false;
  }
  // Waits until no chain routes to `target` (taken out after the timeout).
  bool waitOutOfChains(uint32_t target, int seconds, const char* what) {
    return waitFor([&] { return !routesTo(routing(), target); }, seconds, what);
  }

  // A call to whichever mgmtd is primary.
  template <typename Req, typename Resp>
  Status callPrimary(const char* name, const Req& req, Resp* resp) {
    Status s;
    for (auto until = Clock::now() + std::chrono::seconds(10); Clock::now() < until;) {
      for (const auto& e : mgmtd_eps_) {
        resp->Clear();
        s = rpc_.callSync(*net::Endpoint::parse(e), mgmtMethod(name), req, resp,
                          {.timeout_ms = 3000});
        if (s.code() != ErrorCode::kNotPrimary && s.code() != ErrorCode::kConnectionFailed &&
            s.code() != ErrorCode::kConnectionClosed)
          return s;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    return s;
  }
  // Which mgmtd (0 or 1) is primary; -1 if none answers as primary.
  int primary() {
    mgmt::RegisterNodeReq probe;  // no name: the primary refuses it as invalid
    for (size_t i = 0; i < mgmtd_eps_.size(); ++i) {
      mgmt::RegisterNodeResp resp;
      Status s = rpc_.callSync(*net::Endpoint::parse(mgmtd_eps_[i]), mgmtMethod("RegisterNode"),
                               probe, &resp, {.timeout_ms = 1000});
      if (s.code() == ErrorCode::kInvalidArgument) return static_cast<int>(i);
    }
    return -1;
  }

  // The chunks of `chain` on storage node n's target: (inode, index) ->
  // (chunk version, chain version).
  std::map<std::pair<uint64_t, uint32_t>, std::pair<uint64_t, uint64_t>> chunksOn(int n,
                                                                                  uint32_t chain) {
    std::map<std::pair<uint64_t, uint32_t>, std::pair<uint64_t, uint64_t>> out;
    storage::ListReq req;
    req.set_chain(chain);
    req.set_limit(1000);
    for (;;) {
      storage::ListResp resp;
      Status s = rpc_.callSync(*net::Endpoint::parse(storageEndpoint(n)), storageMethod("List"),
                               req, &resp, {.timeout_ms = 5000});
      if (!s.ok()) {
        ADD_FAILURE() << "List on node " << n << ": " << s.toString();
        return out;
      }
      for (const auto& c : resp.chunks()) {
        out[{c.chunk().inode(), c.chunk().index()}] = {c.info().chunk_version(),
                                                       c.info().chain_version()};
      }
      if (!resp.more() || !resp.has_last_seen()) return out;
      *req.mutable_from() = resp.last_seen();
      req.mutable_from()->set_index(req.from().index() + 1);
    }
  }
  // Node (1-based) serving target `target`, from its endpoint.
  int nodeOf(const mgmt::Routing& r, uint32_t target) {
    for (const auto& t : r.targets()) {
      if (t.id() != target) continue;
      for (int n = 1; n <= o_.storage_nodes; ++n)
        if (storageEndpoint(n) == t.endpoint()) return n;
    }
    return 0;
  }
  // Every chain's replicas hold the same chunks at the same versions.
  void expectReplicasAgree() {
    auto r = routing();
    for (const auto& c : r.chains()) {
      std::map<std::pair<uint64_t, uint32_t>, std::pair<uint64_t, uint64_t>> first;
      for (int i = 0; i < c.targets_size(); ++i) {
        auto chunks = chunksOn(nodeOf(r, c.targets(i)), c.id());
        if (i == 0) {
          first = chunks;
          continue;
        }
        // The differences only: (inode, index) -> (chunk version, chain version).
        std::string diff;
        int shown = 0;
        auto text = [](const auto& m, const std::pair<uint64_t, uint32_t>& k) {
          auto it = m.find(k);
          return it == m.end()
                     ? std::string("none")
                     : std::to_string(it->second.first) + "." + std::to_string(it->second.second);
        };
        std::set<std::pair<uint64_t, uint32_t>> keys;
        for (const auto& [k, v] : first) keys.insert(k);
        for (const auto& [k, v] : chunks) keys.insert(k);
        for (const auto& k : keys) {
          if (text(first, k) == text(chunks, k) || shown++ >= 10) continue;
          diff += " " + std::to_string(k.first) + ":" + std::to_string(k.second) + " head " +
                  text(first, k) + " here " + text(chunks, k) + ";";
        }
        EXPECT_TRUE(diff.empty()) << "chain " << c.id() << ": target " << c.targets(i)
                                  << " differs from the head " << c.targets(0) << ":" << diff;
      }
    }
  }

 private:
  // host:port of a process in `host` (with a lab; else 127.0.0.1, a free port).
  std::string endpointOf(int host) const {
    if (o_.lab) return NetLab::address(host) + ":7000";
    return "127.0.0.1:" + std::to_string(freeLoopbackPort());
  }
  std::unique_ptr<ServeProcess> startProcess(const std::string& role, const std::string& config,
                                             int host) {
    const std::string address = o_.lab ? NetLab::address(host) : "127.0.0.1";
    auto p = std::make_unique<ServeProcess>(
        CISTERN_BIN, role, config, o_.lab ? NetLab::netns(host) : std::string(), address + ":0");
    if (!p->start()) return nullptr;
    return p;
  }
  bool waitPrimary() {
    return waitFor([&] { return primary() >= 0; }, 15, "a primary mgmtd");
  }
  std::string kvConfig() {
    std::string s = "kv.backend = \"etcd\"\nkv.etcd.prefix = \"" + o_.name + "-" +
                    std::to_string(getpid()) + "/\"\nkv.etcd.endpoints = [";
    for (size_t i = 0; i < etcd_->size(); ++i)
      s += (i ? ", " : "") + std::string("\"") + etcd_->endpoint(i) + "\"";
    return s + "]\n";
  }
  std::string write(const std::string& name, const std::string& text) {
    std::string path = dir_ + "/" + name + ".toml";
    std::ofstream(path) << text;
    return path;
  }
  std::string mgmtdConfig(int i) {
    return write("mgmtd" + std::to_string(i),
                 "mgmtd.listen = \"" + mgmtd_eps_[static_cast<size_t>(i)] +
                     "\"\nmgmtd.heartbeat_timeout_ms = " + std::to_string(o_.heartbeat_timeout_ms) +
                     "\nmgmtd.tick_ms = 200\nmgmtd.lease_ms = 2000\n" +
                     (o_.replace_after_s
                          ? "mgmtd.replace_after_s = " + std::to_string(o_.replace_after_s) + "\n"
                          : std::string()) +
                     kvConfig() + authConfig());
  }
  std::string metaConfig(int i) {
    return write("meta" + std::to_string(i),
                 "meta.listen = \"" + meta_eps_[static_cast<size_t>(i)] +
                     "\"\nmeta.session_timeout_ms = 60000\nmeta.kv_lease_ms = " +
                     std::to_string(o_.heartbeat_timeout_ms / 2) + "\n" + kvConfig() +
                     authConfig());
  }
  std::string storageConfig(int n) {
    std::string list;
    for (const auto& e : mgmtd_eps_) list += (list.empty() ? "\"" : ", \"") + e + "\"";
    return write("storage" + std::to_string(n),
                 "storage.listen = \"" + storageEndpoint(n) + "\"\nstorage.node = \"node" +
                     std::to_string(n) + "\"\nstorage.target = \"" + dir_ + "/target" +
                     std::to_string(n) + "\"\nstorage.mgmtd = [" + list +
                     "]\nstorage.engine.reserved_bytes = 0\n" + authConfig());
  }
  std::string authConfig() const {
    return o_.auth_keys.empty() ? std::string() : "auth.keys_file = \"" + o_.auth_keys + "\"\n";
  }

  Options o_;
  std::string dir_;
  bool ok_ = false;
  std::unique_ptr<EtcdCluster> etcd_;
  std::vector<std::string> mgmtd_eps_, storage_eps_, meta_eps_;
  std::vector<std::unique_ptr<ServeProcess>> mgmtd_, storage_, meta_;
  net::RpcClient rpc_{net::ClientOptions{}};
  std::unique_ptr<Client> client_;
};

}  // namespace cistern::testing
