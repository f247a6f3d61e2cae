// The chain state machine (chain_states.h) case by case, then under random
// liveness: a chain always has serving targets or a LASTSRV holding its
// newest data, never both; a target that fell behind serves again only
// through a finished sync; one target syncs at a time.
#include "mgmtd/chain_states.h"

#include <gtest/gtest.h>

#include <map>
#include <set>

#include "common/random.h"

namespace cistern::mgmtd {
namespace {

using S = TargetState;

ChainView chain(std::vector<ChainMember> members, uint64_t version = 1) {
  return ChainView{7, version, std::move(members)};
}

// Reports from a map: target -> {alive, synced}; missing targets are alive.
auto reports(std::map<uint32_t, TargetReport> r) {
  return [r](uint32_t t) {
    auto it = r.find(t);
    return it == r.end() ? TargetReport{true, false} : it->second;
  };
}

TEST(ChainStates, AHealthyChainStaysAsItIsAtTheSameVersion) {
  auto c = chain({{1, S::kServing}, {2, S::kServing}, {3, S::kServing}}, 5);
  auto n = nextChain(c, reports({}));
  EXPECT_EQ(n.members, c.members);
  EXPECT_EQ(n.version, 5u);
  EXPECT_EQ(n.serving(), (std::vector<uint32_t>{1, 2, 3}));
}

TEST(ChainStates, ASilentTargetGoesOfflineToTheEndAndTheVersionMoves) {
  auto n = nextChain(chain({{1, S::kServing}, {2, S::kServing}, {3, S::kServing}}),
                     reports({{2, {false, false}}}));
  EXPECT_EQ(n.members,
            (std::vector<ChainMember>{{1, S::kServing}, {3, S::kServing}, {2, S::kOffline}}));
  EXPECT_EQ(n.version, 2u);
}

TEST(ChainStates, TheLastServingTargetToGoSilentHoldsTheChain) {
  // All at once: the tail has every acknowledged write.
  auto n = nextChain(chain({{1, S::kServing}, {2, S::kServing}, {3, S::kServing}}),
                     reports({{1, {false, false}}, {2, {false, false}}, {3, {false, false}}}));
  EXPECT_EQ(n.members,
            (std::vector<ChainMember>{{3, S::kLastServing}, {1, S::kOffline}, {2, S::kOffline}}));
  EXPECT_TRUE(n.serving().empty());
  // One by one: the last one left.
  auto c = chain({{1, S::kServing}, {2, S::kServing}, {3, S::kServing}});
  c = nextChain(c, reports({{3, {false, false}}}));
  c = nextChain(c, reports({{3, {false, false}}, {1, {false, false}}}));
  c = nextChain(c, reports({{3, {false, false}}, {1, {false, false}}, {2, {false, false}}}));
  EXPECT_EQ(c.members,
            (std::vector<ChainMember>{{2, S::kLastServing}, {1, S::kOffline}, {3, S::kOffline}}));
  // An older replica back first waits; the chain serves again only when the
  // LASTSRV is back, and the older one then syncs from it.
  c = nextChain(c, reports({{2, {false, false}}, {1, {false, false}}}));
  EXPECT_EQ(c.members,
            (std::vector<ChainMember>{{3, S::kWaiting}, {2, S::kLastServing}, {1, S::kOffline}}));
  EXPECT_TRUE(c.serving().empty());
  c = nextChain(c, reports({{1, {false, false}}}));
  EXPECT_EQ(c.members,
            (std::vector<ChainMember>{{2, S::kServing}, {3, S::kSyncing}, {1, S::kOffline}}));
}

TEST(ChainStates, AReturningTargetWaitsSyncsAloneAndJoinsAtTheTail) {
  auto c = chain({{1, S::kServing}, {2, S::kOffline}, {3, S::kOffline}});
  c = nextChain(c, reports({}));  // both back
  EXPECT_EQ(c.members,
            (std::vector<ChainMember>{{1, S::kServing}, {2, S::kWaiting}, {3, S::kWaiting}}));
  c = nextChain(c, reports({}));
  EXPECT_EQ(c.members,
            (std::vector<ChainMember>{{1, S::kServing}, {2, S::kSyncing}, {3, S::kWaiting}}))
      << "one target syncs at a time";
  c = nextChain(c, reports({{2, {true, true}}}));
  EXPECT_EQ(c.members,
            (std::vector<ChainMember>{{1, S::kServing}, {2, S::kServing}, {3, S::kSyncing}}));
  c = nextChain(c, reports({{3, {true, true}}}));
  EXPECT_EQ(c.serving(), (std::vector<uint32_t>{1, 2, 3}));
}

TEST(ChainStates, ASyncWhoseSourceDiesGoesBackToWaiting) {
  auto c = chain({{1, S::kServing}, {2, S::kSyncing}});
  c = nextChain(c, reports({{1, {false, false}}}));
  EXPECT_EQ(c.members, (std::vector<ChainMember>{{2, S::kWaiting}, {1, S::kLastServing}}));
}

TEST(ChainStates, RandomLivenessKeepsEveryInvariant) {
  Xoshiro256 rng(42);
  for (int run = 0; run < 200; ++run) {
    const uint32_t n = 1 + static_cast<uint32_t>(rng.uniform(5));
    ChainView c{1, 1, {}};
    for (uint32_t t = 1; t <= n; ++t) c.members.push_back({t, S::kServing});
    // Targets that hold every acknowledged write (all, at the start).
    std::set<uint32_t> current;
    for (uint32_t t = 1; t <= n; ++t) current.insert(t);
    for (int step = 0; step < 300; ++step) {
      std::map<uint32_t, TargetReport> r;
      for (uint32_t t = 1; t <= n; ++t) r[t] = {rng.uniform(10) < 7, rng.uniform(3) == 0};
      ChainView next = nextChain(c, reports(r));
      std::map<uint32_t, S> before, after;
      for (auto& m : c.members) before[m.target] = m.state;
      for (auto& m : next.members) after[m.target] = m.state;
      ASSERT_EQ(after.size(), n);
      int serving = 0, lastsrv = 0, syncing = 0;
      for (auto& [t, s] : after) {
        serving += s == S::kServing;
        lastsrv += s == S::kLastServing;
        syncing += s == S::kSyncing;
        if (s == S::kServing) {
          // Only from SERVING or LASTSRV (alive), or a finished sync.
          ASSERT_TRUE(before[t] == S::kServing || before[t] == S::kLastServing ||
                      (before[t] == S::kSyncing && r[t].synced))
              << "target " << t << " served from " << stateName(before[t]);
        }
      }
      ASSERT_TRUE((serving > 0) != (lastsrv > 0))
          << "serving " << serving << ", lastsrv " << lastsrv;
      ASSERT_LE(lastsrv, 1);
      ASSERT_LE(syncing, 1);
      EXPECT_EQ(next.version != c.version, next.members != c.members);
      // Serving targets first, in one block.
      bool seen_other = false;
      for (auto& m : next.members) {
        if (m.state != S::kServing) seen_other = true;
        ASSERT_FALSE(seen_other && m.state == S::kServing);
      }
      // Writes acknowledged now reach every serving target (and syncing
      // ones); a target left out of them no longer holds every write.
      std::set<uint32_t> now;
      for (auto& [t, s] : after) {
        if (s == S::kServing && (current.count(t) || before[t] == S::kSyncing)) now.insert(t);
        if (s == S::kLastServing && current.count(t)) now.insert(t);
      }
      for (auto& [t, s] : after) {
        if (s == S::kServing) {
          ASSERT_TRUE(now.count(t)) << "target " << t << " serves stale data";
        }
      }
      current = now;
      c = next;
    }
  }
}

}  // namespace
}  // namespace cistern::mgmtd
