// FileImpl: an inode open in libcistern — its write buffer (at most one
// chunk, always within one chunk so a flush is one chunk write; a full one is
// written behind, see Client::Options::write_behind_bytes) and its
// read-ahead (a window that doubles on each sequential read, from 128 KiB up
// to Options::readahead_max_bytes; a random read resets it). While the caller
// consumes one window the next is already being read (double buffering). The
// buffers are allocated once per open inode and reused: memory per inode is
// at most two chunks + max(write_behind_bytes, one chunk) + 2 ×
// readahead_max_bytes. Calls are serialized by its mutex (direct I/O holds it
// only to order itself after buffered bytes).
#pragma once

#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "client/client_impl.h"
#include "client/heap_buffer.h"
#include "client/shm_slots.h"

namespace cistern::client {

// One per inode open through a client (OpenFiles): every handle of the
// inode (FileHandle, open_files.h) shares it, and checks its own access
// mode; the meta sessions are the handles'.
class FileImpl {
 public:
  // `name`: how errors name the file (its path, or "inode N").
  FileImpl(ClientImpl* client, std::string name, const meta::Inode& inode);
  ~FileImpl();
  FileImpl(const FileImpl&) = delete;
  FileImpl& operator=(const FileImpl&) = delete;

  Error pread(void* buf, size_t n, uint64_t offset, size_t* done);
  // `append`: at the end of the file as this client knows it (O_APPEND).
  Error pwrite(const void* buf, size_t n, uint64_t offset, size_t* done, bool append = false);
  // fsync(2): every buffered byte in storage and synced, the length recorded.
  Error sync();
  // File::wholeContents: the inline bytes, unless this client wrote since.
  bool wholeContents(std::string* out) const;
  uint64_t size() const;
  // The length if this client wrote the file since it last recorded one
  // (nullopt: meta's length is the file's as far as this client knows).
  std::optional<uint64_t> unrecordedSize() const;

  // Writes buffered bytes and drops read-ahead (before a truncate).
  Status flushBuffers();
  // The file's length is now `size` (after a truncate through meta).
  void setSize(uint64_t size);
  // Flushes (synced when this client wrote the file since the last length
  // it recorded), then one meta Close that records the length and ends
  // `session` (0: none; nothing to record and no session: no call).
  Error syncAndEnd(uint64_t session);
  // fallocate(2) that extends: buffered bytes to storage (synced), then the
  // recorded length raised to `end` if it is less (never lowered: another
  // client may have made the file longer).
  Error extendTo(uint64_t end);
  // The inode as the last meta Close (or the open) answered.
  meta::Inode lastInode() const;
  // O_DIRECT-style I/O: no read-ahead and no write buffer, and concurrent
  // calls run in parallel (the lock is held only to order them after
  // buffered bytes). A write raises the length when it completes.
  Error preadDirect(void* buf, size_t n, uint64_t offset, size_t* done);
  // Many direct reads; ranges on one server go in one request (ClientImpl::readMany).
  Error preadManyDirect(std::span<FileRange> ranges);
  Error pwriteDirect(const void* buf, size_t n, uint64_t offset, size_t* done, bool append = false);
  // A session that created the file holds it: if everything written fits
  // Options::inline_max_bytes and stays in the write buffer until that
  // session ends, the bytes go to the metadata service with the close
  // instead of to a chunk (docs/client.md, "Inline files").
  void setFresh();
  // What another open of the inode found (close-to-open): its length, and
  // its inline bytes — reads are served from `data` when
  // inode.data_inline(), from storage otherwise. Read-ahead of a file
  // changed since is dropped. A length this client has not recorded yet
  // stands.
  void adoptOpen(const meta::Inode& inode, std::string data);
  // No write buffer and no read-ahead: writes go to storage as they come and
  // reads fetch what is asked. Keeps the memory of a client with many open
  // files bounded. Call before the first read or write.
  void setUnbuffered() { buffered_ = false; }

 private:
  // Every buffered byte in storage: the write buffer, then the buffers
  // written behind (their first error, if any, is the result).
  Status flushLocked();
  // The full write buffer starts on its way to storage and the caller goes
  // on; waits first for older buffers past write_behind_bytes, or for one
  // that overlaps (writes to the same bytes must land in order).
  Status flushBehindLocked();
  // Waits for the oldest buffer written behind; a failure becomes sticky.
  void reapOldest();
  // Waits for every buffer written behind; a failure first learnt here is
  // the result (one already sticky is not reported again).
  Status drainLocked();
  // Flushes buffered writes before a read of n bytes at offset; *len: how
  // many bytes the file has there (0: none).
  Error startReadLocked(size_t n, uint64_t offset, size_t* len);
  // flushLocked(), then a failure learnt earlier, then, when this file was
  // written since the last recorded length, the client's unsynced writes
  // made durable (ClientImpl::syncWrites): bytes reach the disks before the
  // length that covers them.
  Status settleLocked();
  Status syncLocked();
  // Before bytes go to chunks (see file.cc).
  Status beforeChunkWriteLocked();
  // The close of a fresh file with its bytes inline; false when it does not
  // apply or the service refused (the bytes are still buffered then).
  bool closeInlineLocked(uint64_t session);
  // Reads from the inline bytes (zeros past them, up to the length).
  void readInlineLocked(uint8_t* p, size_t n, uint64_t offset) const;
  // Writes need chunks: a handle that reads inline bytes moves them to
  // chunk 0 first (writers that open the file do it at open).
  Status ensureChunkedLocked();
  Status writeLocked(const uint8_t* p, size_t n, uint64_t offset);
  // Room for `need` bytes in the write buffer, keeping its wbuf_len_ bytes.
  void growBufferLocked(size_t need);
  Status readLocked(uint8_t* p, size_t n, uint64_t offset);
  void startPrefetch(uint64_t offset);
  void dropPrefetch();
  // The prefetched window becomes the current one (its call is the caller's to keep or end).
  void takePrefetched();
  uint64_t chunkSize() const { return inode_.layout().chunk_size(); }

  ClientImpl* const client_;
  const std::string path_;
  const meta::Inode inode_;  // as opened (layout, ino)
  bool buffered_ = true;

  mutable std::mutex mu_;
  bool wrote_ = false;             // since the last length update
  uint64_t size_ = 0;              // length including buffered bytes
  uint64_t meta_size_ = 0;         // length the meta service has
  Status sticky_error_;            // a failed flush: reported by fsync/close
  meta::Inode last_inode_;         // from the last meta Close
  bool fresh_ = false;             // setFresh(), and nothing of it written to storage yet
  bool namespace_synced_ = false;  // a meta Sync made before this handle's first chunk write
  bool has_inline_ = false;        // reads come from inline_
  std::string inline_;             // at most the service's inline limit (64 KiB)

  // Buffers are never zeroed: only the pages that bytes land in are touched
  // (a small file must not pay for a chunk-sized or window-sized memset).
  using Buffer = HeapBuffer;

  Buffer wbuf_;
  uint64_t wbuf_offset_ = 0;
  size_t wbuf_len_ = 0;
  // Full buffers on their way to storage, oldest first.
  struct Behind {
    Buffer buf;
    uint64_t offset = 0;
    size_t len = 0;
    std::unique_ptr<PendingIo> io;
  };
  std::deque<Behind> behind_;
  uint64_t behind_bytes_ = 0;
  std::vector<Buffer> spares_;  // written-behind buffers, reused for the next ones

  // Read-ahead windows: in the client's shared memory when one is free
  // (servers on this host read straight into them), else on the heap.
  ShmWindow rbuf_;
  uint64_t rbuf_offset_ = 0;
  size_t rbuf_len_ = 0;
  uint64_t next_sequential_ = 0;
  size_t window_ = 0;
  // rbuf_'s reads when it became the current window before they all ended
  // (heap windows only): the caller waits for the pieces it copies from.
  std::unique_ptr<PendingIo> current_;
  // The next window, read while the caller consumes rbuf_.
  ShmWindow pbuf_;
  uint64_t pbuf_offset_ = 0;
  size_t pbuf_len_ = 0;
  std::unique_ptr<PendingIo> prefetch_;
};

}  // namespace cistern::client
