#include "storage/slot_allocator.h"

#include <fmt/format.h>

#include <bit>

#include "common/assert.h"

namespace cistern::storage {

SlotAllocator::SlotAllocator(uint32_t slots_per_group, uint32_t groups_max)
    : slots_per_group_(slots_per_group), groups_max_(groups_max) {
  CISTERN_CHECK(slots_per_group > 0 && groups_max > 0, "empty slot allocator");
}

void SlotAllocator::growTo(uint32_t groups) {
  groups_ = groups;
  bits_.resize((uint64_t{groups_} * slots_per_group_ + 63) / 64, 0);
  kept_.resize(bits_.size(), 0);
}

void SlotAllocator::unkeep(uint64_t i) {
  uint64_t bit = uint64_t{1} << (i % 64);
  if (kept_[i / 64] & bit) {
    kept_[i / 64] &= ~bit;
    --kept_count_;
  }
}

bool SlotAllocator::markKept(SlotAddr a) {
  if (a.group >= groups_ || a.slot >= slots_per_group_ || inUse(a)) return false;
  uint64_t i = index(a);
  uint64_t bit = uint64_t{1} << (i % 64);
  if (kept_[i / 64] & bit) return false;
  kept_[i / 64] |= bit;
  ++kept_count_;
  return true;
}

std::optional<SlotAddr> SlotAllocator::dropHighestKept() {
  for (size_t w = kept_.size(); w-- > 0;) {
    if (kept_[w] == 0) continue;
    uint64_t i = w * 64 + 63 - static_cast<uint64_t>(std::countl_zero(kept_[w]));
    unkeep(i);
    return addrOf(i);
  }
  return std::nullopt;
}

bool SlotAllocator::markUsed(SlotAddr a) {
  if (a.slot >= slots_per_group_ || a.group >= groups_max_) return false;
  if (a.group >= groups_) growTo(a.group + 1);
  uint64_t i = index(a);
  uint64_t& word = bits_[i / 64];
  uint64_t bit = uint64_t{1} << (i % 64);
  if (word & bit) return false;
  word |= bit;
  ++used_;
  return true;
}

bool SlotAllocator::inUse(SlotAddr a) const {
  if (a.group >= groups_ || a.slot >= slots_per_group_) return false;
  uint64_t i = index(a);
  return bits_[i / 64] & (uint64_t{1} << (i % 64));
}

Result<SlotAddr> SlotAllocator::allocate() {
  uint64_t total = uint64_t{groups_} * slots_per_group_;
  for (size_t w = hint_; w < bits_.size(); ++w) {
    if (~bits_[w] == 0) continue;
    uint64_t i = w * 64 + static_cast<uint64_t>(std::countr_one(bits_[w]));
    if (i >= total) break;
    bits_[w] |= uint64_t{1} << (i % 64);
    ++used_;
    unkeep(i);
    hint_ = w;
    return addrOf(i);
  }
  if (groups_ >= groups_max_) {
    return Status(ErrorCode::kNoSpace,
                  fmt::format("all {} groups of {} slots are full", groups_max_, slots_per_group_));
  }
  SlotAddr a{groups_, 0};
  growTo(groups_ + 1);
  CISTERN_CHECK(markUsed(a), "fresh slot already used");
  return a;
}

Result<SlotAddr> SlotAllocator::allocateRun() {
  // Never opens a group for a run: a run start takes a wholly free word, and
  // many concurrent run starts (the chunks of one file written in parallel)
  // must not grow the target while existing groups have free slots.
  uint64_t total = uint64_t{groups_} * slots_per_group_;
  for (size_t w = hint_; w < bits_.size() && w * 64 + 63 < total; ++w) {
    if (bits_[w] != 0) continue;
    bits_[w] = 1;
    ++used_;
    uint64_t i = w * 64;
    unkeep(i);
    return addrOf(i);
  }
  return allocate();  // the lowest free slot; grows only when every group is full
}

Result<SlotAddr> SlotAllocator::allocateAfter(SlotAddr prev) {
  if (prev.group < groups_ && prev.slot + 1 < slots_per_group_) {
    uint64_t i = index(prev) + 1;
    uint64_t bit = uint64_t{1} << (i % 64);
    if (!(bits_[i / 64] & bit)) {
      bits_[i / 64] |= bit;
      ++used_;
      unkeep(i);
      return SlotAddr{prev.group, prev.slot + 1};
    }
  }
  return allocateRun();
}

void SlotAllocator::release(SlotAddr a, bool kept) {
  CISTERN_CHECK(inUse(a), "releasing a free slot");
  uint64_t i = index(a);
  bits_[i / 64] &= ~(uint64_t{1} << (i % 64));
  --used_;
  if (kept) CISTERN_CHECK(markKept(a), "kept slot already marked");
  if (i / 64 < hint_) hint_ = i / 64;
}

}  // namespace cistern::storage
