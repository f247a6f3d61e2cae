// The chunk engine's metadata log: opening and replaying it (records whose
// data may not have reached the disk are checked against it), checkpoints,
// and logged small writes (docs/chunk_format.md, "Metadata log").
#include <fcntl.h>
#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <deque>

#include "common/crc32c.h"
#include "kv/logged_rocks.h"
#include "storage/chunk_engine_internal.h"
#include "storage/io_backend.h"

namespace cistern::storage {

using namespace engine_detail;

// Whether the data a chunk record (key, value) names verifies on disk; a
// record read back from the log after a crash. A chunk whose data does not
// verify is reported and false returned; the group file of one that does is
// synced with the others before the replay is flushed.
Result<bool> ChunkEngine::dataOnDisk(std::string_view key, std::string_view value) {
  ASSIGN_OR_RETURN(ChunkId id, decodeChunkKey(key));
  ASSIGN_OR_RETURN(ChunkMeta m, decodeChunkMeta(value));
  if (m.size_class >= kClassCount || m.addr.group >= options_.groups_max ||
      m.addr.slot >= slotsPerGroup(options_, m.size_class)) {
    return Status(ErrorCode::kCorruption,
                  fmt::format("{} in slot {}/{}/{} past the target's groups", idText(id),
                              m.size_class, m.addr.group, m.addr.slot));
  }
  const auto dropped = [&](std::string_view why) {
    CLOG_WARN("storage",
              "target {}: {} version {} dropped: its {} never reached the disk (the write was "
              "not acknowledged; the chunk keeps its previous version)",
              options_.path, idText(id), m.chunk_version, why);
    return false;
  };
  // First the CRC entries: the slot may hold what it held before (another
  // chunk, or an earlier version), whose bytes verify against its own CRCs.
  Status crcs = checkCrcArea(m);
  if (crcs.code() == ErrorCode::kCorruption) return dropped("checksums");
  RETURN_ON_ERROR(crcs);
  // In 2 MiB pages, so that the pieces are read straight into it.
  io_memory::Region buf(kPieceBytes);
  if (!buf) return Status(ErrorCode::kResourceExhausted, "buffer to check a replayed chunk");
  for (uint64_t at = 0; at < m.length; at += kPieceBytes) {
    Status s = readRange(m, at, std::min<uint64_t>(kPieceBytes, m.length - at), buf.data());
    if (s.code() == ErrorCode::kCorruption) return dropped("data");
    RETURN_ON_ERROR(s);
  }
  ASSIGN_OR_RETURN(auto file, groupFile(m.size_class, m.addr.group));
  addDirty(std::move(file));
  return true;
}

Result<uint32_t> ChunkEngine::crcsCrcOnDisk(const ChunkMeta& m) {
  ASSIGN_OR_RETURN(auto file, groupFile(m.size_class, m.addr.group));
  std::vector<uint8_t> crcs(m.length / kBlockBytes * 4);  // at most 64 KiB
  // Through the page cache, where the CRC area is written; past the end of
  // the file it reads as zeros.
  IoRequest r = IoRequest::readOf(file->fd, crcs.data(), crcs.size(), crcPos(m.size_class, m.addr));
  RETURN_ON_ERROR(page_io_->run({&r, 1}));
  return crc32c(crcs.data(), crcs.size());
}

Status ChunkEngine::checkCrcArea(const ChunkMeta& m) {
  if (!m.crcs_crc) return Status::OK();
  ASSIGN_OR_RETURN(uint32_t on_disk, crcsCrcOnDisk(m));
  if (on_disk == *m.crcs_crc) return Status::OK();
  return Status(ErrorCode::kCorruption,
                fmt::format("the CRC area of slot {}/{}/{} is not its record's", m.size_class,
                            m.addr.group, m.addr.slot));
}

// Replays the metadata log past the version RocksDB holds, then starts it.
Status ChunkEngine::openMetaLog() {
  kv::LoggedRocks::Options lo;
  lo.log.dir = options_.path + "/meta-log";
  lo.log.segment_bytes = options_.meta_log_segment_bytes;
  lo.log.segments_max = 8;
  lo.log.direct_io = options_.sync;
  lo.version_key = kMetaVersionKey;
  // Puts one record into RocksDB (logged bytes back into their slots,
  // synced below before the flush). `check`: its data syncs may not have
  // finished; a chunk record whose data does not verify is dropped (that
  // write was never acknowledged, and the chunk keeps its previous record).
  auto applyRecord = [this](kv::LoggedRocks& log, uint64_t first, uint64_t last,
                            kv::WriteBatch& ops, bool check) -> Status {
    const auto where = [&] {
      return fmt::format("{}/meta-log: versions {}..{}", options_.path, first, last);
    };
    kv::WriteBatch records;
    records.reserve(ops.size());
    bool logged = false;  // the previous op carried this record's bytes
    for (kv::WriteOp& op : ops) {
      if (op.key == kDurableVersionKey) continue;
      if (op.key == kLoggedWriteKey) {
        if (Status ws = replayLoggedWrite(op.value); !ws.ok()) return ws.withContext(where());
        logged = true;
        continue;
      }
      if (check && !logged && op.kind == kv::WriteOp::kSet && isChunkKey(op.key)) {
        auto intact = dataOnDisk(op.key, op.value);
        if (!intact.ok()) return intact.status().withContext(where());
        if (!*intact) continue;
      }
      logged = false;
      records.push_back(std::move(op));
    }
    // Persisted by finishReplay's flush.
    if (Status s = log.apply(records, last); !s.ok())
      return Status(s.code(), fmt::format("{}: {}", where(), s.message()));
    return Status::OK();
  };
  // Records past the durable version that later records name are held back
  // until one vouches for them; those left at the end are checked.
  struct Unsure {
    uint64_t first, last;
    kv::WriteBatch ops;
  };
  std::deque<Unsure> unsure;
  auto replay = [&](kv::LoggedRocks& log, const kv::LogRecord& rec, kv::WriteBatch& ops) -> Status {
    std::optional<uint64_t> durable;
    for (const kv::WriteOp& op : ops) {
      if (op.key != kDurableVersionKey) continue;
      if (op.value.size() != 8) {
        return Status(ErrorCode::kCorruption,
                      fmt::format("{}/meta-log: versions {}..{}: durable version of {} bytes",
                                  options_.path, rec.first, rec.last, op.value.size()));
      }
      durable = getLE<uint64_t>(op.value, 0);
    }
    for (; !unsure.empty() && (!durable || unsure.front().last <= *durable); unsure.pop_front()) {
      Unsure& u = unsure.front();
      RETURN_ON_ERROR(applyRecord(log, u.first, u.last, u.ops, /*check=*/!durable));
    }
    // A record without one is older than the durable versions: its data was
    // synced before it was written.
    if (!durable) return applyRecord(log, rec.first, rec.last, ops, /*check=*/false);
    unsure.push_back(Unsure{rec.first, rec.last, std::move(ops)});
    return Status::OK();
  };
  auto opened = kv::LoggedRocks::open(*db_, lo, replay);
  if (!opened.ok()) return opened.status().withContext(options_.path + "/meta");
  meta_log_ = std::move(opened).value();
  for (Unsure& u : unsure)
    RETURN_ON_ERROR(applyRecord(*meta_log_, u.first, u.last, u.ops, /*check=*/true));
  // Logged bytes replayed into their slots are on disk before the flush ends their replay.
  RETURN_ON_ERROR(meta_log_->finishReplay([this] { return syncDirtyFiles(); })
                      .withContext("flush " + options_.path));
  const uint64_t last = meta_log_->lastVersion();
  // Records written unsynced count on the group files' fdatasync to flush
  // the device's cache: only where both live on one file system.
  struct stat log_st {};
  struct stat data_st {};
  flush_covers_log_ = ::stat(lo.log.dir.c_str(), &log_st) == 0 &&
                      ::stat((options_.path + "/data").c_str(), &data_st) == 0 &&
                      log_st.st_dev == data_st.st_dev;
  meta_version_ = last;
  meta_applied_.store(last);
  durable_version_.store(last);
  return meta_log_->start([this] { return checkpointMeta(); });
}

Result<uint64_t> ChunkEngine::checkpointMeta() {
  std::lock_guard checkpoint_lock(checkpoint_mu_);
  uint64_t v = meta_applied_.load(std::memory_order_acquire);
  // Every logged write up to v put its file in the dirty set before it
  // committed, so its bytes are on disk before the flush makes v the
  // version a replay starts after.
  RETURN_ON_ERROR(syncDirtyFiles());
  RETURN_ON_ERROR(meta_log_->flush().withContext(options_.path));
  // Logged bytes up to v are never replayed again: their slots are free to
  // reuse once freed.
  std::vector<SlotAddr> free;
  {
    std::lock_guard lock(logged_mu_);
    std::erase_if(logged_slots_, [v](const auto& e) { return e.second <= v; });
    std::erase_if(held_, [&](const std::pair<SlotAddr, uint64_t>& h) {
      if (h.second > v) return false;
      free.push_back(h.first);
      return true;
    });
  }
  std::lock_guard lock(alloc_mu_);
  for (SlotAddr a : free) allocators_[0].release(a);
  return v;
}

Status ChunkEngine::replayLoggedWrite(std::string_view bytes) {
  ASSIGN_OR_RETURN(LoggedWrite w, decodeLoggedWrite(bytes));
  if (w.addr.group >= options_.groups_max || w.addr.slot >= slotsPerGroup(options_, w.size_class)) {
    return Status(ErrorCode::kCorruption,
                  fmt::format("logged write to slot {}/{}/{} past the target's groups",
                              w.size_class, w.addr.group, w.addr.slot));
  }
  ASSIGN_OR_RETURN(auto file, groupFile(w.size_class, w.addr.group));
  IoRequest ws[2] = {IoRequest::writeOf(file->fd, w.data.data(), w.data.size(),
                                        slotPos(w.size_class, w.addr) + w.data_offset),
                     IoRequest::writeOf(file->fd, w.crcs.data(), w.crcs.size(),
                                        crcPos(w.size_class, w.addr) + w.crc_offset)};
  RETURN_ON_ERROR(page_io_->run({ws, w.crcs.empty() ? size_t{1} : size_t{2}})
                      .withContext("replay a write into " + groupPath(w.size_class, w.addr.group)));
  addDirty(std::move(file));
  return Status::OK();
}

void ChunkEngine::addDirty(std::shared_ptr<File> file) {
  std::lock_guard lock(logged_mu_);
  if (std::find(dirty_files_.begin(), dirty_files_.end(), file) == dirty_files_.end())
    dirty_files_.push_back(std::move(file));
}

Status ChunkEngine::syncDirtyFiles() {
  std::vector<std::shared_ptr<File>> files;
  {
    std::lock_guard lock(logged_mu_);
    files.swap(dirty_files_);
  }
  for (const auto& f : files) {
    // Never retried: the page cache may have dropped the dirty pages.
    if (::fdatasync(f->fd) != 0)
      return fail(fmt::format("fdatasync of a group file: {}", std::strerror(errno)));
  }
  return Status::OK();
}

}  // namespace cistern::storage
