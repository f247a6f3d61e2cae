#include "storage/chunk_engine.h"

#include <fcntl.h>
#include <rocksdb/cache.h>
#include <rocksdb/db.h>
#include <rocksdb/filter_policy.h>
#include <rocksdb/table.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>

#include "common/config.h"
#include "kv/logged_rocks.h"
#include "storage/chunk_engine_internal.h"
#include "storage/io_backend.h"

// The chunk engine's life: options, open (with the metadata log's replay),
// the group files, listing, scrub and space. The write path's group commit
// is in chunk_commit.cc, the metadata log in chunk_meta_log.cc, reads in
// chunk_read.cc, writes and truncates in chunk_apply.cc, slots in
// chunk_slots.cc (docs/chunk_format.md).
namespace cistern::storage {

using namespace engine_detail;

ChunkEngine::File::~File() {
  if (dfd != fd) ::close(dfd);
  ::close(fd);
}

ChunkEngine::ChunkEngine(ChunkEngineOptions options, std::unique_ptr<rocksdb::DB> db)
    : options_(std::move(options)), db_(std::move(db)) {
  std::error_code ec;
  abs_path_ = std::filesystem::absolute(options_.path, ec).lexically_normal().string();
  if (ec || abs_path_.empty()) abs_path_ = options_.path;
  for (uint32_t c = 0; c < kClassCount; ++c)
    allocators_.emplace_back(slotsPerGroup(options_, c), options_.groups_max);
  commit_stages_ = std::make_unique<CommitStages>(this);
  group_commit_ = std::make_unique<GroupCommit>(commit_stages_.get(), GroupCommit::Options{});
}

bool ChunkEngine::bounceFor(const uint8_t* p, size_t n) const {
  return options_.huge_page_io && io_memory::hugePagesEnabled() && !io_memory::contains(p, n);
}

ChunkEngine::~ChunkEngine() {
  if (syncer_.joinable()) {
    {
      std::lock_guard lock(unsynced_mu_);
      syncer_stop_ = true;
    }
    syncer_cv_.notify_all();
    syncer_.join();
  }
  if (unsynced_ok_ && options_.flush_at_close) {
    if (Status s = syncData(); !s.ok())
      CLOG_WARN("storage", "target {}: unsynced writes at close: {}", options_.path, s.toString());
  }
  if (meta_log_) {
    meta_log_.reset();  // stops its checkpoint thread
    if (!options_.flush_at_close) {
      (void)db_->Close();  // as a crash leaves it: the log replays
      return;
    }
    // Logged bytes must be on disk before the flush ends their replay.
    if (Status s = syncDirtyFiles(); !s.ok()) {
      CLOG_WARN("storage", "target {}: not flushed at close, the log replays: {}", options_.path,
                s.toString());
    } else if (rocksdb::Status f = db_->Flush(rocksdb::FlushOptions()); !f.ok()) {
      CLOG_WARN("storage", "target {}: metadata flush at close: {}", options_.path, f.ToString());
    }
  }
  if (db_) (void)db_->Close();
  if (flush_listener_) flush_listener_->engine.store(nullptr);
}

void ChunkEngineOptions::bind(ConfigBinder& b, const std::string& p) {
  b.bind(p + ".io_engine", &io_engine,
         "io_uring (psync where io_uring cannot be set up) or psync (pread/pwrite)");
  b.bind(p + ".direct_io", &direct_io,
         "read and write data blocks with O_DIRECT where the file system supports it");
  b.bind(p + ".crc_cache_bytes", &crc_cache_bytes,
         "memory for pages of block CRCs per target (0: off; small reads then cost two I/Os)");
  b.bind(p + ".meta_cache_bytes", &meta_cache_bytes,
         "RocksDB block cache of a target's chunk metadata");
  b.bind(p + ".meta_memtable_bytes", &meta_memtable_bytes,
         "RocksDB memtable of a target's chunk metadata (two while one is flushed; at least "
         "64 KiB)");
  b.bind(p + ".open_files_max", &open_files_max, "group files a target keeps open (at least 1)");
  b.bind(p + ".reserved_bytes", &reserved_bytes,
         "writes fail with ENOSPC while the target's file system has less free");
  b.bind(p + ".huge_page_io", &huge_page_io,
         "reads and writes over 64 KiB of memory in 4 KiB pages go through a 2 MiB-page buffer "
         "and a copy (one segment per I/O)");
  b.bind(p + ".kept_free_bytes", &kept_free_bytes,
         "freed slots keep their disk blocks up to this many bytes per target");
  b.bind(p + ".sync_interval_ms", &sync_interval_ms,
         "longest an unsynced write (a client's, made durable at its fsync or close) waits for "
         "the target to sync it");
  b.bind(p + ".unsynced_bytes_max", &unsynced_bytes_max,
         "bytes of unsynced writes (and the old slots they hold) past which a write is synced at "
         "once");
}

Status ChunkEngineOptions::validate() const {
  RETURN_ON_ERROR(checkIoEngineName(io_engine));
  if (open_files_max == 0 || groups_max == 0) {
    return Status(ErrorCode::kInvalidArgument,
                  "storage open_files_max and groups_max must be at least 1");
  }
  if (sync_interval_ms == 0)
    return Status(ErrorCode::kInvalidArgument, "storage sync_interval_ms must be at least 1");
  if (meta_memtable_bytes < (64 << 10)) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("storage meta_memtable_bytes must be at least 65536, not {}",
                              meta_memtable_bytes));
  }
  return Status::OK();
}

Result<std::unique_ptr<ChunkEngine>> ChunkEngine::open(const ChunkEngineOptions& options) {
  RETURN_ON_ERROR(options.validate().withContext("target " + options.path));
  std::error_code ec;
  std::filesystem::create_directories(options.path + "/data", ec);
  if (ec)
    return Status(ErrorCode::kIOError,
                  fmt::format("create {}/data: {}", options.path, ec.message()));
  rocksdb::Options o;
  // RocksDB flushes unlogged memtables at close unless told otherwise.
  o.avoid_flush_during_shutdown = !options.flush_at_close;
  o.create_if_missing = true;
  o.max_open_files = 256;
  o.write_buffer_size = options.meta_memtable_bytes;
  o.max_write_buffer_number = 2;
  // Every write to a new chunk looks up a key no table holds: bloom filters
  // answer that without reading each table's index and data blocks. Index
  // and filter blocks live in the block cache, so the metadata's memory is
  // the cache's size however many chunks the target holds.
  rocksdb::BlockBasedTableOptions table;
  table.filter_policy.reset(rocksdb::NewBloomFilterPolicy(10));
  table.block_cache = rocksdb::NewLRUCache(options.meta_cache_bytes);
  table.cache_index_and_filter_blocks = true;
  table.pin_l0_filter_and_index_blocks_in_cache = true;
  o.table_factory.reset(rocksdb::NewBlockBasedTableFactory(table));
  auto listener = std::make_shared<FlushListener>();
  o.listeners.push_back(listener);
  rocksdb::DB* raw = nullptr;
  RETURN_ON_ERROR(fromRocks(rocksdb::DB::Open(o, options.path + "/meta", &raw),
                            "open " + options.path + "/meta"));
  std::unique_ptr<ChunkEngine> engine(new ChunkEngine(options, std::unique_ptr<rocksdb::DB>(raw)));
  engine->flush_listener_ = listener;
  listener->engine.store(engine.get());
  auto io = makeIoBackend(options.io_engine);
  if (!io.ok() && io.code() == ErrorCode::kNotSupported) {
    CLOG_WARN("storage", "target {}: {}; using psync", options.path, io.status().toString());
    io = makeIoBackend("psync");
  }
  if (!io.ok()) return io.status().withContext("target " + options.path);
  engine->io_ = std::move(io).value();
  for (std::string_view name : kIoEngineNames) {  // a reopen may switch
    metrics::Registry::global()
        .gauge("storage_io_engine", {{"target", options.path}, {"engine", std::string(name)}},
               "1 for the I/O engine each target uses (storage.io_engine), else 0")
        .set(name == engine->io_->name() ? 1 : 0);
  }
  ASSIGN_OR_RETURN(engine->page_io_, makeIoBackend("psync"));
  if (options.crc_cache_bytes > 0)
    engine->crc_cache_ = std::make_unique<CrcCache>(options.crc_cache_bytes);
  if (options.meta_commit_log) RETURN_ON_ERROR(engine->openMetaLog());
  RETURN_ON_ERROR(engine->rebuild());
  // A record holds the logged data of one batch: a quarter segment, so
  // that the biggest logged write fits with room to spare.
  const uint64_t segment = options.meta_log_segment_bytes;
  engine->log_batch_bytes_max_ =
      segment > kv::kLogSegmentHeaderBytes
          ? std::min<uint64_t>(1 << 20, (segment - kv::kLogSegmentHeaderBytes) / 4)
          : 0;
  engine->log_data_ = options.log_small_writes && options.sync && engine->meta_log_ &&
                      engine->log_batch_bytes_max_ >= 2 * slotStride(0);
  engine->findKeptSlots();  // after log_data_: logged classes keep nothing
  // An unsynced record goes out with O_DIRECT: the group files' sync must
  // flush it from the device's cache too.
  engine->unsynced_ok_ = options.sync && engine->meta_log_ && engine->flush_covers_log_;
  if (engine->unsynced_ok_) engine->syncer_ = std::thread([e = engine.get()] { e->syncerLoop(); });
  return engine;
}

// Rebuilds the slot bitmaps from the committed metadata: any slot that no
// record references (a write that crashed before its metadata) is free.
Status ChunkEngine::rebuild() {
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    if (!isChunkKey(it->key())) continue;
    std::string_view key(it->key().data(), it->key().size());
    ASSIGN_OR_RETURN(ChunkId id, decodeChunkKey(key));
    auto m = decodeChunkMeta(std::string_view(it->value().data(), it->value().size()));
    if (!m.ok()) return m.status().withContext(idText(id));
    data_bytes_[m->size_class] += m->length;
    ++chunks_;
    if (!allocators_[m->size_class].markUsed(m->addr)) {
      return Status(ErrorCode::kCorruption,
                    fmt::format("{}: slot {}/{}/{} is referenced twice or out of range", idText(id),
                                m->size_class, m->addr.group, m->addr.slot));
    }
  }
  return fromRocks(it->status(), "scan chunk metadata");
}

std::mutex& ChunkEngine::chunkLock(const ChunkId& id) {
  return chunk_locks_[(id.inode * 0x9E3779B97F4A7C15ull + id.index) % chunk_locks_.size()];
}

Status ChunkEngine::fail(const std::string& what) {
  failed_ = true;
  CLOG_ERROR("storage", "target {} failed and is now read-only: {}", options_.path, what);
  return Status(ErrorCode::kIOError, fmt::format("target failed: {}", what));
}

Result<std::shared_ptr<ChunkEngine::File>> ChunkEngine::groupFile(uint32_t c, uint32_t group,
                                                                  bool open) {
  uint64_t key = (uint64_t{c} << 32) | group;
  std::lock_guard lock(files_mu_);
  if (auto it = files_.find(key); it != files_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second.second);
    return it->second.first;
  }
  if (!open) return std::shared_ptr<File>();
  std::string path = groupPath(c, group);
  std::error_code ec;
  std::filesystem::create_directories(std::filesystem::path(path).parent_path(), ec);
  // Owner-only: a group file holds every tenant's chunks (short-circuit
  // readers must be the server's user or root).
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) return errnoStatus(errno, "open " + path);
  // Data blocks go through O_DIRECT where the filesystem has it (tmpfs does
  // not); the CRC area, in pages of its own, stays in the page cache.
  int dfd = options_.direct_io ? ::open(path.c_str(), O_RDWR | O_CLOEXEC | O_DIRECT) : -1;
  if (c >= kRunClass) {
    // Large classes are read in runs of slots: allocate the whole group at
    // once so that it is contiguous on disk (writes into holes from several
    // writers at a time would scatter it). Best effort: a full disk is
    // reported by the writes themselves.
    struct stat st;
    if (::fstat(fd, &st) == 0 && st.st_size == 0) {
      (void)::fallocate(fd, 0, 0,
                        static_cast<off_t>(uint64_t{slotsPerGroup(options_, c)} * slotStride(c)));
    }
  }
  std::shared_ptr<File> file(new File{fd, dfd >= 0 ? dfd : fd});
  file->path = std::move(path);
  if (struct stat st; ::fstat(fd, &st) == 0) {
    file->dev = st.st_dev;
    file->ino = st.st_ino;
  }
  lru_.push_front(key);
  files_[key] = {file, lru_.begin()};
  while (files_.size() > options_.open_files_max) {
    files_.erase(lru_.back());  // the descriptor closes when its last user is done
    lru_.pop_back();
  }
  return file;
}

Result<std::vector<std::pair<ChunkId, ChunkMeta>>> ChunkEngine::list(ChunkId from, uint32_t limit) {
  std::vector<std::pair<ChunkId, ChunkMeta>> out;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->Seek(encodeChunkKey(from)); it->Valid() && out.size() < limit; it->Next()) {
    if (!isChunkKey(it->key())) continue;
    ASSIGN_OR_RETURN(ChunkId id,
                     decodeChunkKey(std::string_view(it->key().data(), it->key().size())));
    auto m = decodeChunkMeta(std::string_view(it->value().data(), it->value().size()));
    if (!m.ok()) return m.status().withContext(idText(id));
    out.emplace_back(id, *m);
  }
  RETURN_ON_ERROR(fromRocks(it->status(), "list chunks"));
  return out;
}

Result<std::vector<ChunkId>> ChunkEngine::scrub(uint64_t bytes_per_second,
                                                const std::atomic<bool>* stop) {
  static auto& scrubbed = metrics::Registry::global().counter(
      "storage_scrub_bytes_total", {}, "Chunk bytes re-read and verified by scrub");
  static auto& bad_total = metrics::Registry::global().counter(
      "storage_scrub_bad_chunks_total", {}, "Chunks that failed verification in a scrub");
  std::vector<ChunkId> bad;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  uint8_t* buf = scratch().piece.get(kPieceBytes);
  auto t0 = std::chrono::steady_clock::now();
  uint64_t bytes = 0;
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    if (stop && stop->load()) break;
    if (!isChunkKey(it->key())) continue;
    ASSIGN_OR_RETURN(ChunkId id,
                     decodeChunkKey(std::string_view(it->key().data(), it->key().size())));
    auto m = decodeChunkMeta(std::string_view(it->value().data(), it->value().size()));
    Status s = m.status();
    for (uint64_t at = 0; s.ok() && at < m->length; at += kPieceBytes) {
      size_t n = std::min<uint64_t>(kPieceBytes, m->length - at);
      s = readRange(*m, at, n, buf, /*cached_crcs=*/false);  // the disk's own CRCs
      bytes += n;
    }
    // Bytes and CRCs that agree but are not the record's (a write that went
    // to the wrong slot, or a slot's earlier content).
    if (s.ok()) s = checkCrcArea(*m);
    if (s.code() == ErrorCode::kCorruption) {
      // Overwritten since the scan began? Then the new version is checked by reads.
      auto now = query(id);
      if (now.ok() && *now == std::optional<ChunkMeta>(*m)) {
        bad.push_back(id);
        bad_total.inc();
      }
    } else if (!s.ok()) {
      return s.withContext(idText(id));
    }
    scrubbed.inc(m.ok() ? m->length : 0);
    if (bytes_per_second > 0) {
      auto due = t0 + std::chrono::duration<double>(static_cast<double>(bytes) /
                                                    static_cast<double>(bytes_per_second));
      std::this_thread::sleep_until(due);
    }
  }
  RETURN_ON_ERROR(fromRocks(it->status(), "scrub scan"));
  return bad;
}

ChunkEngine::Space ChunkEngine::space() const {
  Space out;
  struct statvfs vfs;
  if (::statvfs(options_.path.c_str(), &vfs) == 0) {
    out.fs_total_bytes = uint64_t{vfs.f_blocks} * vfs.f_frsize;
    out.fs_free_bytes = uint64_t{vfs.f_bavail} * vfs.f_frsize;
  }
  out.reserved_bytes = options_.reserved_bytes;
  out.failed = failed_;
  std::lock_guard logged_lock(logged_mu_);
  out.classes[0].slots_held = held_.size();
  std::lock_guard lock(alloc_mu_);
  out.chunks = chunks_;
  for (uint32_t c = 0; c < kClassCount; ++c) {
    auto& k = out.classes[c];
    k.slot_bytes = classBytes(c);
    k.slots_used = allocators_[c].usedSlots() - k.slots_held;
    k.slots_max = uint64_t{allocators_[c].slotsPerGroup()} * options_.groups_max;
    k.data_bytes = data_bytes_[c];
    k.slots_kept = allocators_[c].keptSlots();
    out.data_bytes += k.data_bytes;
    out.kept_bytes += k.slots_kept * slotStride(c);
  }
  return out;
}

uint64_t ChunkEngine::heldSlots(uint32_t size_class) const {
  if (size_class != 0) return 0;
  std::lock_guard lock(logged_mu_);
  return held_.size();
}

uint64_t ChunkEngine::usedSlots(uint32_t size_class) const {
  // Held slots are released to the allocator after they leave held_, so
  // with logged_mu_ held the difference never goes below zero.
  std::lock_guard logged_lock(logged_mu_);
  std::lock_guard lock(alloc_mu_);
  return allocators_[size_class].usedSlots() - (size_class == 0 ? held_.size() : 0);
}

}  // namespace cistern::storage
