// The chunk engine's writes and truncates: the checks a mutation passes
// (chain version, fence, reserve), then copy-on-write into a new slot or
// in place, and the record committed (docs/chunk_format.md).
#include <rocksdb/db.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>

#include "common/crc32c.h"
#include "common/fault.h"
#include "storage/chunk_engine_internal.h"
#include "storage/io_backend.h"

namespace cistern::storage {

using namespace engine_detail;

Result<std::optional<ChunkMeta>> ChunkEngine::queryInMemory(ChunkId id, bool* in_memory) {
  rocksdb::ReadOptions ro;
  ro.read_tier = rocksdb::kBlockCacheTier;
  std::string value;
  rocksdb::Status s = db_->Get(ro, encodeChunkKey(id), &value);
  *in_memory = !s.IsIncomplete();
  if (s.IsNotFound() || s.IsIncomplete()) return std::optional<ChunkMeta>();
  if (!s.ok()) return fromRocks(s, "read metadata of " + idText(id));  // text only on error
  auto m = decodeChunkMeta(value);
  if (!m.ok()) return m.status().withContext(idText(id));
  return std::optional<ChunkMeta>(*m);
}

Result<std::optional<ChunkMeta>> ChunkEngine::query(ChunkId id) {
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), encodeChunkKey(id), &value);
  if (s.IsNotFound()) return std::optional<ChunkMeta>();
  if (!s.ok()) return fromRocks(s, "read metadata of " + idText(id));  // text only on error
  auto m = decodeChunkMeta(value);
  if (!m.ok()) return m.status().withContext(idText(id));
  return std::optional<ChunkMeta>(*m);
}

// A writer routed by an older chain table than the chunk's last writer may
// not know of a newer replica set; it must refresh its routing and retry.
Status ChunkEngine::checkChainVersion(ChunkId id, const std::optional<ChunkMeta>& old,
                                      uint64_t chain_version) const {
  if (old && chain_version < old->chain_version) {
    return Status(ErrorCode::kStaleChainVersion,
                  fmt::format("{}: write with chain version {} after version {}", idText(id),
                              chain_version, old->chain_version));
  }
  return Status::OK();
}

// Under the chunk lock: whatever changed the chunk before this returned OK
// has finished, and whatever changes it next starts after it.
Status ChunkEngine::checkNotAfter(ChunkId id, int64_t not_after_ns) const {
  if (not_after_ns == 0) return Status::OK();
  const int64_t now_ns = options_.clock->wallMicros() * 1000;
  if (now_ns <= not_after_ns) return Status::OK();
  return Status(ErrorCode::kLeaseExpired,
                fmt::format("{}: refused {} ms past the call's not-after time (a lease that ran "
                            "out, or an attempt its client gave up on)",
                            idText(id), (now_ns - not_after_ns) / 1'000'000));
}

Status ChunkEngine::checkReserve(uint64_t bytes) {
  struct statvfs vfs;
  if (::statvfs(options_.path.c_str(), &vfs) != 0) return Status::OK();
  uint64_t free_bytes = uint64_t{vfs.f_bavail} * vfs.f_frsize;
  if (free_bytes < options_.reserved_bytes + bytes) {
    // Kept slots hold space this write may not get: give it all back first.
    bool kept;
    {
      std::lock_guard lock(alloc_mu_);
      kept = keptBytesLocked() > 0;
    }
    if (kept) {
      trimKept(0);
      if (::statvfs(options_.path.c_str(), &vfs) == 0)
        free_bytes = uint64_t{vfs.f_bavail} * vfs.f_frsize;
    }
  }
  if (free_bytes < options_.reserved_bytes + bytes) {
    return Status(ErrorCode::kNoSpace,
                  fmt::format("target {} has {} bytes free, below the {} byte reserve",
                              options_.path, free_bytes, options_.reserved_bytes));
  }
  return Status::OK();
}

Result<ChunkMeta> ChunkEngine::write(ChunkId id, uint64_t offset, std::span<const uint8_t> data,
                                     uint64_t chain_version, bool stable, int64_t not_after_ns,
                                     bool durable, bool* unsynced, uint32_t chain) {
  if (failed_)
    return Status(ErrorCode::kIOError, fmt::format("target {} has failed", options_.path));
  if (offset + data.size() > kMaxChunkBytes) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("write to {} ends at {} past {}", idText(id), offset + data.size(),
                              kMaxChunkBytes));
  }
  std::lock_guard chunk_lock(chunkLock(id));
  RETURN_ON_ERROR(checkNotAfter(id, not_after_ns));
  ASSIGN_OR_RETURN(auto old, query(id));
  RETURN_ON_ERROR(checkChainVersion(id, old, chain_version));
  return apply(id, old, offset, data.data(), data.size(), Stamp{chain, chain_version, 0},
               old ? old->length : uint64_t{0}, stable, durable, unsynced);
}

Result<ChunkMeta> ChunkEngine::replace(ChunkId id, std::span<const uint8_t> data, uint32_t chain,
                                       uint64_t chain_version, uint64_t chunk_version,
                                       bool durable) {
  if (failed_)
    return Status(ErrorCode::kIOError, fmt::format("target {} has failed", options_.path));
  if (data.size() > kMaxChunkBytes) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("replace of {} with {} bytes past {}", idText(id), data.size(),
                              kMaxChunkBytes));
  }
  if (chunk_version == 0) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("replace of {} at chunk version 0", idText(id)));
  }
  std::lock_guard chunk_lock(chunkLock(id));
  ASSIGN_OR_RETURN(auto old, query(id));
  // No chain-version check: the predecessor's copy is the chain's, and a
  // replica's own may be newer by chain version (an update it took that
  // the chain never committed).
  return apply(id, old, 0, data.data(), data.size(), Stamp{chain, chain_version, chunk_version}, 0,
               /*stable=*/false, durable);
}

Result<ChunkMeta> ChunkEngine::truncate(ChunkId id, uint64_t length, uint64_t chain_version,
                                        int64_t not_after_ns, uint32_t chain) {
  if (failed_)
    return Status(ErrorCode::kIOError, fmt::format("target {} has failed", options_.path));
  if (length > kMaxChunkBytes) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("truncate {} to {} past {}", idText(id), length, kMaxChunkBytes));
  }
  std::lock_guard chunk_lock(chunkLock(id));
  RETURN_ON_ERROR(checkNotAfter(id, not_after_ns));
  ASSIGN_OR_RETURN(auto old, query(id));
  RETURN_ON_ERROR(checkChainVersion(id, old, chain_version));
  uint64_t old_len = old ? old->length : 0;
  if (!old || length >= old_len)  // grow: append zeros
    return apply(id, old, old_len, nullptr, length - old_len, Stamp{chain, chain_version, 0},
                 old_len);
  ASSIGN_OR_RETURN(uint32_t c, classFor(length));
  if (c != old->size_class)  // shrink into a smaller class: copy what stays
    return apply(id, old, length, nullptr, 0, Stamp{chain, chain_version, 0}, length);
  // Shrink within the class: only the record changes (new length, new tail CRC).
  ChunkMeta m = *old;
  m.length = static_cast<uint32_t>(length);
  m.chunk_version = old->chunk_version + 1;
  m.chain_version = chain_version;
  m.chain = chain;
  uint64_t tail_at = length / kBlockBytes * kBlockBytes;
  alignas(64) uint8_t tail[kBlockBytes];
  RETURN_ON_ERROR(readRange(*old, tail_at, length - tail_at, tail).withContext(idText(id)));
  m.tail_crc = crc32c(tail, length - tail_at);
  if (m.crcs_crc) {
    ASSIGN_OR_RETURN(m.crcs_crc, crcsCrcOnDisk(m));
  }
  PendingCommit pending{nullptr, encodeChunkKey(id), encodeChunkMeta(m)};
  RETURN_ON_ERROR(commit(pending).withContext(idText(id)));
  std::lock_guard lock(alloc_mu_);
  data_bytes_[c] -= old_len - length;
  return m;
}

// The new content: the old content's first `keep` bytes, with [offset,
// offset + len) replaced by `data` (zeros if null); bytes never written are
// zeros. REQUIRES: the chunk lock is held; keep <= old length.
Result<ChunkMeta> ChunkEngine::apply(ChunkId id, const std::optional<ChunkMeta>& old,
                                     uint64_t offset, const uint8_t* data, uint64_t len,
                                     const Stamp& stamp, uint64_t keep, bool stable, bool durable,
                                     bool* unsynced) {
  static auto& write_bytes = metrics::Registry::global().counter(
      "storage_write_bytes_total", {}, "Chunk bytes written by writes and truncates");
  write_bytes.inc(len);
  const uint64_t old_len = old ? old->length : 0;
  const uint64_t end = offset + len;
  const uint64_t new_len = std::max(keep, end);
  ASSIGN_OR_RETURN(uint32_t c, classFor(new_len));
  // An append within the class goes in place, past the committed bytes.
  const bool in_place = old && old->size_class == c && keep == old_len && offset >= old_len;
  RETURN_ON_ERROR(checkReserve(in_place ? new_len - old_len : new_len));
  SlotAddr addr;
  if (in_place) {
    addr = old->addr;
  } else if (old || c < kRunClass) {
    std::lock_guard lock(alloc_mu_);
    ASSIGN_OR_RETURN(addr, allocators_[c].allocate());  // lowest free: dense
  } else {
    // A new large chunk goes into its file's run of 64 slots, in index
    // order, so the file reads back sequentially from disk whatever order
    // its chunks were written in. The previous chunk's slot finds the run of
    // a file written before a restart.
    std::optional<ChunkMeta> prev;
    if (id.index > 0) {
      ASSIGN_OR_RETURN(prev, query(ChunkId{id.inode, id.index - 1}));
    }
    std::optional<SlotAddr> prev_addr;
    if (prev && prev->size_class == c) prev_addr = prev->addr;
    std::lock_guard lock(alloc_mu_);
    ASSIGN_OR_RETURN(addr, allocators_[c].allocateInRun(id.inode, id.index, prev_addr));
  }
  // Before any byte goes into the slot: a reader that fetched an older
  // record naming it must learn that the slot may have changed hands.
  if (!in_place) slot_allocations_.fetch_add(1);
  auto releaseNew = [&] {
    if (!in_place) releaseSlot(c, addr, /*removed=*/false);
  };
  auto file = groupFile(c, addr.group);
  if (!file.ok()) {
    releaseNew();
    return file.status();
  }
  // Logged writes go through the page cache: the log record makes them
  // durable, the checkpoint's fdatasync writes them out in bulk.
  const bool logged = logsData(c);
  const int fd = (*file)->fd, dfd = logged ? fd : (*file)->dfd;
  std::string logged_bytes;
  const uint64_t base = slotPos(c, addr);
  const uint64_t write_from = in_place ? old_len : 0;
  const uint64_t first_block = write_from / kBlockBytes;
  const uint64_t full = new_len / kBlockBytes;
  Scratch& sc = scratch();
  if (sc.crcs.size() < full - first_block) sc.crcs.resize(kMaxChunkBytes / kBlockBytes);
  uint32_t tail_crc = 0;
  auto writePieces = [&]() -> Status {
    const uint64_t need = std::min(kPieceBytes, roundUp(new_len - first_block * kBlockBytes));
    uint8_t* buf = sc.piece.get(need);
    const bool large = Scratch::PieceBuffer::isLarge(need);
    for (uint64_t ps = first_block * kBlockBytes; ps < new_len; ps += kPieceBytes) {
      const uint64_t pe = std::min(ps + kPieceBytes, new_len);
      // Assemble whole blocks in the aligned buffer: kept old bytes, new
      // bytes, zeros (also past the end, up to the block boundary). Only the
      // old bytes that the new ones leave standing are read.
      uint64_t old_to = std::min(pe, keep);
      uint64_t from = std::max(ps, offset), to = std::min(pe, end);
      const bool fresh = from < to && data;  // new bytes land in this piece
      const uint64_t head_to = fresh ? std::min(old_to, from) : old_to;
      if (ps < head_to) RETURN_ON_ERROR(readRange(*old, ps, head_to - ps, buf));
      if (fresh && to < old_to) RETURN_ON_ERROR(readRange(*old, to, old_to - to, buf + (to - ps)));
      // Past the kept bytes: new bytes where the write covers, zeros elsewhere.
      const uint64_t zero_from = std::max(ps, old_to), buf_end = ps + roundUp(pe - ps);
      // What goes to the disk: the aligned buffer, or the caller's bytes
      // themselves when they alone fill the piece's whole blocks.
      const uint8_t* src = buf;
      if (stable && fresh && !logged && from == ps && to == pe && (pe - ps) % kBlockBytes == 0 &&
          reinterpret_cast<uintptr_t>(data + (ps - offset)) % kBlockBytes == 0 &&
          !(large && bounceFor(data + (ps - offset), pe - ps))) {
        src = data + (ps - offset);
      } else if (fresh) {
        std::memcpy(buf + (from - ps), data + (from - offset), to - from);
        if (zero_from < from) std::memset(buf + (zero_from - ps), 0, from - zero_from);
        uint64_t zero_to = std::max(to, zero_from);
        std::memset(buf + (zero_to - ps), 0, buf_end - zero_to);
      } else {
        std::memset(buf + (zero_from - ps), 0, buf_end - zero_from);
      }
      // In place, the block holding the old end is rewritten with the same
      // committed bytes; nothing before it is touched.
      for (uint64_t bs = ps; bs < pe; bs += kBlockBytes) {
        uint64_t be = std::min(bs + kBlockBytes, pe);
        uint32_t crc = crc32c(src + (bs - ps), be - bs);
        if (bs / kBlockBytes < full)
          sc.crcs[bs / kBlockBytes - first_block] = crc;
        else
          tail_crc = crc;
      }
      const uint64_t wstart = std::max(ps, write_from / kBlockBytes * kBlockBytes);
      IoRequest ws[2] = {
          IoRequest::writeOf(dfd, src + (wstart - ps), roundUp(pe - wstart), base + wstart)};
      size_t count = 1;
      if (pe == new_len && first_block == 0 && new_len == classBytes(c) && wstart == 0 &&
          full * 4 <= kBlockBytes) {
        // A whole slot rewritten: its CRC page follows the data, so both go
        // out as one direct I/O (no dirty page left for the sync to write).
        uint8_t* page = sc.io.get(kBlockBytes);
        std::memcpy(page, sc.crcs.data(), full * 4);
        std::memset(page + full * 4, 0, kBlockBytes - full * 4);
        ws[0].iov[1] = {page, kBlockBytes};
        ws[0].iovcnt = 2;
      } else if (pe == new_len && full > first_block) {  // the last piece: with the CRCs
        ws[count++] = IoRequest::writeOf(fd, sc.crcs.data(), (full - first_block) * 4,
                                         crcPos(c, addr) + first_block * 4);
      }
      // Page-cache writes finish in the system call: io_uring would only
      // hand them to a worker thread.
      RETURN_ON_ERROR((logged ? *page_io_ : *io_).run({ws, count}));
      if (logged) {
        // A class-0 slot is smaller than a piece: this is the only one.
        const uint64_t crc_count = full > first_block ? full - first_block : 0;
        logged_bytes = encodeLoggedWrite(LoggedWrite{
            .size_class = c,
            .addr = addr,
            .data_offset = static_cast<uint32_t>(wstart),
            .data = {reinterpret_cast<const char*>(buf + (wstart - ps)), roundUp(pe - wstart)},
            .crc_offset = static_cast<uint32_t>(first_block * 4),
            .crcs = {reinterpret_cast<const char*>(sc.crcs.data()), crc_count * 4}});
      }
    }
    return CISTERN_FAULT("storage.write.after_data");
  };
  if (Status s = writePieces(); !s.ok()) {
    releaseNew();
    return s.withContext(idText(id));
  }
  // The slot's new CRCs are on the disk and its new record not yet
  // published: no reader can take a cached page of what was there before.
  if (crc_cache_) crc_cache_->invalidate(c, addr);
  // A slot written from its first block has all its CRCs in `sc.crcs`: its
  // first CRC page is cached once the record is published (after the
  // invalidation, so a reader's older page cannot replace it), and a read
  // or Locate that follows needs no I/O for them.
  const bool cache_page = crc_cache_ && first_block == 0 && full > 0;
  const uint64_t page_generation = cache_page ? crc_cache_->generation(c, addr) : 0;
  ChunkMeta m;
  m.size_class = c;
  m.addr = addr;
  m.length = static_cast<uint32_t>(new_len);
  m.chunk_version =
      stamp.chunk_version != 0 ? stamp.chunk_version : (old ? old->chunk_version : 0) + 1;
  m.chain_version = stamp.chain_version;
  m.chain = stamp.chain;
  m.tail_crc = tail_crc;
  // An append extends the CRC of the entries before it (a version 2 record
  // stays without one: its entries' CRC would need the whole area read).
  const size_t new_entries = full > first_block ? (full - first_block) * 4 : 0;
  if (first_block == 0)
    m.crcs_crc = crc32c(sc.crcs.data(), new_entries);
  else if (old->crcs_crc)
    m.crcs_crc = crc32cExtend(*old->crcs_crc, sc.crcs.data(), new_entries);
  PendingCommit pending{logged ? nullptr : *file, encodeChunkKey(id), encodeChunkMeta(m)};
  // Unsynced: the bytes written, and the old slot held until the sync.
  pending.lazy =
      !durable && unsynced_ok_ && !logged &&
      unsyncedRoom(new_len - write_from + (old && !in_place ? classBytes(old->size_class) : 0));
  if (logged) {
    addDirty(*file);  // after its bytes were written, before its record commits
    pending.logged = std::move(logged_bytes);
  }
  Status committed = commit(pending);
  if (committed.code() == ErrorCode::kNoSpace) {
    releaseNew();  // the old record is intact; a new slot was never referenced
    return committed.withContext(idText(id));
  }
  RETURN_ON_ERROR(committed);
  if (cache_page) {
    uint8_t page[CrcCache::kPageBytes] = {};
    std::memcpy(page, sc.crcs.data(), std::min<uint64_t>(full, CrcCache::kEntriesPerPage) * 4);
    crc_cache_->put(CrcCache::Key{c, addr, 0}, m.chunk_version, page_generation, page);
  }
  if (logged) {
    std::lock_guard lock(logged_mu_);
    logged_slots_[slotKey(addr)] = pending.version;
  }
  {
    std::lock_guard lock(alloc_mu_);
    if (old)
      data_bytes_[old->size_class] -= old_len;
    else
      ++chunks_;
    data_bytes_[c] += new_len;
  }
  if (unsynced) *unsynced = pending.lazy;
  RETURN_ON_ERROR(CISTERN_FAULT("storage.write.after_meta"));
  if (old && !in_place) {
    // A crash before the sync may bring the old record back: its slot
    // waits for the sync that makes this one durable.
    if (pending.lazy) {
      std::lock_guard lock(unsynced_mu_);
      if (durable_version_.load() < pending.version) {
        unsynced_freed_.push_back(FreedSlot{old->size_class, old->addr, pending.version});
        return m;
      }
    }
    releaseSlot(old->size_class, old->addr, /*removed=*/false);
  }
  return m;
}

}  // namespace cistern::storage
