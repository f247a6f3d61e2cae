// ClusterManager: what the primary mgmtd of a cluster does with the
// cluster-state tables in the KV (docs/chain_protocol.md): registers storage
// nodes and gives their targets ids, lays out chains over them
// (placement.h), takes heartbeats, and on each tick moves every chain's
// targets by the state machine (chain_states.h), replaces members silent
// past the grace period (re-replication), bumping the chain's and the
// routing version when anything changed.
//
// A node that registers again has restarted: its targets may have lost
// what they held in memory (a replica's uncommitted versions,
// docs/chain_protocol.md), so the next tick counts them as silent — each
// leaves its chains and comes back through a sync. That mark is kept in
// the KV (mgmt::Target.restarted), so a primary that dies before its next
// tick does not lose it (the simulation found a chain stuck that way).
//
// Liveness is this process's knowledge, not the KV's: a target is alive if
// its node's heartbeat listed it within `heartbeat_timeout_ms`. A manager
// that just started (a new primary) counts every target as heard at its
// start, so a takeover does not take the cluster down for a missed beat.
//
// Thread-safe; each call is one or a few KV transactions. The clock is
// injected (tests advance a ManualClock).
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <set>

#include "common/clock.h"
#include "common/metrics.h"
#include "common/result.h"
#include "kv/engine.h"
#include "mgmt.pb.h"
#include "mgmtd/chain_states.h"
#include "mgmtd/placement.h"

namespace cistern::mgmtd {

struct ClusterManagerOptions {
  // A target not listed in a heartbeat for this long is OFFLINE.
  uint32_t heartbeat_timeout_ms = 10000;
  // A chain member silent this long (counted from its last heartbeat, or
  // from this manager's start) is replaced by another target (placement.h
  // pickReplacement), which joins as WAITING and syncs; 0: never. Only
  // while the chain has a SERVING member (a LASTSRV one is waited for).
  uint32_t replace_after_ms = 600000;
  // Called when news calls for a step before the next tick (a finished
  // sync, a node that registered again); may be empty.
  std::function<void()> wake;
};

class ClusterManager {
 public:
  ClusterManager(kv::Engine& kv, Clock& clock, ClusterManagerOptions options = {});

  Result<mgmt::RegisterNodeResp> registerNode(const mgmt::RegisterNodeReq& req);
  Result<mgmt::HeartbeatResp> heartbeat(const mgmt::HeartbeatReq& req);
  // kAlreadyExists when the cluster has chains (adding and moving chains is
  // rebalancing, not this).
  Result<mgmt::CreateChainsResp> createChains(const mgmt::CreateChainsReq& req);
  // The moves that bring targets within req.spread chains of each other
  // and empty the draining nodes (marking req.drain's nodes draining
  // first); unless req.dry_run, starts them: each chain gets its new
  // member (WAITING, then syncing) and names the old one `leaving`, which
  // the step removes once every other member is SERVING. Chains with a
  // member not SERVING, or a move under way, are left as they are.
  Result<mgmt::RebalanceResp> rebalance(const mgmt::RebalanceReq& req);
  // The chain versions mgmtd committed, each chain's last
  // kv::kChainHistoryKept (docs/chain_protocol.md, "Chain history").
  Result<mgmt::ChainHistoryResp> chainHistory(const mgmt::ChainHistoryReq& req);
  // One step of every chain from the heartbeats seen; returns the routing
  // version now.
  Result<uint64_t> tick();
  const ClusterManagerOptions& options() const { return options_; }
  // Forgets every heartbeat and starts the grace period again (a standby
  // taking over: it has heard nothing as a standby).
  void restart();

 private:
  bool aliveLocked(uint32_t target, SteadyTime now) const;
  // Silent for replace_after_ms (and it is on).
  bool goneLocked(uint32_t target, SteadyTime now) const;
  SteadyTime lastSeenLocked(uint32_t target) const;
  // A rebalance's move of `chain`: removes the `leaving` member once every
  // other member is SERVING (then clears it; also when it is no member any
  // more). True when the chain changed.
  bool finishMove(ChainView& chain, uint32_t& leaving);
  // Replaces `chain`'s members gone past the grace period; true when it
  // did. `targets`: every registered target.
  Result<bool> replaceGone(ChainView& chain, SteadyTime now,
                           const std::map<uint32_t, mgmt::Target>& restarted,
                           const std::map<uint32_t, PlacementTarget>& targets,
                           std::map<uint32_t, uint32_t>& uses, std::vector<std::string>& replaced);

  kv::Engine& kv_;
  Clock& clock_;
  const ClusterManagerOptions options_;
  metrics::Counter& replaced_total_;
  metrics::Counter& moved_total_;
  std::mutex mu_;
  SteadyTime started_;                        // guarded by mu_
  std::map<uint32_t, SteadyTime> last_seen_;  // target -> its node's last heartbeat listing it
  std::set<std::pair<uint32_t, uint32_t>> synced_;  // (chain, target) reported synced
};

}  // namespace cistern::mgmtd
