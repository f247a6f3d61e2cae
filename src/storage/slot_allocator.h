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
  // takes the slot right after `prev` if it is free, else starts a run.
  Result<SlotAddr> allocateRun();
  Result<SlotAddr> allocateAfter(SlotAddr prev);
  // A new chunk of a file read sequentially (the chunk engine's classes from
  // 1 MiB up): chunk `chunk_index` of `inode` goes to slot `chunk_index % 64`
  // of the 64-slot word that holds the file's chunks [chunk_index -
  // chunk_index % 64, +64), so a file's chunks lie in index order on disk
  // whatever order they are written in (a client writes several chunks of a
  // file at once) and while other files are written too. The first chunk of such a run to arrive
  // picks its word: the one after the file's previous run if that is wholly
  // free, else the lowest wholly free word; with none, a new group once
  // three quarters of the slots are in use (half, for a file evidently
  // large: a second run, or the 9th chunk of its first), else the lowest
  // free slot (no run). The words of the last `kRunsRemembered` runs are remembered;
  // `prev`, the committed slot of chunk `chunk_index - 1` in this class if any,
  // finds a run's word after a restart. A slot the run would use that is
  // already taken (the file's older chunk of that index) gives the lowest
  // free slot. Groups whose slot count is not a multiple of 64 fall back to
  // allocateAfter(prev) / allocateRun().
  Result<SlotAddr> allocateInRun(uint64_t inode, uint32_t chunk_index,
                                 std::optional<SlotAddr> prev);
  static constexpr size_t kRunsRemembered = 256;
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

  // Runs of allocateInRun(): the word that holds indices [run * 64, +64) of
  // a file. A fixed table, replaced round robin.
  struct Run {
    uint64_t inode = 0;
    uint32_t run = 0;
    bool valid = false;
    uint64_t word = 0;
  };
  const Run* findRun(uint64_t inode, uint32_t run) const;
  // REQUIRES: findRun(inode, run) is null.
  void rememberRun(uint64_t inode, uint32_t run, uint64_t word);
  bool isFree(uint64_t i) const { return !(bits_[i / 64] & (uint64_t{1} << (i % 64))); }
  // Hands out free slot `i`.
  SlotAddr take(uint64_t i);
  std::vector<Run> runs_ = std::vector<Run>(kRunsRemembered);
  size_t next_run_ = 0;
};

}  // namespace cistern::storage
