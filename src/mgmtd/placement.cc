// Chain placement (placement.h): a greedy choice, replica by replica, of the
// target that keeps the counts most even.
#include "mgmtd/placement.h"

#include <fmt/format.h>

#include <algorithm>
#include <map>
#include <set>
#include <tuple>

namespace cistern::mgmtd {

Result<std::vector<PlacedChain>> placeChains(const std::vector<PlacementTarget>& targets,
                                             uint32_t replication, uint32_t chains) {
  if (replication < 1 || replication > 5)
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("replication {}: between 1 and 5", replication));
  if (chains == 0) return Status(ErrorCode::kInvalidArgument, "0 chains asked for");
  std::set<std::string> nodes;
  std::set<uint32_t> ids;
  for (const PlacementTarget& t : targets) {
    if (t.id == 0) return Status(ErrorCode::kInvalidArgument, "target id 0");
    if (!ids.insert(t.id).second)
      return Status(ErrorCode::kInvalidArgument, fmt::format("target {} listed twice", t.id));
    nodes.insert(t.node);
  }
  if (nodes.size() < replication)
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("replication {} needs targets on {} nodes; {} have targets",
                              replication, replication, nodes.size()));

  const size_t n = targets.size();
  std::vector<uint32_t> use(n, 0), heads(n, 0);
  std::map<std::string, uint32_t> node_use;
  // Chains each pair of nodes shares: what a node's failure puts on the other.
  std::map<std::pair<std::string, std::string>, uint32_t> shared;
  auto pairKey = [](const std::string& a, const std::string& b) {
    return a < b ? std::make_pair(a, b) : std::make_pair(b, a);
  };

  std::vector<std::vector<size_t>> out_idx;  // indexes into `targets`, head first
  out_idx.reserve(chains);
  std::vector<PlacedChain> out;
  out.reserve(chains);
  for (uint32_t c = 0; c < chains; ++c) {
    std::vector<size_t> chosen;
    std::set<std::string> used_nodes, used_racks;
    for (uint32_t r = 0; r < replication; ++r) {
      size_t best = n;
      std::tuple<uint32_t, uint32_t, uint32_t, uint32_t, uint32_t> best_key{};
      for (size_t i = 0; i < n; ++i) {
        const PlacementTarget& t = targets[i];
        if (used_nodes.count(t.node)) continue;
        uint32_t same_rack = !t.rack.empty() && used_racks.count(t.rack) ? 1 : 0;
        uint32_t pairs = 0;
        for (size_t j : chosen) pairs += shared[pairKey(t.node, targets[j].node)];
        auto key = std::make_tuple(same_rack, use[i], pairs, node_use[t.node], t.id);
        if (best == n || key < best_key) {
          best = i;
          best_key = key;
        }
      }
      chosen.push_back(best);
      used_nodes.insert(targets[best].node);
      if (!targets[best].rack.empty()) used_racks.insert(targets[best].rack);
    }
    for (size_t a = 0; a < chosen.size(); ++a) {
      ++use[chosen[a]];
      ++node_use[targets[chosen[a]].node];
      for (size_t b = a + 1; b < chosen.size(); ++b)
        ++shared[pairKey(targets[chosen[a]].node, targets[chosen[b]].node)];
    }
    // The head: the replica that has led the fewest chains so far.
    auto head = std::min_element(chosen.begin(), chosen.end(), [&](size_t a, size_t b) {
      return std::make_pair(heads[a], targets[a].id) < std::make_pair(heads[b], targets[b].id);
    });
    std::rotate(chosen.begin(), head, chosen.end());
    ++heads[chosen.front()];
    out_idx.push_back(std::move(chosen));
  }
  // Heads, evened out: while a target leads two chains more than another
  // could, the lead moves along a path of chains — each handed from its head
  // to a replica that leads the next one on the path — ending at a target
  // that leads fewer (an augmenting path; each move narrows the spread).
  for (;;) {
    const uint32_t most = *std::max_element(heads.begin(), heads.end());
    std::vector<int> via_chain(n, -1);  // chain that reached target i
    std::vector<size_t> from(n, n);
    std::vector<size_t> queue;
    for (size_t i = 0; i < n; ++i) {
      if (heads[i] == most && use[i] > 0) {
        queue.push_back(i);
        from[i] = i;
      }
    }
    size_t end = n;
    for (size_t q = 0; q < queue.size() && end == n; ++q) {
      const size_t a = queue[q];
      for (size_t c = 0; c < out_idx.size() && end == n; ++c) {
        if (out_idx[c].front() != a) continue;
        for (size_t b : out_idx[c]) {
          if (from[b] != n) continue;
          from[b] = a;
          via_chain[b] = static_cast<int>(c);
          if (heads[b] + 2 <= most) {
            end = b;
            break;
          }
          queue.push_back(b);
        }
      }
    }
    if (end == n) break;
    ++heads[end];
    for (size_t b = end; from[b] != b; b = from[b]) {
      auto& chosen = out_idx[static_cast<size_t>(via_chain[b])];
      std::rotate(chosen.begin(), std::find(chosen.begin(), chosen.end(), b), chosen.end());
      if (from[from[b]] == from[b]) --heads[from[b]];
    }
  }
  for (const auto& chosen : out_idx) {
    PlacedChain chain;
    for (size_t i : chosen) chain.targets.push_back(targets[i].id);
    out.push_back(std::move(chain));
  }
  return out;
}

std::optional<uint32_t> pickReplacement(const std::vector<PlacementTarget>& candidates,
                                        const std::vector<PlacementTarget>& others,
                                        const std::map<uint32_t, uint32_t>& uses) {
  std::set<std::string> nodes, racks;
  for (const PlacementTarget& t : others) {
    nodes.insert(t.node);
    if (!t.rack.empty()) racks.insert(t.rack);
  }
  std::map<std::string, uint32_t> node_use;
  for (const PlacementTarget& t : candidates) {
    auto it = uses.find(t.id);
    node_use[t.node] += it == uses.end() ? 0 : it->second;
  }
  std::optional<uint32_t> best;
  std::tuple<uint32_t, uint32_t, uint32_t, uint32_t> best_key{};
  for (const PlacementTarget& t : candidates) {
    if (nodes.count(t.node)) continue;
    auto it = uses.find(t.id);
    auto key = std::make_tuple(!t.rack.empty() && racks.count(t.rack) ? 1u : 0u,
                               it == uses.end() ? 0u : it->second, node_use[t.node], t.id);
    if (!best || key < best_key) {
      best = t.id;
      best_key = key;
    }
  }
  return best;
}

std::vector<PlannedMove> planRebalance(const std::vector<PlacementTarget>& usable,
                                       const std::vector<PlacementTarget>& draining,
                                       const std::vector<ChainMembers>& chains, uint32_t spread) {
  std::map<uint32_t, PlacementTarget> all;
  std::map<uint32_t, uint32_t> uses;  // usable target -> chains it is in
  for (const auto& t : usable) {
    all[t.id] = t;
    uses[t.id] = 0;
  }
  std::set<uint32_t> leaving;
  for (const auto& t : draining) {
    all[t.id] = t;
    leaving.insert(t.id);
  }
  std::map<uint32_t, std::vector<uint32_t>> members;
  for (const auto& c : chains) {
    members[c.chain] = c.targets;
    for (uint32_t t : c.targets)
      if (uses.count(t)) ++uses[t];
  }
  std::vector<PlannedMove> plan;
  std::set<uint32_t> moved;  // chains with a move in this plan
  // Where `from`'s replica of `chain` goes: a usable target not in it, on a
  // node (and rack, where possible) none of the others is on; for a
  // balancing move, only one that ends less used than `from` was.
  const auto destination = [&](uint32_t chain, uint32_t from, bool balance) {
    std::vector<PlacementTarget> others, candidates;
    std::set<uint32_t> in(members[chain].begin(), members[chain].end());
    for (uint32_t t : members[chain])
      if (t != from && all.count(t)) others.push_back(all[t]);
    for (const auto& t : usable) {
      if (in.count(t.id)) continue;
      if (balance && uses[t.id] + 1 >= uses[from]) continue;
      candidates.push_back(t);
    }
    return pickReplacement(candidates, others, uses);
  };
  const auto apply = [&](uint32_t chain, uint32_t from, uint32_t to) {
    plan.push_back({chain, from, to});
    moved.insert(chain);
    for (uint32_t& t : members[chain])
      if (t == from) t = to;
    if (uses.count(from)) --uses[from];
    ++uses[to];
  };
  // Every replica off the draining targets first.
  for (auto& [chain, ts] : members) {
    for (uint32_t from : std::vector<uint32_t>(ts)) {
      if (!leaving.count(from) || moved.count(chain)) continue;
      if (auto to = destination(chain, from, false)) apply(chain, from, *to);
    }
  }
  // Then the most used usable target gives a replica to a less used one,
  // until the counts are within `spread` or no move helps.
  for (;;) {
    if (uses.empty()) break;
    auto [lo, hi] = std::minmax_element(uses.begin(), uses.end(), [](const auto& a, const auto& b) {
      return a.second != b.second ? a.second < b.second : a.first < b.first;
    });
    if (hi->second - lo->second <= spread) break;
    const uint32_t from = hi->first;
    bool done = false;
    for (auto& [chain, ts] : members) {
      if (moved.count(chain) || std::find(ts.begin(), ts.end(), from) == ts.end()) continue;
      if (auto to = destination(chain, from, true)) {
        apply(chain, from, *to);
        done = true;
        break;
      }
    }
    if (!done) break;  // every chain of the most used target moved or has nowhere to go
  }
  return plan;
}

}  // namespace cistern::mgmtd
