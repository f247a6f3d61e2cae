// Kills a writing child with SIGKILL at random points, then checks on reopen
// that every chunk is at a committed version with a correct CRC, no
// acknowledged write is lost, and slots of unfinished writes are reclaimed.
// Rounds: $CISTERN_CRASH_ROUNDS (default 200).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <map>

#include "storage/chunk_crash_content.h"
#include "storage/chunk_engine.h"
#include "tests/support/child_process.h"

namespace cistern::storage {
namespace {

// Runs the child for `run_ms`, kills it, returns the highest acked version per chunk.
std::map<uint32_t, uint64_t> runAndKill(const std::string& dir, uint64_t seed, int run_ms) {
  std::map<uint32_t, uint64_t> acked;
  auto out = testing::runAndKill(CHUNK_CRASH_CHILD, {dir, std::to_string(seed)}, run_ms);
  for (const auto& line : testing::completeLines(out)) {
    unsigned idx = 0;
    unsigned long long ver = 0;
    if (std::sscanf(line.c_str(), "%u %llu", &idx, &ver) == 2)
      acked[idx] = std::max<uint64_t>(acked[idx], ver);
  }
  return acked;
}

TEST(ChunkCrash, SigkillAtRandomPointsLeavesOnlyCommittedChunks) {
  char tmpl[] = "/tmp/cistern-chunk-crash-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  int rounds = 200;
  if (const char* env = std::getenv("CISTERN_CRASH_ROUNDS")) rounds = std::atoi(env);
  std::map<uint32_t, uint64_t> acked_ever;
  uint64_t total_acked = 0;
  for (int round = 0; round < rounds; ++round) {
    auto acked = runAndKill(dir, static_cast<uint64_t>(round) * 7 + 1, 30 + (round * 37) % 90);
    for (auto& [i, v] : acked) {
      acked_ever[i] = std::max(acked_ever[i], v);
      total_acked++;
    }
    ChunkEngineOptions o;
    o.path = dir;
    o.group_bytes = 1 << 20;
    auto engine = ChunkEngine::open(o);
    ASSERT_TRUE(engine.ok()) << "round " << round << ": " << engine.status().toString();
    uint64_t chunks = 0, slots = 0;
    for (uint32_t i = 0; i < kCrashChunks; ++i) {
      auto m = (*engine)->query({kCrashInode, i});
      ASSERT_TRUE(m.ok());
      if (!*m) {
        ASSERT_EQ(acked_ever.count(i), 0u)
            << "acknowledged chunk " << i << " lost in round " << round;
        continue;
      }
      ++chunks;
      uint64_t v = (*m)->chunk_version;
      ASSERT_GE(v, acked_ever[i]) << "chunk " << i << " went back to an older version in round "
                                  << round;
      ASSERT_LE(v, acked_ever[i] + 1) << "chunk " << i << " skipped versions";
      acked_ever[i] = v;  // an unacknowledged but committed write is now the floor
      auto want = crashContent(i, v);
      std::vector<uint8_t> got(want.size() + 1);
      auto n = (*engine)->read({kCrashInode, i}, 0, got);
      ASSERT_TRUE(n.ok()) << "chunk " << i << " round " << round << ": " << n.status().toString();
      ASSERT_EQ(*n, want.size());
      got.resize(*n);
      ASSERT_EQ(got, want) << "chunk " << i << " round " << round;
    }
    for (uint32_t c = 0; c < kClassCount; ++c) slots += (*engine)->usedSlots(c);
    ASSERT_EQ(slots, chunks) << "leaked slots not reclaimed in round " << round;
  }
  EXPECT_GT(total_acked, 0u);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace cistern::storage
