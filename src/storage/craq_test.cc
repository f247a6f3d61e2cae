// CRAQ's replica state machine (craq.h) under a fake network that delays,
// reorders, duplicates and drops messages, with clients that retry, and
// chains that lose their middle or their tail mid-run. Checked at every
// step: a client is answered only for a version the tail has committed, all
// answers for one update carry one version, a clean read never shows a
// version the tail has not committed, committed versions never go back;
// and at the end every write is answered and every live replica holds the
// same committed chunk.
#include "storage/craq.h"

#include <fmt/format.h>
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "common/random.h"

namespace cistern::storage::craq {
namespace {

struct Message {
  bool ack = false;
  bool from_client = false;
  int from = -1, to = -1;  // replica indexes; -1: a client
  int client = -1;         // the client a head's answer goes to
  Write write;
  Ack a;
};

struct Sim {
  explicit Sim(uint64_t seed, int replicas) : rng(seed), nodes(static_cast<size_t>(replicas)) {
    for (int i = 0; i < replicas; ++i) chain.push_back(i);
    reconfigure();
  }

  Xoshiro256 rng;
  std::vector<Replica> nodes;
  std::vector<int> chain;  // live replicas, head first
  uint64_t chain_version = 0;
  std::vector<Message> net;
  // Per client: the update in flight and the answers seen.
  struct Client {
    uint64_t seq = 0;
    bool waiting = false;
    int since_sent = 0;
    std::map<uint64_t, std::set<uint64_t>> answers;  // seq -> versions answered
  };
  std::vector<Client> clients = std::vector<Client>(3);
  std::map<int, uint64_t> last_committed;

  Role roleOf(size_t pos) const {
    if (chain.size() == 1) return Role::kOnly;
    if (pos == 0) return Role::kHead;
    return pos + 1 == chain.size() ? Role::kTail : Role::kMiddle;
  }
  void reconfigure() {
    ++chain_version;
    for (size_t p = 0; p < chain.size(); ++p)
      emit(chain[p], nodes[static_cast<size_t>(chain[p])].setChain(chain_version, roleOf(p)));
  }
  int successor(int node) const {
    for (size_t p = 0; p + 1 < chain.size(); ++p)
      if (chain[p] == node) return chain[p + 1];
    return -2;
  }
  int predecessor(int node) const {
    for (size_t p = 1; p < chain.size(); ++p)
      if (chain[p] == node) return chain[p - 1];
    return -2;
  }
  bool live(int node) const { return std::find(chain.begin(), chain.end(), node) != chain.end(); }
  Replica& tail() { return nodes[static_cast<size_t>(chain.back())]; }

  void emit(int node, const Output& out) {
    for (const Write& w : out.forward)
      if (int s = successor(node); s >= 0) net.push_back({false, false, node, s, -1, w, {}});
    for (const Ack& a : out.ack_up)
      if (int p = predecessor(node); p >= 0) net.push_back({true, false, node, p, -1, {}, a});
    for (const Ack& a : out.answer_client)
      net.push_back({true, false, node, -1, static_cast<int>(a.id.client), {}, a});
  }

  void clientSend(int c) {
    Client& cl = clients[static_cast<size_t>(c)];
    Write w;
    w.id = {static_cast<uint64_t>(c), cl.seq};
    w.chain_version = chain_version;
    w.data = fmt::format("c{}-{}", c, cl.seq);
    net.push_back({false, true, -1, chain.front(), c, w, {}});
    cl.waiting = true;
    cl.since_sent = 0;
  }

  // Delivers one random message (maybe twice, maybe not at all).
  void step() {
    for (size_t c = 0; c < clients.size(); ++c) {
      Client& cl = clients[c];
      if (cl.waiting && ++cl.since_sent > 40) {
        // No answer yet: send again (to the head of the chain as now).
        Write w;
        w.id = {c, cl.seq};
        w.chain_version = chain_version;
        w.data = fmt::format("c{}-{}", c, cl.seq);
        net.push_back({false, true, -1, chain.front(), static_cast<int>(c), w, {}});
        cl.since_sent = 0;
      }
    }
    if (net.empty()) return;
    size_t i = rng.uniform(net.size());
    Message m = net[i];
    if (rng.uniform(10) != 0)
      net.erase(net.begin() + static_cast<std::ptrdiff_t>(i));  // else: duplicated
    if (rng.uniform(50) == 0) return;                           // dropped
    if (m.to == -1) {                                           // an answer to a client
      Client& cl = clients[static_cast<size_t>(m.client)];
      cl.answers[m.a.id.seq].insert(m.a.version);
      ASSERT_GE(tail().committedVersion(), m.a.version) << "answered before the tail committed";
      if (cl.waiting && m.a.id.seq == cl.seq) {
        cl.waiting = false;
        ++cl.seq;
      }
      return;
    }
    if (!live(m.to)) return;
    Replica& r = nodes[static_cast<size_t>(m.to)];
    if (m.ack) {
      emit(m.to, r.onAck(m.a));
    } else {
      Write w = m.write;
      if (m.from_client) w.chain_version = chain_version;  // clients refresh routing on refusal
      emit(m.to, r.onWrite(w));
    }
  }

  void check() {
    const uint64_t tail_version = tail().committedVersion();
    for (int n : chain) {
      const Replica& r = nodes[static_cast<size_t>(n)];
      auto read = r.read();
      if (read.clean) {
        ASSERT_LE(read.version, tail_version) << "replica " << n << " dirty read";
      }
      ASSERT_GE(r.committedVersion(), last_committed[n]) << "replica " << n << " went back";
      last_committed[n] = r.committedVersion();
    }
  }
};

void run(uint64_t seed, int replicas, bool lose_middle, bool lose_tail) {
  Sim sim(seed, replicas);
  const int writes_per_client = 30;
  for (size_t c = 0; c < sim.clients.size(); ++c) sim.clientSend(static_cast<int>(c));
  bool middle_lost = false, tail_lost = false;
  for (int s = 0; s < 200000; ++s) {
    // Failures while writes are in flight: after a third and two thirds of
    // them, at a step of the seed's choosing within the next few.
    const uint64_t committed = sim.tail().committedVersion();
    if (lose_middle && !middle_lost && committed >= 30 && sim.rng.uniform(4) == 0) {
      sim.chain.erase(sim.chain.begin() + 1);
      sim.reconfigure();
      middle_lost = true;
    }
    if (lose_tail && !tail_lost && committed >= 60 && sim.rng.uniform(4) == 0) {
      sim.chain.pop_back();
      sim.reconfigure();
      tail_lost = true;
    }
    sim.step();
    if (::testing::Test::HasFatalFailure()) return;
    sim.check();
    if (::testing::Test::HasFatalFailure()) return;
    for (size_t c = 0; c < sim.clients.size(); ++c) {
      auto& cl = sim.clients[c];
      if (!cl.waiting && cl.seq < writes_per_client) sim.clientSend(static_cast<int>(c));
    }
    bool done = true;
    for (auto& cl : sim.clients) done &= cl.seq >= writes_per_client && !cl.waiting;
    if (done) break;
  }
  EXPECT_EQ(middle_lost, lose_middle) << "seed " << seed;
  EXPECT_EQ(tail_lost, lose_tail) << "seed " << seed;
  for (auto& cl : sim.clients) {
    ASSERT_EQ(cl.seq, static_cast<uint64_t>(writes_per_client))
        << "seed " << seed << ": writes stuck";
    for (auto& [seq, versions] : cl.answers)
      ASSERT_EQ(versions.size(), 1u)
          << "seed " << seed << ": update " << seq << " answered with two versions";
  }
  // Deliver what is left; then every live replica holds the tail's chunk.
  for (int s = 0; s < 100000 && !sim.net.empty(); ++s) {
    Message m = sim.net.back();
    sim.net.pop_back();
    if (m.to < 0 || !sim.live(m.to)) continue;
    Replica& r = sim.nodes[static_cast<size_t>(m.to)];
    sim.emit(m.to, m.ack ? r.onAck(m.a) : r.onWrite(m.write));
  }
  // Versions: each committed update once, consecutively.
  EXPECT_EQ(sim.tail().committedVersion(), sim.clients.size() * writes_per_client)
      << "seed " << seed;
  for (int n : sim.chain) {
    EXPECT_EQ(sim.nodes[static_cast<size_t>(n)].committedVersion(), sim.tail().committedVersion())
        << "seed " << seed << " replica " << n;
    EXPECT_EQ(sim.nodes[static_cast<size_t>(n)].committedData(), sim.tail().committedData());
  }
}

TEST(Craq, ThreeReplicasUnderAMisbehavingNetwork) {
  for (uint64_t seed = 1; seed <= 30; ++seed) run(seed, 3, false, false);
}
TEST(Craq, TheMiddleFailsMidRun) {
  for (uint64_t seed = 1; seed <= 30; ++seed) run(seed, 3, true, false);
}
TEST(Craq, TheMiddleAndThenTheTailFail) {
  for (uint64_t seed = 1; seed <= 30; ++seed) run(seed, 3, true, true);
}
TEST(Craq, FiveReplicasLoseTheirTail) {
  for (uint64_t seed = 1; seed <= 20; ++seed) run(seed, 5, false, true);
}
TEST(Craq, OneReplicaCommitsAtOnce) {
  for (uint64_t seed = 1; seed <= 5; ++seed) run(seed, 1, false, false);
}

TEST(Craq, StaleChainVersionsAndMisroutedWritesAreRefused) {
  Replica head, tail;
  (void)head.setChain(3, Role::kHead);
  (void)tail.setChain(3, Role::kTail);
  Write w{{1, 1}, 2, 0, "x"};
  auto out = head.onWrite(w);
  ASSERT_EQ(out.refuse.size(), 1u);
  EXPECT_EQ(out.refuse[0].second.code(), ErrorCode::kStaleChainVersion);
  w.chain_version = 3;
  out = tail.onWrite(w);  // a client write sent to the tail
  ASSERT_EQ(out.refuse.size(), 1u);
  out = head.onWrite(w);
  ASSERT_EQ(out.forward.size(), 1u);
  EXPECT_EQ(out.forward[0].version, 1u);
  EXPECT_FALSE(head.read().clean) << "pending: readers go to the tail";
  out = tail.onWrite(out.forward[0]);
  ASSERT_EQ(out.ack_up.size(), 1u);
  EXPECT_TRUE(tail.read().clean);
  out = head.onAck(out.ack_up[0]);
  ASSERT_EQ(out.answer_client.size(), 1u);
  EXPECT_EQ(head.read().data, "x");
  // The same update again: answered, not applied twice.
  out = head.onWrite(w);
  ASSERT_EQ(out.answer_client.size(), 1u);
  EXPECT_EQ(out.answer_client[0].version, 1u);
  EXPECT_TRUE(out.forward.empty());
  EXPECT_EQ(head.committedVersion(), 1u);
}

}  // namespace
}  // namespace cistern::storage::craq
