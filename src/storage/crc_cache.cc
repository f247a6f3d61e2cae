#include "storage/crc_cache.h"

#include <algorithm>
#include <cstring>

namespace cistern::storage {

namespace {

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;

uint64_t slotHash(uint32_t size_class, SlotAddr addr) {
  return ((uint64_t{size_class} << 48) ^ (uint64_t{addr.group} << 24) ^ addr.slot) * kGolden;
}

}  // namespace

size_t CrcCache::KeyHash::operator()(const Key& k) const {
  uint64_t h = (slotHash(k.size_class, k.addr) ^ k.page) * kGolden;
  return static_cast<size_t>(h ^ (h >> 29));
}

CrcCache::CrcCache(uint64_t bytes)
    : capacity_(std::max<size_t>(1, bytes / kPageBytes / kShards)), shards_(new Shard[kShards]) {}

CrcCache::~CrcCache() = default;

CrcCache::Shard& CrcCache::shardOf(uint32_t size_class, SlotAddr addr) {
  // Every page of a slot in one shard: invalidate() takes one lock.
  return shards_[(slotHash(size_class, addr) >> 40) % kShards];
}

bool CrcCache::get(const Key& k, uint64_t version, uint32_t first, uint32_t count, uint32_t* out,
                   uint64_t* generation) {
  Shard& s = shardOf(k.size_class, k.addr);
  std::lock_guard lock(s.mu);
  auto it = s.index.find(k);
  if (it == s.index.end() || s.entries[it->second].version != version) {
    *generation = s.generation;
    return false;
  }
  Entry& e = s.entries[it->second];
  e.referenced = true;
  std::memcpy(out, e.page.get() + size_t{first} * 4, size_t{count} * 4);
  return true;
}

uint64_t CrcCache::generation(uint32_t size_class, SlotAddr addr) {
  Shard& s = shardOf(size_class, addr);
  std::lock_guard lock(s.mu);
  return s.generation;
}

void CrcCache::put(const Key& k, uint64_t version, uint64_t generation, const uint8_t* page) {
  Shard& s = shardOf(k.size_class, k.addr);
  std::lock_guard lock(s.mu);
  if (s.generation != generation) return;  // the slot changed hands meanwhile
  size_t at;
  if (auto it = s.index.find(k); it != s.index.end()) {
    at = it->second;  // another version of the same page
  } else if (s.entries.size() < capacity_) {
    at = s.entries.size();
    s.entries.emplace_back();
    s.entries[at].page.reset(new uint8_t[kPageBytes]);
    s.index.emplace(k, at);
  } else {
    // CLOCK: the first page not referenced since the hand last passed it,
    // or a free entry.
    for (;; s.hand = (s.hand + 1) % s.entries.size()) {
      Entry& e = s.entries[s.hand];
      if (!e.used) break;
      if (!e.referenced) {
        s.index.erase(e.key);
        break;
      }
      e.referenced = false;
    }
    at = s.hand;
    s.hand = (s.hand + 1) % s.entries.size();
    s.index.emplace(k, at);
  }
  Entry& e = s.entries[at];
  e.key = k;
  e.version = version;
  e.referenced = false;
  e.used = true;
  std::memcpy(e.page.get(), page, kPageBytes);
}

void CrcCache::invalidate(uint32_t size_class, SlotAddr addr) {
  Shard& s = shardOf(size_class, addr);
  std::lock_guard lock(s.mu);
  ++s.generation;
  const uint32_t pages = static_cast<uint32_t>(crcAreaBytes(size_class) / kPageBytes);
  for (uint32_t p = 0; p < pages; ++p) {
    auto it = s.index.find(Key{size_class, addr, p});
    if (it == s.index.end()) continue;
    s.entries[it->second].used = false;
    s.index.erase(it);
  }
}

uint64_t CrcCache::pages() const {
  uint64_t n = 0;
  for (size_t i = 0; i < kShards; ++i) {
    std::lock_guard lock(shards_[i].mu);
    n += shards_[i].index.size();
  }
  return n;
}

uint64_t CrcCache::capacityPages() const { return uint64_t{capacity_} * kShards; }

}  // namespace cistern::storage
