// Internal: optimistic concurrency control over a Store, shared by every
// backend. This is where serializability lives; backends only provide
// snapshots and atomic batch application.
//
// Commit protocol: the group commit of common/group_commit.h, in two
// stages.
//   1. Stage 1 takes the whole queue and, under the engine mutex, checks
//      each transaction against the history of write ranges of batches
//      accepted after its read version, including batches still being
//      logged or applied and ones accepted earlier in the same batch.
//      Accepted ones get consecutive versions and their writes go into one
//      batch; refused ones finish with kTxnConflict (or kTxnTooOld). Outside
//      the mutex it makes the batch durable (Store::log: one sync for the
//      group).
//   2. Stage 2 applies the batches logged since the last stage 2 (merged,
//      in version order), publishes the newest version and wakes their
//      transactions. Stage 1 of the next batch overlaps it.
// Synced commits to a store with its own log (Store::hasLog) have a log
// writer thread run stage 1, which takes the whole queue as soon as the
// previous log write returns and hands stage 2 to one of the batch's own
// transactions, which has to be woken anyway (unless that wake-up is
// measured to cost more than applying the batch on the writer would cost
// the queued transactions). The disk then need not wait for a batch to be
// applied or for a new leader to be scheduled, and only one sync is in
// flight (on the disks measured, concurrent syncs each take longer than the
// group they would replace). A transaction that finds the writer idle and
// nobody queued carries its batch itself (a lone committer then pays no
// wake-ups). Other engines' stages are led by the committing threads.
// A batch is logged synced when any of its transactions is
// Durability::kSynced (or the store has no log of its own), unsynced
// otherwise: the log keeps what a crash leaves a prefix.
// A snapshot taken while a batch is being applied may include that batch
// while its read version does not; the extra writes then only cause
// conservative conflicts, never missed ones. A batch is visible only once it
// is durable.
#pragma once

#include <atomic>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/group_commit.h"
#include "kv/buffered_txn.h"
#include "kv/engine.h"
#include "kv/store.h"

namespace cistern::kv {

// Turns every kAdd of `ops` into a kSet of the counter's resulting value,
// read from the store's current state (`snapshot` is called only when the
// batch has adds). The caller is the only writer.
Status foldAdds(const std::function<std::shared_ptr<StoreSnapshot>()>& snapshot, WriteBatch* ops);

class OccEngine final : public Engine, public TxnHost {
 public:
  OccEngine(std::unique_ptr<Store> store, const EngineOptions& options);
  ~OccEngine() override;

  std::unique_ptr<Transaction> begin() override;
  std::unique_ptr<ReadTransaction> beginRead() override;
  std::string_view name() const override { return store_->name(); }
  Status sync() override;

  const EngineOptions& options() const override { return options_; }
  Clock& clock() override { return SystemClock::instance(); }

 private:
  struct Pending;
  class Stages;
  struct HistoryEntry {
    uint64_t version;
    std::vector<KeyRange> writes;  // normalized
  };
  // A batch logged by stage 1, waiting for stage 2.
  struct Batch {
    WriteBatch ops;
    uint64_t first = 0, last = 0;  // versions
  };

  Status commit(BufferedTxn& txn) override;
  Status formAndLog(const std::vector<GroupCommit::Entry*>& batch);   // stage 1
  Status applyLogged(const std::vector<GroupCommit::Entry*>& batch);  // stage 2
  void setFailed(const Status& s);                                    // REQUIRES: mu_ held
  Status resolve(const BufferedTxn& txn) const;                       // REQUIRES: mu_ held
  void prune();                                                       // REQUIRES: mu_ held
  void releaseRead(uint64_t read_version) override;

  std::unique_ptr<Store> store_;
  EngineOptions options_;

  std::mutex mu_;
  uint64_t assigned_version_ = 0;  // last version given to a transaction
  // Last version applied and visible; written under mu_, read anywhere.
  std::atomic<uint64_t> committed_version_{0};
  // Versions <= forgotten_version_ are no longer in history_.
  uint64_t forgotten_version_ = 0;
  std::deque<HistoryEntry> history_;
  std::deque<Batch> logged_;              // logged, not yet applied (version order)
  std::mutex reads_mu_;                   // after mu_ when both are held
  std::multiset<uint64_t> active_reads_;  // GUARDED_BY(reads_mu_)
  Status failed_;                         // sticky: a failed log write or apply stops new commits
  bool apply_failed_ = false;  // the store is in doubt: not even logged batches are applied

  std::unique_ptr<Stages> stages_;
  std::unique_ptr<GroupCommit> group_commit_;
};

}  // namespace cistern::kv
