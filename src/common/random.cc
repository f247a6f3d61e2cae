#include "common/random.h"

#include <random>

#include "common/assert.h"

namespace cistern {
namespace {
uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ULL);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}
}  // namespace

uint64_t Random::uniform(uint64_t n) {
  CISTERN_CHECK(n > 0, "uniform(0)");
  // Rejection sampling removes modulo bias.
  uint64_t limit = UINT64_MAX - UINT64_MAX % n;
  uint64_t x;
  do {
    x = next();
  } while (x >= limit);
  return x % n;
}

double Random::unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }

Xoshiro256::Xoshiro256(uint64_t seed) {
  for (auto& s : s_) s = splitmix64(seed);
}

uint64_t Xoshiro256::next() {
  uint64_t result = rotl(s_[1] * 5, 7) * 9;
  uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

Random& threadLocalRandom() {
  thread_local Xoshiro256 r{(static_cast<uint64_t>(std::random_device{}()) << 32) ^
                            std::random_device{}()};
  return r;
}

}  // namespace cistern
