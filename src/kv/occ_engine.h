// Internal: optimistic concurrency control over a Store, shared by every
// backend. This is where serializability lives; backends only provide
// snapshots and atomic batch application.
//
// Commit protocol (group commit, pipelined):
//   1. commit() queues the transaction. A queued thread leads when fewer than
//      commit_pipeline_depth batches are formed and not yet applied; the
//      others wait. A thread whose batch is done goes on leading while
//      others queued meanwhile.
//   2. The leader takes the whole queue and, under the engine mutex, checks
//      each transaction against the history of write ranges of batches
//      accepted after its read version, including batches still being
//      written and ones accepted earlier in the same batch. Accepted ones get
//      consecutive versions and their writes go into one batch; rejected ones
//      fail with kTxnConflict.
//   3. Outside the mutex the leader makes the batch durable (Store::log: one
//      sync for the group, overlapping the neighbouring batches' syncs), then
//      waits for its turn, applies it and publishes its version, in version
//      order, and wakes its transactions.
// Synced commits to a store with its own log (Store::hasLog) and
// commit_pipeline_depth 1 (the default) go another way:
// a log writer thread takes the whole queue as soon as the previous log
// write returns, forms the batch as in 2. and makes it durable, and hands
// the rest of 3. to one of the batch's own transactions, which has to be
// woken anyway (unless that wake-up is measured to cost more than applying
// the batch on the writer would cost the queued transactions:
// applyOnWriter). The disk then need not wait for a batch to be applied or for
// a new leader to be scheduled, and only one sync is in flight (on the
// disks measured, concurrent syncs each take longer than the group they
// would replace). A transaction that finds the writer idle and nobody
// queued carries its batch itself (a lone committer then pays no
// wake-ups); the writer takes over whatever queued meanwhile once that log
// write returns.
// A snapshot taken while a batch is being applied may include that batch
// while its read version does not; the extra writes then only cause
// conservative conflicts, never missed ones. A batch is visible only once it
// is durable.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "kv/engine.h"
#include "kv/store.h"

namespace cistern::kv {

struct KeyRange {
  std::string begin;  // inclusive
  std::string end;    // exclusive
};

// Turns every kAdd of `ops` into a kSet of the counter's resulting value,
// read from the store's current state (`snapshot` is called only when the
// batch has adds). The caller is the only writer.
Status foldAdds(const std::function<std::shared_ptr<StoreSnapshot>()>& snapshot, WriteBatch* ops);

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

  struct Batch {
    WriteBatch ops;
    std::vector<Pending*> accepted;
    uint64_t first = 0, last = 0;  // versions
    SteadyTime handed_at;          // when the log writer handed it to an applier
  };

  Status commit(TxnImpl& txn);
  // Sets a transaction's outcome and wakes its thread. REQUIRES: mu_ held.
  void finish(Pending* p, Status status);
  Batch formBatch();                                                  // REQUIRES: mu_ held
  void runBatch(Batch& b, std::unique_lock<std::mutex>& lock);        // REQUIRES: mu_ held
  void logBatch(const Batch& b, std::unique_lock<std::mutex>& lock);  // REQUIRES: mu_ held
  void applyBatch(Batch& b, std::unique_lock<std::mutex>& lock);      // REQUIRES: mu_ held
  void writerLoop();
  // The writer applies the batch it logged itself (else hands it off).
  bool applyOnWriter(size_t batch, size_t queued);  // REQUIRES: mu_ held
  void setFailed(const Status& s);                  // REQUIRES: mu_ held
  Status resolve(const TxnImpl& txn) const;         // REQUIRES: mu_ held
  void prune();                                     // REQUIRES: mu_ held
  void releaseRead(uint64_t read_version);

  std::unique_ptr<Store> store_;
  EngineOptions options_;

  std::mutex mu_;
  std::deque<Pending*> queue_;
  uint32_t inflight_ = 0;            // batches formed and not yet applied
  std::condition_variable turn_cv_;  // a batch was applied, or the engine failed
  uint64_t assigned_version_ = 0;    // last version given to a transaction
  // Last version applied and visible; written under mu_, read anywhere.
  std::atomic<uint64_t> committed_version_{0};
  // Versions <= forgotten_version_ are no longer in history_.
  uint64_t forgotten_version_ = 0;
  std::deque<HistoryEntry> history_;
  std::mutex reads_mu_;                   // after mu_ when both are held
  std::multiset<uint64_t> active_reads_;  // GUARDED_BY(reads_mu_)
  Status failed_;                         // sticky: a failed apply leaves the store in doubt

  // Synced commits with one log write at a time have a log writer thread.
  std::thread writer_;
  std::condition_variable writer_cv_;  // the queue got its first transaction, or stop
  // The writer carries no batch: it waits for one, or is about to (from its
  // start, or once the queue is empty); a committer may then lead.
  bool writer_idle_ = true;
  // A committer that found the writer idle and the queue empty carries its
  // own batch; the writer takes no batch until its log write is done.
  bool leading_ = false;
  // Who applies a logged batch while others wait to be logged (writerLoop):
  // moving averages, in µs, of applying a batch and of handing one to a
  // thread of its own transactions (the wake-up until it starts applying);
  // a count of batches since the last hand-off, to measure that again.
  double apply_avg_us_ = 0;
  double handoff_avg_us_ = 0;
  uint32_t since_handoff_ = 0;
  bool stop_ = false;
};

}  // namespace cistern::kv
