// The primary mgmtd's cluster bookkeeping (cluster_manager.h).
#include "mgmtd/cluster_manager.h"

#include <fmt/format.h>

#include <algorithm>

#include "common/log.h"
#include "kv/cluster_keys.h"
#include "mgmtd/chain_states.h"
#include "mgmtd/routing_table.h"

namespace cistern::mgmtd {
namespace {

// The state machine's states are the proto's, in the same order.
static_assert(static_cast<int>(TargetState::kServing) == mgmt::SERVING &&
              static_cast<int>(TargetState::kSyncing) == mgmt::SYNCING &&
              static_cast<int>(TargetState::kWaiting) == mgmt::WAITING &&
              static_cast<int>(TargetState::kOffline) == mgmt::OFFLINE &&
              static_cast<int>(TargetState::kLastServing) == mgmt::LASTSRV);
TargetState fromProto(mgmt::TargetState s) { return static_cast<TargetState>(s); }
mgmt::TargetState toProto(TargetState s) { return static_cast<mgmt::TargetState>(s); }

// The routing version once `t` commits: moved if the transaction changed
// anything routing shows.
Result<uint64_t> routingVersionAfter(kv::Transaction& t, bool changed) {
  return changed ? bumpRoutingVersion(t) : routingVersion(t);
}

ChainView viewOf(const mgmt::Chain& c) {
  ChainView v;
  v.id = c.id();
  v.version = c.version();
  if (c.members_size() == 0) {
    for (uint32_t t : c.targets()) v.members.push_back({t, TargetState::kServing});
  } else {
    for (const auto& m : c.members()) v.members.push_back({m.target(), fromProto(m.state())});
  }
  return v;
}

mgmt::Chain chainOf(const ChainView& v) {
  mgmt::Chain c;
  c.set_id(v.id);
  c.set_version(v.version);
  for (uint32_t t : v.serving()) c.add_targets(t);
  for (const ChainMember& m : v.members) {
    auto* pm = c.add_members();
    pm->set_target(m.target);
    pm->set_state(toProto(m.state));
  }
  return c;
}

// Writes a chain's row and keeps its version in the history (each chain's
// last kv::kChainHistoryKept versions; an older one is dropped).
void putChain(kv::Transaction& t, const mgmt::Chain& row, int64_t unix_ms) {
  t.set(kv::chainKey(row.id()), row.SerializeAsString());
  mgmt::ChainEvent e;
  *e.mutable_chain() = row;
  e.set_unix_ms(unix_ms);
  t.set(kv::chainHistoryKey(row.id(), row.version()), e.SerializeAsString());
  if (row.version() > kv::kChainHistoryKept)
    t.clear(kv::chainHistoryKey(row.id(), row.version() - kv::kChainHistoryKept));
}

}  // namespace

ClusterManager::ClusterManager(kv::Engine& kv, Clock& clock, ClusterManagerOptions options)
    : kv_(kv),
      clock_(clock),
      options_(options),
      replaced_total_(metrics::Registry::global().counter(
          "mgmtd_replicas_replaced_total", {},
          "chain members silent past the grace period and replaced by another target")),
      moved_total_(metrics::Registry::global().counter(
          "mgmtd_replicas_moved_total", {},
          "replicas moved by a rebalance or a drain (the new one serving, the old one gone)")),
      started_(clock.now()) {}

void ClusterManager::restart() {
  std::lock_guard lock(mu_);
  started_ = clock_.now();
  last_seen_.clear();
  synced_.clear();
}

SteadyTime ClusterManager::lastSeenLocked(uint32_t target) const {
  auto it = last_seen_.find(target);
  return it == last_seen_.end() ? started_ : std::max(it->second, started_);
}

bool ClusterManager::aliveLocked(uint32_t target, SteadyTime now) const {
  return now - lastSeenLocked(target) < std::chrono::milliseconds(options_.heartbeat_timeout_ms);
}

bool ClusterManager::goneLocked(uint32_t target, SteadyTime now) const {
  return options_.replace_after_ms != 0 &&
         now - lastSeenLocked(target) >= std::chrono::milliseconds(options_.replace_after_ms);
}

Result<mgmt::RegisterNodeResp> ClusterManager::registerNode(const mgmt::RegisterNodeReq& req) {
  if (req.name().empty()) return Status(ErrorCode::kInvalidArgument, "node registration: no name");
  if (req.endpoint().empty())
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("node {}: no storage endpoint given", req.name()));
  mgmt::RegisterNodeResp resp;
  std::set<uint32_t> in_chains;  // targets that are members of a chain
  RETURN_ON_ERROR(kv::runTransaction(kv_, [&](kv::Transaction& t) -> Status {
    resp.Clear();
    in_chains.clear();
    ASSIGN_OR_RETURN(auto chains, t.getRange(kv::chainBegin(), kv::chainEnd(), {}));
    for (const auto& row : chains.kvs) {
      if (row.value.empty()) continue;
      ASSIGN_OR_RETURN(mgmt::Chain chain, parseRow<mgmt::Chain>(row.value, "chain"));
      for (const ChainMember& m : viewOf(chain).members) in_chains.insert(m.target);
    }
    bool changed = false;
    ASSIGN_OR_RETURN(auto raw, t.get(kv::nodeKey(req.name())));
    mgmt::Node old;
    if (raw) {
      ASSIGN_OR_RETURN(old, parseRow<mgmt::Node>(*raw, "node"));
    }
    // Known paths keep their ids.
    std::map<std::string, uint32_t> known;
    for (uint32_t id : old.targets()) {
      ASSIGN_OR_RETURN(auto row, t.get(kv::targetKey(id)));
      if (!row) continue;
      ASSIGN_OR_RETURN(mgmt::Target target, parseRow<mgmt::Target>(*row, "target"));
      known[target.path()] = id;
    }
    ASSIGN_OR_RETURN(auto counter, t.get(kv::targetIdCounterKey()));
    uint64_t last_id = counter ? static_cast<uint64_t>(kv::decodeCounter(*counter)) : 0;
    mgmt::Node node;
    node.set_name(req.name());
    node.set_rack(req.rack());
    node.set_endpoint(req.endpoint());
    for (const std::string& path : req.target_paths()) {
      uint32_t id;
      if (auto it = known.find(path); it != known.end()) {
        id = it->second;
      } else {
        id = static_cast<uint32_t>(++last_id);
        t.set(kv::targetIdCounterKey(), kv::encodeCounter(static_cast<int64_t>(last_id)));
      }
      mgmt::Target target;
      target.set_id(id);
      target.set_endpoint(req.endpoint());
      target.set_path(path);
      target.set_node(req.name());
      target.set_rack(req.rack());
      target.set_restarted(in_chains.count(id) > 0);
      ASSIGN_OR_RETURN(auto before, t.get(kv::targetKey(id)));
      const std::string bytes = target.SerializeAsString();
      if (!before || *before != bytes) {
        t.set(kv::targetKey(id), bytes);
        changed = true;
      }
      node.add_targets(id);
      resp.add_target_ids(id);
    }
    const std::string bytes = node.SerializeAsString();
    if (!raw || *raw != bytes) {
      t.set(kv::nodeKey(req.name()), bytes);
      changed = true;
    }
    ASSIGN_OR_RETURN(uint64_t v, routingVersionAfter(t, changed));
    resp.set_routing_version(v);
    return Status::OK();
  }));
  resp.set_heartbeat_timeout_ms(options_.heartbeat_timeout_ms);
  std::lock_guard lock(mu_);
  const SteadyTime now = clock_.now();
  bool restarted = false;
  for (uint32_t id : resp.target_ids()) {
    last_seen_[id] = now;
    restarted |= in_chains.count(id) > 0;
  }
  if (restarted && options_.wake) options_.wake();
  return resp;
}

Result<mgmt::HeartbeatResp> ClusterManager::heartbeat(const mgmt::HeartbeatReq& req) {
  mgmt::Node node;
  RETURN_ON_ERROR(kv::runReadTransaction(kv_, [&](kv::ReadTransaction& t) -> Status {
    ASSIGN_OR_RETURN(auto raw, t.get(kv::nodeKey(req.name())));
    if (!raw)
      return Status(ErrorCode::kNotFound, fmt::format("node {} has not registered", req.name()));
    ASSIGN_OR_RETURN(node, parseRow<mgmt::Node>(*raw, "node"));
    return Status::OK();
  }));
  std::set<uint32_t> own(node.targets().begin(), node.targets().end());
  {
    std::lock_guard lock(mu_);
    const SteadyTime now = clock_.now();
    for (uint32_t id : req.alive_targets()) {
      if (!own.count(id))
        return Status(ErrorCode::kInvalidArgument,
                      fmt::format("node {} reports target {}, which is not its", req.name(), id));
      last_seen_[id] = now;
    }
    for (const auto& s : req.synced()) {
      if (own.count(s.target())) synced_.insert({s.chain(), s.target()});
    }
  }
  if (req.synced_size() > 0 && options_.wake) options_.wake();
  // The whole table only for a node whose routing is older (beats come
  // every few hundred milliseconds from every node).
  mgmt::HeartbeatResp resp;
  uint64_t version = 0;
  RETURN_ON_ERROR(kv::runReadTransaction(kv_, [&](kv::ReadTransaction& t) -> Status {
    ASSIGN_OR_RETURN(version, routingVersion(t));
    return Status::OK();
  }));
  resp.set_routing_version(version);
  if (version > req.routing_version()) {
    ASSIGN_OR_RETURN(*resp.mutable_routing(), loadRouting(kv_));
    resp.set_routing_version(resp.routing().version());
  }
  return resp;
}

Result<mgmt::CreateChainsResp> ClusterManager::createChains(const mgmt::CreateChainsReq& req) {
  mgmt::CreateChainsResp resp;
  RETURN_ON_ERROR(kv::runTransaction(kv_, [&](kv::Transaction& t) -> Status {
    resp.Clear();
    ASSIGN_OR_RETURN(auto chains, t.getRange(kv::chainBegin(), kv::chainEnd(), {.limit = 1}));
    if (!chains.kvs.empty())
      return Status(ErrorCode::kAlreadyExists,
                    "the cluster has chains already (adding chains is a rebalance)");
    ASSIGN_OR_RETURN(auto rows, t.getRange(kv::targetBegin(), kv::targetEnd(), {}));
    std::vector<PlacementTarget> targets;
    for (const auto& row : rows.kvs) {
      ASSIGN_OR_RETURN(mgmt::Target target, parseRow<mgmt::Target>(row.value, "target"));
      targets.push_back({target.id(), target.node(), target.rack()});
    }
    ASSIGN_OR_RETURN(auto placed, placeChains(targets, req.replication(), req.chains()));
    for (size_t i = 0; i < placed.size(); ++i) {
      ChainView v;
      v.id = static_cast<uint32_t>(i + 1);
      v.version = 1;
      for (uint32_t target : placed[i].targets)
        v.members.push_back({target, TargetState::kServing});
      mgmt::Chain c = chainOf(v);
      putChain(t, c, clock_.wallMicros() / 1000);
      *resp.add_chains() = std::move(c);
    }
    ASSIGN_OR_RETURN(uint64_t version, bumpRoutingVersion(t));
    resp.set_routing_version(version);
    return Status::OK();
  }));
  return resp;
}

Result<bool> ClusterManager::replaceGone(ChainView& chain, SteadyTime now,
                                         const std::map<uint32_t, mgmt::Target>& restarted,
                                         const std::map<uint32_t, PlacementTarget>& targets,
                                         std::map<uint32_t, uint32_t>& uses,
                                         std::vector<std::string>& replaced) {
  if (chain.serving().empty()) return false;  // a LASTSRV member holds the only copy
  std::vector<uint32_t> gone;
  {
    std::lock_guard lock(mu_);
    for (const ChainMember& m : chain.members) {
      if (m.state == TargetState::kOffline && goneLocked(m.target, now)) gone.push_back(m.target);
    }
  }
  if (gone.empty()) return false;
  bool moved = false;
  for (uint32_t lost : gone) {
    std::vector<PlacementTarget> others, candidates;
    std::set<uint32_t> members;
    for (const ChainMember& m : chain.members) {
      members.insert(m.target);
      if (m.target == lost) continue;
      if (auto it = targets.find(m.target); it != targets.end()) others.push_back(it->second);
    }
    {
      std::lock_guard lock(mu_);
      for (const auto& [id, target] : targets) {
        if (!members.count(id) && aliveLocked(id, now) && !restarted.count(id))
          candidates.push_back(target);
      }
    }
    auto pick = pickReplacement(candidates, others, uses);
    if (!pick) continue;  // no target on another node works now: try again next tick
    auto it = std::find_if(chain.members.begin(), chain.members.end(),
                           [&](const ChainMember& m) { return m.target == lost; });
    chain.members.erase(it);
    // Behind the SERVING, SYNCING and WAITING members (the step's order).
    auto at = std::find_if(chain.members.begin(), chain.members.end(), [](const ChainMember& m) {
      return m.state == TargetState::kLastServing || m.state == TargetState::kOffline;
    });
    chain.members.insert(at, {*pick, TargetState::kWaiting});
    --uses[lost];
    ++uses[*pick];
    replaced_total_.inc();
    replaced.push_back(
        fmt::format("chain {}: target {} silent past the grace period; target {} "
                    "takes its place and syncs",
                    chain.id, lost, *pick));
    moved = true;
  }
  return moved;
}

bool ClusterManager::finishMove(ChainView& chain, uint32_t& leaving) {
  auto it = std::find_if(chain.members.begin(), chain.members.end(),
                         [&](const ChainMember& m) { return m.target == leaving; });
  if (it == chain.members.end()) {  // gone meanwhile (replaced): nothing left to do
    leaving = 0;
    return false;
  }
  for (const ChainMember& m : chain.members)
    if (m.target != leaving && m.state != TargetState::kServing) return false;  // not yet
  chain.members.erase(it);
  moved_total_.inc();
  CLOG_INFO("mgmtd", "chain {}: target {} left it (rebalance)", chain.id, leaving);
  leaving = 0;
  return true;
}

Result<mgmt::RebalanceResp> ClusterManager::rebalance(const mgmt::RebalanceReq& req) {
  mgmt::RebalanceResp resp;
  const SteadyTime now = clock_.now();
  RETURN_ON_ERROR(kv::runTransaction(kv_, [&](kv::Transaction& t) -> Status {
    resp.Clear();
    bool changed = false;
    std::set<std::string> draining_nodes;
    ASSIGN_OR_RETURN(auto node_rows, t.getRange(kv::nodeBegin(), kv::nodeEnd(), {}));
    std::map<std::string, mgmt::Node> nodes;
    for (const auto& row : node_rows.kvs) {
      ASSIGN_OR_RETURN(mgmt::Node node, parseRow<mgmt::Node>(row.value, "node"));
      nodes[node.name()] = std::move(node);
    }
    for (const std::string& name : req.drain()) {
      auto it = nodes.find(name);
      if (it == nodes.end())
        return Status(ErrorCode::kNotFound, fmt::format("drain: no node {} registered", name));
      if (!it->second.draining() && !req.dry_run()) {
        it->second.set_draining(true);
        t.set(kv::nodeKey(name), it->second.SerializeAsString());
        changed = true;
      }
      draining_nodes.insert(name);
    }
    for (const auto& [name, node] : nodes)
      if (node.draining()) draining_nodes.insert(name);
    std::vector<PlacementTarget> usable, draining;
    ASSIGN_OR_RETURN(auto target_rows, t.getRange(kv::targetBegin(), kv::targetEnd(), {}));
    {
      std::lock_guard lock(mu_);
      for (const auto& row : target_rows.kvs) {
        ASSIGN_OR_RETURN(mgmt::Target target, parseRow<mgmt::Target>(row.value, "target"));
        PlacementTarget p{target.id(), target.node(), target.rack()};
        if (draining_nodes.count(target.node())) {
          draining.push_back(p);
        } else if (aliveLocked(target.id(), now) && !target.restarted()) {
          usable.push_back(p);
        }
      }
    }
    ASSIGN_OR_RETURN(auto rows, t.getRange(kv::chainBegin(), kv::chainEnd(), {}));
    std::map<uint32_t, mgmt::Chain> chains;
    std::vector<ChainMembers> movable;
    for (const auto& row : rows.kvs) {
      if (row.value.empty()) continue;
      ASSIGN_OR_RETURN(mgmt::Chain chain, parseRow<mgmt::Chain>(row.value, "chain"));
      const ChainView v = viewOf(chain);
      ChainMembers m{chain.id(), {}};
      bool whole = chain.leaving() == 0;
      for (const ChainMember& member : v.members) {
        m.targets.push_back(member.target);
        whole &= member.state == TargetState::kServing;
      }
      if (whole) movable.push_back(std::move(m));
      chains[chain.id()] = std::move(chain);
    }
    for (const PlannedMove& move : planRebalance(usable, draining, movable, req.spread())) {
      auto* out = resp.add_moves();
      out->set_chain(move.chain);
      out->set_from(move.from);
      out->set_to(move.to);
      if (req.dry_run()) continue;
      mgmt::Chain& chain = chains[move.chain];
      ChainView v = viewOf(chain);
      v.members.push_back({move.to, TargetState::kWaiting});  // every member SERVING: last
      v.version += 1;
      mgmt::Chain row = chainOf(v);
      row.set_leaving(move.from);
      putChain(t, row, clock_.wallMicros() / 1000);
      changed = true;
    }
    ASSIGN_OR_RETURN(uint64_t v, routingVersionAfter(t, changed));
    resp.set_routing_version(v);
    return Status::OK();
  }));
  if (!req.dry_run() && resp.moves_size() > 0) {
    CLOG_INFO("mgmtd", "rebalance: {} moves started", resp.moves_size());
    if (options_.wake) options_.wake();
  }
  return resp;
}

Result<uint64_t> ClusterManager::tick() {
  std::set<std::pair<uint32_t, uint32_t>> synced;
  const SteadyTime now = clock_.now();
  {
    std::lock_guard lock(mu_);
    synced = synced_;
  }
  uint64_t version = 0;
  std::vector<std::string> replaced;  // for the log, once committed
  // The chains as this step leaves them, and the targets silent now (gauges).
  int64_t chains = 0, degraded = 0, unavailable = 0, silent = 0;
  RETURN_ON_ERROR(kv::runTransaction(kv_, [&](kv::Transaction& t) -> Status {
    replaced.clear();
    chains = degraded = unavailable = silent = 0;
    std::map<uint32_t, PlacementTarget> targets;
    std::map<uint32_t, mgmt::Target> restarted;  // registered again (mgmt::Target.restarted)
    ASSIGN_OR_RETURN(auto target_rows, t.getRange(kv::targetBegin(), kv::targetEnd(), {}));
    for (const auto& row : target_rows.kvs) {
      ASSIGN_OR_RETURN(mgmt::Target target, parseRow<mgmt::Target>(row.value, "target"));
      targets[target.id()] = {target.id(), target.node(), target.rack()};
      {
        std::lock_guard lock(mu_);
        silent += !aliveLocked(target.id(), now);
      }
      if (target.restarted()) restarted[target.id()] = std::move(target);
    }
    ASSIGN_OR_RETURN(auto rows, t.getRange(kv::chainBegin(), kv::chainEnd(), {}));
    std::vector<ChainView> views;
    std::map<uint32_t, uint32_t> leaving;  // chain -> its rebalance's leaving member
    std::map<uint32_t, uint32_t> uses;     // target -> chains it is in
    for (const auto& row : rows.kvs) {
      if (row.value.empty()) continue;  // an old one-target chain of `cistern up`
      ASSIGN_OR_RETURN(mgmt::Chain chain, parseRow<mgmt::Chain>(row.value, "chain"));
      views.push_back(viewOf(chain));
      if (chain.leaving() != 0) leaving[chain.id()] = chain.leaving();
      for (const ChainMember& m : views.back().members) ++uses[m.target];
    }
    bool changed = false;
    for (const ChainView& before : views) {
      ChainView after = nextChain(before, [&](uint32_t target) {
        std::lock_guard lock(mu_);
        const bool alive = aliveLocked(target, now) && !restarted.count(target);
        return TargetReport{alive, synced.count({before.id, target}) > 0};
      });
      ASSIGN_OR_RETURN(bool moved, replaceGone(after, now, restarted, targets, uses, replaced));
      uint32_t& out = leaving[after.id];  // 0: none
      const uint32_t was_leaving = out;
      if (out != 0 && finishMove(after, out)) moved = true;
      if (moved && after.version == before.version) after.version = before.version + 1;
      const size_t serving = after.serving().size();
      ++chains;
      degraded += serving < after.members.size() - (out != 0 ? 1 : 0);
      unavailable += serving == 0;
      if (after.version == before.version && out == was_leaving) continue;
      mgmt::Chain row = chainOf(after);
      row.set_leaving(out);
      putChain(t, row, clock_.wallMicros() / 1000);
      changed = true;
    }
    for (auto& [id, target] : restarted) {  // taken out of every chain above
      target.set_restarted(false);
      t.set(kv::targetKey(id), target.SerializeAsString());
      changed = true;
    }
    ASSIGN_OR_RETURN(version, routingVersionAfter(t, changed));
    return Status::OK();
  }));
  for (const std::string& r : replaced) CLOG_INFO("mgmtd", "{}", r);
  static auto& g_chains = metrics::Registry::global().gauge(
      "mgmtd_chains", {}, "chains in the routing table (as the primary's last step left them)");
  static auto& g_degraded = metrics::Registry::global().gauge(
      "mgmtd_chains_degraded", {},
      "chains with a member not SERVING (offline, waiting or syncing; a move's leaving member "
      "aside)");
  static auto& g_unavailable = metrics::Registry::global().gauge(
      "mgmtd_chains_unavailable", {}, "chains with no SERVING member: their data cannot be read");
  static auto& g_silent = metrics::Registry::global().gauge(
      "mgmtd_targets_silent", {}, "targets not in a heartbeat within the heartbeat timeout");
  g_chains.set(chains);
  g_degraded.set(degraded);
  g_unavailable.set(unavailable);
  g_silent.set(silent);
  std::lock_guard lock(mu_);
  for (const auto& s : synced) synced_.erase(s);
  return version;
}

Result<mgmt::ChainHistoryResp> ClusterManager::chainHistory(const mgmt::ChainHistoryReq& req) {
  mgmt::ChainHistoryResp resp;
  RETURN_ON_ERROR(kv::runReadTransaction(kv_, [&](kv::ReadTransaction& t) -> Status {
    resp.Clear();
    std::string from = kv::chainHistoryBegin(req.chain());
    const std::string end = kv::chainHistoryEnd(req.chain());
    for (;;) {
      ASSIGN_OR_RETURN(auto rows, t.getRange(from, end, {.limit = 1000}));
      for (const auto& row : rows.kvs) {
        ASSIGN_OR_RETURN(*resp.add_events(), parseRow<mgmt::ChainEvent>(row.value, "chain event"));
      }
      if (!rows.more || rows.kvs.empty()) return Status::OK();
      from = rows.kvs.back().key + '\0';
    }
  }));
  return resp;
}

}  // namespace cistern::mgmtd
