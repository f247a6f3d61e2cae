// Internal: optimistic concurrency control over a Store, shared by every
// backend. This is where serializability lives; backends only provide
// snapshots and atomic batch application.
//
// Commit protocol (group commit, one resolver at a time):
//   1. commit() queues the transaction. The first queued thread becomes the
//      leader; the others wait.
//   2. The leader takes the whole queue and, under the engine mutex, checks
//      each transaction against the history of write ranges committed after
//      its read version (and against transactions accepted earlier in the
//      same batch). Accepted ones get consecutive versions and their writes go
//      into one batch; rejected ones fail with kTxnConflict.
//   3. The leader applies the batch (one fsync for all) outside the mutex,
//      then publishes the new committed version and wakes the waiters.
// A snapshot taken while a batch is being applied may include that batch
// while its read version does not; the extra writes then only cause
// conservative conflicts, never missed ones.
#pragma once

#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "common/clock.h"
#include "kv/engine.h"
#include "kv/store.h"

namespace cistern::kv {

struct KeyRange {
  std::string begin;  // inclusive
  std::string end;    // exclusive
};

// Sorts and merges overlapping or touching ranges in place.
void normalizeRanges(std::vector<KeyRange>* ranges);
// True when two normalized lists share a key.
bool rangesIntersect(const std::vector<KeyRange>& a, const std::vector<KeyRange>& b);

class TxnImpl;

class OccEngine final : public Engine {
 public:
  OccEngine(std::unique_ptr<Store> store, const EngineOptions& options);
  ~OccEngine() override;

  std::unique_ptr<Transaction> begin() override;
  std::unique_ptr<ReadTransaction> beginRead() override;
  std::string_view name() const override { return store_->name(); }

  const EngineOptions& options() const { return options_; }
  Clock& clock() { return SystemClock::instance(); }

 private:
  friend class TxnImpl;
  struct Pending;
  struct HistoryEntry {
    uint64_t version;
    std::vector<KeyRange> writes;  // normalized
  };

  Status commit(TxnImpl& txn);
  void lead(std::unique_lock<std::mutex>& lock);
  Status resolve(const TxnImpl& txn) const;  // REQUIRES: mu_ held
  Status foldAdds(WriteBatch* ops);          // REQUIRES: the caller is the leader
  void prune();                              // REQUIRES: mu_ held
  void releaseRead(uint64_t read_version);

  std::unique_ptr<Store> store_;
  EngineOptions options_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Pending*> queue_;
  bool leader_active_ = false;
  uint64_t committed_version_ = 0;
  // Versions <= forgotten_version_ are no longer in history_.
  uint64_t forgotten_version_ = 0;
  std::deque<HistoryEntry> history_;
  std::multiset<uint64_t> active_reads_;
  Status failed_;  // sticky: a failed apply leaves the store in doubt
};

}  // namespace cistern::kv
