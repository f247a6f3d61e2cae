// Kills a child process with SIGKILL in the middle of RocksDB commits, then
// checks on reopen that every transaction is whole or absent and that every
// acknowledged one is present.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <set>
#include <string>

#include "common/random.h"
#include "kv/kv_test_util.h"
#include "tests/support/child_process.h"

namespace cistern::kv {
namespace {

// Runs the child for `run_ms`, kills it, and returns the txn ids it acknowledged.
std::set<long> runAndKill(const std::string& dir, long first, int run_ms) {
  std::set<long> acked;
  for (const auto& line : testing::completeLines(
           testing::runAndKill(KV_CRASH_CHILD, {dir, std::to_string(first)}, run_ms))) {
    acked.insert(std::stol(line));
  }
  return acked;
}

TEST(KvCrash, SigkillDuringCommitsLeavesEveryTransactionWholeOrAbsent) {
  TempDir dir;
  std::string db = dir.path() + "/db";
  Xoshiro256 rng(2024);
  long next = 0;
  std::set<long> all_acked;
  constexpr int kRounds = 12;
  for (int round = 0; round < kRounds; ++round) {
    std::set<long> acked = runAndKill(db, next, 150 + static_cast<int>(rng.uniform(250)));
    all_acked.insert(acked.begin(), acked.end());

    RocksEngineOptions o;
    o.path = db;
    o.block_cache_bytes = 8 << 20;
    auto engine = openRocksEngine(o);
    ASSERT_TRUE(engine.ok()) << engine.status().toString();
    auto t = (*engine)->beginRead();
    auto rows = t->getRange("txn/", "txn0");
    ASSERT_TRUE(rows.ok());
    ASSERT_FALSE(rows->more);
    std::map<long, int> parts;
    for (auto& kv : rows->kvs) {
      long id = std::stol(kv.key.substr(4));
      parts[id]++;
      ASSERT_EQ(kv.value.size(), 1000 + (id % 7) * 500u) << kv.key;
      ASSERT_EQ(kv.value[0], static_cast<char>('a' + id % 26));
    }
    for (auto& [id, n] : parts) ASSERT_EQ(n, 10) << "transaction " << id << " is torn";
    for (long id : all_acked)
      ASSERT_TRUE(parts.count(id)) << "acknowledged transaction " << id << " lost";
    long last_present = parts.empty() ? -1 : parts.rbegin()->first;
    // Committed transactions form a prefix: the child commits one at a time.
    ASSERT_EQ(static_cast<long>(parts.size()), last_present + 1);
    next = last_present + 1;
    t.reset();
  }
  EXPECT_GT(all_acked.size(), 0u);
}

}  // namespace
}  // namespace cistern::kv
