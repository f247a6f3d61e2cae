// Internal to the chunk engine's files (chunk_engine.cc, chunk_commit.cc,
// chunk_meta_log.cc, chunk_read.cc, chunk_apply.cc, chunk_slots.cc): the
// layout arithmetic of slots and CRC areas, the keys the engine keeps
// beside chunk records, the per-thread scratch buffers, and the structures
// the engine's steps share (PendingCommit, RangeRead, FlushListener).
#pragma once

#include <fmt/format.h>
#include <rocksdb/listener.h>
#include <rocksdb/slice.h>
#include <rocksdb/status.h>
#include <rocksdb/write_batch.h>

#include <bit>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/assert.h"
#include "common/endian.h"
#include "common/group_commit.h"
#include "common/io_memory.h"
#include "common/log.h"
#include "common/metrics.h"
#include "storage/chunk_engine.h"
#include "storage/crc_cache.h"

namespace cistern::storage {
namespace engine_detail {

inline Status errnoStatus(int err, const std::string& what) {
  ErrorCode code = err == ENOSPC ? ErrorCode::kNoSpace : ErrorCode::kIOError;
  return Status(code, fmt::format("{}: {}", what, std::strerror(err)));
}

inline Status fromRocks(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return Status::OK();
  return Status(s.IsNoSpace() ? ErrorCode::kNoSpace : ErrorCode::kIOError,
                fmt::format("{}: {}", what, s.ToString()));
}

// Classes from 1 MiB up place new chunks in runs (SlotAllocator::allocateInRun)
// in pre-allocated group files; smaller ones, mostly small files, stay dense
// and sparse.
constexpr uint32_t kRunClass = 4;
static_assert(classBytes(kRunClass) == 1 << 20);

inline uint32_t slotsPerGroup(const ChunkEngineOptions& o, uint32_t c) {
  return static_cast<uint32_t>(std::max<uint64_t>(4, o.group_bytes / classBytes(c)));
}

inline uint64_t roundUp(uint64_t n) { return (n + kBlockBytes - 1) / kBlockBytes * kBlockBytes; }
inline uint64_t slotPos(uint32_t c, SlotAddr a) { return uint64_t{a.slot} * slotStride(c); }
inline uint64_t crcPos(uint32_t c, SlotAddr a) { return slotPos(c, a) + classBytes(c); }

inline std::string idText(const ChunkId& id) {
  return fmt::format("chunk {}:{}", id.inode, id.index);
}

// With the metadata commit log, every RocksDB batch also stores its version
// under this key; it is longer than a chunk key (12 bytes) so no chunk can
// have it, and it sorts after all of them.
inline const std::string kMetaVersionKey = std::string(12, '\xff') + "/applied_version";

// The log-only op that carries a logged write's bytes (encodeLoggedWrite)
// ahead of its chunk record; never stored in RocksDB.
inline const std::string kLoggedWriteKey = std::string(12, '\xff') + "/logged_write";

// The log-only op that ends every record: the version up to which every
// batch was durable (data and record) when the record was written. Replay
// trusts the records up to the highest one seen and checks the data of the
// later ones, whose data syncs may not have finished.
inline const std::string kDurableVersionKey = std::string(12, '\xff') + "/durable_version";

inline bool isChunkKey(const rocksdb::Slice& key) { return key.size() == 12; }

constexpr uint64_t kPieceBytes = 1 << 20;  // scratch size; a multiple of kBlockBytes

inline std::string encodeVersion(uint64_t v) {
  std::string out;
  appendLE<uint64_t>(out, v);
  return out;
}

// Block-aligned memory for O_DIRECT.
struct AlignedFree {
  void operator()(uint8_t* p) const { std::free(p); }
};
using AlignedBuffer = std::unique_ptr<uint8_t, AlignedFree>;
// `bytes`: a multiple of kBlockBytes.
inline AlignedBuffer alignedBuffer(size_t bytes) {
  return AlignedBuffer(static_cast<uint8_t*>(std::aligned_alloc(kBlockBytes, bytes)));
}

static_assert(std::endian::native == std::endian::little, "CRC areas are stored little-endian");

// Per-thread scratch, reused: touching fresh memory is slow, and a request
// must not allocate in proportion to its size.
// Buffers are block-aligned for O_DIRECT and allocated on first use.
struct Scratch {
  // What a piece goes through: up to kSmallBytes in 4 KiB pages, more in
  // 2 MiB pages (common/io_memory.h) — a 2 MiB page costs its whole size the
  // first time a thread touches it, which 4 KiB reads need not pay.
  struct PieceBuffer {
    static constexpr uint64_t kSmallBytes = (64 << 10) + kBlockBytes;
    AlignedBuffer small;
    io_memory::Region large;
    // Whether `bytes` go through the buffer in 2 MiB pages.
    static bool isLarge(uint64_t bytes) { return bytes > kSmallBytes; }
    // Room for `bytes` (at most a piece and a block).
    uint8_t* get(uint64_t bytes) {
      if (!isLarge(bytes)) {
        if (!small) small = alignedBuffer(kSmallBytes);
        CISTERN_CHECK(small, "out of memory for a chunk I/O buffer");
        return small.get();
      }
      if (!large) large = io_memory::Region(kPieceBytes + kBlockBytes);
      CISTERN_CHECK(large, "out of memory for a chunk I/O buffer");
      return large.data();
    }
  };
  PieceBuffer io;          // readRange
  PieceBuffer piece;       // assembling a write
  AlignedBuffer crc_page;  // readRange: a CRC page read to be cached
  std::vector<uint32_t> crcs;
  std::vector<uint32_t> read_crcs;
  uint8_t* crcPage() {
    if (!crc_page) crc_page = alignedBuffer(CrcCache::kPageBytes);
    return crc_page.get();
  }
};
inline Scratch& scratch() {
  thread_local Scratch s;
  return s;
}

inline Status mismatch(const ChunkMeta& m, uint64_t block) {
  static auto& mismatches = metrics::Registry::global().counter(
      "storage_checksum_mismatch_total", {}, "Blocks whose CRC32C did not match on read");
  mismatches.inc();
  return Status(ErrorCode::kCorruption,
                fmt::format("checksum mismatch in block {} of slot {}/{}/{}", block, m.size_class,
                            m.addr.group, m.addr.slot));
}

// The blocks a read of [offset, end) of a chunk `length` bytes long touches
// (b0..b1), and how many of them from b0 on have a CRC in the slot's CRC
// area (its whole blocks). REQUIRES: offset < end <= length.
struct Blocks {
  uint64_t b0 = 0, b1 = 0, full = 0, in_area = 0;
  // Whether those CRCs lie in one page of the CRC area (what the CRC cache keeps).
  bool inOnePage() const {
    return b0 / CrcCache::kEntriesPerPage == (b0 + in_area - 1) / CrcCache::kEntriesPerPage;
  }
};
inline Blocks blocksOf(uint64_t length, uint64_t offset, uint64_t end) {
  Blocks b;
  b.full = length / kBlockBytes;
  b.b0 = offset / kBlockBytes;
  b.b1 = (end - 1) / kBlockBytes;
  b.in_area = b.b0 < b.full ? std::min(b.b1 + 1, b.full) - b.b0 : 0;
  return b;
}

}  // namespace engine_detail

struct ChunkEngine::PendingCommit {
  std::shared_ptr<File> file;  // to fdatasync; null for record-only and logged writes
  std::string key;
  std::string value;
  bool erase = false;        // delete the record instead of putting `value`
  std::string logged;        // encodeLoggedWrite: the data goes in the log record
  uint64_t version = 0;      // of the batch, once logged
  bool lazy = false;         // unsynced write; false once its batch turned out durable
  GroupCommit::Entry entry;  // its place in the engine's group commit

  // The batch's chunk records as one RocksDB batch: puts, and deletes of
  // removed chunks.
  static rocksdb::WriteBatch recordsBatch(const std::vector<PendingCommit*>& batch);
};

// The engine's two commit stages (chunk_commit.cc, ChunkEngine::commit).
class ChunkEngine::CommitStages final : public GroupCommit::Stages {
 public:
  explicit CommitStages(ChunkEngine* engine) : engine_(engine) {}
  size_t take(const std::deque<GroupCommit::Entry*>& queued) override;
  Status stage1(const std::vector<GroupCommit::Entry*>& batch) override;
  Status stage2(const std::vector<GroupCommit::Entry*>& batch) override;

 private:
  static std::vector<PendingCommit*> pendingOf(const std::vector<GroupCommit::Entry*>& batch);
  ChunkEngine* const engine_;
};

// One range read of readRange or startRead/finishRead: the plan, the
// buffers it reads into (the thread's scratch, or an AsyncRead's own), and
// the piece whose I/O is being performed.
struct ChunkEngine::RangeRead {
  ChunkMeta m;
  uint64_t offset = 0, end = 0;
  uint8_t* out = nullptr;
  bool bounce = false;  // read into `buf` even where `out` could take the bytes
  std::shared_ptr<File> file;
  uint8_t* buf = nullptr;       // aligned, a piece and a block
  uint32_t* crcs = nullptr;     // room for the range's CRCs
  uint8_t* crc_page = nullptr;  // aligned, one CRC page
  // Set by beginRange.
  uint64_t b0 = 0, b1 = 0;  // blocks, inclusive
  uint64_t full = 0;        // blocks with a CRC in the CRC area
  uint64_t crc_count = 0;   // of those, in the range
  uint64_t data_to = 0;
  bool fused = false;
  std::optional<IoRequest> crc_read;
  std::optional<CrcCache::Key> crc_key;  // the page read is to be cached
  uint64_t crc_generation = 0;
  bool from_cache = false;
  // The piece in flight.
  uint64_t ps = 0, pe = 0;
  uint8_t* dst = nullptr;
  uint8_t* fused_crcs = nullptr;  // where a fused read puts the CRC page
  IoRequest io[2];
  size_t io_count = 0;
};

// A memtable flush must not persist a record whose data is not yet durable:
// every record in the memtables it writes was applied after its data was
// written and its file handed to the next sync, which this runs first.
struct ChunkEngine::FlushListener : rocksdb::EventListener {
  std::atomic<ChunkEngine*> engine{nullptr};
  void OnFlushBegin(rocksdb::DB*, const rocksdb::FlushJobInfo&) override {
    ChunkEngine* e = engine.load();
    if (e == nullptr || !e->unsynced_ok_) return;
    // Releases nothing: releasing a held class-0 slot may force a
    // checkpoint, whose flush this one would wait for. The next sync does.
    if (Status s = e->syncData(nullptr, /*release=*/false); !s.ok())
      CLOG_WARN("storage", "target {}: sync before a metadata flush: {}", e->options_.path,
                s.toString());
  }
};

// Whether the data a chunk record (key, value) names verifies on disk; a
// record read back from the log after a crash. A chunk whose data does not
// verify is reported and false returned; the group file of one that does is

}  // namespace cistern::storage
