// The chunk engine's read path: a range read in pieces with its CRCs from
// the CRC cache or the slot's CRC area, the asynchronous form the storage
// service batches, read() with its retry when a slot moves, and locate().
#include <algorithm>

#include "common/crc32c.h"
#include "common/fault.h"
#include "storage/chunk_engine_internal.h"
#include "storage/io_backend.h"

namespace cistern::storage {

using namespace engine_detail;

void ChunkEngine::beginRange(RangeRead& r, bool cached_crcs) {
  const ChunkMeta& m = r.m;
  const Blocks blocks = blocksOf(m.length, r.offset, r.end);
  r.full = blocks.full;
  r.b0 = blocks.b0;
  r.b1 = blocks.b1;
  r.crc_count = blocks.in_area;
  // A read of a full slot's last blocks whose CRCs lie in the first page of
  // the CRC area (right after the data) fetches data and CRCs in one I/O.
  r.data_to = roundUp(std::min((r.b1 + 1) * kBlockBytes, uint64_t{m.length}));
  r.fused = r.crc_count > 0 && r.data_to == classBytes(m.size_class) &&
            (r.b0 + r.crc_count) * 4 <= kBlockBytes &&
            r.data_to - r.b0 * kBlockBytes <= kPieceBytes;
  // Otherwise the CRCs come from the CRC cache when they lie in one page of
  // the CRC area, or are read together with the first piece's data (the
  // whole page, which is then cached once the data verified against it).
  if (r.crc_count == 0 || r.fused) return;
  constexpr uint64_t kPerPage = CrcCache::kEntriesPerPage;
  const uint64_t b0 = r.b0;
  if (cached_crcs && crc_cache_ && blocks.inOnePage()) {
    static auto& hits = metrics::Registry::global().counter(
        "storage_crc_cache_hits_total", {}, "Reads whose CRCs came from the CRC cache");
    static auto& misses = metrics::Registry::global().counter(
        "storage_crc_cache_misses_total", {}, "Reads that read their CRC page from the disk");
    CrcCache::Key key{m.size_class, m.addr, static_cast<uint32_t>(b0 / kPerPage)};
    if (crc_cache_->get(key, m.chunk_version, static_cast<uint32_t>(b0 % kPerPage),
                        static_cast<uint32_t>(r.crc_count), r.crcs, &r.crc_generation)) {
      hits.inc();
      r.from_cache = true;
    } else {
      misses.inc();
      r.crc_key = key;
      r.crc_read =
          IoRequest::readOf(r.file->fd, r.crc_page, CrcCache::kPageBytes,
                            crcPos(m.size_class, m.addr) + key.page * CrcCache::kPageBytes);
    }
  } else {
    r.crc_read = IoRequest::readOf(r.file->fd, r.crcs, r.crc_count * 4,
                                   crcPos(m.size_class, m.addr) + b0 * 4);
  }
}

// Whole blocks, a piece at a time, into the aligned buffer: verified there,
// then the wanted bytes are copied out.
void ChunkEngine::preparePiece(RangeRead& r, uint64_t ps) {
  const uint64_t base = slotPos(r.m.size_class, r.m.addr);
  r.ps = ps;
  // Data end of the piece: whole blocks, up to the block holding `end`.
  r.pe = std::min({ps + kPieceBytes, (r.b1 + 1) * kBlockBytes, uint64_t{r.m.length}});
  // Whole blocks wanted whole, at a block-aligned place in `out`: read
  // straight into `out` (no copy), unless its pages are small (bounce).
  r.dst = r.buf;
  if (!r.bounce && ps >= r.offset && r.pe <= r.end && (r.pe - ps) % kBlockBytes == 0 &&
      reinterpret_cast<uintptr_t>(r.out + (ps - r.offset)) % kBlockBytes == 0) {
    r.dst = r.out + (ps - r.offset);
  }
  if (r.fused) {
    // Data and the first CRC page in one I/O; the CRC page lands in `buf`.
    uint64_t data_len = r.data_to - ps;
    r.fused_crcs = r.dst == r.buf ? r.buf + data_len : r.buf;
    r.io[0] = IoRequest::readOf(r.file->dfd, r.dst, data_len, base + ps);
    if (r.dst == r.buf) {
      r.io[0].iov[0].iov_len += kBlockBytes;  // contiguous: one buffer
    } else {
      r.io[0].iov[1] = {r.fused_crcs, kBlockBytes};
      r.io[0].iovcnt = 2;
    }
    r.io_count = 1;
    return;
  }
  r.io[0] = IoRequest::readOf(r.file->dfd, r.dst, roundUp(r.pe - ps), base + ps);
  r.io_count = 1;
  if (r.crc_read) {
    r.io[r.io_count++] = *r.crc_read;
    r.crc_read.reset();
  }
}

Status ChunkEngine::finishPiece(RangeRead& r) {
  if (r.fused) {
    std::memcpy(r.crcs, r.fused_crcs + r.b0 * 4, r.crc_count * 4);
  } else if (r.crc_key && r.io_count == 2) {  // the CRC page came with this piece
    std::memcpy(r.crcs, r.crc_page + (r.b0 % CrcCache::kEntriesPerPage) * 4, r.crc_count * 4);
  }
  const ChunkMeta& m = r.m;
  for (uint64_t bs = r.ps; bs < r.pe; bs += kBlockBytes) {
    uint64_t block = bs / kBlockBytes;
    uint32_t want = block < r.full ? r.crcs[block - r.b0] : m.tail_crc;
    if (crc32c(r.dst + (bs - r.ps), std::min(kBlockBytes, r.pe - bs)) != want) {
      // A cached page may be what is wrong: the next attempt reads the disk's.
      if (r.from_cache) crc_cache_->invalidate(m.size_class, m.addr);
      return mismatch(m, block);
    }
  }
  if (r.dst == r.buf) {
    uint64_t from = std::max(r.ps, r.offset), to = std::min(r.pe, r.end);
    std::memcpy(r.out + (from - r.offset), r.buf + (from - r.ps), to - from);
  }
  return Status::OK();
}

void ChunkEngine::endRange(RangeRead& r) {
  // Every block verified against the page: keep it for the next reads.
  if (r.crc_key) crc_cache_->put(*r.crc_key, r.m.chunk_version, r.crc_generation, r.crc_page);
}

Status ChunkEngine::readRange(const ChunkMeta& m, uint64_t offset, size_t n, uint8_t* out,
                              bool cached_crcs) {
  if (n == 0) return Status::OK();
  RangeRead r;
  ASSIGN_OR_RETURN(r.file, groupFile(m.size_class, m.addr.group));
  r.m = m;
  r.offset = offset;
  r.end = offset + n;
  r.out = out;
  Scratch& sc = scratch();
  r.crc_page = sc.crcPage();
  if (sc.read_crcs.empty()) sc.read_crcs.resize(kMaxChunkBytes / kBlockBytes);
  r.crcs = sc.read_crcs.data();
  beginRange(r, cached_crcs);
  // A piece's blocks and one more (a CRC page read with the data).
  const uint64_t need = std::min(kPieceBytes, (r.b1 + 1 - r.b0) * kBlockBytes) + kBlockBytes;
  r.buf = sc.io.get(need);
  r.bounce = Scratch::PieceBuffer::isLarge(need) && bounceFor(out, n);
  for (uint64_t ps = r.b0 * kBlockBytes; ps < r.end; ps += kPieceBytes) {
    preparePiece(r, ps);
    RETURN_ON_ERROR(io_->run({r.io, r.io_count}));
    RETURN_ON_ERROR(finishPiece(r));
  }
  endRange(r);
  return Status::OK();
}

// Reads of at most kAsyncReadBytesMax touch at most this many blocks, and a
// fused read one more (the CRC page).
constexpr size_t kAsyncReadBlocks = ChunkEngine::kAsyncReadBytesMax / kBlockBytes + 2;
static_assert((kAsyncReadBlocks + 1) * kBlockBytes <= kPieceBytes + kBlockBytes);

struct ChunkEngine::AsyncRead::State {
  RangeRead range;
  uint64_t allocations = 0;  // slot_allocations_ when the record was read
  ChunkId id;
  AlignedBuffer buf = alignedBuffer((kAsyncReadBlocks + 1) * kBlockBytes);
  AlignedBuffer crc_page = alignedBuffer(CrcCache::kPageBytes);
  uint32_t crcs[kAsyncReadBlocks] = {};
};

ChunkEngine::AsyncRead::AsyncRead() : s_(std::make_unique<State>()) {}
ChunkEngine::AsyncRead::~AsyncRead() = default;
std::span<IoRequest> ChunkEngine::AsyncRead::io() { return {s_->range.io, s_->range.io_count}; }

Result<std::optional<size_t>> ChunkEngine::startRead(ChunkId id, uint64_t offset,
                                                     std::span<uint8_t> out, AsyncRead& a) {
  using Started = std::optional<size_t>;
  // A delay at a fault point would stall the caller's event loop.
  if (out.size() > kAsyncReadBytesMax || fault::g_enabled_count.load() > 0) return Started();
  AsyncRead::State& s = *a.s_;
  s.allocations = slot_allocations_.load();
  bool in_memory = false;
  ASSIGN_OR_RETURN(auto m, queryInMemory(id, &in_memory));
  if (!in_memory) return Started();
  if (!m) return Status(ErrorCode::kNotFound, idText(id));
  RangeRead& r = s.range;
  r = RangeRead();
  if (offset >= m->length || out.empty()) return Started(0);
  const size_t n = std::min<size_t>(out.size(), m->length - offset);
  ASSIGN_OR_RETURN(r.file, groupFile(m->size_class, m->addr.group, /*open=*/false));
  if (!r.file) return Started();
  s.id = id;
  r.m = *m;
  r.offset = offset;
  r.end = offset + n;
  r.out = out.data();
  r.buf = s.buf.get();
  r.crc_page = s.crc_page.get();
  r.crcs = s.crcs;
  beginRange(r, /*cached_crcs=*/true);
  preparePiece(r, r.b0 * kBlockBytes);
  CISTERN_CHECK(r.pe >= r.end, "an asynchronous read is one piece");
  return Started(n);
}

bool ChunkEngine::finishRead(AsyncRead& a, std::span<const int> results) {
  AsyncRead::State& s = *a.s_;
  RangeRead& r = s.range;
  if (r.io_count == 0) return true;  // nothing to read
  for (size_t i = 0; i < r.io_count; ++i) {
    if (i >= results.size() || results[i] < 0) return false;
    // Short at the end of a file (a CRC page, a slot not written to its
    // end): the rest reads as zeros, as with IoBackend. Every block used is
    // verified below, so zeros that should not be there are caught.
    zeroFrom(r.io[i], static_cast<size_t>(results[i]));
  }
  if (!finishPiece(r).ok()) return false;  // read() tells corruption from a moved chunk
  if (slot_allocations_.load() != s.allocations) {
    // As in read(): the slot may hold another chunk's bytes by now.
    bool in_memory = false;
    auto now = queryInMemory(s.id, &in_memory);
    if (!now.ok() || !in_memory || !*now || (*now)->size_class != r.m.size_class ||
        (*now)->addr != r.m.addr)
      return false;
  }
  endRange(r);
  static auto& read_bytes = metrics::Registry::global().counter("storage_read_bytes_total", {},
                                                                "Chunk bytes read and verified");
  read_bytes.inc(r.end - r.offset);
  return true;
}

Result<size_t> ChunkEngine::read(ChunkId id, uint64_t offset, std::span<uint8_t> out) {
  // A copy-on-write commit may release the slot between our metadata read
  // and our data read, and a new chunk may fill it. Its bytes may verify
  // against its CRCs, so a read during which any slot was handed out again
  // checks that the record still names the slot (else it reads anew). A
  // mismatch is only corruption if the record is still the one we read, and
  // if the disk's own CRCs disagree too (the first attempt may take them from
  // the CRC cache).
  for (int attempt = 0;; ++attempt) {
    const uint64_t allocations = slot_allocations_.load();
    ASSIGN_OR_RETURN(auto m, query(id));
    if (!m) return Status(ErrorCode::kNotFound, idText(id));
    if (offset >= m->length) return size_t{0};
    RETURN_ON_ERROR(CISTERN_FAULT("storage.read.after_meta"));
    size_t n = std::min<size_t>(out.size(), m->length - offset);
    Status s = readRange(*m, offset, n, out.data(), /*cached_crcs=*/attempt == 0);
    if (s.ok() && slot_allocations_.load() != allocations) {
      ASSIGN_OR_RETURN(auto now, query(id));
      if (!now || now->size_class != m->size_class || now->addr != m->addr) {
        if (attempt < 100) continue;  // moved: read it where it is now
        return Status(ErrorCode::kTargetBusy,
                      fmt::format("{} moved during 100 reads in a row", idText(id)));
      }
    }
    if (s.ok()) {
      static auto& read_bytes = metrics::Registry::global().counter(
          "storage_read_bytes_total", {}, "Chunk bytes read and verified");
      read_bytes.inc(n);
      return n;
    }
    if (s.code() == ErrorCode::kCorruption && attempt < 3) {
      ASSIGN_OR_RETURN(auto again, query(id));
      if (again != m || attempt == 0) continue;
    }
    return s.withContext(idText(id));
  }
}

std::optional<std::vector<Result<ChunkEngine::Location>>> ChunkEngine::locate(
    std::span<const LocateRange> ranges, bool in_memory_only) {
  // Per range: its record, and where its CRCs come from.
  struct Plan {
    std::optional<ChunkMeta> m;
    Blocks blocks;                     // none when the range starts at or past the chunk's end
    std::optional<CrcCache::Key> key;  // the page read is to be cached
    uint64_t generation = 0;
    AlignedBuffer page;
  };
  std::vector<Result<Location>> out;
  // As in read(): a slot handed out again between a record and its CRCs
  // could give another chunk's CRCs, which its bytes would then pass.
  for (int attempt = 0;; ++attempt) {
    out.clear();
    out.reserve(ranges.size());  // (reads below point into its locations)
    const uint64_t allocations = slot_allocations_.load();
    std::vector<Plan> plans(ranges.size());
    std::vector<IoRequest> io;
    for (size_t i = 0; i < ranges.size(); ++i) {
      const LocateRange& r = ranges[i];
      Plan& p = plans[i];
      bool in_memory = true;
      auto m = in_memory_only ? queryInMemory(r.id, &in_memory) : query(r.id);
      if (!in_memory) return std::nullopt;
      if (!m.ok()) {
        out.emplace_back(m.status());
        continue;
      }
      if (!*m) {
        out.emplace_back(Status(ErrorCode::kNotFound, idText(r.id)));
        continue;
      }
      p.m = **m;
      auto file = groupFile(p.m->size_class, p.m->addr.group, /*open=*/!in_memory_only);
      if (file.ok() && !*file) return std::nullopt;  // not open now
      if (!file.ok()) {
        out.emplace_back(file.status());
        continue;
      }
      Location loc;
      loc.path = (*file)->path;
      loc.dev = (*file)->dev;
      loc.ino = (*file)->ino;
      loc.slot_offset = slotPos(p.m->size_class, p.m->addr);
      loc.length = p.m->length;
      const uint64_t end = std::min<uint64_t>(r.offset + r.length, p.m->length);
      if (r.offset < end) {
        p.blocks = blocksOf(p.m->length, r.offset, end);
        loc.crcs.resize(p.blocks.b1 - p.blocks.b0 + 1);
        if (p.blocks.b1 >= p.blocks.full) loc.crcs.back() = p.m->tail_crc;
      }
      constexpr uint64_t kPerPage = CrcCache::kEntriesPerPage;
      const uint64_t b0 = p.blocks.b0, in_area = p.blocks.in_area;
      if (in_area > 0 && crc_cache_ && p.blocks.inOnePage()) {
        CrcCache::Key key{p.m->size_class, p.m->addr, static_cast<uint32_t>(b0 / kPerPage)};
        if (!crc_cache_->get(key, p.m->chunk_version, static_cast<uint32_t>(b0 % kPerPage),
                             static_cast<uint32_t>(in_area), loc.crcs.data(), &p.generation)) {
          if (in_memory_only) return std::nullopt;
          // The whole page, cached once read.
          p.key = key;
          p.page = alignedBuffer(CrcCache::kPageBytes);
          io.push_back(IoRequest::readOf(
              (*file)->fd, p.page.get(), CrcCache::kPageBytes,
              crcPos(p.m->size_class, p.m->addr) + key.page * CrcCache::kPageBytes));
        }
      } else if (in_area > 0) {
        if (in_memory_only) return std::nullopt;
        io.push_back(IoRequest::readOf((*file)->fd, loc.crcs.data(), in_area * 4,
                                       crcPos(p.m->size_class, p.m->addr) + b0 * 4));
      }
      out.emplace_back(std::move(loc));
    }
    if (!io.empty()) {
      // (The requests point into `out`'s locations, which no longer move.)
      Status s = io_->run(io);
      if (!s.ok()) {
        for (auto& r : out)
          if (r.ok()) r = s;
        return out;
      }
    }
    bool moved = false;
    for (size_t i = 0; i < ranges.size(); ++i) {
      Plan& p = plans[i];
      if (!out[i].ok()) continue;
      if (p.key) {
        std::memcpy(out[i]->crcs.data(),
                    p.page.get() + (p.blocks.b0 % CrcCache::kEntriesPerPage) * 4,
                    p.blocks.in_area * 4);
      }
      if (slot_allocations_.load() != allocations) {
        auto now = query(ranges[i].id);
        if (!now.ok() || !*now || (*now)->size_class != p.m->size_class ||
            (*now)->addr != p.m->addr) {
          moved = true;
          continue;
        }
      }
      // Not cached before the slot was checked: a page of a later occupant
      // must not be kept under this version.
      if (p.key) crc_cache_->put(*p.key, p.m->chunk_version, p.generation, p.page.get());
    }
    if (!moved) return out;
    if (attempt >= 100) {
      for (auto& r : out)
        if (r.ok()) r = Status(ErrorCode::kTargetBusy, "chunks moved during 100 locates in a row");
      return out;
    }
  }
}

}  // namespace cistern::storage
