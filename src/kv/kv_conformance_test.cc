// One conformance suite, run against every kv::Engine backend.
#include <gtest/gtest.h>

#include <atomic>
#include <map>
#include <thread>

#include "common/fault.h"
#include "common/random.h"
#include "kv/key_codec.h"
#include "kv/kv_test_util.h"
#ifdef CISTERN_KV_ETCD_SUITE
#include "kv/kv_etcd_test_util.h"
#endif

namespace cistern::kv {
namespace {

class KvConformance : public ::testing::TestWithParam<EngineFactory> {
 protected:
  void SetUp() override { reopen(); }
  void TearDown() override { fault::disableAll(); }

  void reopen(EngineOptions o = {}) {
    engine_.reset();
    options_ = o;
    engine_ = GetParam().open(dir_.path(), o);
  }

  void put(std::string_view k, std::string_view v) {
    auto t = engine_->begin();
    t->set(k, v);
    ASSERT_TRUE(t->commit().ok());
  }

  std::optional<std::string> read(std::string_view k) {
    auto t = engine_->beginRead();
    auto r = t->get(k);
    EXPECT_TRUE(r.ok());
    return *r;
  }

  std::vector<std::string> keys(const RangeResult& r) {
    std::vector<std::string> out;
    for (auto& kv : r.kvs) out.push_back(kv.key);
    return out;
  }

  TempDir dir_;
  EngineOptions options_;
  std::unique_ptr<Engine> engine_;
};

using Keys = std::vector<std::string>;

TEST_P(KvConformance, MissingKeyReadsAsAbsent) {
  EXPECT_EQ(read("nope"), std::nullopt);
  EXPECT_EQ(GetParam().name.rfind(std::string(engine_->name()), 0), 0u);  // rocksdb_wal: "rocksdb"
}

TEST_P(KvConformance, ReadYourOwnWrites) {
  put("a", "old");
  auto t = engine_->begin();
  t->set("a", "new");
  t->set("b", "2");
  t->clear("c");
  EXPECT_EQ(*t->get("a"), std::optional<std::string>("new"));
  EXPECT_EQ(*t->get("b"), std::optional<std::string>("2"));
  EXPECT_EQ(*t->get("c"), std::nullopt);
  // Not visible to others until commit.
  EXPECT_EQ(read("a"), "old");
  ASSERT_TRUE(t->commit().ok());
  EXPECT_EQ(read("a"), "new");
  EXPECT_EQ(read("b"), "2");
}

TEST_P(KvConformance, SnapshotIsolationForReaders) {
  put("k", "1");
  auto reader = engine_->beginRead();
  auto rw = engine_->begin();
  put("k", "2");
  put("k2", "x");
  EXPECT_EQ(*reader->get("k"), std::optional<std::string>("1"));
  EXPECT_EQ(*rw->get("k2"), std::nullopt);
  EXPECT_TRUE(reader->getRange("a", "z")->kvs.size() == 1);
  EXPECT_EQ(read("k"), "2");
}

TEST_P(KvConformance, RangeReadsOrderLimitReverseAndMore) {
  for (std::string k : {"b", "d", "a", "c", "e"}) put(k, "v" + k);
  auto t = engine_->beginRead();
  EXPECT_EQ(keys(*t->getRange("a", "e")), (Keys{"a", "b", "c", "d"}));
  auto lim = *t->getRange("a", "z", {.limit = 2});
  EXPECT_EQ(keys(lim), (Keys{"a", "b"}));
  EXPECT_TRUE(lim.more);
  auto rev = *t->getRange("b", "z", {.limit = 3, .reverse = true});
  EXPECT_EQ(keys(rev), (Keys{"e", "d", "c"}));
  EXPECT_TRUE(rev.more);
  auto all_rev = *t->getRange("a", "z", {.reverse = true});
  EXPECT_EQ(keys(all_rev), (Keys{"e", "d", "c", "b", "a"}));
  EXPECT_FALSE(all_rev.more);
  EXPECT_EQ(all_rev.kvs[0].value, "ve");
  EXPECT_TRUE(t->getRange("z", "a")->kvs.empty());
}

TEST_P(KvConformance, RangeReadsMergeOwnSetsClearsAndClearRanges) {
  for (std::string k : {"a", "b", "c", "d", "e", "f"}) put(k, "old");
  auto t = engine_->begin();
  t->clearRange("b", "e");  // removes b c d
  t->set("c", "new");       // set after the clear survives
  t->clear("f");
  t->set("bb", "ins");
  EXPECT_EQ(keys(*t->getRange("a", "z")), (Keys{"a", "bb", "c", "e"}));
  EXPECT_EQ(keys(*t->getRange("a", "z", {.reverse = true})), (Keys{"e", "c", "bb", "a"}));
  EXPECT_EQ(keys(*t->getRange("a", "z", {.limit = 2, .reverse = true})), (Keys{"e", "c"}));
  EXPECT_EQ(*t->get("d"), std::nullopt);
  ASSERT_TRUE(t->commit().ok());
  auto r = engine_->beginRead();
  auto rows = *r->getRange("", "\xff");
  EXPECT_EQ(keys(rows), (Keys{"a", "bb", "c", "e"}));
  EXPECT_EQ(rows.kvs[2].value, "new");
}

TEST_P(KvConformance, ReadWriteConflictFailsTheReader) {
  put("k", "0");
  auto t1 = engine_->begin();
  ASSERT_TRUE(t1->get("k").ok());
  put("k", "1");  // commits after t1's read version
  t1->set("other", "x");
  EXPECT_EQ(t1->commit().code(), ErrorCode::kTxnConflict);
  EXPECT_EQ(read("other"), std::nullopt);  // no effect
}

TEST_P(KvConformance, WriteWriteConflictFailsTheSecond) {
  auto t1 = engine_->begin();
  auto t2 = engine_->begin();
  t1->set("k", "1");
  t2->set("k", "2");
  EXPECT_TRUE(t1->commit().ok());
  EXPECT_EQ(t2->commit().code(), ErrorCode::kTxnConflict);
  EXPECT_EQ(read("k"), "1");
}

TEST_P(KvConformance, PhantomInReadRangeConflicts) {
  put("a", "1");
  put("z", "1");
  auto t1 = engine_->begin();
  EXPECT_EQ(t1->getRange("b", "y")->kvs.size(), 0u);
  put("m", "phantom");
  t1->set("result", "empty");
  EXPECT_EQ(t1->commit().code(), ErrorCode::kTxnConflict);
}

TEST_P(KvConformance, ClearRangeConflictsWithReaderOfAKeyInside) {
  put("m", "1");
  auto t1 = engine_->begin();
  ASSERT_TRUE(t1->get("m").ok());
  auto t2 = engine_->begin();
  t2->clearRange("a", "z");
  ASSERT_TRUE(t2->commit().ok());
  t1->set("x", "1");
  EXPECT_EQ(t1->commit().code(), ErrorCode::kTxnConflict);
}

TEST_P(KvConformance, LimitedRangeReadConflictsOnlyUpToLastRowReturned) {
  for (std::string k : {"a", "b", "c"}) put(k, "1");
  auto t1 = engine_->begin();
  EXPECT_EQ(keys(*t1->getRange("a", "z", {.limit = 2})), (Keys{"a", "b"}));
  put("y", "after the rows read");
  t1->set("w", "1");
  EXPECT_TRUE(t1->commit().ok());
}

TEST_P(KvConformance, SnapshotReadsAddNoConflict) {
  put("k", "0");
  auto t1 = engine_->begin();
  ASSERT_TRUE(t1->get("k", /*snapshot=*/true).ok());
  ASSERT_TRUE(t1->getRange("a", "z", {.snapshot = true}).ok());
  put("k", "1");
  put("m", "1");
  t1->set("other", "x");
  EXPECT_TRUE(t1->commit().ok());
}

TEST_P(KvConformance, DisjointTransactionsBothCommit) {
  auto t1 = engine_->begin();
  auto t2 = engine_->begin();
  ASSERT_TRUE(t1->get("a").ok());
  ASSERT_TRUE(t2->get("b").ok());
  t1->set("a", "1");
  t2->set("b", "2");
  EXPECT_TRUE(t1->commit().ok());
  EXPECT_TRUE(t2->commit().ok());
  EXPECT_GT(t2->commitVersion(), t1->commitVersion());
}

TEST_P(KvConformance, CommitTwiceAndUseAfterCommitFail) {
  auto t = engine_->begin();
  t->set("a", "1");
  ASSERT_TRUE(t->commit().ok());
  EXPECT_EQ(t->commit().code(), ErrorCode::kTxnFinished);
  EXPECT_EQ(t->get("a").code(), ErrorCode::kTxnFinished);
}

TEST_P(KvConformance, OversizedKeysValuesAndTransactionsAreRejected) {
  EngineOptions o;
  o.key_bytes_max = 16;
  o.value_bytes_max = 32;
  o.txn_bytes_max = 100;
  reopen(o);
  auto t1 = engine_->begin();
  t1->set(std::string(17, 'k'), "v");
  EXPECT_EQ(t1->commit().code(), ErrorCode::kKeyTooLarge);
  auto t2 = engine_->begin();
  t2->set("k", std::string(33, 'v'));
  EXPECT_EQ(t2->commit().code(), ErrorCode::kValueTooLarge);
  auto t3 = engine_->begin();
  for (int i = 0; i < 10; ++i) t3->set("key" + std::to_string(i), std::string(20, 'v'));
  EXPECT_EQ(t3->commit().code(), ErrorCode::kTxnTooLarge);
  EXPECT_EQ(read("key0"), std::nullopt);  // nothing of a failed transaction lands
}

// The OCC engine's own bound (etcd's is compaction: KvEtcd tests).
TEST_P(KvConformance, BoundedHistoryTurnsOldTransactionsTooOld) {
  if (GetParam().name == "etcd") GTEST_SKIP() << "no conflict history: etcd checks revisions";
  EngineOptions o;
  o.conflict_history_max = 10;
  reopen(o);
  auto old = engine_->begin();
  for (int i = 0; i < 30; ++i) put("k" + std::to_string(i), "v");
  old->set("x", "1");
  EXPECT_EQ(old->commit().code(), ErrorCode::kTxnTooOld);
}

TEST_P(KvConformance, RunTransactionRetriesConflictsThenSucceeds) {
  put("n", "0");
  int calls = 0;
  Status s = runTransaction(*engine_, [&](Transaction& t) -> Status {
    ++calls;
    auto v = t.get("n");
    RETURN_ON_ERROR(v);
    if (calls == 1) put("n", "5");  // a concurrent writer invalidates the first attempt
    t.set("n", std::to_string(std::stoi(**v) + 1));
    return Status::OK();
  });
  EXPECT_TRUE(s.ok()) << s.toString();
  EXPECT_EQ(calls, 2);
  EXPECT_EQ(read("n"), "6");
}

TEST_P(KvConformance, RunTransactionGivesUpAfterAttemptsMax) {
  int calls = 0;
  Status s = runTransaction(*engine_,
                            [&](Transaction& t) -> Status {
                              ++calls;
                              RETURN_ON_ERROR(t.get("n"));
                              put("n", std::to_string(calls));
                              t.set("n", "mine");
                              return Status::OK();
                            },
                            {.attempts_max = 3, .backoff_ms_initial = 1, .backoff_ms_max = 1});
  EXPECT_EQ(s.code(), ErrorCode::kTxnRetriesExhausted);
  EXPECT_EQ(calls, 3);
  EXPECT_EQ(read("n"), "3");
}

TEST_P(KvConformance, RunTransactionReturnsBodyErrorWithoutCommitting) {
  Status s = runTransaction(*engine_, [&](Transaction& t) -> Status {
    t.set("k", "v");
    return Status(ErrorCode::kNotFound, "parent missing");
  });
  EXPECT_EQ(s.code(), ErrorCode::kNotFound);
  EXPECT_EQ(read("k"), std::nullopt);
}

TEST_P(KvConformance, EightThreadsIncrementOneCounterExactly) {
  EngineOptions o;
  o.sync_commits = false;  // this test is about isolation; durability has its own tests
  reopen(o);
  const int kThreads = 8, kIncrements = 10000 / GetParam().scale;
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kThreads; ++i) {
    threads.emplace_back([&] {
      for (int j = 0; j < kIncrements; ++j) {
        Status s =
            runTransaction(*engine_,
                           [](Transaction& t) -> Status {
                             auto v = t.get("counter");
                             RETURN_ON_ERROR(v);
                             uint64_t n = *v ? std::stoull(**v) : 0;
                             t.set("counter", std::to_string(n + 1));
                             return Status::OK();
                           },
                           {.attempts_max = 100000, .backoff_ms_initial = 0, .backoff_ms_max = 1});
        if (!s.ok()) failures++;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(read("counter"), std::to_string(kThreads * kIncrements));
}

TEST_P(KvConformance, ConcurrentTransfersKeepTheTotalForEveryReader) {
  EngineOptions o;
  o.sync_commits = false;
  reopen(o);
  constexpr int kAccounts = 10, kStart = 100;
  for (int i = 0; i < kAccounts; ++i) put("acct/" + std::to_string(i), std::to_string(kStart));
  std::atomic<bool> stop{false};
  std::atomic<int> bad_sums{0}, reads{0};
  std::thread reader([&] {
    while (!stop) {
      auto t = engine_->beginRead();
      auto rows = t->getRange("acct/", "acct0");
      int sum = 0;
      for (auto& kv : rows->kvs) sum += std::stoi(kv.value);
      if (sum != kAccounts * kStart || rows->kvs.size() != kAccounts) bad_sums++;
      reads++;
    }
  });
  std::vector<std::thread> writers;
  for (int w = 0; w < 4; ++w) {
    writers.emplace_back([&, w] {
      Xoshiro256 rng(w);
      for (int i = 0; i < 500 / GetParam().scale; ++i) {
        std::string a = "acct/" + std::to_string(rng.uniform(kAccounts));
        std::string b = "acct/" + std::to_string(rng.uniform(kAccounts));
        Status s =
            runTransaction(*engine_,
                           [&](Transaction& t) -> Status {
                             auto va = t.get(a);
                             RETURN_ON_ERROR(va);
                             auto vb = t.get(b);
                             RETURN_ON_ERROR(vb);
                             if (a == b) return Status::OK();
                             t.set(a, std::to_string(std::stoi(**va) - 7));
                             t.set(b, std::to_string(std::stoi(**vb) + 7));
                             return Status::OK();
                           },
                           {.attempts_max = 10000, .backoff_ms_initial = 0, .backoff_ms_max = 1});
        ASSERT_TRUE(s.ok()) << s.toString();
      }
    });
  }
  for (auto& w : writers) w.join();
  stop = true;
  reader.join();
  EXPECT_GT(reads.load(), 0);
  EXPECT_EQ(bad_sums.load(), 0);
}

TEST_P(KvConformance, AtomicAddsFromEightThreadsNeverConflict) {
  EngineOptions o;
  o.sync_commits = false;
  reopen(o);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 2000 / GetParam().scale; ++i) {
        auto txn = engine_->begin();
        txn->atomicAdd("counter", 1);
        txn->set("own/" + std::to_string(t), std::to_string(i));
        if (!txn->commit().ok()) failures++;  // no retries: adds must not conflict
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_EQ(decodeCounter(*read("counter")), 8 * (2000 / GetParam().scale));
}

TEST_P(KvConformance, AtomicAddsSeeOwnWritesAndFoldWithSetsAndClears) {
  put("c", encodeCounter(5));
  put("z", encodeCounter(100));
  {
    auto t = engine_->begin();
    t->atomicAdd("c", 3);
    t->atomicAdd("c", -1);
    EXPECT_EQ(decodeCounter(**t->get("c")), 7);
    t->atomicAdd("fresh", 2);
    t->clearRange("y", "zz");
    t->atomicAdd("z", 1);  // after a clear: counts from 0
    auto rows = t->getRange("a", "zz");
    ASSERT_EQ(rows->kvs.size(), 3u);
    EXPECT_EQ(rows->kvs[0].key, "c");
    EXPECT_EQ(decodeCounter(rows->kvs[0].value), 7);
    EXPECT_EQ(decodeCounter(rows->kvs[1].value), 2);
    EXPECT_EQ(decodeCounter(rows->kvs[2].value), 1);
    ASSERT_TRUE(t->commit().ok());
  }
  EXPECT_EQ(decodeCounter(*read("c")), 7);
  EXPECT_EQ(decodeCounter(*read("fresh")), 2);
  EXPECT_EQ(decodeCounter(*read("z")), 1);
  // A set after an add wins; an add after a set adds to it.
  auto t = engine_->begin();
  t->atomicAdd("c", 10);
  t->set("c", encodeCounter(1));
  t->atomicAdd("c", 1);
  ASSERT_TRUE(t->commit().ok());
  EXPECT_EQ(decodeCounter(*read("c")), 2);
}

TEST_P(KvConformance, ReaderOfACounterConflictsWithAnAdd) {
  put("c", encodeCounter(1));
  auto reader = engine_->begin();
  ASSERT_TRUE(reader->get("c").ok());
  auto adder = engine_->begin();
  adder->atomicAdd("c", 1);
  ASSERT_TRUE(adder->commit().ok());
  reader->set("derived", "x");
  EXPECT_EQ(reader->commit().code(), ErrorCode::kTxnConflict);
}

TEST_P(KvConformance, AddsInOneGroupCommitBatchAccumulate) {
  // Many concurrent committers land in shared batches; each add must count.
  EngineOptions o;
  o.sync_commits = true;
  reopen(o);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 50; ++i) {
        auto txn = engine_->begin();
        txn->atomicAdd("n", 2);
        EXPECT_TRUE(txn->commit().ok());
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(decodeCounter(*read("n")), 800);
}

// Random single-threaded operations compared with a std::map model, including
// read-your-writes inside open transactions and every range-read variant.
TEST_P(KvConformance, RandomOperationsMatchAModel) {
  Xoshiro256 rng(12345);
  std::map<std::string, std::string> model;
  auto randomKey = [&] { return std::string(1, static_cast<char>('a' + rng.uniform(20))); };
  for (int round = 0; round < 300; ++round) {
    auto t = engine_->begin();
    std::map<std::string, std::string> local = model;
    for (int op = 0; op < 10; ++op) {
      switch (rng.uniform(5)) {
        case 0: {
          std::string k = randomKey(), v = std::to_string(rng.next() % 1000);
          t->set(k, v);
          local[k] = v;
          break;
        }
        case 1: {
          std::string k = randomKey();
          t->clear(k);
          local.erase(k);
          break;
        }
        case 2: {
          std::string b = randomKey(), e = randomKey();
          t->clearRange(b, e);
          if (b < e) local.erase(local.lower_bound(b), local.lower_bound(e));
          break;
        }
        case 3: {
          std::string k = randomKey();
          auto got = t->get(k);
          auto it = local.find(k);
          ASSERT_EQ(*got,
                    it == local.end() ? std::nullopt : std::optional<std::string>(it->second));
          break;
        }
        case 4: {
          std::string b = randomKey(), e = randomKey();
          RangeOptions ro{.limit = static_cast<uint32_t>(rng.uniform(4)), .reverse = rng.oneIn(2)};
          auto got = t->getRange(b, e, ro);
          std::vector<KeyValue> want;
          if (b < e) {
            for (auto it = local.lower_bound(b); it != local.lower_bound(e); ++it)
              want.push_back({it->first, it->second});
          }
          if (ro.reverse) std::reverse(want.begin(), want.end());
          if (ro.limit && want.size() > ro.limit) want.resize(ro.limit);
          ASSERT_EQ(got->kvs, want) << "round " << round;
          break;
        }
      }
    }
    if (rng.oneIn(4)) continue;  // abandon: nothing must land
    ASSERT_TRUE(t->commit().ok());
    model = local;
  }
  auto r = engine_->beginRead();
  auto all = r->getRange("", "\xff");
  std::vector<KeyValue> want;
  for (auto& [k, v] : model) want.push_back({k, v});
  EXPECT_EQ(all->kvs, want);
}

TEST_P(KvConformance, FailedApplyStopsTheEngineFromAcceptingWrites) {
  if (GetParam().name == "etcd") GTEST_SKIP() << "no local apply: etcd applies";
  fault::enable("kv.commit.before_apply", fault::Spec{.code = ErrorCode::kIOError});
  auto t = engine_->begin();
  t->set("a", "1");
  EXPECT_EQ(t->commit().code(), ErrorCode::kIOError);
  fault::disableAll();
  auto t2 = engine_->begin();
  t2->set("b", "1");
  EXPECT_EQ(t2->commit().code(), ErrorCode::kIOError);
  EXPECT_EQ(read("a"), std::nullopt);
}

TEST_P(KvConformance, KeysFromFFFFUpAreReservedForTheStores) {
  auto t = engine_->begin();
  t->set(std::string("\xff\xff/engine/applied_version"), "x");
  EXPECT_EQ(t->commit().code(), ErrorCode::kInvalidArgument);
  auto c = engine_->begin();
  c->clearRange("a", std::string("\xff\xff\x01"));
  EXPECT_EQ(c->commit().code(), ErrorCode::kInvalidArgument);
  put("a", "1");
  auto ok = engine_->begin();
  ok->clearRange("a", std::string("\xff\xff"));  // ends exactly where they begin
  ASSERT_TRUE(ok->commit().ok());
  EXPECT_EQ(read("a"), std::nullopt);
}

// Engines that keep data across reopen.
class KvDurable : public KvConformance {};

TEST_P(KvDurable, CountersAndClearedRangesSurviveReopenExactly) {
  for (int i = 0; i < 50; ++i) {
    auto t = engine_->begin();
    t->atomicAdd("n", 2);
    t->set("r/" + std::to_string(i), "x");
    if (i % 10 == 9) t->clearRange("r/", "r/" + std::to_string(i - 5));
    ASSERT_TRUE(t->commit().ok());
  }
  auto before = engine_->beginRead()->getRange("", "\xff");
  reopen();
  auto after = engine_->beginRead()->getRange("", "\xff");
  ASSERT_TRUE(before.ok() && after.ok());
  EXPECT_EQ(after->kvs, before->kvs);
  EXPECT_EQ(decodeCounter(*read("n")), 100);
  // Commits continue after reopen.
  put("later", "1");
  reopen();
  EXPECT_EQ(read("later"), "1");
}

TEST_P(KvDurable, CommittedDataSurvivesReopen) {
  put("durable", "yes");
  {
    auto t = engine_->begin();
    t->clearRange("a", "b");
    t->set("big", std::string(100000, 'x'));
    ASSERT_TRUE(t->commit().ok());
  }
  reopen();
  EXPECT_EQ(read("durable"), "yes");
  EXPECT_EQ(read("big"), std::string(100000, 'x'));
}

// Commits `key` = "1".
Status setOne(Engine& engine, const std::string& key) {
  auto t = engine.begin();
  t->set(key, "1");
  return t->commit();
}

// Returns once the lone commit's log write has reached the delay fault
// point of the tests below (it sleeps there while others queue).
void waitForLoneLogWrite() {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (fault::fired("kv.log.before_write") == 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  ASSERT_EQ(fault::fired("kv.log.before_write"), 1u);
}

struct LoneAndQueued {
  Status lone, queued[3];
};
// Commits "lone" on an idle engine, its log write delayed 200 ms (at
// kv.log.before_write), then "queued0".."queued2" while it sleeps; returns
// their results once all four are done (a failure after 10 s).
LoneAndQueued commitLoneThenQueued(Engine& engine) {
  fault::enable("kv.log.before_write", fault::Spec{.action = fault::Action::kDelay,
                                                   .delay = std::chrono::milliseconds(200),
                                                   .times = 1});
  LoneAndQueued c;
  std::atomic<int> done{0};
  std::thread first([&] {
    c.lone = setOne(engine, "lone");
    done++;
  });
  waitForLoneLogWrite();
  std::vector<std::thread> later;
  for (int i = 0; i < 3; ++i) {
    later.emplace_back([&, i] {
      c.queued[i] = setOne(engine, "queued" + std::to_string(i));
      done++;
    });
  }
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (done < 4 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  if (done.load() != 4) {
    ADD_FAILURE() << "commits queued behind the lone one never completed";
    std::terminate();  // threads still waiting cannot be joined
  }
  first.join();
  for (auto& t : later) t.join();
  return c;
}

// A RocksDB engine in `dir` with a small block cache.
RocksEngineOptions smallRocks(const TempDir& dir) {
  RocksEngineOptions o;
  o.path = dir.path() + "/db";
  o.block_cache_bytes = 8 << 20;
  return o;
}

TEST(KvRocks, AFailedLogWriteStopsTheEngineAndLosesNothingAcknowledged) {
  TempDir dir;
  RocksEngineOptions o = smallRocks(dir);
  {
    auto e = openRocksEngine(o);
    ASSERT_TRUE(e.ok());
    auto t = (*e)->begin();
    t->set("before", "1");
    ASSERT_TRUE(t->commit().ok());
    fault::enable("kv.log.before_write", fault::Spec{.code = ErrorCode::kIOError});
    auto t2 = (*e)->begin();
    t2->set("failed", "1");
    EXPECT_EQ(t2->commit().code(), ErrorCode::kIOError);
    fault::disableAll();
    auto t3 = (*e)->begin();
    t3->set("after", "1");
    Status s = t3->commit();
    EXPECT_EQ(s.code(), ErrorCode::kIOError);
    EXPECT_NE(s.message().find("kv.log.before_write"), std::string::npos) << s.toString();
  }
  auto e = openRocksEngine(o);
  ASSERT_TRUE(e.ok()) << e.status().toString();
  auto r = (*e)->beginRead();
  EXPECT_EQ(*r->get("before"), "1");
  EXPECT_EQ(*r->get("failed"), std::nullopt);
  EXPECT_EQ(*r->get("after"), std::nullopt);
  // The reopened engine takes writes again.
  auto t = (*e)->begin();
  t->set("again", "1");
  EXPECT_TRUE(t->commit().ok());
}

// A commit on an idle engine carries its own batch; commits that queue
// while its log write is slow are the writer's to take once it returns
// (they would wait forever if nobody told the writer).
TEST(KvRocks, CommitsQueuedBehindALoneCommitAreTakenOverByTheWriter) {
  TempDir dir;
  RocksEngineOptions o = smallRocks(dir);
  {
    auto e = openRocksEngine(o);
    ASSERT_TRUE(e.ok());
    Engine& engine = **e;
    LoneAndQueued c = commitLoneThenQueued(engine);
    EXPECT_EQ(fault::fired("kv.log.before_write"), 1u);  // the lone commit's log write slept
    fault::disableAll();
    EXPECT_TRUE(c.lone.ok()) << c.lone.toString();
    for (auto& s : c.queued) EXPECT_TRUE(s.ok()) << s.toString();
  }
  auto e = openRocksEngine(o);
  ASSERT_TRUE(e.ok()) << e.status().toString();
  auto r = (*e)->beginRead();
  EXPECT_EQ(*r->get("lone"), "1");
  for (int i = 0; i < 3; ++i) EXPECT_EQ(*r->get("queued" + std::to_string(i)), "1");
}

// The same failure in a batch the log writer carries: the lone commit ahead
// of it is durable, the queued ones fail and are absent after a reopen, and
// the engine takes no more writes.
TEST(KvRocks, AFailedLogWriteOfTheWritersBatchFailsItAndLaterCommits) {
  TempDir dir;
  RocksEngineOptions o = smallRocks(dir);
  {
    auto e = openRocksEngine(o);
    ASSERT_TRUE(e.ok());
    Engine& engine = **e;
    // The lone commit's log write sleeps while the others queue; the next
    // batch (the writer's) fails before its log write.
    fault::enable("kv.commit.before_apply",
                  fault::Spec{.code = ErrorCode::kIOError, .skip = 1, .times = 1});
    LoneAndQueued c = commitLoneThenQueued(engine);
    EXPECT_EQ(fault::fired("kv.commit.before_apply"), 1u);
    fault::disableAll();
    EXPECT_TRUE(c.lone.ok()) << c.lone.toString();
    for (auto& s : c.queued) EXPECT_EQ(s.code(), ErrorCode::kIOError) << s.toString();
    EXPECT_EQ(setOne(engine, "after").code(), ErrorCode::kIOError);
  }
  auto e = openRocksEngine(o);
  ASSERT_TRUE(e.ok()) << e.status().toString();
  auto r = (*e)->beginRead();
  EXPECT_EQ(*r->get("lone"), "1");
  for (int i = 0; i < 3; ++i) EXPECT_EQ(*r->get("queued" + std::to_string(i)), std::nullopt);
  EXPECT_EQ(*r->get("after"), std::nullopt);
}

// Durability::kLazy: the commit is visible at once and reopens (a clean
// close syncs it); Engine::sync() makes it durable, and a failed sync stops
// the engine like a failed log write (never retried).
TEST(KvRocks, LazyCommitsAreSyncedOnRequestAndAFailedSyncStopsTheEngine) {
  TempDir dir;
  RocksEngineOptions o = smallRocks(dir);
  o.lazy_sync_ms = 60'000;
  {
    auto e = openRocksEngine(o);
    ASSERT_TRUE(e.ok());
    auto t = (*e)->begin();
    t->set("lazy", "1");
    t->setDurability(Durability::kLazy);
    ASSERT_TRUE(t->commit().ok());
    EXPECT_EQ(*(*e)->beginRead()->get("lazy"), "1");
    EXPECT_TRUE((*e)->sync().ok());
    auto t2 = (*e)->begin();
    t2->set("lazy2", "1");
    t2->setDurability(Durability::kLazy);
    ASSERT_TRUE(t2->commit().ok());
    fault::enable("kv.log.lazy_sync", fault::Spec{.code = ErrorCode::kIOError});
    Status s = (*e)->sync();
    fault::disableAll();
    EXPECT_EQ(s.code(), ErrorCode::kIOError) << s.toString();
    EXPECT_EQ(setOne(**e, "after").code(), ErrorCode::kIOError);
  }
  auto e = openRocksEngine(o);
  ASSERT_TRUE(e.ok()) << e.status().toString();
  auto r = (*e)->beginRead();
  EXPECT_EQ(*r->get("lazy"), "1");
  EXPECT_EQ(*r->get("after"), std::nullopt);
}

TEST(KvRocks, OpenFailureNamesThePath) {
  RocksEngineOptions o;
  o.path = "/proc/cistern-cannot-create/db";
  auto r = openRocksEngine(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.code(), ErrorCode::kIOError);
  EXPECT_NE(r.status().message().find(o.path), std::string::npos) << r.status().toString();
}

// The etcd suite (kv_etcd_test) runs the same tests against a real etcd cluster.
#ifdef CISTERN_KV_ETCD_SUITE
std::vector<EngineFactory> suiteEngines() { return {etcdEngine()}; }
#else
std::vector<EngineFactory> suiteEngines() { return kvTestEngines(); }
#endif

INSTANTIATE_TEST_SUITE_P(AllEngines, KvConformance, ::testing::ValuesIn(suiteEngines()),
                         [](const auto& info) { return info.param.name; });

std::vector<EngineFactory> durableEngines() {
  std::vector<EngineFactory> out;
  for (auto& e : suiteEngines()) {
    if (e.durable) out.push_back(e);
  }
  return out;
}
INSTANTIATE_TEST_SUITE_P(DurableEngines, KvDurable, ::testing::ValuesIn(durableEngines()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace cistern::kv
