// GroupCommit: the group-commit pipeline of the KV engine (kv/occ_engine.cc)
// and of the chunk engine (storage/chunk_commit.cc).
//
// Committers queue entries and block in commit(). Batches of queued entries
// pass two stages: stage 1 (the KV: check conflicts, write the log record;
// the chunk engine: write the metadata log record) runs one batch at a time,
// in queue order; stage 2 (the KV: apply to the store and publish the
// version; the chunk engine: sync the data files and apply the records)
// runs one at a time over every batch that has left stage 1 since the last
// stage 2, merged, in the order they left it. So stage 1 of one batch
// overlaps stage 2 of the batches before it, and an entry is done only when
// its batch has left stage 2, after every batch before it. Stage 1 may
// settle entries on its own (a conflict): they finish at once with their
// status and skip stage 2. A failed stage finishes its batch's entries with
// its error.
//
// Who runs the stages:
//  - Led by the committers (the default): a committer whose batch has left
//    stage 1 leads stage 2 if nobody does; otherwise a committer leads
//    stage 1 if it has work and nobody leads it; the rest sleep. A finished
//    stage wakes the entries it finished and, for each stage left with work
//    and no leader, one committer queued there — never every waiter. A lone
//    committer runs both stages itself and pays no wake-up.
//  - With a stage-1 thread (Options::stage1_thread, the KV's synced log):
//    a thread of the pipeline takes the whole queue the moment its previous
//    stage 1 returns, so the disk waits neither for a batch's stage 2 nor
//    for a leader to be scheduled. It runs stage 2 itself when nothing
//    waits for stage 1, or when waking a committer of the batch to run it
//    would cost the batch more than running it here costs the queue
//    (measured moving averages, Stage2Runner::kAuto); otherwise it hands
//    stage 2 to one of the batch's committers. A committer that finds the
//    thread idle and nobody queued runs its batch itself (no wake-ups).
//
// Committers sleep on a futex word in their entry, not the pipeline mutex:
// a finished one returns without queueing for the mutex behind the leaders.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/clock.h"
#include "common/status.h"

namespace cistern {

namespace metrics {
class Histogram;
}

class GroupCommit {
 public:
  // One committer's place in the pipeline, for one commit() call.
  struct Entry {
    void* item = nullptr;  // the owner's record (for the stages)
    Status status;
    // Set by stage 1 with `status`: this entry is finished (e.g. refused).
    bool settled = false;

    // The pipeline's own:
    enum : uint32_t { kWaiting = 0, kWake = 1, kDone = 2, kSleeping = 4 };
    std::atomic<uint32_t> state{kWaiting};
    bool past_stage1 = false;
  };

  class Stages {
   public:
    virtual ~Stages() = default;
    // How many of the queued entries (at least 1, at most queued.size())
    // the next stage-1 batch takes.
    virtual size_t take(const std::deque<Entry*>& queued) { return queued.size(); }
    // Stage 1 of one batch. Entries it settles finish with their status; an
    // error finishes the others with it.
    virtual Status stage1(const std::vector<Entry*>& batch) = 0;
    // Stage 2 of the batches that left stage 1 since the last stage 2, in
    // that order; an error finishes them all with it.
    virtual Status stage2(const std::vector<Entry*>& batch) = 0;
  };

  enum class Stage2Runner { kAuto, kStage1Thread, kHandoff };
  struct Options {
    bool stage1_thread = false;
    // With the stage-1 thread: who runs stage 2 while committers wait for
    // stage 1 (kAuto: chosen per batch from measured costs).
    Stage2Runner stage2_runner = Stage2Runner::kAuto;
    const char* thread_name = "commit";  // for top -H and perf
    // Microseconds from the stage-1 thread handing stage 2 to a committer
    // until that committer starts it (optional).
    metrics::Histogram* handoff_us = nullptr;
  };

  GroupCommit(Stages* stages, const Options& options);
  ~GroupCommit();  // REQUIRES: no commit() in progress
  GroupCommit(const GroupCommit&) = delete;
  GroupCommit& operator=(const GroupCommit&) = delete;

  // Queues `e` and returns its status once its batch has left stage 2 (or
  // stage 1 settled it, or a stage failed).
  Status commit(Entry& e);

 private:
  using Lock = std::unique_lock<std::mutex>;
  // Runs stage 1 of the next batch on this thread. REQUIRES: mu_ held,
  // queue1_ not empty, stage 1 not led.
  void leadStage1(Lock& lock);
  // Runs stage 2 of everything past stage 1. REQUIRES: mu_ held, queue2_
  // not empty, stage 2 not led.
  void leadStage2(Lock& lock);
  // Wakes, for each stage with work and no leader, one committer that sleeps
  // in its queue (the stage-1 thread for stage 1 when there is one).
  void wakeIdleStages(const Entry* self);  // REQUIRES: mu_ held
  void finish(Entry* e, const Status& s);  // REQUIRES: mu_ held
  // Sleeps until woken or finished; true when finished (then without mu_).
  bool sleep(Entry& e, Lock& lock);
  void stage1Loop();
  bool stage2OnThread(size_t batch, size_t queued);  // REQUIRES: mu_ held

  Stages* const stages_;
  const Options options_;
  std::mutex mu_;
  std::deque<Entry*> queue1_;   // waiting for stage 1
  std::vector<Entry*> queue2_;  // past stage 1, waiting for stage 2
  bool stage1_led_ = false;
  bool stage2_led_ = false;

  // The stage-1 thread.
  std::thread thread_;
  std::condition_variable thread_cv_;  // work for it, or stop
  bool thread_idle_ = true;
  bool stop_ = false;
  // Moving averages (µs) of a stage 2 and of a hand-off's wake-up; batches
  // since the last hand-off (every 16th is handed off, to measure again).
  double stage2_avg_us_ = 0;
  double handoff_avg_us_ = 0;
  uint32_t since_handoff_ = 0;
  SteadyTime handed_at_{};  // of the hand-off not yet taken up
  bool handed_ = false;
};

}  // namespace cistern
