#include "common/clock.h"

#include <thread>

namespace cistern {

SystemClock& SystemClock::instance() {
  static SystemClock c;
  return c;
}

int64_t SystemClock::wallMicros() const {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void SystemClock::sleepFor(Duration d) { std::this_thread::sleep_for(d); }

SteadyTime ManualClock::now() const {
  std::lock_guard lock(mu_);
  return SteadyTime(elapsed_);
}

int64_t ManualClock::wallMicros() const {
  std::lock_guard lock(mu_);
  return wall_start_ + std::chrono::duration_cast<std::chrono::microseconds>(elapsed_).count();
}

void ManualClock::sleepFor(Duration d) {
  std::unique_lock lock(mu_);
  Duration wake = elapsed_ + d;
  ++sleepers_;
  cv_.wait(lock, [&] { return elapsed_ >= wake; });
  --sleepers_;
}

int ManualClock::sleepers() const {
  std::lock_guard lock(mu_);
  return sleepers_;
}

void ManualClock::advance(Duration d) {
  {
    std::lock_guard lock(mu_);
    elapsed_ += d;
  }
  cv_.notify_all();
}

}  // namespace cistern
