// Chain placement: which targets form each chain of a cluster
// (docs/chain_protocol.md, "Placement").
//
// Every chain has `replication` targets on as many different nodes (never
// two replicas on one node), on different racks where the racks allow it.
// Targets take part in as equal a number of chains as the count allows, and
// the replicas of each node's chains spread over the other nodes as evenly
// as they can, so that when a node fails its chains' reads and the
// re-replication load fall evenly on the rest. Heads (which take the writes)
// are spread the same way. Deterministic: the same targets and counts give
// the same chains.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/result.h"

namespace cistern::mgmtd {

struct PlacementTarget {
  uint32_t id = 0;
  std::string node;  // the machine (a failure domain)
  std::string rack;  // a larger failure domain; empty: unknown
};

struct PlacedChain {
  std::vector<uint32_t> targets;  // head first
};

// kInvalidArgument when replication is outside 1..5, the chain count is 0,
// or fewer nodes have targets than the replication needs (naming both).
Result<std::vector<PlacedChain>> placeChains(const std::vector<PlacementTarget>& targets,
                                             uint32_t replication, uint32_t chains);

// The target that takes a lost replica's place in a chain (re-replication):
// among `candidates` (targets that work now and are not in the chain), one
// on a node no remaining member (`others`) is on, preferring a rack none
// of them is on, then the fewest chains (`uses`: target -> chains it is
// in), then the node with the fewest chains, then the lowest id. nullopt
// when every candidate shares a node with a member.
std::optional<uint32_t> pickReplacement(const std::vector<PlacementTarget>& candidates,
                                        const std::vector<PlacementTarget>& others,
                                        const std::map<uint32_t, uint32_t>& uses);

// Rebalancing (docs/chain_protocol.md, "Rebalance and drain"): moves of one
// replica each that bring every usable target's chain count within
// `spread` of the others' and take every replica off targets of draining
// nodes. `usable`: the targets that may receive replicas (working, on no
// draining node); `draining`: targets whose replicas must all move. A chain
// moves at most one replica per plan (a move adds the new replica, which
// syncs, before the old one leaves: never fewer copies); each move obeys
// pickReplacement's rules. Deterministic.
struct PlannedMove {
  uint32_t chain = 0, from = 0, to = 0;
  bool operator==(const PlannedMove&) const = default;
};
struct ChainMembers {
  uint32_t chain = 0;
  std::vector<uint32_t> targets;  // every member
};
std::vector<PlannedMove> planRebalance(const std::vector<PlacementTarget>& usable,
                                       const std::vector<PlacementTarget>& draining,
                                       const std::vector<ChainMembers>& chains, uint32_t spread);

}  // namespace cistern::mgmtd
