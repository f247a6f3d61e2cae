// The deterministic simulation in `make test` (docs/chain_protocol.md, "The
// simulation"): a fixed range of seeds must pass every checker, a seed
// replays exactly, and each deliberately broken variant of the protocol is
// caught within the same seeds.
#include <gtest/gtest.h>

#include <cstdlib>

#include "common/log.h"
#include "tests/sim/world.h"

namespace cistern::sim {
namespace {

int seeds() {
  const char* env = std::getenv("CISTERN_SIM_SEEDS");
  return env ? std::atoi(env) : 3000;
}

class Sim : public ::testing::Test {
 protected:
  void SetUp() override { log::setLevel(log::Level::kWarn); }
};

TEST_F(Sim, EverySeedKeepsEveryInvariant) {
  const int n = seeds();
  uint64_t acked = 0, reads = 0, crashes = 0, lost = 0, cut = 0, mgmtd = 0;
  for (int s = 1; s <= n; ++s) {
    SimResult r = runSimulation(static_cast<uint64_t>(s));
    ASSERT_TRUE(r.ok) << "seed " << s << ": " << r.violation
                      << "\n  replay: tests/sim/swarm --seed " << s << " --trace";
    acked += r.writes_acked;
    reads += r.reads_checked;
    crashes += r.crashes;
    lost += r.lost_nodes;
    cut += r.partitions;
    mgmtd += r.mgmtd_crashes;
  }
  std::fprintf(stderr,
               "%d seeds: %llu writes acknowledged, %llu reads checked, %llu crashes, %llu nodes "
               "lost for good, %llu cut off, %llu mgmtd crashes\n",
               n, static_cast<unsigned long long>(acked), static_cast<unsigned long long>(reads),
               static_cast<unsigned long long>(crashes), static_cast<unsigned long long>(lost),
               static_cast<unsigned long long>(cut), static_cast<unsigned long long>(mgmtd));
  // The runs did what they are for.
  EXPECT_GT(acked, 50u * static_cast<uint64_t>(n));
  EXPECT_GT(reads, 20u * static_cast<uint64_t>(n));
  EXPECT_GT(crashes, static_cast<uint64_t>(n));
  EXPECT_GT(lost, static_cast<uint64_t>(n) / 10);
}

TEST_F(Sim, ASeedReplaysExactly) {
  for (uint64_t s : {7u, 8u}) {
    SimResult a = runSimulation(s), b = runSimulation(s);
    EXPECT_EQ(a.events, b.events) << "seed " << s;
    EXPECT_EQ(a.messages, b.messages);
    EXPECT_EQ(a.writes_acked, b.writes_acked);
    EXPECT_EQ(a.converged_ms, b.converged_ms);
  }
}

// A broken protocol must fail some seed of the range `make test` runs.
void expectCaught(const char* what, void (*broken)(SimOptions&)) {
  SimOptions o;
  broken(o);
  for (int s = 1; s <= seeds(); ++s) {
    SimResult r = runSimulation(static_cast<uint64_t>(s), o);
    if (r.ok) continue;
    std::fprintf(stderr, "%s: caught by seed %d: %s\n", what, s, r.violation.c_str());
    return;
  }
  ADD_FAILURE() << what << " passed every seed";
}

TEST_F(Sim, AHeadThatAnswersBeforeItsSuccessorsIsCaught) {
  expectCaught("acknowledging at the head", [](SimOptions& o) { o.bug_ack_at_head = true; });
}

TEST_F(Sim, AReplicaThatReadsAChunkWithAChangeInFlightIsCaught) {
  expectCaught("reading dirty chunks", [](SimOptions& o) { o.bug_read_dirty = true; });
}

TEST_F(Sim, AHeadThatTakesBackAChangeItsDiskFailedIsCaught) {
  expectCaught("taking back a failed change", [](SimOptions& o) { o.bug_head_takes_back = true; });
}

}  // namespace
}  // namespace cistern::sim
