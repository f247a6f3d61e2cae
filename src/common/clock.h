// Clock: the only way cistern code reads time or sleeps, so tests can drive
// time by hand (ManualClock) and fault tests can run fast.
//
// SystemClock reads CLOCK_MONOTONIC (steady) and CLOCK_REALTIME (wall). Both
// implementations are thread-safe.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace cistern {

using Duration = std::chrono::nanoseconds;
using SteadyTime = std::chrono::steady_clock::time_point;

class Clock {
 public:
  virtual ~Clock() = default;
  virtual SteadyTime now() const = 0;
  // Wall-clock time in microseconds since the Unix epoch (file times, tokens).
  virtual int64_t wallMicros() const = 0;
  virtual void sleepFor(Duration d) = 0;
};

// The real clocks. system() is a process-wide instance.
class SystemClock final : public Clock {
 public:
  static SystemClock& instance();
  SteadyTime now() const override { return std::chrono::steady_clock::now(); }
  int64_t wallMicros() const override;
  void sleepFor(Duration d) override;
};

// A clock that moves only when advance() is called. sleepFor() blocks until
// another thread advances the clock past the wake-up time.
class ManualClock final : public Clock {
 public:
  explicit ManualClock(int64_t wall_micros_start = 1'700'000'000'000'000)
      : wall_start_(wall_micros_start) {}
  SteadyTime now() const override;
  int64_t wallMicros() const override;
  void sleepFor(Duration d) override;
  void advance(Duration d);
  // Threads blocked in sleepFor() now; lets a test wait until a sleeper sleeps.
  int sleepers() const;

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Duration elapsed_{0};
  int sleepers_ = 0;
  int64_t wall_start_;
};

}  // namespace cistern
