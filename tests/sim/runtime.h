// The deterministic simulation's runtime (docs/chain_protocol.md, "The
// simulation"): one thread, one clock that moves only from event to event,
// and C++20 coroutines for the processes' concurrent work, so that one seed
// gives one schedule, every time.
//
//   Scheduler  events in (time, sequence) order; time is simulated µs.
//   Task<T>    a lazily started coroutine; `co_await task` runs it.
//   Actor      a process (a storage node, mgmtd, a client): its coroutines
//              run under its incarnation. crash() starts a new one: every
//              coroutine of the old one throws Crashed at its next resume
//              and unwinds (its frames freed, its locks forgotten).
//   spawn      starts a Task<void> on its own (its end is nobody's).
//   Future<T>  a spawned task whose result is awaited later (an apply and a
//              forward at once, as the storage service does).
//   ChunkLock  one holder per key, FIFO, per actor incarnation.
#pragma once

#include <coroutine>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <utility>
#include <vector>

namespace cistern::sim {

using Micros = int64_t;

// Thrown into a coroutine whose actor crashed (or was stopped) meanwhile.
struct Crashed {};

class Scheduler {
 public:
  Micros now() const { return now_; }
  void at(Micros t, std::function<void()> f) {
    events_.push({t < now_ ? now_ : t, seq_++, std::move(f)});
  }
  void after(Micros d, std::function<void()> f) { at(now_ + d, std::move(f)); }
  // Runs the earliest event; false when none is left.
  bool runOne() {
    if (events_.empty()) return false;
    Event e = events_.top();  // (a copy: top() is const)
    events_.pop();
    now_ = e.t;
    ++ran_;
    e.f();
    return true;
  }
  // Runs every event up to time t; the clock ends at t.
  void runUntil(Micros t) {
    while (!events_.empty() && events_.top().t <= t) runOne();
    if (now_ < t) now_ = t;
  }
  size_t pending() const { return events_.size(); }
  uint64_t ran() const { return ran_; }

 private:
  struct Event {
    Micros t;
    uint64_t seq;
    std::function<void()> f;
    bool operator>(const Event& o) const { return t != o.t ? t > o.t : seq > o.seq; }
  };
  std::priority_queue<Event, std::vector<Event>, std::greater<>> events_;
  Micros now_ = 0;
  uint64_t seq_ = 0;
  uint64_t ran_ = 0;
};

class Actor {
 public:
  explicit Actor(Scheduler& s) : sched_(s) {}
  Scheduler& sched() { return sched_; }
  uint64_t incarnation() const { return incarnation_; }
  bool up() const { return up_; }
  // Ends this incarnation: its coroutines throw Crashed when next resumed
  // (waiters on its locks are resumed now for that).
  void crash() {
    ++incarnation_;
    up_ = false;
    auto locks = std::move(locks_);
    locks_.clear();
    for (auto& [key, l] : locks)
      for (auto h : l.waiters) sched_.after(0, [h] { h.resume(); });
  }
  void start() { up_ = true; }
  // Throws Crashed unless still `inc`.
  void check(uint64_t inc) const {
    if (inc != incarnation_) throw Crashed{};
  }

  struct Lock {
    bool held = false;
    std::deque<std::coroutine_handle<>> waiters;
  };
  std::map<uint64_t, Lock>& locks() { return locks_; }

 private:
  Scheduler& sched_;
  uint64_t incarnation_ = 1;
  bool up_ = false;
  std::map<uint64_t, Lock> locks_;
};

template <typename T>
class Task;

namespace detail {

struct PromiseBase {
  std::coroutine_handle<> continuation;
  std::exception_ptr error;
  std::suspend_always initial_suspend() noexcept { return {}; }
  struct Final {
    bool await_ready() noexcept { return false; }
    template <typename P>
    std::coroutine_handle<> await_suspend(std::coroutine_handle<P> h) noexcept {
      auto c = h.promise().continuation;
      return c ? c : std::noop_coroutine();
    }
    void await_resume() noexcept {}
  };
  Final final_suspend() noexcept { return {}; }
  void unhandled_exception() { error = std::current_exception(); }
};

template <typename T>
struct Promise : PromiseBase {
  std::optional<T> value;
  Task<T> get_return_object();
  void return_value(T v) { value = std::move(v); }
};

template <>
struct Promise<void> : PromiseBase {
  Task<void> get_return_object();
  void return_void() {}
};

}  // namespace detail

template <typename T = void>
class [[nodiscard]] Task {
 public:
  using promise_type = detail::Promise<T>;
  explicit Task(std::coroutine_handle<promise_type> h) : h_(h) {}
  Task(Task&& o) noexcept : h_(std::exchange(o.h_, {})) {}
  Task& operator=(Task&& o) noexcept {
    if (this != &o) {
      if (h_) h_.destroy();
      h_ = std::exchange(o.h_, {});
    }
    return *this;
  }
  ~Task() {
    if (h_) h_.destroy();
  }

  bool await_ready() const noexcept { return false; }
  std::coroutine_handle<> await_suspend(std::coroutine_handle<> c) noexcept {
    h_.promise().continuation = c;
    return h_;
  }
  T await_resume() {
    if (h_.promise().error) std::rethrow_exception(h_.promise().error);
    if constexpr (!std::is_void_v<T>) return std::move(*h_.promise().value);
  }

 private:
  std::coroutine_handle<promise_type> h_;
};

namespace detail {
template <typename T>
Task<T> Promise<T>::get_return_object() {
  return Task<T>(std::coroutine_handle<Promise<T>>::from_promise(*this));
}
inline Task<void> Promise<void>::get_return_object() {
  return Task<void>(std::coroutine_handle<Promise<void>>::from_promise(*this));
}

// A coroutine nobody awaits: frees itself when it ends.
struct Detached {
  struct promise_type {
    Detached get_return_object() { return {}; }
    std::suspend_never initial_suspend() noexcept { return {}; }
    std::suspend_never final_suspend() noexcept { return {}; }
    void return_void() {}
    void unhandled_exception() {
      try {
        throw;
      } catch (const Crashed&) {  // its actor crashed: the work ends with it
      }
    }
  };
};
inline Detached runDetached(Task<void> t) { co_await t; }
}  // namespace detail

// Starts `t` now (it runs until its first suspension before spawn returns).
inline void spawn(Task<void> t) { detail::runDetached(std::move(t)); }

// Resumes after `d` µs; throws Crashed if `a` crashed meanwhile.
struct Sleep {
  Actor& a;
  Micros d;
  uint64_t inc;
  bool await_ready() const noexcept { return false; }
  void await_suspend(std::coroutine_handle<> h) {
    a.sched().after(d, [h] { h.resume(); });
  }
  void await_resume() const { a.check(inc); }
};
inline Sleep sleepFor(Actor& a, Micros d) { return Sleep{a, d, a.incarnation()}; }

// A task of `a` started now, its result awaited later.
template <typename T>
class Future {
 public:
  struct State {
    std::optional<T> value;
    bool crashed = false;
    std::coroutine_handle<> waiter;
  };
  Future(Actor& a, Task<T> t) : a_(a), inc_(a.incarnation()), s_(std::make_shared<State>()) {
    run(a_, std::move(t), s_);
  }
  bool await_ready() const noexcept { return s_->value.has_value() || s_->crashed; }
  void await_suspend(std::coroutine_handle<> h) { s_->waiter = h; }
  T await_resume() {
    a_.check(inc_);
    if (s_->crashed) throw Crashed{};
    return std::move(*s_->value);
  }

 private:
  static detail::Detached run(Actor& a, Task<T> t, std::shared_ptr<State> s) {
    try {
      s->value = co_await t;
    } catch (const Crashed&) {
      s->crashed = true;
    }
    wake(a, *s);
  }
  static void wake(Actor& a, State& s) {  // (no lambda in a coroutine body: GCC 12)
    if (auto w = std::exchange(s.waiter, {})) a.sched().after(0, [w] { w.resume(); });
  }
  Actor& a_;
  uint64_t inc_;
  std::shared_ptr<State> s_;
};

// Holds actor `a`'s lock on `key` until destroyed.
class Guard {
 public:
  Guard(Actor& a, uint64_t key, uint64_t inc) : a_(&a), key_(key), inc_(inc) {}
  Guard(Guard&& o) noexcept : a_(std::exchange(o.a_, nullptr)), key_(o.key_), inc_(o.inc_) {}
  Guard(const Guard&) = delete;
  ~Guard() {
    if (!a_ || a_->incarnation() != inc_) return;  // a crash forgot every lock
    auto& l = a_->locks()[key_];
    if (l.waiters.empty()) {
      a_->locks().erase(key_);
      return;
    }
    auto h = l.waiters.front();  // handed over: stays held
    l.waiters.pop_front();
    a_->sched().after(0, [h] { h.resume(); });
  }

 private:
  Actor* a_;
  uint64_t key_;
  uint64_t inc_;
};

struct LockAwait {
  Actor& a;
  uint64_t key;
  uint64_t inc;
  bool await_ready() {
    auto& l = a.locks()[key];
    if (l.held) return false;
    l.held = true;
    return true;
  }
  void await_suspend(std::coroutine_handle<> h) { a.locks()[key].waiters.push_back(h); }
  Guard await_resume() {
    a.check(inc);
    return Guard(a, key, inc);
  }
};
inline LockAwait lockChunk(Actor& a, uint64_t key) { return LockAwait{a, key, a.incarnation()}; }

}  // namespace cistern::sim
