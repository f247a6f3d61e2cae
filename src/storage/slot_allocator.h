// SlotAllocator: which slots of one size class are in use.
//
// Slots are numbered within group files of `slots_per_group` slots each. The
// allocator is a bitmap rebuilt at start-up from the chunk metadata (so slots
// written but never committed before a crash are free again: "leaked slots are
// reclaimed"). allocate() returns the lowest free slot, so files stay dense and
// freed space is reused before the class grows; a new group is opened only
// when every slot is in use, up to `groups_max` (then kNoSpace). Memory: one
// bit per slot. Not thread-safe: the chunk engine serializes calls.
#pragma once

#include <cstdint>
#include <vector>

#include "common/result.h"
#include "storage/chunk_meta.h"

namespace cistern::storage {

class SlotAllocator {
 public:
  SlotAllocator(uint32_t slots_per_group, uint32_t groups_max);

  // Start-up: records that committed metadata references `a`. False if it was
  // already referenced (two chunks in one slot: corruption) or out of range.
  bool markUsed(SlotAddr a);
  Result<SlotAddr> allocate();
  // Placement for files read sequentially: allocateRun() starts a new run at
  // the first slot of the lowest wholly free 64-slot word (the lowest free slot if
  // there is no such word: a run never opens a group by itself), allocateAfter()
  // takes the slot right after `prev` if it is free, else starts a run. So
  // the chunks of a file written in order lie in order on disk even while
  // other files are written at the same time.
  Result<SlotAddr> allocateRun();
  Result<SlotAddr> allocateAfter(SlotAddr prev);
  // REQUIRES: `a` is in use.
  void release(SlotAddr a);
  bool inUse(SlotAddr a) const;

  uint64_t usedSlots() const { return used_; }
  // Groups that hold or have held a slot (the files that must exist).
  uint32_t groups() const { return groups_; }
  uint32_t slotsPerGroup() const { return slots_per_group_; }

 private:
  uint64_t index(SlotAddr a) const { return uint64_t{a.group} * slots_per_group_ + a.slot; }
  void growTo(uint32_t groups);

  uint32_t slots_per_group_;
  uint32_t groups_max_;
  uint32_t groups_ = 0;
  std::vector<uint64_t> bits_;
  uint64_t used_ = 0;
  size_t hint_ = 0;  // no free bit below word hint_
};

}  // namespace cistern::storage
