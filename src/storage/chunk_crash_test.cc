// Kills a writing child with SIGKILL at random points, then checks on reopen
// that every chunk is at a committed version with a correct CRC, no
// acknowledged write is lost, and slots of unfinished writes are reclaimed.
// Rounds: $CISTERN_CRASH_ROUNDS (default 200).
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "storage/chunk_crash_content.h"
#include "storage/chunk_engine.h"
#include "tests/support/child_process.h"

namespace cistern::storage {
namespace {

// Runs the child for `run_ms`, kills it, returns the highest acked version
// per chunk. With `after_first_ack` the time runs from its first
// acknowledged write, however slowly it starts.
std::map<uint32_t, uint64_t> runAndKill(const std::string& dir, uint64_t seed, int run_ms,
                                        bool power_loss = false, bool after_first_ack = false,
                                        bool unsynced = false) {
  std::map<uint32_t, uint64_t> acked;
  std::vector<std::string> args{dir, std::to_string(seed)};
  if (power_loss) args.push_back("power-loss");
  if (unsynced) args.push_back("unsynced");
  // Power-loss rounds are about acknowledged writes: always from the first one.
  auto out = testing::runAndKill(CHUNK_CRASH_CHILD, args, run_ms, power_loss || after_first_ack);
  for (const auto& line : testing::completeLines(out)) {
    unsigned idx = 0;
    unsigned long long ver = 0;
    if (std::sscanf(line.c_str(), "%u %llu", &idx, &ver) == 2)
      acked[idx] = std::max<uint64_t>(acked[idx], ver);
  }
  return acked;
}

std::string readFile(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}

int crashRounds() {
  const char* env = std::getenv("CISTERN_CRASH_ROUNDS");
  return env ? std::atoi(env) : 200;
}

// Scratch chunks found by verifyAfterCrash, over all rounds.
uint64_t scratch_seen = 0;

// Reopens the target after a kill: every chunk is at a committed version no
// older than its last acknowledged one, holds exactly that version's bytes,
// and no slot is leaked.
void verifyAfterCrash(const std::string& dir, int round, std::map<uint32_t, uint64_t>& acked_ever,
                      bool power_loss = false) {
  {
    ChunkEngineOptions o;
    o.path = dir;
    o.group_bytes = 1 << 20;
    if (power_loss) o.meta_log_segment_bytes = 64 << 20;  // as the child's
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
    // Scratch chunks: whole, with the content of their length.
    for (uint32_t j = 0; j < kScratchChunks; ++j) {
      auto m = (*engine)->query({kScratchInode, j});
      ASSERT_TRUE(m.ok());
      if (!*m) continue;
      ++chunks;
      ++scratch_seen;
      std::vector<uint8_t> got((*m)->length);
      auto n = (*engine)->read({kScratchInode, j}, 0, got);
      ASSERT_TRUE(n.ok()) << "scratch chunk " << j << " round " << round << ": "
                          << n.status().toString();
      ASSERT_EQ(*n, got.size());
      ASSERT_EQ(got, scratchContent(j, got.size())) << "scratch chunk " << j << " round " << round;
    }
    for (uint32_t c = 0; c < kClassCount; ++c) slots += (*engine)->usedSlots(c);
    ASSERT_EQ(slots, chunks) << "leaked slots not reclaimed in round " << round;
  }
}

// Kill-and-verify rounds on one target; returns the acknowledged writes
// seen. Even rounds count their time from the start, so some kills land in
// the engine's open and recovery; odd ones (and all `unsynced` ones: the
// child's mode with half its writes unsynced) from the child's first
// acknowledged write, so that writes are killed on any machine (a
// sanitizer build takes ~200 ms to its first write, longer than every even
// round runs).
uint64_t killRounds(const std::string& dir, int rounds, bool unsynced) {
  std::map<uint32_t, uint64_t> acked_ever;
  uint64_t total_acked = 0;
  for (int round = 0; round < rounds; ++round) {
    const uint64_t seed = static_cast<uint64_t>(round) * 7 + (unsynced ? 5 : 1);
    auto acked = runAndKill(dir, seed, 30 + (round * 37) % 90, /*power_loss=*/false,
                            /*after_first_ack=*/unsynced || round % 2 == 1, unsynced);
    for (auto& [i, v] : acked) {
      acked_ever[i] = std::max(acked_ever[i], v);
      total_acked++;
    }
    verifyAfterCrash(dir, round, acked_ever);
    if (::testing::Test::HasFatalFailure()) break;
  }
  return total_acked;
}

TEST(ChunkCrash, SigkillAtRandomPointsLeavesOnlyCommittedChunks) {
  char tmpl[] = "/tmp/cistern-chunk-crash-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  EXPECT_GT(killRounds(dir, crashRounds(), /*unsynced=*/false), 0u);
  EXPECT_GT(scratch_seen, 0u);
  std::filesystem::remove_all(dir);
}

// Half the writes unsynced (acknowledged before their data and record are
// synced, the engine syncing every 2 ms): a kill of the process loses none
// of them — their bytes and records were out of the process — and the held
// slots of their chunks' previous versions leak nothing.
TEST(ChunkCrash, SigkillLosesNoAcknowledgedUnsyncedWrite) {
  char tmpl[] = "/tmp/cistern-chunk-crash-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  EXPECT_GT(killRounds(dir, std::max(1, crashRounds() / 4), /*unsynced=*/true), 0u);
  std::filesystem::remove_all(dir);
}

// Writes into small chunks go to the group file unsynced, with their bytes in
// the metadata log record. Simulates a power loss: after the kill, the
// class-0 group files go back to what they held before the run (everything
// the child wrote there since its open was only in the page cache); the log
// replay must bring every acknowledged write back, byte for byte.
TEST(ChunkCrash, LoggedWritesSurviveLosingThePageCache) {
  namespace fs = std::filesystem;
  char tmpl[] = "/tmp/cistern-chunk-power-XXXXXX";
  std::string dir = mkdtemp(tmpl);
  const std::string c0 = dir + "/data/c0", saved = dir + "/c0-before";
  int rounds = std::max(1, crashRounds() / 4);
  std::map<uint32_t, uint64_t> acked_ever;
  uint64_t total_acked = 0;
  int rolled_back = 0;  // rounds in which the child's class-0 writes were undone
  for (int round = 0; round < rounds; ++round) {
    fs::remove_all(saved);
    if (fs::exists(c0)) fs::copy(c0, saved);
    auto acked = runAndKill(dir, static_cast<uint64_t>(round) * 13 + 5, 40 + (round * 37) % 90,
                            /*power_loss=*/true);
    for (auto& [i, v] : acked) {
      acked_ever[i] = std::max(acked_ever[i], v);
      total_acked++;
    }
    // Put the files back as the disk held them; files made since are lost.
    bool changed = false;
    if (fs::exists(c0)) {
      for (const auto& f : fs::directory_iterator(c0)) {
        fs::path before = fs::path(saved) / f.path().filename();
        changed = changed || !fs::exists(before) || readFile(before) != readFile(f.path());
        if (fs::exists(before))
          fs::copy_file(before, f.path(), fs::copy_options::overwrite_existing);
        else
          fs::remove(f.path());
      }
    }
    rolled_back += changed ? 1 : 0;
    verifyAfterCrash(dir, round, acked_ever, /*power_loss=*/true);
    if (::testing::Test::HasFatalFailure()) break;
  }
  EXPECT_GT(total_acked, 0u);
  EXPECT_GT(rolled_back, 0);  // rounds that wrote small chunks and lost them
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace cistern::storage
