// libcistern open files: write coalescing, read-ahead, length updates.
#include <fmt/format.h>

#include <cstring>

#include "client/file_impl.h"
#include "common/metrics.h"
#include "proto/file_type.h"

namespace cistern::client {

namespace {
constexpr size_t kWindowMin = 128 << 10;
constexpr size_t kWriteBufferMin = 64 << 10;

// The inode as storage I/O sees it: its bytes in chunks.
meta::Inode chunked(meta::Inode inode) {
  inode.set_data_inline(false);
  return inode;
}

// As write(2) at the file system's size limit: a write starting at or past
// it fails with kFileTooLarge (EFBIG); one that crosses it is cut short there.
Status clipToMaxSize(uint64_t offset, size_t* n) {
  if (*n == 0) return Status::OK();
  if (offset >= meta::kMaxFileBytes) {
    return Status(ErrorCode::kFileTooLarge,
                  fmt::format("write at {}: files end at {} bytes", offset, meta::kMaxFileBytes));
  }
  *n = static_cast<size_t>(std::min<uint64_t>(*n, meta::kMaxFileBytes - offset));
  return Status::OK();
}
}  // namespace

FileImpl::FileImpl(ClientImpl* client, std::string name, const meta::Inode& inode)
    : client_(client), path_(std::move(name)), inode_(chunked(inode)) {
  size_ = inode_.size();
  meta_size_ = size_;
  last_inode_ = inode;
}

void FileImpl::setFresh() {
  std::lock_guard lock(mu_);
  fresh_ = true;
}

void FileImpl::adoptOpen(const meta::Inode& inode, std::string data) {
  std::lock_guard lock(mu_);
  const bool changed =
      inode.mtime_ns() != last_inode_.mtime_ns() || inode.size() != last_inode_.size();
  last_inode_ = inode;
  // Written through since the last recorded length: this client's bytes
  // are past any inline state an open that raced with its writes reports
  // (the writer moved the bytes to chunks), and its length stands unless
  // another client made the file longer.
  if (wrote_ || wbuf_len_ > 0 || !behind_.empty()) {
    size_ = std::max(size_, inode.size());
    return;
  }
  // Close-to-open: what this open found is what every handle of the inode
  // reads from now on.
  has_inline_ = inode.data_inline();
  inline_ = has_inline_ ? std::move(data) : std::string();
  size_ = inode.size();
  meta_size_ = size_;
  if (changed) {
    rbuf_len_ = 0;
    dropPrefetch();
  }
}

bool FileImpl::wholeContents(std::string* out) const {
  std::lock_guard lock(mu_);
  if (!has_inline_ || wrote_ || wbuf_len_ > 0 || !behind_.empty() || size_ != inline_.size())
    return false;
  *out = inline_;
  return true;
}

void FileImpl::readInlineLocked(uint8_t* p, size_t n, uint64_t offset) const {
  size_t have = offset < inline_.size() ? std::min<size_t>(n, inline_.size() - offset) : 0;
  if (have > 0) std::memcpy(p, inline_.data() + offset, have);
  std::memset(p + have, 0, n - have);
}

Status FileImpl::ensureChunkedLocked() {
  if (!has_inline_) return Status::OK();
  // Bytes this handle put inline at an early close (a FUSE flush of one of
  // several descriptors, e.g. a forked child's exit), and its owner writes
  // on: they move to chunk 0 first, as for any writer.
  RETURN_ON_ERROR(client_->convertInline(inode_.ino()));
  has_inline_ = false;
  inline_.clear();
  return Status::OK();
}

bool FileImpl::closeInlineLocked(uint64_t session) {
  const uint64_t max = client_->options().inline_max_bytes;
  if (!fresh_ || session == 0 || has_inline_ || !behind_.empty() || !sticky_error_.ok() ||
      size_ == 0 || size_ > max || wbuf_len_ == 0 || wbuf_offset_ + wbuf_len_ != size_) {
    return false;
  }
  fresh_ = false;
  // Nothing of the file is in storage: bytes before the buffer are a hole.
  std::string data(static_cast<size_t>(size_), '\0');
  std::memcpy(data.data() + wbuf_offset_, wbuf_.data(), wbuf_len_);
  auto n = client_->metaClose(inode_.ino(), session, size_, true, &data);
  if (!n.ok()) return false;  // refused (or unreachable): the ordinary close follows
  last_inode_ = *n;
  meta_size_ = size_;
  wrote_ = false;
  wbuf_len_ = 0;
  has_inline_ = true;
  inline_ = std::move(data);
  return true;
}

FileImpl::~FileImpl() {
  std::lock_guard lock(mu_);
  (void)drainLocked();  // buffers written behind must not outlive their memory
  dropPrefetch();
}

uint64_t FileImpl::size() const {
  std::lock_guard lock(mu_);
  return size_;
}

std::optional<uint64_t> FileImpl::unrecordedSize() const {
  std::lock_guard lock(mu_);
  if (!wrote_ && wbuf_len_ == 0 && behind_.empty() && size_ == meta_size_) return std::nullopt;
  return size_;
}

// Meta commits namespace changes unsynced: the file's create may not be
// durable yet. It is made so before this handle's first bytes go to
// chunks, so that a crash cannot leave chunks of a file the namespace lost
// (fsck would find them orphaned). A no-op at meta when nothing is unsynced.
Status FileImpl::beforeChunkWriteLocked() {
  fresh_ = false;
  if (namespace_synced_) return Status::OK();
  RETURN_ON_ERROR(client_->metaSync());
  namespace_synced_ = true;
  return Status::OK();
}

Status FileImpl::flushLocked() {
  // Older buffers may hold the same bytes: they land first.
  Status s = drainLocked();
  if (wbuf_len_ > 0) {
    Status w = beforeChunkWriteLocked();
    if (w.ok()) w = client_->writeData(inode_, wbuf_offset_, wbuf_len_, wbuf_.data());
    // A failed flush loses the buffered bytes: fsync() and close() report it.
    if (!w.ok() && sticky_error_.ok()) sticky_error_ = w;
    wbuf_len_ = 0;
    if (s.ok()) s = w;
  }
  return s;
}

void FileImpl::reapOldest() {
  Behind& b = behind_.front();
  Status s = b.io->wait();
  if (!s.ok() && sticky_error_.ok()) sticky_error_ = s;
  behind_bytes_ -= b.len;
  spares_.push_back(std::move(b.buf));
  behind_.pop_front();
}

Status FileImpl::drainLocked() {
  const bool failed_before = !sticky_error_.ok();
  while (!behind_.empty()) reapOldest();
  return failed_before ? Status::OK() : sticky_error_;  // a failure learnt now
}

Status FileImpl::flushBehindLocked() {
  const uint64_t cap = client_->options().write_behind_bytes;
  if (cap == 0) return flushLocked();
  const uint64_t end = wbuf_offset_ + wbuf_len_;
  while (!behind_.empty() && behind_.front().io->finished()) reapOldest();
  bool overlaps = false;
  for (const Behind& b : behind_)
    overlaps = overlaps || (b.offset < end && wbuf_offset_ < b.offset + b.len);
  if (overlaps) (void)drainLocked();
  while (!behind_.empty() && behind_bytes_ + wbuf_len_ > cap) reapOldest();
  // A write behind that failed is reported by the write that learns of it.
  if (!sticky_error_.ok()) {
    wbuf_len_ = 0;
    return sticky_error_;
  }
  RETURN_ON_ERROR(beforeChunkWriteLocked());
  Behind b;
  b.buf = std::move(wbuf_);
  b.offset = wbuf_offset_;
  b.len = wbuf_len_;
  b.io = client_->startWrite(inode_, b.offset, b.len, b.buf.data());
  behind_bytes_ += b.len;
  behind_.push_back(std::move(b));
  wbuf_ = Buffer{};
  if (!spares_.empty()) {
    wbuf_ = std::move(spares_.back());
    spares_.pop_back();
  }
  wbuf_len_ = 0;
  return Status::OK();
}

Status FileImpl::writeLocked(const uint8_t* p, size_t n, uint64_t offset) {
  const uint64_t chunk = chunkSize();
  if (chunk == 0) return Status(ErrorCode::kCorruption, "file has no layout");
  RETURN_ON_ERROR(client_->reserveTo(inode_.ino(), offset + n));  // quotas: before, not after
  RETURN_ON_ERROR(ensureChunkedLocked());
  // Coherent reads after writes: read-ahead bytes may now be stale.
  rbuf_len_ = 0;
  dropPrefetch();
  if (!buffered_) {
    RETURN_ON_ERROR(beforeChunkWriteLocked());
    RETURN_ON_ERROR(client_->writeData(inode_, offset, n, p));
    size_ = std::max(size_, offset + n);
    return Status::OK();
  }
  while (n > 0) {
    // Append to the buffer when contiguous and within the same chunk.
    if (wbuf_len_ > 0 && offset == wbuf_offset_ + wbuf_len_ && offset % chunk != 0) {
      uint64_t room = chunk - offset % chunk;
      size_t take = static_cast<size_t>(std::min<uint64_t>(room, n));
      growBufferLocked(wbuf_len_ + take);
      std::memcpy(wbuf_.data() + wbuf_len_, p, take);
      wbuf_len_ += take;
      p += take;
      n -= take;
      offset += take;
      size_ = std::max(size_, offset);
      if (offset % chunk == 0) RETURN_ON_ERROR(flushBehindLocked());
      continue;
    }
    if (wbuf_len_ > 0) RETURN_ON_ERROR(flushBehindLocked());
    if (offset % chunk == 0 && n >= chunk &&
        (n >= 2 * chunk || client_->options().write_behind_bytes == 0)) {
      // Whole chunks go straight from the caller's buffer, in parallel
      // (after the buffers written behind, which may hold the same bytes).
      RETURN_ON_ERROR(drainLocked());
      RETURN_ON_ERROR(beforeChunkWriteLocked());
      size_t whole = static_cast<size_t>(n / chunk * chunk);
      RETURN_ON_ERROR(client_->writeData(inode_, offset, whole, p));
      p += whole;
      n -= whole;
      offset += whole;
      size_ = std::max(size_, offset);
      continue;
    }
    uint64_t room = chunk - offset % chunk;
    size_t take = static_cast<size_t>(std::min<uint64_t>(room, n));
    growBufferLocked(take);
    std::memcpy(wbuf_.data(), p, take);
    wbuf_offset_ = offset;
    wbuf_len_ = take;
    p += take;
    n -= take;
    offset += take;
    size_ = std::max(size_, offset);
    if (offset % chunk == 0) RETURN_ON_ERROR(flushBehindLocked());
  }
  return Status::OK();
}

void FileImpl::growBufferLocked(size_t need) {
  if (need <= wbuf_.size()) return;
  // Doubling from 64 KiB up to a chunk: a small file's handle does not take
  // (and the allocator map, touch and give back) a chunk-sized buffer.
  size_t cap = std::max<size_t>({need, 2 * wbuf_.size(), kWriteBufferMin});
  wbuf_.grow(std::min<size_t>(cap, chunkSize()), wbuf_len_);
}

Error FileImpl::pwrite(const void* buf, size_t n, uint64_t offset, size_t* done, bool append) {
  *done = 0;
  std::lock_guard lock(mu_);
  if (append) offset = size_;
  if (Status s = clipToMaxSize(offset, &n); !s.ok()) return toError(s, path_);
  wrote_ = true;
  Status s = writeLocked(static_cast<const uint8_t*>(buf), n, offset);
  if (!s.ok()) return toError(s, path_);
  *done = n;
  return {};
}

void FileImpl::dropPrefetch() {
  if (current_) {
    if (!current_->wait().ok()) rbuf_len_ = 0;  // some of rbuf_ was never read
    current_.reset();
  }
  if (prefetch_) {
    (void)prefetch_->wait();
    prefetch_.reset();
  }
  pbuf_len_ = 0;
}

void FileImpl::takePrefetched() {
  std::swap(rbuf_, pbuf_);
  rbuf_offset_ = pbuf_offset_;
  rbuf_len_ = pbuf_len_;
  pbuf_len_ = 0;
}

void FileImpl::startPrefetch(uint64_t offset) {
  if (prefetch_ || window_ == 0 || offset >= size_) return;
  size_t len = static_cast<size_t>(std::min<uint64_t>(window_, size_ - offset));
  pbuf_.ensure(client_->windowShm(), client_->options().readahead_max_bytes);
  pbuf_offset_ = offset;
  pbuf_len_ = len;
  prefetch_ = client_->startRead(inode_, offset, len, pbuf_.data());
}

Status FileImpl::readLocked(uint8_t* p, size_t n, uint64_t offset) {
  if (has_inline_) {
    readInlineLocked(p, n, offset);
    return Status::OK();
  }
  const size_t window_max =
      buffered_ ? static_cast<size_t>(client_->options().readahead_max_bytes) : 0;
  bool sequential = offset == next_sequential_;
  next_sequential_ = offset + n;
  window_ =
      sequential && window_max > 0 ? std::min(std::max(window_ * 2, kWindowMin), window_max) : 0;
  while (n > 0) {
    // Served from read-ahead?
    if (rbuf_len_ > 0 && offset >= rbuf_offset_ && offset < rbuf_offset_ + rbuf_len_) {
      size_t take = static_cast<size_t>(std::min<uint64_t>(n, rbuf_offset_ + rbuf_len_ - offset));
      const uint8_t* from = rbuf_.data() + (offset - rbuf_offset_);
      if (current_ && !current_->waitRange(from, take)) {
        // A piece of the window failed: read again below, where a real
        // error shows.
        static auto& rereads = metrics::Registry::global().counter(
            "client_readahead_rereads_total", {},
            "Read-ahead windows with a failed piece, read again by the reader");
        rereads.inc();
        (void)current_->wait();
        current_.reset();
        rbuf_len_ = 0;
        continue;
      }
      // All read and none failed: nothing more to wait for. (A failed
      // piece keeps current_, so that a read of its bytes finds out.)
      if (current_ && current_->finished() && current_->wait().ok()) current_.reset();
      std::memcpy(p, from, take);
      p += take;
      n -= take;
      offset += take;
      continue;
    }
    // The prefetched window becomes the current one.
    if (prefetch_ && offset >= pbuf_offset_ && offset < pbuf_offset_ + pbuf_len_ &&
        !pbuf_.shared()) {
      // Heap memory: taken over while its pieces are still read (the caller
      // waits for those it copies from), and the next window is read into
      // the old one right away, so that the disk has two windows to work
      // on while the caller waits.
      if (current_) {
        (void)current_->wait();  // (a window the caller skipped)
        current_.reset();
      }
      takePrefetched();
      current_ = std::move(prefetch_);
      startPrefetch(rbuf_offset_ + rbuf_len_);
      continue;
    }
    if (prefetch_ && offset >= pbuf_offset_ && offset < pbuf_offset_ + pbuf_len_) {
      Status s = prefetch_->wait();
      prefetch_.reset();
      if (s.ok() && pbuf_.intact()) {
        takePrefetched();
        continue;
      }
      pbuf_len_ = 0;  // read again below; a real error shows there
    }
    dropPrefetch();
    if (window_ == 0 || n >= window_) {
      // Random or large: straight into the caller's buffer.
      RETURN_ON_ERROR(client_->readData(inode_, offset, n, p));
      if (window_ > 0) startPrefetch(offset + n);
      return Status::OK();
    }
    size_t fetch = static_cast<size_t>(std::min<uint64_t>(window_, size_ - offset));
    rbuf_.ensure(client_->windowShm(), window_max);
    rbuf_len_ = 0;
    RETURN_ON_ERROR(client_->readData(inode_, offset, fetch, rbuf_.data()));
    if (!rbuf_.intact()) continue;  // now on the heap: read again
    rbuf_offset_ = offset;
    rbuf_len_ = fetch;
  }
  if (window_ > 0 && rbuf_len_ > 0) startPrefetch(rbuf_offset_ + rbuf_len_);
  return Status::OK();
}

Error FileImpl::startReadLocked(size_t n, uint64_t offset, size_t* len) {
  *len = 0;
  if (wbuf_len_ > 0 || !behind_.empty()) {
    Status s = flushLocked();
    if (!s.ok()) return toError(s, path_);
  }
  if (offset < size_) *len = static_cast<size_t>(std::min<uint64_t>(n, size_ - offset));
  return {};
}

Error FileImpl::pread(void* buf, size_t n, uint64_t offset, size_t* done) {
  *done = 0;
  std::lock_guard lock(mu_);
  size_t len = 0;
  if (Error e = startReadLocked(n, offset, &len); e || len == 0) return e;
  Status s = readLocked(static_cast<uint8_t*>(buf), len, offset);
  if (!s.ok()) return toError(s, path_);
  *done = len;
  return {};
}

Error FileImpl::preadDirect(void* buf, size_t n, uint64_t offset, size_t* done) {
  *done = 0;
  size_t len = 0;
  {
    std::lock_guard lock(mu_);
    if (Error e = startReadLocked(n, offset, &len); e || len == 0) return e;
    if (has_inline_) {
      readInlineLocked(static_cast<uint8_t*>(buf), len, offset);
      *done = len;
      return {};
    }
  }
  Status s = client_->readData(inode_, offset, len, static_cast<uint8_t*>(buf));
  if (!s.ok()) return toError(s, path_);
  *done = len;
  return {};
}

Error FileImpl::preadManyDirect(std::span<FileRange> ranges) {
  std::vector<ClientImpl::ReadSpan> spans;
  spans.reserve(ranges.size());
  {
    std::lock_guard lock(mu_);
    for (auto& r : ranges) {
      size_t len = 0;
      if (Error e = startReadLocked(r.n, r.offset, &len)) return e;
      r.done = len;
      if (len == 0) continue;
      if (has_inline_) {
        readInlineLocked(static_cast<uint8_t*>(r.buf), len, r.offset);
      } else {
        spans.push_back({r.offset, len, static_cast<uint8_t*>(r.buf)});
      }
    }
  }
  Status s = client_->readMany(inode_, spans);
  if (!s.ok()) {
    for (auto& r : ranges) r.done = 0;
    return toError(s, path_);
  }
  return {};
}

Error FileImpl::pwriteDirect(const void* buf, size_t n, uint64_t offset, size_t* done,
                             bool append) {
  *done = 0;
  {
    std::lock_guard lock(mu_);
    // O_APPEND with O_DIRECT: at the end as it is now (writes racing past
    // it may overlap, as two appending direct writers on a network file
    // system do).
    if (append) offset = size_;
    if (Status s = clipToMaxSize(offset, &n); !s.ok()) return toError(s, path_);
    if (Status q = client_->reserveTo(inode_.ino(), offset + n); !q.ok()) return toError(q, path_);
    if (Status c = ensureChunkedLocked(); !c.ok()) return toError(c, path_);
    if (Status c = beforeChunkWriteLocked(); !c.ok()) return toError(c, path_);
    // Buffered bytes first, so that they cannot land over this write later.
    Status s = flushLocked();
    if (!s.ok()) return toError(s, path_);
    rbuf_len_ = 0;
    dropPrefetch();
    wrote_ = true;
  }
  Status s = client_->writeData(inode_, offset, n, static_cast<const uint8_t*>(buf));
  if (!s.ok()) return toError(s, path_);
  std::lock_guard lock(mu_);
  size_ = std::max(size_, offset + n);
  *done = n;
  return {};
}

Status FileImpl::settleLocked() {
  RETURN_ON_ERROR(flushLocked());
  if (!sticky_error_.ok()) return sticky_error_;
  return wrote_ ? client_->syncWrites() : Status::OK();
}

Status FileImpl::syncLocked() {
  // The bytes on the servers' disks before the length that covers them.
  RETURN_ON_ERROR(settleLocked());
  // The length, durable with every namespace change before it (the file's
  // create among them); with nothing to record, those changes alone.
  if (wrote_ || size_ > meta_size_) {
    ASSIGN_OR_RETURN(last_inode_, client_->metaClose(inode_.ino(), 0, size_, wrote_, nullptr,
                                                     /*durable=*/true));
    meta_size_ = size_;
    wrote_ = false;
    return Status::OK();
  }
  return client_->metaSync();
}

Error FileImpl::sync() {
  std::lock_guard lock(mu_);
  return toError(syncLocked(), path_);
}

Status FileImpl::flushBuffers() {
  std::lock_guard lock(mu_);
  Status s = flushLocked();
  rbuf_len_ = 0;
  dropPrefetch();
  if (s.ok()) s = sticky_error_;
  return s;
}

void FileImpl::setSize(uint64_t size) {
  std::lock_guard lock(mu_);
  (void)drainLocked();  // no older write may land past the new end
  size_ = size;
  meta_size_ = size;
  if (size < inline_.size()) inline_.resize(static_cast<size_t>(size));  // cut in place by meta
  rbuf_len_ = 0;
  dropPrefetch();
}

Error FileImpl::syncAndEnd(uint64_t session) {
  std::lock_guard lock(mu_);
  if (closeInlineLocked(session)) return {};
  Status s = settleLocked();
  if (!s.ok()) {
    if (session != 0) (void)client_->metaClose(inode_.ino(), session, meta_size_, false);
    return toError(s, path_);
  }
  if (session == 0 && !wrote_ && size_ <= meta_size_) return {};
  // Bytes in chunks were synced above (settleLocked): their length is made
  // durable with them, so that a crash after close never leaves a file
  // shorter than what its writer closed. Inline files and the namespace
  // wait for fsync (or the KV's lazy sync).
  auto n = client_->metaClose(inode_.ino(), session, size_, wrote_, nullptr,
                              /*durable=*/wrote_ && namespace_synced_);
  if (!n.ok()) return toError(n.status(), path_);
  last_inode_ = *n;
  meta_size_ = size_;
  wrote_ = false;
  return {};
}

Error FileImpl::extendTo(uint64_t end) {
  std::lock_guard lock(mu_);
  if (end <= size_) return {};
  if (end > meta::kMaxFileBytes) return toError(Status(ErrorCode::kFileTooLarge), path_);
  Status s = ensureChunkedLocked();
  if (s.ok()) s = settleLocked();
  if (!s.ok()) return toError(s, path_);
  fresh_ = false;  // the file is no longer its creator's small write alone
  auto n = client_->metaClose(inode_.ino(), 0, end, true);
  if (!n.ok()) return toError(n.status(), path_);
  last_inode_ = *n;
  wrote_ = false;
  meta_size_ = n->size();
  size_ = std::max(size_, meta_size_);
  rbuf_len_ = 0;
  dropPrefetch();
  return {};
}

meta::Inode FileImpl::lastInode() const {
  std::lock_guard lock(mu_);
  return last_inode_;
}

}  // namespace cistern::client
