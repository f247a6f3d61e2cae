// SlotAllocator: which slots of one size class are in use.
//
// Slots are numbered within group files of `slots_per_group` slots each. The
// allocator is a bitmap rebuilt at start-up from the chunk metadata (so slots
// written but never committed before a crash are free again: "leaked slots are
// reclaimed"). allocate() returns the lowest free slot, so files stay dense and
// freed space is reused before the class grows; a new group is opened only
// when every slot is in use, up to `groups_max` (then kNoSpace). A free slot
// may be marked *kept*: it still holds written disk blocks (no hole was
// punched), which the engine counts against its budget; handing the slot
// out clears the mark. Memory: two bits per slot. Not thread-safe: the chunk
// engine serializes calls.
#pragma once

#include <cstdint>
#include <optional>
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
  // REQUIRES: `a` is in use. `kept`: the slot keeps its disk blocks.
  void release(SlotAddr a, bool kept = false);
  bool inUse(SlotAddr a) const;
  // Start-up: `a`, free, holds disk blocks. False if in use, out of range
  // or already marked.
  bool markKept(SlotAddr a);
  // Unmarks the highest kept slot and returns it (to punch), if any.
  std::optional<SlotAddr> dropHighestKept();

  uint64_t usedSlots() const { return used_; }
  uint64_t keptSlots() const { return kept_count_; }
  // Groups that hold or have held a slot (the files that must exist).
  uint32_t groups() const { return groups_; }
  uint32_t slotsPerGroup() const { return slots_per_group_; }

 private:
  uint64_t index(SlotAddr a) const { return uint64_t{a.group} * slots_per_group_ + a.slot; }
  SlotAddr addrOf(uint64_t i) const {
    return SlotAddr{static_cast<uint32_t>(i / slots_per_group_),
                    static_cast<uint32_t>(i % slots_per_group_)};
  }
  void growTo(uint32_t groups);
  // Slot `i` was just handed out: it is no longer kept.
  void unkeep(uint64_t i);

  uint32_t slots_per_group_;
  uint32_t groups_max_;
  uint32_t groups_ = 0;
  std::vector<uint64_t> bits_;
  std::vector<uint64_t> kept_;  // free slots that hold disk blocks
  uint64_t used_ = 0;
  uint64_t kept_count_ = 0;
  size_t hint_ = 0;  // no free bit below word hint_
};

}  // namespace cistern::storage
