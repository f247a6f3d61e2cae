#include "storage/chunk_engine.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <rocksdb/db.h>
#include <rocksdb/write_batch.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <functional>
#include <vector>

#include "common/crc32c.h"
#include "common/fault.h"
#include "common/log.h"
#include "common/metrics.h"

namespace cistern::storage {
namespace {

Status errnoStatus(int err, const std::string& what) {
  ErrorCode code = err == ENOSPC ? ErrorCode::kNoSpace : ErrorCode::kIOError;
  return Status(code, fmt::format("{}: {}", what, std::strerror(err)));
}

Status fromRocks(const rocksdb::Status& s, const std::string& what) {
  if (s.ok()) return Status::OK();
  return Status(s.IsNoSpace() ? ErrorCode::kNoSpace : ErrorCode::kIOError,
                fmt::format("{}: {}", what, s.ToString()));
}

uint32_t slotsPerGroup(const ChunkEngineOptions& o, uint32_t c) {
  return static_cast<uint32_t>(std::max<uint64_t>(4, o.group_bytes / classBytes(c)));
}

std::string idText(const ChunkId& id) { return fmt::format("chunk {}:{}", id.inode, id.index); }

}  // namespace

ChunkEngine::File::~File() { ::close(fd); }

struct ChunkEngine::PendingCommit {
  std::shared_ptr<File> file;
  std::string key;
  std::string value;
  Status status;
  bool done = false;
};

Status ChunkEngine::commit(PendingCommit& p) {
  std::unique_lock lock(commit_mu_);
  commit_queue_.push_back(&p);
  while (!p.done) {
    if (!committing_) {
      committing_ = true;
      leadCommits(lock);
      committing_ = false;
      commit_cv_.notify_all();
    } else {
      commit_cv_.wait(lock);
    }
  }
  return p.status;
}

void ChunkEngine::leadCommits(std::unique_lock<std::mutex>& lock) {
  static auto& batch_size = metrics::Registry::global().histogram(
      "storage_commit_batch_size", {}, "Chunk writes sharing one data sync and metadata batch");
  while (!commit_queue_.empty()) {
    std::vector<PendingCommit*> batch;
    batch.swap(commit_queue_);
    lock.unlock();
    batch_size.observe(batch.size());
    Status s;
    if (failed_)
      s = Status(ErrorCode::kIOError, fmt::format("target {} has failed", options_.path));
    if (s.ok() && options_.sync) {
      std::vector<int> synced;
      for (PendingCommit* p : batch) {
        if (std::find(synced.begin(), synced.end(), p->file->fd) != synced.end()) continue;
        if (::fdatasync(p->file->fd) != 0) {
          // Never retried: the page cache may have dropped the dirty pages.
          s = fail(fmt::format("fdatasync of a group file: {}", std::strerror(errno)));
          break;
        }
        synced.push_back(p->file->fd);
      }
    }
    if (s.ok()) {
      rocksdb::WriteBatch wb;
      for (PendingCommit* p : batch) (void)wb.Put(p->key, p->value);
      rocksdb::WriteOptions wo;
      wo.sync = options_.sync;
      rocksdb::Status ps = db_->Write(wo, &wb);
      if (ps.IsNoSpace()) {
        s = Status(ErrorCode::kNoSpace, "chunk metadata: " + ps.ToString());
      } else if (!ps.ok()) {
        s = fail("metadata write: " + ps.ToString());
      }
    }
    lock.lock();
    for (PendingCommit* p : batch) {
      p->status = s;
      p->done = true;
    }
    commit_cv_.notify_all();
  }
}

ChunkEngine::ChunkEngine(ChunkEngineOptions options, std::unique_ptr<rocksdb::DB> db)
    : options_(std::move(options)), db_(std::move(db)) {
  for (uint32_t c = 0; c < kClassCount; ++c)
    allocators_.emplace_back(slotsPerGroup(options_, c), options_.groups_max);
}

ChunkEngine::~ChunkEngine() {
  if (db_) (void)db_->Close();
}

Result<std::unique_ptr<ChunkEngine>> ChunkEngine::open(const ChunkEngineOptions& options) {
  std::error_code ec;
  std::filesystem::create_directories(options.path + "/data", ec);
  if (ec)
    return Status(ErrorCode::kIOError,
                  fmt::format("create {}/data: {}", options.path, ec.message()));
  rocksdb::Options o;
  o.create_if_missing = true;
  o.max_open_files = 256;
  rocksdb::DB* raw = nullptr;
  RETURN_ON_ERROR(fromRocks(rocksdb::DB::Open(o, options.path + "/meta", &raw),
                            "open " + options.path + "/meta"));
  std::unique_ptr<ChunkEngine> engine(new ChunkEngine(options, std::unique_ptr<rocksdb::DB>(raw)));
  RETURN_ON_ERROR(engine->rebuild());
  return engine;
}

// Rebuilds the slot bitmaps from the committed metadata: any slot that no
// record references (a write that crashed before its metadata) is free.
Status ChunkEngine::rebuild() {
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    std::string_view key(it->key().data(), it->key().size());
    ASSIGN_OR_RETURN(ChunkId id, decodeChunkKey(key));
    auto m = decodeChunkMeta(std::string_view(it->value().data(), it->value().size()));
    if (!m.ok()) return m.status().withContext(idText(id));
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

Result<std::shared_ptr<ChunkEngine::File>> ChunkEngine::groupFile(uint32_t c, uint32_t group) {
  uint64_t key = (uint64_t{c} << 32) | group;
  std::lock_guard lock(files_mu_);
  if (auto it = files_.find(key); it != files_.end()) {
    lru_.splice(lru_.begin(), lru_, it->second.second);
    return it->second.first;
  }
  std::string dir = fmt::format("{}/data/c{}", options_.path, c);
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  std::string path = fmt::format("{}/g{}.dat", dir, group);
  int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) return errnoStatus(errno, "open " + path);
  std::shared_ptr<File> file(
      new File{fd});  // not make_shared(File{fd}): the temporary would close fd
  lru_.push_front(key);
  files_[key] = {file, lru_.begin()};
  while (files_.size() > options_.open_files_max) {
    files_.erase(lru_.back());  // the descriptor closes when its last user is done
    lru_.pop_back();
  }
  return file;
}

Status ChunkEngine::readSlot(const ChunkMeta& m, uint8_t* out) {
  ASSIGN_OR_RETURN(auto file, groupFile(m.size_class, m.addr.group));
  uint64_t pos = uint64_t{m.addr.slot} * classBytes(m.size_class);
  size_t done = 0;
  while (done < m.length) {
    ssize_t n = ::pread(file->fd, out + done, m.length - done, static_cast<off_t>(pos + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errnoStatus(errno, "read slot");
    if (n == 0) break;  // past the end of the file: the bytes were never written
    done += static_cast<size_t>(n);
  }
  if (done < m.length) std::memset(out + done, 0, m.length - done);
  if (crc32c(out, m.length) != m.crc32c) {
    return Status(ErrorCode::kCorruption, fmt::format("checksum mismatch in slot {}/{}/{}",
                                                      m.size_class, m.addr.group, m.addr.slot));
  }
  return Status::OK();
}

Result<std::optional<ChunkMeta>> ChunkEngine::query(ChunkId id) {
  std::string value;
  rocksdb::Status s = db_->Get(rocksdb::ReadOptions(), encodeChunkKey(id), &value);
  if (s.IsNotFound()) return std::optional<ChunkMeta>();
  RETURN_ON_ERROR(fromRocks(s, "read metadata of " + idText(id)));
  auto m = decodeChunkMeta(value);
  if (!m.ok()) return m.status().withContext(idText(id));
  return std::optional<ChunkMeta>(*m);
}

Result<ChunkMeta> ChunkEngine::write(ChunkId id, uint64_t offset, std::span<const uint8_t> data,
                                     uint64_t chain_version) {
  if (failed_)
    return Status(ErrorCode::kIOError, fmt::format("target {} has failed", options_.path));
  uint64_t end = offset + data.size();
  if (end > kMaxChunkBytes) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("write to {} ends at {} past {}", idText(id), end, kMaxChunkBytes));
  }
  std::lock_guard chunk_lock(chunkLock(id));
  ASSIGN_OR_RETURN(auto old, query(id));
  uint64_t length = std::max<uint64_t>(old ? old->length : 0, end);
  ASSIGN_OR_RETURN(uint32_t c, classFor(length));
  std::vector<uint8_t> content(length, 0);
  if (old) RETURN_ON_ERROR(readSlot(*old, content.data()));
  if (!data.empty()) std::memcpy(content.data() + offset, data.data(), data.size());

  struct statvfs vfs;
  if (::statvfs(options_.path.c_str(), &vfs) == 0) {
    uint64_t free_bytes = uint64_t{vfs.f_bavail} * vfs.f_frsize;
    if (free_bytes < options_.reserved_bytes + length) {
      return Status(ErrorCode::kNoSpace,
                    fmt::format("target {} has {} bytes free, below the {} byte reserve",
                                options_.path, free_bytes, options_.reserved_bytes));
    }
  }
  SlotAddr addr;
  {
    std::lock_guard lock(alloc_mu_);
    ASSIGN_OR_RETURN(addr, allocators_[c].allocate());
  }
  auto releaseNew = [&] {
    std::lock_guard lock(alloc_mu_);
    allocators_[c].release(addr);
  };
  auto file = groupFile(c, addr.group);
  if (!file.ok()) {
    releaseNew();
    return file.status();
  }
  uint64_t pos = uint64_t{addr.slot} * classBytes(c);
  for (size_t done = 0; done < length;) {
    ssize_t n =
        ::pwrite((*file)->fd, content.data() + done, length - done, static_cast<off_t>(pos + done));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      int err = errno;
      releaseNew();
      return errnoStatus(err, fmt::format("write {}", idText(id)));
    }
    done += static_cast<size_t>(n);
  }
  if (Status s = CISTERN_FAULT("storage.write.after_data"); !s.ok()) {
    releaseNew();
    return s;
  }
  ChunkMeta m;
  m.size_class = c;
  m.addr = addr;
  m.length = static_cast<uint32_t>(length);
  m.chunk_version = (old ? old->chunk_version : 0) + 1;
  m.chain_version = chain_version;
  m.crc32c = crc32c(content.data(), content.size());
  PendingCommit pending{*file, encodeChunkKey(id), encodeChunkMeta(m)};
  Status committed = commit(pending);
  if (committed.code() == ErrorCode::kNoSpace) {
    releaseNew();  // the old record is intact; the new slot was never referenced
    return committed.withContext(idText(id));
  }
  RETURN_ON_ERROR(committed);
  RETURN_ON_ERROR(CISTERN_FAULT("storage.write.after_meta"));
  if (old) {
    std::lock_guard lock(alloc_mu_);
    allocators_[old->size_class].release(old->addr);
  }
  return m;
}

Result<size_t> ChunkEngine::read(ChunkId id, uint64_t offset, std::span<uint8_t> out) {
  ASSIGN_OR_RETURN(auto m, query(id));
  if (!m) return Status(ErrorCode::kNotFound, idText(id));
  if (offset >= m->length) return size_t{0};
  std::vector<uint8_t> content(m->length);
  RETURN_ON_ERROR(readSlot(*m, content.data()).withContext(idText(id)));
  size_t n = std::min<size_t>(out.size(), m->length - offset);
  std::memcpy(out.data(), content.data() + offset, n);
  return n;
}

Status ChunkEngine::remove(ChunkId id) {
  if (failed_)
    return Status(ErrorCode::kIOError, fmt::format("target {} has failed", options_.path));
  std::lock_guard chunk_lock(chunkLock(id));
  ASSIGN_OR_RETURN(auto m, query(id));
  if (!m) return Status::OK();
  rocksdb::WriteOptions wo;
  wo.sync = options_.sync;
  rocksdb::Status s = db_->Delete(wo, encodeChunkKey(id));
  if (!s.ok()) return fail("metadata delete: " + s.ToString());
  std::lock_guard lock(alloc_mu_);
  allocators_[m->size_class].release(m->addr);
  return Status::OK();
}

Result<std::vector<ChunkId>> ChunkEngine::scrub() {
  std::vector<ChunkId> bad;
  std::unique_ptr<rocksdb::Iterator> it(db_->NewIterator(rocksdb::ReadOptions()));
  std::vector<uint8_t> buf;
  for (it->SeekToFirst(); it->Valid(); it->Next()) {
    ASSIGN_OR_RETURN(ChunkId id,
                     decodeChunkKey(std::string_view(it->key().data(), it->key().size())));
    auto m = decodeChunkMeta(std::string_view(it->value().data(), it->value().size()));
    if (!m.ok()) {
      bad.push_back(id);
      continue;
    }
    buf.resize(m->length);
    Status s = readSlot(*m, buf.data());
    if (s.code() == ErrorCode::kCorruption)
      bad.push_back(id);
    else
      RETURN_ON_ERROR(s);
  }
  RETURN_ON_ERROR(fromRocks(it->status(), "scrub scan"));
  return bad;
}

uint64_t ChunkEngine::usedSlots(uint32_t size_class) const {
  std::lock_guard lock(alloc_mu_);
  return allocators_[size_class].usedSlots();
}

}  // namespace cistern::storage
