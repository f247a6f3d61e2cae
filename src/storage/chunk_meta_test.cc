#include "storage/chunk_meta.h"

#include <gtest/gtest.h>

#include <map>
#include <optional>
#include <set>

#include "common/crc32c.h"
#include "common/random.h"
#include "storage/slot_allocator.h"

namespace cistern::storage {
namespace {

TEST(SizeClasses, CoverSixtyFourKiBToSixtyFourMiB) {
  EXPECT_EQ(*classFor(0), 0u);
  EXPECT_EQ(*classFor(1), 0u);
  EXPECT_EQ(*classFor(64 * 1024), 0u);
  EXPECT_EQ(*classFor(64 * 1024 + 1), 1u);
  EXPECT_EQ(*classFor(1 << 20), 4u);
  EXPECT_EQ(*classFor(kMaxChunkBytes), kClassCount - 1);
  EXPECT_EQ(classFor(kMaxChunkBytes + 1).code(), ErrorCode::kInvalidArgument);
}

TEST(ChunkKey, RoundTripsAndSortsByInodeThenIndex) {
  ChunkId a{1, 0xFFFFFFFF}, b{2, 0}, c{2, 1};
  EXPECT_LT(encodeChunkKey(a), encodeChunkKey(b));
  EXPECT_LT(encodeChunkKey(b), encodeChunkKey(c));
  EXPECT_EQ(*decodeChunkKey(encodeChunkKey(a)), a);
  EXPECT_EQ(decodeChunkKey("short").code(), ErrorCode::kCorruption);
}

ChunkMeta sample() {
  ChunkMeta m;
  m.size_class = 4;
  m.addr = {3, 17};
  m.length = 123456;
  m.chunk_version = 9;
  m.chain_version = 77;
  m.tail_crc = 0xabcdef01;
  m.crcs_crc = 0x12345678;
  m.chain = 0x01020304;
  return m;
}

TEST(ChunkMetaRecord, RoundTrips) {
  std::string rec = encodeChunkMeta(sample());
  ASSERT_EQ(rec.size(), kChunkMetaBytes);
  auto back = decodeChunkMeta(rec);
  ASSERT_TRUE(back.ok()) << back.status().toString();
  EXPECT_EQ(*back, sample());
}

// Records written before crcs_crc existed are read, and a change that keeps
// them without it writes them back in their own format.
TEST(ChunkMetaRecord, VersionTwoRecordsRoundTripWithoutTheCrcsCrc) {
  ChunkMeta m = sample();
  m.crcs_crc.reset();
  std::string rec = encodeChunkMeta(m);
  ASSERT_EQ(rec.size(), kChunkMetaBytes2);
  m.chain = 0;  // a version 2 record keeps no chain
  EXPECT_EQ(rec[0], 2);
  auto back = decodeChunkMeta(rec);
  ASSERT_TRUE(back.ok()) << back.status().toString();
  EXPECT_EQ(*back, m);
  // A version 3 header on a version 2 body (or the reverse) is refused.
  std::string v3 = encodeChunkMeta(sample());
  for (auto [bytes, version] : {std::pair{rec, 3}, std::pair{v3, 2}}) {
    bytes[0] = static_cast<char>(version);
    const size_t body = bytes.size() - 4;
    const uint32_t crc = crc32c(bytes.data(), body);
    for (int i = 0; i < 4; ++i)
      bytes[body + static_cast<size_t>(i)] = static_cast<char>(crc >> (8 * i));
    auto r = decodeChunkMeta(bytes);
    EXPECT_EQ(r.code(), ErrorCode::kCorruption);
    EXPECT_NE(r.status().message().find("record version"), std::string::npos)
        << r.status().toString();
  }
}

// Records written before chains existed (version 3: 44 bytes) are read,
// with no chain.
TEST(ChunkMetaRecord, VersionThreeRecordsAreReadWithoutAChain) {
  std::string rec = encodeChunkMeta(sample()).substr(0, kChunkMetaBytes3);
  rec[0] = 3;
  const uint32_t crc = crc32c(rec.data(), kChunkMetaBytes3 - 4);
  for (int i = 0; i < 4; ++i)
    rec[kChunkMetaBytes3 - 4 + static_cast<size_t>(i)] = static_cast<char>(crc >> (8 * i));
  auto back = decodeChunkMeta(rec);
  ASSERT_TRUE(back.ok()) << back.status().toString();
  ChunkMeta want = sample();
  want.chain = 0;
  EXPECT_EQ(*back, want);
  rec[0] = 4;  // a version 4 header on a version 3 body
  EXPECT_EQ(decodeChunkMeta(rec).code(), ErrorCode::kCorruption);
}

TEST(ChunkMetaRecord, EveryFlippedBitIsDetected) {
  ChunkMeta v2 = sample();
  v2.crcs_crc.reset();
  for (const std::string& rec : {encodeChunkMeta(sample()), encodeChunkMeta(v2)}) {
    for (size_t byte = 0; byte < rec.size(); ++byte) {
      for (int bit = 0; bit < 8; ++bit) {
        std::string bad = rec;
        bad[byte] = static_cast<char>(bad[byte] ^ (1 << bit));
        EXPECT_EQ(decodeChunkMeta(bad).code(), ErrorCode::kCorruption) << byte << ":" << bit;
      }
    }
    EXPECT_EQ(decodeChunkMeta(rec.substr(1)).code(), ErrorCode::kCorruption);
  }
}

TEST(ChunkMetaRecord, LengthBeyondTheClassIsCorruption) {
  ChunkMeta m = sample();
  m.size_class = 0;
  m.length = 64 * 1024 + 1;
  auto r = decodeChunkMeta(encodeChunkMeta(m));
  EXPECT_EQ(r.code(), ErrorCode::kCorruption);
  EXPECT_NE(r.status().message().find("exceeds class"), std::string::npos);
  m.size_class = 11;
  m.length = 0;
  EXPECT_EQ(decodeChunkMeta(encodeChunkMeta(m)).code(), ErrorCode::kCorruption);
}

TEST(LoggedWriteRecord, RoundTripsWithItsBytes) {
  std::string data(8192, 'd'), crcs = "abcdefgh";
  LoggedWrite w{.size_class = 0,
                .addr = {3, 7},
                .data_offset = 4096,
                .data = data,
                .crc_offset = 4,
                .crcs = crcs};
  std::string enc = encodeLoggedWrite(w);
  EXPECT_EQ(enc.size(), kLoggedWriteHeaderBytes + data.size() + crcs.size());
  auto d = decodeLoggedWrite(enc);
  ASSERT_TRUE(d.ok()) << d.status().toString();
  EXPECT_EQ(d->size_class, 0u);
  EXPECT_EQ(d->addr, (SlotAddr{3, 7}));
  EXPECT_EQ(d->data_offset, 4096u);
  EXPECT_EQ(d->data, data);
  EXPECT_EQ(d->crc_offset, 4u);
  EXPECT_EQ(d->crcs, crcs);
}

TEST(LoggedWriteRecord, BadRecordsAreCorruptionNamingTheProblem) {
  std::string block(4096, 'x'), crc4 = "wxyz";
  auto enc = [&](LoggedWrite w) { return encodeLoggedWrite(w); };
  LoggedWrite ok{.data = block, .crcs = crc4};
  struct Case {
    std::string bytes;
    const char* says;
  } cases[] = {
      {enc(ok).substr(0, 20), "logged write of 20 bytes"},
      {enc(ok).substr(0, enc(ok).size() - 1), "says 4096 data and 4 CRC bytes"},
      {enc(ok) + "x", "says 4096 data and 4 CRC bytes"},
      {enc(LoggedWrite{.size_class = kClassCount, .data = block}), "size class 11"},
      {enc(LoggedWrite{.data_offset = 100, .data = block}), "at 100 in a slot of 65536"},
      {enc(LoggedWrite{.data_offset = 65536, .data = block}), "at 65536 in a slot of 65536"},
      {enc(LoggedWrite{.data = std::string_view(block).substr(0, 100)}), "logged write of 100"},
      {enc(LoggedWrite{.crc_offset = 2, .crcs = crc4}), "CRC bytes at 2"},
      {enc(LoggedWrite{.crc_offset = 64, .crcs = crc4}), "CRC bytes at 64"},
  };
  for (const auto& c : cases) {
    auto d = decodeLoggedWrite(c.bytes);
    ASSERT_FALSE(d.ok()) << c.says;
    EXPECT_EQ(d.code(), ErrorCode::kCorruption);
    EXPECT_NE(d.status().message().find(c.says), std::string::npos) << d.status().toString();
  }
  std::string wrong_version = enc(ok);
  wrong_version[0] = 9;
  EXPECT_EQ(decodeLoggedWrite(wrong_version).code(), ErrorCode::kCorruption);
}

TEST(SlotAllocator, AllocatesLowestFreeAndGrowsByGroups) {
  SlotAllocator a(4, 2);
  for (uint32_t i = 0; i < 8; ++i) {
    auto s = a.allocate();
    ASSERT_TRUE(s.ok());
    EXPECT_EQ(s->group, i / 4);
    EXPECT_EQ(s->slot, i % 4);
  }
  EXPECT_EQ(a.allocate().code(), ErrorCode::kNoSpace);
  a.release({1, 2});
  a.release({0, 1});
  EXPECT_EQ(*a.allocate(), (SlotAddr{0, 1}));
  EXPECT_EQ(*a.allocate(), (SlotAddr{1, 2}));
  EXPECT_EQ(a.usedSlots(), 8u);
  EXPECT_EQ(a.groups(), 2u);
}

TEST(SlotAllocator, RebuildFromMetadataRejectsDoubleUseAndReclaimsTheRest) {
  SlotAllocator a(100, 10);
  EXPECT_TRUE(a.markUsed({2, 5}));
  EXPECT_FALSE(a.markUsed({2, 5}));
  EXPECT_FALSE(a.markUsed({0, 100}));
  EXPECT_FALSE(a.markUsed({10, 0}));
  EXPECT_EQ(a.groups(), 3u);
  EXPECT_EQ(*a.allocate(), (SlotAddr{0, 0}));  // unreferenced slots are free again
  EXPECT_TRUE(a.inUse({2, 5}));
  EXPECT_FALSE(a.inUse({2, 6}));
}

TEST(SlotAllocator, RandomAllocAndReleaseMatchAModel) {
  SlotAllocator a(37, 5);
  std::set<std::pair<uint32_t, uint32_t>> used;
  Xoshiro256 rng(5);
  for (int i = 0; i < 20000; ++i) {
    if (rng.oneIn(2) && !used.empty()) {
      auto it = used.begin();
      std::advance(it, static_cast<long>(rng.uniform(used.size())));
      a.release({it->first, it->second});
      used.erase(it);
    } else {
      auto s = a.allocate();
      if (used.size() == 37 * 5) {
        ASSERT_EQ(s.code(), ErrorCode::kNoSpace);
        continue;
      }
      ASSERT_TRUE(s.ok());
      // The lowest free slot in (group, slot) order.
      std::pair<uint32_t, uint32_t> want{0, 0};
      while (used.count(want))
        want = want.second + 1 == 37 ? std::make_pair(want.first + 1, 0u)
                                     : std::make_pair(want.first, want.second + 1);
      ASSERT_EQ(std::make_pair(s->group, s->slot), want);
      used.insert(want);
    }
    ASSERT_EQ(a.usedSlots(), used.size());
  }
}

// The order a client's parallel writes bring a file's chunks in: windows of
// 8 chunks, each window in a shuffled order, the files' windows interleaved.
std::vector<std::pair<uint64_t, uint32_t>> clientOrder(uint64_t files, uint32_t chunks,
                                                       uint64_t seed) {
  Xoshiro256 rng(seed);
  std::vector<std::pair<uint64_t, uint32_t>> order;
  for (uint32_t first = 0; first < chunks; first += 8) {
    for (uint64_t f = 0; f < files; ++f) {
      std::vector<uint32_t> window;
      for (uint32_t i = first; i < std::min(first + 8, chunks); ++i) window.push_back(i);
      for (size_t i = window.size(); i > 1; --i) std::swap(window[i - 1], window[rng.uniform(i)]);
      for (uint32_t i : window) order.emplace_back(100 + f, i);
    }
  }
  return order;
}

TEST(SlotAllocator, RunsKeepAFilesChunksInIndexOrderWhateverOrderTheyArriveIn) {
  SlotAllocator a(256, 8);                               // four 64-slot words per group
  std::map<std::pair<uint64_t, uint32_t>, uint64_t> at;  // (file, chunk) -> slot number
  for (auto [file, i] : clientOrder(4, 256, 1)) {
    auto s = a.allocateInRun(file, i, std::nullopt);  // no predecessor committed yet
    ASSERT_TRUE(s.ok()) << s.status().toString();
    at[{file, i}] = uint64_t{s->group} * 256 + s->slot;
  }
  std::set<uint64_t> words;
  for (uint64_t file = 100; file < 104; ++file) {
    for (uint32_t i = 0; i < 256; ++i) {
      uint64_t slot = at[{file, i}];
      EXPECT_EQ(slot % 64, i % 64) << file << ":" << i;
      if (i % 64 == 0) {
        EXPECT_TRUE(words.insert(slot / 64).second) << "word shared: " << file << ":" << i;
      } else {
        EXPECT_EQ(slot, (at[{file, i - 1}] + 1)) << file << ":" << i;
      }
    }
  }
  EXPECT_EQ(a.groups(), 4u);  // 1024 chunks, 4 groups of 256: none opened for nothing
  EXPECT_EQ(a.usedSlots(), 1024u);
}

TEST(SlotAllocator, ARunFoundAgainFromThePreviousChunkAfterARestart) {
  SlotAllocator before(256, 4);
  std::optional<SlotAddr> last;
  for (uint32_t i = 0; i < 70; ++i) last = *before.allocateInRun(7, i, last);
  ASSERT_EQ(last->slot, 64u + 5);
  // A restarted allocator knows the slots in use but not the runs.
  SlotAllocator after(256, 4);
  for (uint32_t s = 0; s < 70; ++s) ASSERT_TRUE(after.markUsed({0, s}));
  ASSERT_TRUE(after.allocateRun().ok());  // another file's run takes word 2
  auto next = after.allocateInRun(7, 70, last);
  ASSERT_TRUE(next.ok());
  EXPECT_EQ(next->slot, 64u + 6);
  for (uint32_t i = 71; i < 128; ++i) ASSERT_EQ(after.allocateInRun(7, i, std::nullopt)->slot, i);
  // Its next run goes into the word after this one, past the other file's.
  auto third = after.allocateInRun(7, 128, SlotAddr{0, 127});
  ASSERT_TRUE(third.ok());
  EXPECT_EQ(third->slot, 192u);
}

TEST(SlotAllocator, SmallFilesStartingRunsDoNotGrowTheTargetWithoutBound) {
  // Files of one chunk each start a run each: once no word is wholly free
  // they fill the gaps, and a group is opened only past 3/4 in use.
  SlotAllocator a(256, 100);
  for (uint64_t file = 0; file < 1000; ++file) ASSERT_TRUE(a.allocateInRun(file, 0, {}).ok());
  EXPECT_EQ(a.usedSlots(), 1000u);
  EXPECT_LE(a.groups(), 6u);  // 1000 / (256 * 3/4) = 5.2
  // A slot a remembered run wants that is taken already: the lowest free one.
  SlotAllocator b(256, 2);
  ASSERT_EQ(b.allocateInRun(1, 0, {})->slot, 0u);
  auto other = b.allocate();  // slot 1, where chunk 1 of file 1 would go
  ASSERT_EQ(other->slot, 1u);
  EXPECT_EQ(b.allocateInRun(1, 1, {})->slot, 2u);
}

void keptMarksMatchAModel(uint32_t slots_per_group);

// Kept marks follow a model through every way of allocating and releasing:
// a slot is kept from a kept release (or markKept) until it is handed out
// again or dropped.
TEST(SlotAllocator, KeptMarksMatchAModel) {
  for (uint32_t slots : {100u, 128u}) {  // 100: 64-slot words straddle group boundaries
    SCOPED_TRACE(slots);
    keptMarksMatchAModel(slots);
  }
}

void keptMarksMatchAModel(uint32_t slots_per_group) {
  SlotAllocator a(slots_per_group, 3);
  std::set<std::pair<uint32_t, uint32_t>> used, kept;
  std::optional<SlotAddr> last;
  Xoshiro256 rng(9);
  for (int i = 0; i < 20000; ++i) {
    uint64_t op = rng.uniform(10);
    if (op < 4 && !used.empty()) {
      auto it = used.begin();
      std::advance(it, static_cast<long>(rng.uniform(used.size())));
      bool keep = rng.oneIn(2);
      a.release({it->first, it->second}, keep);
      if (keep) kept.insert(*it);
      used.erase(it);
    } else if (op == 4) {
      auto d = a.dropHighestKept();
      ASSERT_EQ(d.has_value(), !kept.empty());
      if (d) {
        ASSERT_EQ(std::make_pair(d->group, d->slot), *kept.rbegin());
        kept.erase(std::prev(kept.end()));
      }
    } else if (op == 5) {
      SlotAddr s{static_cast<uint32_t>(rng.uniform(3)),
                 static_cast<uint32_t>(rng.uniform(slots_per_group))};
      bool want =
          s.group < a.groups() && !used.count({s.group, s.slot}) && !kept.count({s.group, s.slot});
      ASSERT_EQ(a.markKept(s), want);
      if (want) kept.insert({s.group, s.slot});
    } else {
      auto s = op == 6           ? a.allocateRun()
               : op == 7 && last ? a.allocateAfter(*last)
               : op == 8 ? a.allocateInRun(rng.uniform(4), static_cast<uint32_t>(rng.uniform(300)),
                                           rng.oneIn(2) ? last : std::nullopt)
                         : a.allocate();
      if (!s.ok()) {
        ASSERT_EQ(s.code(), ErrorCode::kNoSpace);
        ASSERT_EQ(used.size(), 3u * slots_per_group);
        continue;
      }
      ASSERT_TRUE(used.insert({s->group, s->slot}).second);
      kept.erase({s->group, s->slot});
      last = *s;
    }
    ASSERT_EQ(a.usedSlots(), used.size());
    ASSERT_EQ(a.keptSlots(), kept.size());
  }
}

TEST(SlotAllocatorDeathTest, ReleasingAFreeSlotAborts) {
  SlotAllocator a(4, 1);
  EXPECT_DEATH(a.release({0, 0}), "releasing a free slot");
}

}  // namespace
}  // namespace cistern::storage
