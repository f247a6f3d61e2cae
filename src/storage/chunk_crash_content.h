// Shared by chunk_crash_child and chunk_crash_test: the content of chunk
// `index` at `version`. The length depends on the index only (lengths across
// chunks span several size classes), so every write replaces the whole chunk.
#pragma once

#include <cstdint>
#include <vector>

#include "common/random.h"

namespace cistern::storage {

inline constexpr uint64_t kCrashInode = 42;
inline constexpr uint32_t kCrashChunks = 16;

inline std::vector<uint8_t> crashContent(uint32_t index, uint64_t version) {
  Xoshiro256 sizes(index + 1);
  std::vector<uint8_t> v(1 + sizes.uniform(200 * 1024));
  Xoshiro256 rng(index * 1000003ull + version);
  for (auto& b : v) b = static_cast<uint8_t>(rng.next());
  return v;
}

}  // namespace cistern::storage
