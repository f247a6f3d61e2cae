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

namespace cistern::kv {
namespace {

// Runs the child for `run_ms`, kills it, and returns the txn ids it acknowledged.
std::set<long> runAndKill(const std::string& dir, long first, int run_ms) {
  int pipefd[2];
  EXPECT_EQ(pipe(pipefd), 0);
  pid_t pid = fork();
  if (pid == 0) {
    dup2(pipefd[1], STDOUT_FILENO);
    close(pipefd[0]);
    close(pipefd[1]);
    std::string first_s = std::to_string(first);
    execl(KV_CRASH_CHILD, KV_CRASH_CHILD, dir.c_str(), first_s.c_str(), nullptr);
    _exit(127);
  }
  close(pipefd[1]);
  usleep(static_cast<useconds_t>(run_ms) * 1000);
  kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  EXPECT_TRUE(WIFSIGNALED(status)) << "child exited early with status " << status;
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = read(pipefd[0], buf, sizeof buf)) > 0) out.append(buf, static_cast<size_t>(n));
  close(pipefd[0]);
  std::set<long> acked;
  size_t pos = 0;
  while (true) {
    size_t nl = out.find('\n', pos);
    if (nl == std::string::npos) break;  // a partial last line is not an ack
    acked.insert(std::stol(out.substr(pos, nl - pos)));
    pos = nl + 1;
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
