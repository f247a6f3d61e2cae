// ChainTable: what a storage server of a cluster knows of the chains its
// target is in (docs/chain_protocol.md, "Storage servers"), from the routing
// table mgmtd hands out with heartbeats, and whether it may serve at all.
//
// Serving lease: a server serves reads and clients' writes only while its
// last heartbeat answered by the primary mgmtd was sent less than half the
// heartbeat timeout ago. mgmtd takes a target out of its chains only after
// a whole timeout of silence, so a server cut off from mgmtd (a partition, a
// SIGSTOP) has stopped serving by the time its chains move on without it.
//
// Restart fence: a process that registers again may have lost what it held
// in memory (its uncommitted versions, dirty marks), so mgmtd marks its
// target restarted (mgmt::Target.restarted, in the routing) until a step
// has taken it out of its chains. While the routing this process holds
// marks its target restarted, or is older than its registration, the
// target serves nothing and syncs nobody. (The fence once held until a
// chain's version moved past the first routing seen; the simulation found
// a chain whose LASTSRV member restarted wait forever on that: its version
// moves only when the sync the fence forbade finishes.)
//
// Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/clock.h"
#include "common/result.h"

namespace cistern::mgmt {
class Routing;
}

namespace cistern::storage {

struct ChainPosition {
  uint32_t chain = 0;
  uint64_t version = 0;
  bool serving = false;  // SERVING, readable (and past the restart fence)
  bool syncing = false;  // SYNCING: takes forwarded changes, is not read
  bool head = false;     // the first SERVING member: takes clients' changes
  // The next member that takes changes (SERVING or SYNCING); 0: none.
  uint32_t successor = 0;
  std::string successor_endpoint;
  bool successor_syncing = false;
  // The chain's other SERVING members, in chain order (the tail last): where
  // a repair fetches a good copy.
  std::vector<std::string> serving_peers;
};

class ChainTable {
 public:
  explicit ChainTable(Clock& clock = SystemClock::instance()) : clock_(clock) {}

  // Which target this server serves, once mgmtd has given it an id.
  void setTarget(uint32_t target);
  // This process registered `target`, answered at `routing_version`:
  // routings older than that are ignored, the next one is taken whatever
  // its version (the fence above).
  void registered(uint32_t target, uint64_t routing_version);
  uint32_t target() const;
  // Replaces the view with `routing`'s if it is newer; kInvalidArgument
  // naming the chain if a chain names a target the table does not have.
  Status update(const mgmt::Routing& routing);
  uint64_t routingVersion() const;

  // This target's place in `chain`; nullopt when it is not a member (or
  // behind the restart fence).
  std::optional<ChainPosition> position(uint32_t chain) const;
  // Chains whose successor of this target is SYNCING: this server streams
  // it what it lacks.
  std::vector<ChainPosition> syncsToRun() const;

  // A heartbeat sent at `sent` was answered: serve until half the timeout
  // after it.
  void renewLease(SteadyTime sent, uint32_t heartbeat_timeout_ms);
  bool leased() const;
  // kNotServing naming the target unless leased() and the chain is known
  // at `chain_version` with this target SERVING (kStaleChainVersion when the
  // versions differ: the caller or this server refreshes its routing).
  Result<ChainPosition> serving(uint32_t chain, uint64_t chain_version) const;

 private:
  Clock& clock_;
  mutable std::mutex mu_;
  uint32_t target_ = 0;
  uint64_t routing_version_ = 0;
  bool seen_ = false;  // a routing was applied
  uint64_t registered_version_ = 0;
  bool fenced_ = false;  // the routing marks this target restarted
  std::map<uint32_t, ChainPosition> positions_;
  SteadyTime lease_until_{};
};

}  // namespace cistern::storage
