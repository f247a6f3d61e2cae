// GroupCommit (group_commit.h): every change of an entry's state word but
// its owner's own (kSleeping before it sleeps, kWaiting once awake, both
// under mu_) is made under mu_ by the thread that wakes or finishes it.
#include "common/group_commit.h"

#include <linux/futex.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>

#include "common/metrics.h"

namespace cistern {
namespace {

static_assert(sizeof(std::atomic<uint32_t>) == sizeof(uint32_t) &&
              std::atomic<uint32_t>::is_always_lock_free);

// Sleeps while `*word` holds `expected` (returns early on any wake-up or signal).
void futexWait(std::atomic<uint32_t>* word, uint32_t expected) {
  (void)::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected,
                  nullptr, nullptr, 0);
}

// Wakes a thread sleeping on `word`. Only the address is used: the waiter
// may see its new value, return and free it before this runs; a wake-up at
// an address reused meanwhile is a spurious one for whoever sleeps there,
// which every futex user (glibc's locks, futexWait's callers) checks for.
void futexWake(const void* word) {
  (void)::syscall(SYS_futex, word, FUTEX_WAKE_PRIVATE, 1, nullptr, nullptr, 0);
}

uint64_t micros(SteadyTime from, SteadyTime to) {
  return static_cast<uint64_t>(std::max<int64_t>(
      0, std::chrono::duration_cast<std::chrono::microseconds>(to - from).count()));
}

// Wakes one entry of `queue` other than `self` that sleeps; none if all
// are awake (each looks for work under the mutex before it sleeps again).
template <typename Queue>
void wakeOneOf(const Queue& queue, const GroupCommit::Entry* self) {
  for (GroupCommit::Entry* e : queue) {
    if (e == self) continue;
    uint32_t st = GroupCommit::Entry::kSleeping;
    if (e->state.compare_exchange_strong(st, GroupCommit::Entry::kWake,
                                         std::memory_order_acq_rel)) {
      futexWake(&e->state);
      return;
    }
  }
}

}  // namespace

GroupCommit::GroupCommit(Stages* stages, const Options& options)
    : stages_(stages), options_(options) {
  if (options_.stage1_thread) {
    thread_ = std::thread([this] {
      pthread_setname_np(pthread_self(), options_.thread_name);
      stage1Loop();
    });
  }
}

GroupCommit::~GroupCommit() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  thread_cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void GroupCommit::finish(Entry* e, const Status& s) {
  if (&e->status != &s) e->status = s;
  const void* word = &e->state;
  // Once it sees kDone its owner may return and free *e: only the address
  // is used after the exchange.
  if (e->state.exchange(Entry::kDone, std::memory_order_acq_rel) & Entry::kSleeping)
    futexWake(word);
}

bool GroupCommit::sleep(Entry& e, Lock& lock) {
  e.state.store(Entry::kSleeping, std::memory_order_release);
  lock.unlock();
  uint32_t st;
  while ((st = e.state.load(std::memory_order_acquire)) == Entry::kSleeping)
    futexWait(&e.state, Entry::kSleeping);  // or a spurious wake-up
  if (st == Entry::kDone) return true;
  lock.lock();
  if (e.state.load(std::memory_order_acquire) == Entry::kDone) {
    lock.unlock();
    return true;
  }
  e.state.store(Entry::kWaiting, std::memory_order_relaxed);
  return false;
}

void GroupCommit::leadStage1(Lock& lock) {
  stage1_led_ = true;
  const size_t n = std::clamp<size_t>(stages_->take(queue1_), 1, queue1_.size());
  std::vector<Entry*> batch(queue1_.begin(), queue1_.begin() + static_cast<std::ptrdiff_t>(n));
  queue1_.erase(queue1_.begin(), queue1_.begin() + static_cast<std::ptrdiff_t>(n));
  lock.unlock();
  Status s = stages_->stage1(batch);
  lock.lock();
  stage1_led_ = false;
  for (Entry* e : batch) {
    if (e->settled) {
      finish(e, e->status);
    } else if (!s.ok()) {
      finish(e, s);
    } else {
      e->past_stage1 = true;
      queue2_.push_back(e);
    }
  }
}

void GroupCommit::leadStage2(Lock& lock) {
  stage2_led_ = true;
  std::vector<Entry*> batch;
  batch.swap(queue2_);
  if (handed_) {
    // The stage-1 thread's hand-off is taken up.
    const uint64_t waited = micros(handed_at_, std::chrono::steady_clock::now());
    handed_ = false;
    handoff_avg_us_ += (static_cast<double>(waited) - handoff_avg_us_) / 8;
    if (options_.handoff_us) options_.handoff_us->observe(waited);
  }
  lock.unlock();
  const SteadyTime t0 = std::chrono::steady_clock::now();
  Status s = stages_->stage2(batch);
  const uint64_t took = micros(t0, std::chrono::steady_clock::now());
  lock.lock();
  stage2_avg_us_ += (static_cast<double>(took) - stage2_avg_us_) / 8;
  stage2_led_ = false;
  for (Entry* e : batch) finish(e, s);
}

void GroupCommit::wakeIdleStages(const Entry* self) {
  if (!queue1_.empty() && !stage1_led_) {
    if (thread_.joinable()) {
      if (thread_idle_) thread_cv_.notify_one();
    } else {
      wakeOneOf(queue1_, self);
    }
  }
  // A caller whose batch left stage 1 and is not done leads stage 2 itself next.
  const bool self_next =
      self && self->past_stage1 && self->state.load(std::memory_order_relaxed) != Entry::kDone;
  if (!queue2_.empty() && !stage2_led_ && !self_next) wakeOneOf(queue2_, self);
}

Status GroupCommit::commit(Entry& e) {
  e.state.store(Entry::kWaiting, std::memory_order_relaxed);
  e.past_stage1 = false;
  e.settled = false;
  Lock lock(mu_);
  queue1_.push_back(&e);
  const bool threaded = thread_.joinable();
  if (threaded) {
    if (thread_idle_ && !stage1_led_ && queue1_.size() == 1) {
      // The thread sleeps and nobody else is queued: carry the batch on
      // this thread, sparing two wake-ups (the thread's, then this one's).
      leadStage1(lock);
      wakeIdleStages(&e);
    } else if (thread_idle_ && !stage1_led_) {
      thread_cv_.notify_one();
    }
  }
  for (;;) {
    if (e.state.load(std::memory_order_acquire) == Entry::kDone) break;
    const bool stage2_free = !queue2_.empty() && !stage2_led_;
    if (stage2_free && (e.past_stage1 || !threaded)) {
      // Stage 2 first for a caller whose batch left stage 1 (that is what
      // it waits for); a caller still queued helps while stage 1 is led.
      if (e.past_stage1 || queue1_.empty() || stage1_led_) {
        leadStage2(lock);
        wakeIdleStages(&e);
        continue;
      }
    }
    if (!threaded && !queue1_.empty() && !stage1_led_) {
      leadStage1(lock);
      wakeIdleStages(&e);
      continue;
    }
    if (sleep(e, lock)) return e.status;
  }
  return e.status;
}

void GroupCommit::stage1Loop() {
  Lock lock(mu_);
  for (;;) {
    if (queue1_.empty() || stage1_led_) {  // a leading committer notifies when it is done
      if (stop_ && queue1_.empty()) return;
      thread_idle_ = true;
      thread_cv_.wait(lock);
      continue;
    }
    thread_idle_ = false;
    leadStage1(lock);
    if (queue2_.empty() || stage2_led_) continue;  // its leader hands on when done
    if (queue1_.empty() || stage2OnThread(queue2_.size(), queue1_.size())) {
      // Nothing waits for stage 1 (running stage 2 here costs the disk
      // nothing), or the wait is worth it: the batch is spared a hand-off.
      leadStage2(lock);
      wakeIdleStages(nullptr);
      continue;
    }
    since_handoff_ = 0;
    handed_at_ = std::chrono::steady_clock::now();
    handed_ = true;
    wakeOneOf(queue2_, nullptr);
  }
}

// Stage 2 on the thread holds up stage 1 of the `queued` entries by a stage
// 2; handing it to a committer of its own `batch` holds those up by that
// committer's wake-up, and lets the thread run the next stage 1 meanwhile.
// The thread runs it when the wake-ups would cost more than twice the stage
// 2 (twice: while the thread is the bottleneck, its stage 2 also delays
// every batch behind the queued one). With idle cores a wake-up takes about
// as long as a KV apply (~50 µs each here); with both cores busy (a mount of
// `cistern up --mount` and 16 callers on 2 cores) 180–300 µs against 90–130
// µs. Every 16th batch is handed off whatever the averages say, to measure
// the wake-up again.
bool GroupCommit::stage2OnThread(size_t batch, size_t queued) {
  switch (options_.stage2_runner) {
    case Stage2Runner::kStage1Thread:
      return true;
    case Stage2Runner::kHandoff:
      return false;
    case Stage2Runner::kAuto:
      break;
  }
  if (++since_handoff_ >= 16) return false;
  return handoff_avg_us_ * static_cast<double>(batch) >
         2 * stage2_avg_us_ * static_cast<double>(queued);
}

}  // namespace cistern
