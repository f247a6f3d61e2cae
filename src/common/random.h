// Random: the only source of randomness in cistern code (backoff jitter,
// fault probabilities, test workloads), so a test can fix the seed and replay.
//
// Xoshiro256** is fast and deterministic for a seed; it is NOT for secrets.
// One instance is not thread-safe: give each thread its own (threadLocal()).
#pragma once

#include <cstdint>

namespace cistern {

class Random {
 public:
  virtual ~Random() = default;
  virtual uint64_t next() = 0;
  // Uniform in [0, n); n > 0.
  uint64_t uniform(uint64_t n);
  // Uniform in [0, 1).
  double unit();
  bool oneIn(uint64_t n) { return uniform(n) == 0; }
};

class Xoshiro256 final : public Random {
 public:
  explicit Xoshiro256(uint64_t seed);
  uint64_t next() override;

 private:
  uint64_t s_[4];
};

// A per-thread generator seeded from the OS entropy pool.
Random& threadLocalRandom();

}  // namespace cistern
