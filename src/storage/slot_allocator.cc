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
  return !isFree(index(a));
}

Result<SlotAddr> SlotAllocator::allocate() {
  uint64_t total = uint64_t{groups_} * slots_per_group_;
  for (size_t w = hint_; w < bits_.size(); ++w) {
    if (~bits_[w] == 0) continue;
    uint64_t i = w * 64 + static_cast<uint64_t>(std::countr_one(bits_[w]));
    if (i >= total) break;
    hint_ = w;
    return take(i);
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
    if (bits_[w] == 0) return take(w * 64);
  }
  return allocate();  // the lowest free slot; grows only when every group is full
}

Result<SlotAddr> SlotAllocator::allocateAfter(SlotAddr prev) {
  if (prev.group < groups_ && prev.slot + 1 < slots_per_group_) {
    uint64_t i = index(prev) + 1;
    if (isFree(i)) return take(i);
  }
  return allocateRun();
}

SlotAddr SlotAllocator::take(uint64_t i) {
  bits_[i / 64] |= uint64_t{1} << (i % 64);
  ++used_;
  unkeep(i);
  return addrOf(i);
}

const SlotAllocator::Run* SlotAllocator::findRun(uint64_t inode, uint32_t run) const {
  for (const Run& r : runs_) {
    if (r.valid && r.inode == inode && r.run == run) return &r;
  }
  return nullptr;
}

void SlotAllocator::rememberRun(uint64_t inode, uint32_t run, uint64_t word) {
  runs_[next_run_] = Run{inode, run, true, word};
  next_run_ = (next_run_ + 1) % runs_.size();
}

Result<SlotAddr> SlotAllocator::allocateInRun(uint64_t inode, uint32_t chunk_index,
                                              std::optional<SlotAddr> prev) {
  if (slots_per_group_ % 64 != 0) return prev ? allocateAfter(*prev) : allocateRun();
  const uint32_t run = chunk_index / 64, pos = chunk_index % 64;
  const uint64_t words = bits_.size();  // whole words: slots_per_group_ % 64 == 0
  const Run* known = findRun(inode, run);
  std::optional<uint64_t> word;
  if (known) {
    word = known->word;
  } else if (prev && prev->group < groups_ && pos > 0 && index(*prev) % 64 == pos - 1) {
    word = index(*prev) / 64;  // the run of a file written before a restart
  }
  if (word) {
    uint64_t i = *word * 64 + pos;
    if (!isFree(i)) return allocate();
    if (!known) rememberRun(inode, run, *word);
    return take(i);
  }
  // The first chunk of a run to arrive picks its word.
  std::optional<uint64_t> after;
  if (const Run* r = run > 0 ? findRun(inode, run - 1) : nullptr) {
    after = r->word + 1;
  } else if (prev && prev->group < groups_ && pos == 0 && index(*prev) % 64 == 63) {
    after = index(*prev) / 64 + 1;
  }
  std::optional<uint64_t> w;
  if (after && *after < words && bits_[*after] == 0) w = after;
  for (uint64_t x = hint_; !w && x < words; ++x) {
    if (bits_[x] == 0) w = x;
  }
  if (!w) {
    // A new group for the run once 3/4 of the slots are in use, or half of
    // them for a file that is evidently large (its second run, or the 9th
    // chunk of its first): a run takes a whole word, which files of a few
    // chunks leave mostly empty (every group is pre-allocated whole).
    const uint64_t total = uint64_t{groups_} * slots_per_group_;
    const bool large = run > 0 || pos >= 8;
    if (groups_ >= groups_max_ || used_ * 4 < total * (large ? 2 : 3)) return allocate();
    w = words;  // the first word of a new group
    growTo(groups_ + 1);
  }
  rememberRun(inode, run, *w);
  return take(*w * 64 + pos);
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
