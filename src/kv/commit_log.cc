#include "kv/commit_log.h"

#include <dirent.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <utility>

#include "common/assert.h"
#include "common/crc32c.h"
#include "common/endian.h"
#include "common/fault.h"
#include "common/log.h"

namespace cistern::kv {
namespace {

constexpr uint32_t kSegmentMagic = 0x47455343;  // "CSEG"
constexpr uint32_t kRecordMagic = 0x43455243;   // "CREC"
constexpr size_t kSegmentHeaderFields = 32;     // magic, crc, generation, epoch, bytes

Status corrupt(std::string_view why) {
  return Status(ErrorCode::kCorruption, fmt::format("commit log: {}", why));
}

Status ioError(std::string_view what, const std::string& path, int err) {
  return Status(err == ENOSPC ? ErrorCode::kNoSpace : ErrorCode::kIOError,
                fmt::format("commit log: {} {}: {}", what, path, std::strerror(err)));
}

std::string segmentPath(const std::string& dir, uint32_t id) {
  return fmt::format("{}/{:06d}.log", dir, id);
}

Status writeAll(int fd, std::string_view bytes, uint64_t off, const std::string& path) {
  while (!bytes.empty()) {
    ssize_t n = ::pwrite(fd, bytes.data(), bytes.size(), static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ioError("write", path, errno);
    bytes.remove_prefix(static_cast<size_t>(n));
    off += static_cast<uint64_t>(n);
  }
  return Status::OK();
}

// Writes and syncs only this record's range (RWF_DSYNC: one device write
// with FUA when the blocks are already allocated); fdatasync where the
// kernel lacks it. Never retried: a failed sync fails the log.
Status writeDsync(int fd, std::string_view bytes, uint64_t off, const std::string& path) {
  while (!bytes.empty()) {
    iovec iov{const_cast<char*>(bytes.data()), bytes.size()};
    ssize_t n = ::pwritev2(fd, &iov, 1, static_cast<off_t>(off), RWF_DSYNC);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && (errno == EOPNOTSUPP || errno == ENOSYS)) {
      RETURN_ON_ERROR(writeAll(fd, bytes, off, path));
      if (::fdatasync(fd) != 0) return ioError("fdatasync", path, errno);
      return Status::OK();
    }
    if (n < 0) return ioError("write", path, errno);
    bytes.remove_prefix(static_cast<size_t>(n));
    off += static_cast<uint64_t>(n);
  }
  return Status::OK();
}

Status readAll(int fd, std::string* out, size_t n, uint64_t off, const std::string& path) {
  out->resize(n);
  size_t done = 0;
  while (done < n) {
    ssize_t r = ::pread(fd, out->data() + done, n - done, static_cast<off_t>(off + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return ioError("read", path, errno);
    if (r == 0) break;
    done += static_cast<size_t>(r);
  }
  out->resize(done);
  return Status::OK();
}

std::string encodeSegmentHeader(uint64_t generation, uint64_t epoch, uint64_t bytes) {
  std::string h(kLogSegmentHeaderBytes, '\0');
  putLE<uint32_t>(h, 0, kSegmentMagic);
  putLE<uint64_t>(h, 8, generation);
  putLE<uint64_t>(h, 16, epoch);
  putLE<uint64_t>(h, 24, bytes);
  putLE<uint32_t>(h, 4, crc32c(h.data() + 8, kSegmentHeaderFields - 8));
  return h;
}

}  // namespace

std::string encodeLogBatch(const WriteBatch& batch) {
  std::string out;
  appendLE<uint32_t>(out, static_cast<uint32_t>(batch.size()));
  for (const WriteOp& op : batch) {
    appendLE<uint8_t>(out, op.kind);
    appendLE<uint32_t>(out, static_cast<uint32_t>(op.key.size()));
    appendLE<uint32_t>(out, static_cast<uint32_t>(op.value.size()));
    out += op.key;
    out += op.value;
  }
  return out;
}

Result<WriteBatch> decodeLogBatch(std::string_view in) {
  if (in.size() < 4) return corrupt("batch shorter than its count");
  uint32_t count = getLE<uint32_t>(in, 0);
  size_t off = 4;
  WriteBatch batch;
  // Each op takes at least 9 bytes, so a count larger than that is corrupt
  // before anything is reserved.
  if (count > (in.size() - off) / 9) return corrupt(fmt::format("batch count {}", count));
  batch.reserve(count);
  for (uint32_t i = 0; i < count; ++i) {
    if (in.size() - off < 9) return corrupt(fmt::format("op {} truncated", i));
    uint8_t kind = getLE<uint8_t>(in, off);
    uint64_t klen = getLE<uint32_t>(in, off + 1);
    uint64_t vlen = getLE<uint32_t>(in, off + 5);
    off += 9;
    if (kind > WriteOp::kAdd) return corrupt(fmt::format("op {} of kind {}", i, kind));
    if (klen + vlen > in.size() - off) return corrupt(fmt::format("op {} overruns the batch", i));
    batch.push_back({static_cast<WriteOp::Kind>(kind), std::string(in.substr(off, klen)),
                     std::string(in.substr(off + klen, vlen))});
    off += klen + vlen;
  }
  if (off != in.size()) return corrupt(fmt::format("{} bytes after the batch", in.size() - off));
  return batch;
}

std::string encodeLogRecord(uint64_t epoch, uint64_t first, uint64_t last,
                            std::string_view payload) {
  std::string r(kLogRecordHeaderBytes, '\0');
  putLE<uint32_t>(r, 0, kRecordMagic);
  putLE<uint64_t>(r, 8, epoch);
  putLE<uint64_t>(r, 16, first);
  putLE<uint64_t>(r, 24, last);
  putLE<uint32_t>(r, 32, static_cast<uint32_t>(payload.size()));
  r += payload;
  putLE<uint32_t>(r, 4, crc32c(r.data() + 8, r.size() - 8));
  return r;
}

Result<LogRecord> decodeLogRecord(std::string_view in) {
  if (in.size() < kLogRecordHeaderBytes) return corrupt("record header truncated");
  if (getLE<uint32_t>(in, 0) != kRecordMagic) return corrupt("no record magic");
  LogRecord r;
  r.epoch = getLE<uint64_t>(in, 8);
  r.first = getLE<uint64_t>(in, 16);
  r.last = getLE<uint64_t>(in, 24);
  uint64_t len = getLE<uint32_t>(in, 32);
  if (getLE<uint32_t>(in, 36) != 0) return corrupt("reserved record field set");
  if (len > in.size() - kLogRecordHeaderBytes) return corrupt("record payload truncated");
  r.bytes = kLogRecordHeaderBytes + len;
  if (getLE<uint32_t>(in, 4) != crc32c(in.data() + 8, r.bytes - 8))
    return corrupt("record checksum mismatch");
  if (r.first == 0 || r.last < r.first) return corrupt("record version range");
  r.payload = in.substr(kLogRecordHeaderBytes, len);
  return r;
}

Result<std::unique_ptr<CommitLog>> CommitLog::open(const CommitLogOptions& options,
                                                   uint64_t persisted_version, const Replay& replay,
                                                   uint64_t* last_version) {
  if (options.segment_bytes < 2 * kLogSegmentHeaderBytes || options.segment_bytes % 4096 != 0 ||
      options.segments_max < 2) {
    return Status(ErrorCode::kConfigInvalid,
                  fmt::format("commit log: segments of {} bytes, at most {}", options.segment_bytes,
                              options.segments_max));
  }
  if (::mkdir(options.dir.c_str(), 0755) != 0 && errno != EEXIST)
    return ioError("mkdir", options.dir, errno);
  std::unique_ptr<CommitLog> log(new CommitLog(options));
  RETURN_ON_ERROR(log->scan(persisted_version, replay, last_version));
  return log;
}

// Reads every segment header, then the records of the newest epoch in
// generation order (see the header comment for the rules).
Status CommitLog::scan(uint64_t persisted_version, const Replay& replay, uint64_t* last_version) {
  DIR* d = ::opendir(options_.dir.c_str());
  if (!d) return ioError("opendir", options_.dir, errno);
  std::vector<uint32_t> ids;
  while (dirent* e = ::readdir(d)) {
    std::string_view name(e->d_name);
    if (name.size() > 4 && name.substr(name.size() - 4) == ".tmp") {
      // A segment whose creation did not finish.
      ::unlinkat(::dirfd(d), e->d_name, 0);
      continue;
    }
    unsigned id = 0;
    char tail = 0;
    if (std::sscanf(e->d_name, "%6u.lo%c", &id, &tail) == 2 && tail == 'g' &&
        std::strlen(e->d_name) == 10) {
      ids.push_back(id);
    }
  }
  ::closedir(d);
  std::sort(ids.begin(), ids.end());

  struct Found {
    size_t index;
    uint64_t generation, epoch;
  };
  std::vector<Found> found;
  for (uint32_t id : ids) {
    std::string path = segmentPath(options_.dir, id);
    int fd = ::open(path.c_str(), O_RDWR | O_CLOEXEC);
    if (fd < 0) return ioError("open", path, errno);
    struct stat st;
    if (::fstat(fd, &st) != 0) {
      int err = errno;
      ::close(fd);
      return ioError("stat", path, err);
    }
    Segment s;
    s.id = id;
    s.fd = fd;
    s.bytes = static_cast<uint64_t>(st.st_size);
    segments_.push_back(s);
    // Segments written with another segment size are read all the same;
    // start() removes them once their records are persisted.
    std::string h;
    RETURN_ON_ERROR(readAll(fd, &h, kSegmentHeaderFields, 0, path));
    if (h.size() == kSegmentHeaderFields && getLE<uint32_t>(h, 0) == kSegmentMagic &&
        getLE<uint32_t>(h, 4) == crc32c(h.data() + 8, kSegmentHeaderFields - 8) &&
        getLE<uint64_t>(h, 24) == s.bytes) {
      found.push_back({segments_.size() - 1, getLE<uint64_t>(h, 8), getLE<uint64_t>(h, 16)});
      generation_ = std::max(generation_, getLE<uint64_t>(h, 8));
      epoch_ = std::max(epoch_, getLE<uint64_t>(h, 16));
    }
  }
  std::sort(found.begin(), found.end(),
            [](const Found& a, const Found& b) { return a.generation < b.generation; });

  uint64_t expected = persisted_version + 1;
  std::string buf;
  bool gap = false;
  for (const Found& f : found) {
    if (f.epoch != epoch_ || gap) continue;
    const Segment& s = segments_[f.index];
    std::string path = segmentPath(options_.dir, s.id);
    RETURN_ON_ERROR(readAll(s.fd, &buf, s.bytes, 0, path));
    std::string_view rest(buf);
    rest.remove_prefix(std::min(rest.size(), kLogSegmentHeaderBytes));
    while (!rest.empty()) {
      auto rec = decodeLogRecord(rest);
      if (!rec.ok() || rec->epoch != f.epoch) break;  // the end of what this use wrote
      rest.remove_prefix(rec->bytes);
      if (rec->last < expected) continue;  // persisted already, or an earlier lap
      if (rec->first != expected) {
        gap = true;  // never acknowledged, and nothing after it was
        break;
      }
      auto batch = decodeLogBatch(rec->payload);
      if (!batch.ok()) {
        return corrupt(fmt::format("{}: versions {}..{}: {}", path, rec->first, rec->last,
                                   batch.status().message()));
      }
      RETURN_ON_ERROR(replay(*rec, *batch));
      expected = rec->last + 1;
    }
  }
  *last_version = expected - 1;
  if (*last_version > persisted_version) {
    CLOG_INFO("kv", "commit log: replayed versions {}..{} from {}", persisted_version + 1,
              *last_version, options_.dir);
  }
  return Status::OK();
}

Result<int> CommitLog::createSegmentFile(uint32_t id) {
  RETURN_ON_ERROR(CISTERN_FAULT("kv.log.create_segment"));
  std::string path = segmentPath(options_.dir, id);
  std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_CREAT | O_TRUNC | O_RDWR | O_CLOEXEC, 0644);
  if (fd < 0) return ioError("create", tmp, errno);
  // Zeros really written (not fallocate's unwritten extents): an overwrite of
  // written blocks needs no journal commit when it is synced.
  std::string zeros(1 << 20, '\0');
  Status s;
  for (uint64_t off = 0; s.ok() && off < options_.segment_bytes; off += zeros.size()) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(zeros.size(), options_.segment_bytes - off));
    s = writeAll(fd, std::string_view(zeros).substr(0, n), off, tmp);
  }
  if (s.ok() && ::fdatasync(fd) != 0) s = ioError("fdatasync", tmp, errno);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) s = ioError("rename", tmp, errno);
  if (s.ok()) {
    int dfd = ::open(options_.dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd < 0 || ::fsync(dfd) != 0) s = ioError("fsync", options_.dir, errno);
    if (dfd >= 0) ::close(dfd);
  }
  if (!s.ok()) {
    ::close(fd);
    ::unlink(tmp.c_str());
    return s;
  }
  return fd;
}

Status CommitLog::start(uint64_t next_version, Checkpoint checkpoint) {
  std::lock_guard lock(mu_);
  // Everything replayed is persisted: every segment may be reused, and one of
  // another size (the option changed, or its creation never finished) goes.
  std::vector<Segment> keep;
  for (Segment& s : segments_) {
    if (s.bytes == options_.segment_bytes) {
      s.state = Segment::kFree;
      keep.push_back(s);
      continue;
    }
    std::string path = segmentPath(options_.dir, s.id);
    CLOG_INFO("kv", "commit log: removing {} ({} bytes, segments are now {})", path, s.bytes,
              options_.segment_bytes);
    ::close(s.fd);
    if (::unlink(path.c_str()) != 0) return ioError("unlink", path, errno);
  }
  segments_ = std::move(keep);
  ++epoch_;
  next_first_ = next_version;
  checkpoint_ = std::move(checkpoint);
  thread_ = std::thread([this] { checkpointLoop(); });
  return Status::OK();
}

CommitLog::~CommitLog() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  if (failed_.ok() && !writeHeld(held_).ok()) CLOG_ERROR("kv", "commit log: held writes lost");
  for (Segment& s : segments_) {
    // A clean close leaves unsynced records durable (appends have returned).
    if (s.dirty && failed_.ok() && ::fdatasync(s.fd) != 0) {
      CLOG_ERROR("kv", "commit log: fdatasync {}: {}", segmentPath(options_.dir, s.id),
                 std::strerror(errno));
    }
    ::close(s.fd);
    if (s.direct_fd >= 0) ::close(s.direct_fd);
  }
}

void CommitLog::fail(const Status& s) {
  {
    std::lock_guard lock(mu_);
    if (failed_.ok()) failed_ = s;
  }
  cv_.notify_all();
}

uint32_t CommitLog::segmentCount() const {
  std::lock_guard lock(mu_);
  return static_cast<uint32_t>(segments_.size());
}

uint64_t CommitLog::checkpoints() const {
  std::lock_guard lock(mu_);
  return checkpoints_;
}

uint64_t CommitLog::spaceWaits() const {
  std::lock_guard lock(mu_);
  return space_waits_;
}

uint64_t CommitLog::lazySyncs() const {
  std::lock_guard lock(mu_);
  return lazy_syncs_;
}

// Creates one more (free) segment file, outside the lock.
Status CommitLog::addSegment(std::unique_lock<std::mutex>& lock) {
  creating_ = true;
  uint32_t id = 0;
  for (const Segment& s : segments_) id = std::max(id, s.id + 1);
  lock.unlock();
  auto fd = createSegmentFile(id);
  lock.lock();
  creating_ = false;
  RETURN_ON_ERROR(fd.status());
  Segment s;
  s.id = id;
  s.fd = *fd;
  s.bytes = options_.segment_bytes;
  segments_.push_back(s);
  return Status::OK();
}

// Seals the active segment (if any) and makes a free one active, waiting for
// the checkpoint thread when none is free. The new header is on disk before
// any record of this use is written.
Status CommitLog::activate(std::unique_lock<std::mutex>& lock) {
  // Held writes (tests) land before their segment can be reused, after the
  // older ones a sync in progress writes.
  if (!held_.empty()) cv_.wait(lock, [&] { return !syncing_; });
  RETURN_ON_ERROR(writeHeld(held_));
  if (active_ >= 0) {
    segments_[static_cast<size_t>(active_)].state = Segment::kSealed;
    active_ = -1;
    cv_.notify_all();  // checkpoint work
  }
  for (;;) {
    if (!failed_.ok()) return failed_;
    if (stop_) return Status(ErrorCode::kShuttingDown, "commit log closing");
    for (size_t i = 0; i < segments_.size(); ++i) {
      if (segments_[i].state != Segment::kFree) continue;
      Segment& s = segments_[i];
      s.generation = ++generation_;
      s.last_version = 0;
      std::string path = segmentPath(options_.dir, s.id);
      Status st = writeAll(s.fd, encodeSegmentHeader(s.generation, epoch_, options_.segment_bytes),
                           0, path);
      if (st.ok() && ::fdatasync(s.fd) != 0) st = ioError("fdatasync", path, errno);
      if (!st.ok()) return st;
      if (direct_ && s.direct_fd < 0) {
        // The fault point stands for a file system that refuses O_DIRECT.
        if (CISTERN_FAULT("kv.log.open_direct").ok()) {
          s.direct_fd = ::open(path.c_str(), O_RDWR | O_DIRECT | O_CLOEXEC);
        } else {
          errno = EINVAL;
        }
        if (s.direct_fd < 0 && errno == EINVAL) {
          CLOG_INFO("kv", "commit log: {} does not take O_DIRECT; buffered writes", options_.dir);
          direct_ = false;
        } else if (s.direct_fd < 0) {
          return ioError("open", path, errno);
        }
      }
      s.state = Segment::kActive;
      active_ = static_cast<int>(i);
      offset_ = kLogSegmentHeaderBytes;
      tail_len_ = 0;
      spare_failed_ = false;
      return Status::OK();
    }
    if (segments_.size() < options_.segments_max && !creating_) {
      Status st = addSegment(lock);
      if (st.ok()) continue;
      // A full disk is not fatal while a checkpoint will free a sealed
      // segment (or freed one while the file was being made): wait for it,
      // as when all segments are in use.
      if (st.code() != ErrorCode::kNoSpace) return st;
      bool freed = false, sealed = false;
      for (const Segment& g : segments_) {
        freed |= g.state == Segment::kFree;
        sealed |= g.state == Segment::kSealed;
      }
      if (freed) continue;
      if (!sealed) return st;
      CLOG_WARN("kv", "commit log: {}; waiting for a checkpoint to free a segment", st.toString());
    }
    // Every segment in use, or no room for another: a wait for a checkpoint.
    // Otherwise another thread is making the next segment (the spare one,
    // still being zeroed): a wait for that, not counted.
    if (segments_.size() >= options_.segments_max || !creating_) ++space_waits_;
    cv_.wait(lock);
  }
}

Status CommitLog::append(uint64_t first, uint64_t last, std::string_view payload, bool sync) {
  return appendRecord(first, last, payload, sync ? Sync::kYes : Sync::kNo);
}

Status CommitLog::appendToDevice(uint64_t first, uint64_t last, std::string_view payload) {
  return appendRecord(first, last, payload, Sync::kUnlessDirect);
}

Status CommitLog::appendRecord(uint64_t first, uint64_t last, std::string_view payload, Sync mode) {
  std::string record = encodeLogRecord(epoch_, first, last, payload);
  if (record.size() > options_.segment_bytes - kLogSegmentHeaderBytes) {
    Status s(ErrorCode::kTxnTooLarge,
             fmt::format("commit log: a batch of {} bytes does not fit a segment of {}",
                         record.size(), options_.segment_bytes));
    fail(s);
    return s;
  }
  int fd;
  uint64_t off;
  size_t seg_index;
  std::string path;
  bool wake = false;
  bool direct = false;
  bool sync = false;
  bool lazy = false;        // written to the page cache, the segment left dirty
  bool after_lazy = false;  // a synced record behind unsynced ones: synced with them
  {
    std::unique_lock lock(mu_);
    ++turn_waiters_;
    // A direct write rewrites the previous record's last block: one at a time.
    cv_.wait(lock, [&] {
      return (next_first_ == first && !(direct_ && writing_)) || !failed_.ok() || stop_;
    });
    --turn_waiters_;
    if (!failed_.ok()) return failed_;
    if (stop_) return Status(ErrorCode::kShuttingDown, "commit log closing");
    if (active_ < 0 || offset_ + record.size() > options_.segment_bytes) {
      Status s = activate(lock);
      if (!s.ok()) {
        if (failed_.ok()) failed_ = s;
        cv_.notify_all();
        return s;
      }
    }
    seg_index = static_cast<size_t>(active_);
    Segment& seg = segments_[seg_index];
    direct = direct_;
    writing_ = direct;
    const bool unsynced_before = lazy_last_ > synced_through_;
    after_lazy = mode == Sync::kYes && unsynced_before;
    lazy = mode == Sync::kNo || after_lazy;
    if (mode == Sync::kNo) {
      if (!unsynced_before) {
        lazy_since_ = std::chrono::steady_clock::now();
        wake = true;  // the checkpoint thread keeps the deadline
      }
      lazy_last_ = last;
    }
    sync = !lazy && (mode == Sync::kYes || (mode == Sync::kUnlessDirect && !direct));
    // Unsynced records go through the page cache, also in direct mode.
    fd = direct && !lazy ? seg.direct_fd : seg.fd;
    off = offset_;
    path = segmentPath(options_.dir, seg.id);
    bool half = offset_ * 2 <= options_.segment_bytes;
    offset_ += record.size();
    half = half && offset_ * 2 > options_.segment_bytes;
    seg.last_version = last;
    next_first_ = last + 1;
    writing_firsts_.insert(first);
    // Wake-ups cost more than the write here: only when someone waits for
    // this turn or the checkpoint thread should make a spare.
    wake = wake || turn_waiters_ > 0 || half;
  }
  if (wake) cv_.notify_all();
  Status s = CISTERN_FAULT("kv.log.before_write");
  // Tests: an unsynced record stays in memory, as in a volatile disk cache.
  std::optional<HeldWrite> held;
  if (lazy && !CISTERN_FAULT("kv.log.unsynced_in_memory").ok()) held.emplace(fd, off, "", path);
  if (s.ok() && held && direct) {
    s = appendDirect(fd, off, record, false, path, &held->bytes);
    held->off = off - off % 4096;
  } else if (s.ok() && held) {
    held->bytes = record;
  } else if (s.ok()) {
    s = direct ? appendDirect(fd, off, record, sync, path)
        : sync ? writeDsync(fd, record, off, path)
               : writeAll(fd, record, off, path);
  }
  {
    std::lock_guard lock(mu_);
    writing_ = false;
    writing_firsts_.erase(first);
    if (s.ok() && held) held_.push_back(std::move(*held));
    if (s.ok() && lazy) segments_[seg_index].dirty = true;
    // Whoever waits for a turn, or a sync for this write to finish.
    wake = turn_waiters_ > 0 || sync_waiters_ > 0;
  }
  if (wake) cv_.notify_all();
  if (!s.ok()) {
    fail(s);
    return s;
  }
  if (after_lazy) {
    std::unique_lock lock(mu_);
    s = syncLocked(lock, last);
  }
  return s;
}

Status CommitLog::sync() {
  std::unique_lock lock(mu_);
  return syncLocked(lock, next_first_ - 1);
}

Status CommitLog::syncLocked(std::unique_lock<std::mutex>& lock, uint64_t target) {
  for (;;) {
    if (!failed_.ok()) return failed_;
    if (synced_through_ >= target) return Status::OK();
    if (syncing_ || (!writing_firsts_.empty() && *writing_firsts_.begin() <= target)) {
      if (stop_) return Status(ErrorCode::kShuttingDown, "commit log closing");
      ++sync_waiters_;
      cv_.wait(lock);
      --sync_waiters_;
      continue;
    }
    // Every append reserved before the oldest still writing has finished:
    // its record is in the page cache or on the device.
    const uint64_t covers =
        writing_firsts_.empty() ? next_first_ - 1 : *writing_firsts_.begin() - 1;
    std::vector<std::pair<int, std::string>> dirty;
    for (Segment& seg : segments_) {
      if (!seg.dirty) continue;
      seg.dirty = false;
      dirty.emplace_back(seg.fd, segmentPath(options_.dir, seg.id));
    }
    std::vector<HeldWrite> held;
    held.swap(held_);
    syncing_ = true;
    lock.unlock();
    Status s = CISTERN_FAULT("kv.log.lazy_sync");
    if (s.ok()) s = writeHeld(held);
    for (const auto& [fd, path] : dirty) {
      if (!s.ok()) break;
      if (::fdatasync(fd) != 0) s = ioError("fdatasync", path, errno);
    }
    lock.lock();
    syncing_ = false;
    ++lazy_syncs_;
    if (!s.ok()) {
      // Never retried: what the failed fdatasync held is in doubt.
      if (failed_.ok()) failed_ = s;
    } else {
      synced_through_ = std::max(synced_through_, covers);
      if (lazy_last_ > synced_through_) lazy_since_ = std::chrono::steady_clock::now();
    }
    cv_.notify_all();
  }
}

Status CommitLog::writeHeld(std::vector<HeldWrite>& held) {
  for (const HeldWrite& w : held) RETURN_ON_ERROR(writeAll(w.fd, w.bytes, w.off, w.path));
  held.clear();
  return Status::OK();
}

// Writes the blocks from the one holding `off` to the end of the record: the
// bytes before `off` in that block are the previous record's (kept in
// block_buf_, so rewriting them changes nothing on disk even if torn), the
// rest of the last block is zero.

Status CommitLog::appendDirect(int fd, uint64_t off, std::string_view record, bool sync,
                               const std::string& path, std::string* hold) {
  constexpr size_t kBlock = 4096;
  CISTERN_CHECK(off % kBlock == tail_len_, "commit log: direct append off its block tail");
  size_t used = tail_len_ + record.size();
  size_t len = (used + kBlock - 1) / kBlock * kBlock;
  if (len > block_cap_ && !resizeBlockBuf(std::max(len, kBlockBufMin))) {
    return Status(ErrorCode::kResourceExhausted, "commit log: block buffer");
  }
  char* buf = block_buf_.get();
  std::memcpy(buf + tail_len_, record.data(), record.size());
  std::memset(buf + used, 0, len - used);
  Status s = hold   ? (hold->assign(buf, len), Status::OK())
             : sync ? writeDsync(fd, std::string_view(buf, len), off - tail_len_, path)
                    : writeAll(fd, std::string_view(buf, len), off - tail_len_, path);
  if (!s.ok()) return s;
  size_t tail = used % kBlock;
  if (tail) std::memmove(buf, buf + used - tail, tail);
  tail_len_ = tail;
  // A huge batch went by: give the memory back (keeping the larger buffer
  // if that fails is harmless).
  if (block_cap_ > (1u << 20)) (void)resizeBlockBuf(kBlockBufMin);
  return Status::OK();
}

bool CommitLog::resizeBlockBuf(size_t cap) {
  std::unique_ptr<char, FreeDeleter> buf(static_cast<char*>(std::aligned_alloc(4096, cap)));
  if (!buf) return false;
  if (tail_len_) std::memcpy(buf.get(), block_buf_.get(), tail_len_);
  block_buf_ = std::move(buf);
  block_cap_ = cap;
  return true;
}

void CommitLog::checkpointLoop() {
  std::unique_lock lock(mu_);
  const auto lazy_delay = std::chrono::milliseconds(options_.lazy_sync_ms);
  while (!stop_) {
    // Unsynced records: durable within lazy_sync_ms of the first.
    const bool lazy = failed_.ok() && lazy_last_ > synced_through_ && !syncing_;
    if (lazy && std::chrono::steady_clock::now() >= lazy_since_ + lazy_delay) {
      if (Status st = syncLocked(lock, lazy_last_); !st.ok() && !stop_)
        CLOG_ERROR("kv", "commit log: background sync: {}", st.toString());
      continue;
    }
    bool sealed = std::any_of(segments_.begin(), segments_.end(),
                              [](const Segment& s) { return s.state == Segment::kSealed; });
    // A spare is made once the active segment is half full, so that a store
    // that writes little never makes a second file.
    bool want_spare = !creating_ && !spare_failed_ && segments_.size() < options_.segments_max &&
                      active_ >= 0 && offset_ * 2 > options_.segment_bytes &&
                      std::none_of(segments_.begin(), segments_.end(),
                                   [](const Segment& s) { return s.state == Segment::kFree; });
    if (!failed_.ok() || (!sealed && !want_spare)) {
      if (lazy)
        cv_.wait_until(lock, lazy_since_ + lazy_delay);
      else
        cv_.wait(lock);
      continue;
    }
    if (want_spare) {
      // A spare ready before the active segment fills keeps file creation
      // off the commit path.
      if (Status st = addSegment(lock); !st.ok()) {
        // Not again before the next segment is activated (no busy retries
        // on a full disk).
        spare_failed_ = true;
        CLOG_WARN("kv", "commit log: spare segment: {}", st.toString());
      }
      cv_.notify_all();
      continue;
    }
    lock.unlock();
    Result<uint64_t> persisted = checkpoint_();
    lock.lock();
    if (!persisted.ok()) {
      if (failed_.ok())
        failed_ = Status(ErrorCode::kIOError,
                         fmt::format("commit log checkpoint: {}", persisted.status().toString()));
      cv_.notify_all();
      continue;
    }
    ++checkpoints_;
    bool freed = false;
    for (Segment& s : segments_) {
      if (s.state == Segment::kSealed && s.last_version <= *persisted) {
        s.state = Segment::kFree;
        freed = true;
      }
    }
    if (freed) {
      cv_.notify_all();
    } else {
      // Batches of the sealed segment were written but not yet applied; they
      // will be within microseconds.
      cv_.wait_for(lock, std::chrono::milliseconds(2));
    }
  }
}

}  // namespace cistern::kv
