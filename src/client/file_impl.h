// FileImpl: an open file of libcistern — its write buffer (at most one
// chunk, always within one chunk so a flush is one chunk write; a full one is
// written behind, see Client::Options::write_behind_bytes) and its
// read-ahead (a window that doubles on each sequential read, from 128 KiB up
// to Options::readahead_max_bytes; a random read resets it). While the caller
// consumes one window the next is already being read (double buffering). The
// buffers are allocated once per handle and reused: memory per handle is at
// most two chunks + max(write_behind_bytes, one chunk) + 2 ×
// readahead_max_bytes. All calls on one handle are serialized by its mutex.
#pragma once

#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "client/client_impl.h"
#include "client/heap_buffer.h"
#include "client/shm_slots.h"

namespace cistern::client {

class FileImpl final : public File {
 public:
  // `inline_data`: the bytes of a data_inline inode (from its open), which
  // reads are then served from.
  FileImpl(ClientImpl* client, std::string path, const meta::Inode& inode, uint64_t session,
           bool read, bool write, bool append, std::string inline_data = {});
  ~FileImpl() override;

  Error pread(void* buf, size_t n, uint64_t offset, size_t* done) override;
  Error pwrite(const void* buf, size_t n, uint64_t offset, size_t* done) override;
  Error fsync() override;
  Error close() override;
  uint64_t size() const override;

  // --- for the FUSE mount, which shares one FileImpl among the kernel's
  // handles of an inode and keeps the meta sessions itself ---
  // Writes buffered bytes and drops read-ahead (before a truncate).
  Error flushBuffers();
  // The file's length is now `size` (after a truncate through meta).
  void setSize(uint64_t size);
  // Flushes, then one meta Close that records the length and ends `session`
  // (0: none). The handle stays usable.
  Error syncAndEnd(uint64_t session);
  // The last meta Close answered with this inode (for close-to-open checks).
  meta::Inode lastInode() const;
  // O_DIRECT-style I/O: no read-ahead and no write buffer, and concurrent
  // calls run in parallel (the handle's lock is held only to order them
  // after buffered bytes). A write raises the length when it completes.
  Error preadDirect(void* buf, size_t n, uint64_t offset, size_t* done);
  Error pwriteDirect(const void* buf, size_t n, uint64_t offset, size_t* done);
  // This handle's session created the file: if everything it writes fits
  // Options::inline_max_bytes and stays in the write buffer until the
  // session ends, the bytes go to the metadata service with the close
  // instead of to a chunk (docs/client.md, "Inline files").
  void setFresh();
  // What an open of the inode said about inline bytes: reads are served from
  // `data` when inode.data_inline(), from storage otherwise.
  void adoptInline(const meta::Inode& inode, std::string data);
  // No write buffer and no read-ahead: writes go to storage as they come and
  // reads fetch what is asked. Keeps the memory of a mount with many open
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
  // Checks a read of n bytes at offset and flushes buffered writes first;
  // *len: how many bytes the file has there (0: none).
  Error startReadLocked(size_t n, uint64_t offset, size_t* len);
  // flushLocked(), then a failure learnt earlier, then (`sync`) the
  // client's unsynced writes made durable (ClientImpl::syncWrites).
  Status settleLocked(bool sync);
  Status syncLocked();
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
  const uint64_t session_;
  const bool can_read_, can_write_, append_;
  bool buffered_ = true;

  mutable std::mutex mu_;
  bool closed_ = false;
  bool wrote_ = false;       // since the last length update
  uint64_t size_ = 0;        // length including buffered bytes
  uint64_t meta_size_ = 0;   // length the meta service has
  Status sticky_error_;      // a failed flush: reported by fsync/close
  meta::Inode last_inode_;   // from the last meta Close
  bool fresh_ = false;       // setFresh(), and nothing of it written to storage yet
  bool has_inline_ = false;  // reads come from inline_
  std::string inline_;       // at most the service's inline limit (64 KiB)

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
