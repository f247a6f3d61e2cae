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

namespace cistern::storage {
namespace {

// Runs the child for `run_ms`, kills it, returns the highest acked version per chunk.
std::map<uint32_t, uint64_t> runAndKill(const std::string& dir, uint64_t seed, int run_ms) {
  int pipefd[2];
  EXPECT_EQ(pipe(pipefd), 0);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(pipefd[1], STDOUT_FILENO);
    close(pipefd[0]);
    close(pipefd[1]);
    std::string s = std::to_string(seed);
    execl(CHUNK_CRASH_CHILD, CHUNK_CRASH_CHILD, dir.c_str(), s.c_str(), nullptr);
    _exit(127);
  }
  close(pipefd[1]);
  usleep(static_cast<useconds_t>(run_ms) * 1000);
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status)) << "child exited early: " << status;
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(pipefd[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  close(pipefd[0]);
  std::map<uint32_t, uint64_t> acked;
  size_t pos = 0;
  while (true) {
    size_t nl = out.find('\n', pos);
    if (nl == std::string::npos) break;
    unsigned idx = 0;
    unsigned long long ver = 0;
    if (std::sscanf(out.c_str() + pos, "%u %llu", &idx, &ver) == 2) acked[idx] = std::max<uint64_t>(acked[idx], ver);
    pos = nl + 1;
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
        ASSERT_EQ(acked_ever.count(i), 0u) << "acknowledged chunk " << i << " lost in round " << round;
        continue;
      }
      ++chunks;
      uint64_t v = (*m)->chunk_version;
      ASSERT_GE(v, acked_ever[i]) << "chunk " << i << " went back to an older version in round " << round;
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
