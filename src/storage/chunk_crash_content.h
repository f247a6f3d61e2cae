// Shared by chunk_crash_child and chunk_crash_test: what chunk `index` holds
// at each version, and the operation that produces it. Versions cycle through
// four operations so that a crash can hit every write path:
//   step 0: truncate to half of the base length (record-only shrink, or a
//           copy into a smaller class)
//   step 1: write the base content at offset 0 (copy-on-write)
//   step 2: overwrite a range in the middle (copy-on-write)
//   step 3: append half the base length again (in place when the class fits)
// crashContent(index, version) is the exact content after that version.
// Besides, the child writes and removes scratch chunks (kScratchInode) of
// random lengths up to 2.5 MiB, whose content is scratchContent(index,
// length): removed slots are kept or punched and written again while it is
// killed.
#pragma once

#include <cstdint>
#include <vector>

#include "common/random.h"

namespace cistern::storage {

inline constexpr uint64_t kCrashInode = 42;
inline constexpr uint32_t kCrashChunks = 16;
inline constexpr uint64_t kScratchInode = 43;
inline constexpr uint32_t kScratchChunks = 8;

struct CrashOp {
  enum Kind { kTruncate, kWrite } kind;
  uint64_t offset = 0;         // kWrite
  std::vector<uint8_t> bytes;  // kWrite
  uint64_t length = 0;         // kTruncate
};

namespace crash_detail {
inline uint64_t baseLength(uint32_t index) {
  Xoshiro256 sizes(index + 1);
  return 2 + sizes.uniform(200 * 1024);
}
inline std::vector<uint8_t> stream(uint32_t index, uint64_t epoch, uint64_t salt, size_t n) {
  Xoshiro256 rng(index * 1000003ull + epoch * 7919ull + salt);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng.next());
  return v;
}
}  // namespace crash_detail

inline std::vector<uint8_t> scratchContent(uint32_t index, uint64_t length) {
  return crash_detail::stream(index, length, 99, length);
}

// The operation that takes chunk `index` to `version` (>= 1).
inline CrashOp crashOp(uint32_t index, uint64_t version) {
  using namespace crash_detail;
  uint64_t a = baseLength(index), epoch = (version - 1) / 4;
  switch ((version - 1) % 4) {
    case 0:
      return {CrashOp::kTruncate, 0, {}, a / 2};
    case 1:
      return {CrashOp::kWrite, 0, stream(index, epoch, 1, a), 0};
    case 2:
      return {CrashOp::kWrite, a / 4, stream(index, epoch, 2, a / 8 + 1), 0};
    default:
      return {CrashOp::kWrite, a, stream(index, epoch, 3, a / 2), 0};
  }
}

inline std::vector<uint8_t> crashContent(uint32_t index, uint64_t version) {
  using namespace crash_detail;
  uint64_t a = baseLength(index), epoch = (version - 1) / 4, step = (version - 1) % 4;
  if (step == 0) {
    if (epoch == 0) return std::vector<uint8_t>(a / 2, 0);  // truncate creates zeros
    auto prev = crashContent(index, version - 1);
    prev.resize(a / 2);
    return prev;
  }
  std::vector<uint8_t> v = crashOp(index, epoch * 4 + 2).bytes;  // step 1
  if (step >= 2) {
    auto mid = crashOp(index, epoch * 4 + 3);
    std::copy(mid.bytes.begin(), mid.bytes.end(), v.begin() + static_cast<long>(mid.offset));
  }
  if (step >= 3) {
    auto tail = crashOp(index, epoch * 4 + 4).bytes;
    v.insert(v.end(), tail.begin(), tail.end());
  }
  return v;
}

}  // namespace cistern::storage
