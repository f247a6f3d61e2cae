// CrcCache: pages of the slots' CRC areas (docs/chunk_format.md), kept in
// memory so that a read of a few blocks costs one I/O (the data) instead of
// two (the data and its CRCs). Bounded by its byte budget; pages are evicted
// by CLOCK and their buffers reused.
//
// A page is cached under its place (size class, group, slot, page of the
// slot's CRC area) and tagged with the version of the chunk whose reader
// read it: a reader only takes pages tagged with the version it holds. A
// writer calls invalidate() for its slot once its data and CRCs are on the
// disk and before its metadata is published, which also bumps the slot's
// shard generation: a reader that read a page before that (it may hold the
// slot's previous bytes) and puts it afterwards is turned away, so no page
// of an earlier occupant of a slot can be taken for a later one. An append
// in place keeps the old version's entries as they were, so a page that a
// reader of the old version puts after it is still right for that version.
// Thread-safe (sharded by slot).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <unordered_map>
#include <vector>

#include "storage/chunk_meta.h"

namespace cistern::storage {

class CrcCache {
 public:
  static constexpr uint32_t kPageBytes = 4096;
  static constexpr uint32_t kEntriesPerPage = kPageBytes / 4;

  struct Key {
    uint32_t size_class = 0;
    SlotAddr addr;
    uint32_t page = 0;  // of the slot's CRC area
    bool operator==(const Key&) const = default;
  };

  // At most `bytes` of pages (at least one page per shard). Memory is taken
  // as pages are first put, not up front.
  explicit CrcCache(uint64_t bytes);
  ~CrcCache();
  CrcCache(const CrcCache&) = delete;
  CrcCache& operator=(const CrcCache&) = delete;

  // Copies entries [first, first + count) of the page into `out` if it is
  // cached for `version`. Otherwise sets `*generation`, to pass to put()
  // with the page read from the disk after this call.
  // REQUIRES: first + count <= kEntriesPerPage.
  bool get(const Key& k, uint64_t version, uint32_t first, uint32_t count, uint32_t* out,
           uint64_t* generation);
  // What get() sets `*generation` to on a miss: for a writer that puts the
  // page it wrote, taken after its invalidate().
  uint64_t generation(uint32_t size_class, SlotAddr addr);
  // Caches `page` (kPageBytes) for `version`, unless the slot was
  // invalidated since `generation`.
  void put(const Key& k, uint64_t version, uint64_t generation, const uint8_t* page);
  // Drops every page of the slot and turns away puts of pages read before.
  void invalidate(uint32_t size_class, SlotAddr addr);

  uint64_t pages() const;  // cached now
  uint64_t capacityPages() const;

 private:
  struct KeyHash {
    size_t operator()(const Key& k) const;
  };
  struct Entry {
    Key key;
    uint64_t version = 0;
    bool referenced = false;
    bool used = false;
    std::unique_ptr<uint8_t[]> page;
  };
  struct Shard {
    std::mutex mu;
    uint64_t generation = 0;
    std::vector<Entry> entries;  // grows to `capacity`, then recycled
    std::unordered_map<Key, size_t, KeyHash> index;
    size_t hand = 0;  // CLOCK
  };
  static constexpr size_t kShards = 16;
  Shard& shardOf(uint32_t size_class, SlotAddr addr);

  size_t capacity_;  // entries per shard
  std::unique_ptr<Shard[]> shards_;
};

}  // namespace cistern::storage
