// Pacer: a byte rate shared by threads (recovery traffic, docs/chain_protocol.md
// "Recovery rate"). reserve() books `bytes` and says when the caller may
// send them: now while the rate has room, else when the bytes booked before
// have had their time. Bursts are not saved up: idle time gives no credit.
// Thread-safe; the clock is the caller's (tests pass their own times).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <mutex>

namespace cistern {

class Pacer {
 public:
  using TimePoint = std::chrono::steady_clock::time_point;
  // bytes_per_second 0: unlimited (reserve() always says now).
  explicit Pacer(uint64_t bytes_per_second) : rate_(bytes_per_second) {}

  TimePoint reserve(uint64_t bytes, TimePoint now) {
    if (rate_ == 0) return now;
    std::lock_guard lock(mu_);
    const TimePoint start = std::max(next_, now);
    next_ =
        start +
        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
            std::chrono::duration<double>(static_cast<double>(bytes) / static_cast<double>(rate_)));
    return start;
  }
  uint64_t rate() const { return rate_; }

 private:
  const uint64_t rate_;
  std::mutex mu_;
  TimePoint next_{};
};

}  // namespace cistern
