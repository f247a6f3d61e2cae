// Chain placement (placement.h): replicas on distinct nodes (and racks),
// even use of targets and heads, a failed node's chains spread over the
// others, clear errors for what cannot be placed.
#include "mgmtd/placement.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <set>

namespace cistern::mgmtd {
namespace {

std::vector<PlacementTarget> cluster(int nodes, int per_node, int racks = 0) {
  std::vector<PlacementTarget> out;
  uint32_t id = 1;
  for (int n = 0; n < nodes; ++n) {
    for (int t = 0; t < per_node; ++t) {
      out.push_back({id++, "node" + std::to_string(n),
                     racks ? "rack" + std::to_string(n % racks) : std::string()});
    }
  }
  return out;
}

template <typename Map>
std::pair<uint32_t, uint32_t> minMax(const Map& m) {
  uint32_t lo = UINT32_MAX, hi = 0;
  for (auto& [k, v] : m) {
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  return {lo, hi};
}

void checkSpread(const std::vector<PlacementTarget>& targets, uint32_t replication,
                 uint32_t chains) {
  auto placed = placeChains(targets, replication, chains);
  ASSERT_TRUE(placed.ok()) << placed.status().toString();
  ASSERT_EQ(placed->size(), chains);
  std::map<uint32_t, const PlacementTarget*> by_id;
  for (auto& t : targets) by_id[t.id] = &t;
  std::map<uint32_t, uint32_t> use, heads;
  for (auto& t : targets) use[t.id] = heads[t.id] = 0;
  std::map<std::string, std::map<std::string, uint32_t>> shared;
  for (auto& c : *placed) {
    ASSERT_EQ(c.targets.size(), replication);
    std::set<std::string> nodes;
    for (uint32_t t : c.targets) {
      EXPECT_TRUE(nodes.insert(by_id[t]->node).second) << "two replicas on " << by_id[t]->node;
      ++use[t];
    }
    ++heads[c.targets.front()];
    for (uint32_t a : c.targets)
      for (uint32_t b : c.targets)
        if (a != b) ++shared[by_id[a]->node][by_id[b]->node];
  }
  auto [lo, hi] = minMax(use);
  EXPECT_LE(hi - lo, 1u) << "targets unevenly used";
  auto [hlo, hhi] = minMax(heads);
  EXPECT_LE(hhi - hlo, 1u) << "heads unevenly spread";
  // A node's chains share their other replicas evenly among the other nodes.
  for (auto& [node, others] : shared) {
    auto [slo, shi] = minMax(others);
    EXPECT_LE(shi - slo, 2u) << node << "'s chains lean on some nodes";
  }
}

TEST(Placement, FourNodesReplicationThree) { checkSpread(cluster(4, 1), 3, 8); }
TEST(Placement, SixNodesTwoDisksEach) { checkSpread(cluster(6, 2), 3, 24); }
TEST(Placement, TenNodesFourDisksReplicationTwo) { checkSpread(cluster(10, 4), 2, 80); }
TEST(Placement, ReplicationOneUsesEveryTargetOnce) { checkSpread(cluster(3, 2), 1, 6); }

TEST(Placement, ReplicasLandOnDistinctRacksWhereThereAreEnough) {
  auto targets = cluster(6, 1, 3);
  auto placed = placeChains(targets, 3, 12);
  ASSERT_TRUE(placed.ok());
  for (auto& c : *placed) {
    std::set<std::string> racks;
    for (uint32_t t : c.targets) racks.insert(targets[t - 1].rack);
    EXPECT_EQ(racks.size(), 3u);
  }
}

TEST(Placement, TheSameInputGivesTheSameChains) {
  auto a = placeChains(cluster(5, 2), 3, 10), b = placeChains(cluster(5, 2), 3, 10);
  ASSERT_TRUE(a.ok() && b.ok());
  for (size_t i = 0; i < a->size(); ++i) EXPECT_EQ((*a)[i].targets, (*b)[i].targets);
}

TEST(Placement, AReplacementIsOnAnotherNodePreferablyAnotherRackAndTheLeastUsed) {
  std::vector<PlacementTarget> others = {{1, "a", "r1"}, {2, "b", "r2"}};
  std::map<uint32_t, uint32_t> uses = {{3, 5}, {4, 1}, {5, 2}, {6, 0}};
  // 3 is on a's node; 4 on rack r1 (a member's); 5 on a new rack; 6 the
  // least used but on b's node.
  std::vector<PlacementTarget> candidates = {
      {3, "a", "r1"}, {4, "c", "r1"}, {5, "d", "r3"}, {6, "b", "r2"}};
  EXPECT_EQ(pickReplacement(candidates, others, uses), std::optional<uint32_t>(5));
  candidates.erase(candidates.begin() + 2);  // without 5: another node on a used rack
  EXPECT_EQ(pickReplacement(candidates, others, uses), std::optional<uint32_t>(4));
  EXPECT_EQ(pickReplacement({{3, "a", ""}, {6, "b", ""}}, others, uses), std::nullopt);
  // Ties: the fewest chains, then the lowest id.
  EXPECT_EQ(pickReplacement({{8, "e", ""}, {7, "f", ""}}, others, {}), std::optional<uint32_t>(7));
}

// `count` chains of `replication` laid out over `targets`, numbered from 1.
std::vector<ChainMembers> laidOut(const std::vector<PlacementTarget>& targets, uint32_t replication,
                                  uint32_t count) {
  std::vector<ChainMembers> chains;
  auto placed = placeChains(targets, replication, count);
  EXPECT_TRUE(placed.ok()) << placed.status().toString();
  if (!placed.ok()) return chains;
  for (size_t i = 0; i < placed->size(); ++i)
    chains.push_back({static_cast<uint32_t>(i + 1), (*placed)[i].targets});
  return chains;
}

// Counts of chains per target after applying `plan` to `chains`.
std::map<uint32_t, uint32_t> usesAfter(std::vector<ChainMembers> chains,
                                       const std::vector<PlannedMove>& plan) {
  std::map<uint32_t, uint32_t> uses;
  for (const auto& m : plan)
    for (auto& c : chains)
      if (c.chain == m.chain) std::replace(c.targets.begin(), c.targets.end(), m.from, m.to);
  for (const auto& c : chains)
    for (uint32_t t : c.targets) ++uses[t];
  return uses;
}

TEST(Placement, ANewNodeTakesChainsUntilTheSpreadHolds) {
  auto four = cluster(4, 1);
  auto chains = laidOut(four, 3, 8);
  ASSERT_EQ(chains.size(), 8u);
  auto five = cluster(5, 1);  // a fifth node joined
  auto plan = planRebalance(five, {}, chains, 1);
  ASSERT_FALSE(plan.empty());
  std::set<uint32_t> moved;
  for (const auto& m : plan) EXPECT_TRUE(moved.insert(m.chain).second) << "one move per chain";
  auto uses = usesAfter(chains, plan);
  uint32_t lo = UINT32_MAX, hi = 0;
  for (const auto& t : five) {
    lo = std::min(lo, uses[t.id]);
    hi = std::max(hi, uses[t.id]);
  }
  EXPECT_LE(hi - lo, 1u) << "24 replicas over 5 targets";
  // Never two replicas of a chain on one node.
  std::map<uint32_t, std::string> node;
  for (const auto& t : five) node[t.id] = t.node;
  for (auto c : chains) {
    for (const auto& m : plan)
      if (m.chain == c.chain) std::replace(c.targets.begin(), c.targets.end(), m.from, m.to);
    std::set<std::string> nodes;
    for (uint32_t t : c.targets) nodes.insert(node[t]);
    EXPECT_EQ(nodes.size(), 3u) << "chain " << c.chain;
  }
  EXPECT_TRUE(planRebalance(five, {}, chains, 8).empty()) << "within a wide spread already";
}

TEST(Placement, ADrainingNodeGivesAwayEveryReplica) {
  auto five = cluster(5, 1);
  auto chains = laidOut(five, 3, 5);
  ASSERT_EQ(chains.size(), 5u);
  std::vector<PlacementTarget> usable(five.begin(), five.end() - 1), draining = {five.back()};
  auto plan = planRebalance(usable, draining, chains, 100);
  auto uses = usesAfter(chains, plan);
  EXPECT_EQ(uses[draining[0].id], 0u) << "nothing left on the draining node";
  for (const auto& m : plan) EXPECT_EQ(m.from, draining[0].id) << "only drain moves (spread 100)";
}

TEST(Placement, WhatCannotBePlacedIsAClearError) {
  auto few = placeChains(cluster(2, 3), 3, 4);
  EXPECT_EQ(few.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(few.status().message().find("3 nodes; 2 have targets"), std::string::npos)
      << few.status().toString();
  EXPECT_EQ(placeChains(cluster(6, 1), 0, 4).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(placeChains(cluster(6, 1), 6, 4).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(placeChains(cluster(6, 1), 3, 0).code(), ErrorCode::kInvalidArgument);
  auto dup = cluster(4, 1);
  dup[1].id = dup[0].id;
  EXPECT_EQ(placeChains(dup, 3, 4).code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace cistern::mgmtd
