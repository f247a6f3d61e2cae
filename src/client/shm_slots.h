// Same-host reads and writes through shared memory (docs/client.md,
// "Same-host reads and writes").
//
// The client owns one memfd: a 4 KiB header page holding a random token, then
// `slots` slots of `slot_bytes`. Each storage server on this host maps it
// once (ShmAttach, storage/shm_registry.h) and then reads chunk bytes
// straight into a slot that the client names in its BatchRead (the client
// copies them out), or takes the bytes of a Write from the slot it names (the
// client copied them in). No socket carries the data. Servers on other hosts
// refuse the attach and keep getting the socket. Thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "client/heap_buffer.h"
#include "net/endpoint.h"

namespace cistern::storage {
class ShmAttachReq;
}

namespace cistern::client {

class ShmSlots {
 public:
  // About `bytes` of memory in 16 slots of 64 KiB to 4 MiB (a default chunk
  // is 1 MiB; longer pieces are read a slot at a time), then `windows`
  // read-ahead windows of `window_bytes` (4 KiB multiples). Null when the
  // memory cannot be made (the reason is logged).
  static std::unique_ptr<ShmSlots> create(uint64_t bytes, uint32_t windows = 0,
                                          uint64_t window_bytes = 0);
  ~ShmSlots();
  ShmSlots(const ShmSlots&) = delete;
  ShmSlots& operator=(const ShmSlots&) = delete;

  uint32_t slotBytes() const { return slot_bytes_; }
  // A free slot, or -1 when all are in use.
  int take();
  // `clean`: no server can still be writing into it. A slot given back
  // unclean (its call ended before the server answered) is never reused.
  void give(int slot, bool clean);
  uint8_t* data(int slot) const { return base_ + offset(slot); }
  uint64_t offset(int slot) const { return kHeaderBytes + uint64_t(slot) * slot_bytes_; }
  void fillAttach(storage::ShmAttachReq* req) const;

  // Read-ahead windows: lent to one file handle at a time, which has servers
  // read straight into it (no slot, no copy). A free window, or -1.
  int lendWindow();
  uint8_t* windowData(int w) const { return windows_base_ + uint64_t(w) * window_bytes_; }
  uint64_t windowBytes() const { return window_bytes_; }
  // The offset of [p, p + n) in the memory if it lies in one lent window.
  std::optional<uint64_t> windowOffset(const uint8_t* p, uint64_t n) const;
  // A call that reads into the window at `p` ended before the server
  // answered: it may still write into it. Its holder must not trust its
  // bytes (windowPoisoned) and the window is never lent again.
  void poisonWindow(const uint8_t* p);
  bool windowPoisoned(int w) const;
  void returnWindow(int w);

  // What the client knows of a server's attachment.
  static constexpr uint64_t kNotTried = 0;
  static constexpr uint64_t kAttaching = ~uint64_t{1};  // another call is attaching
  static constexpr uint64_t kRefused = ~uint64_t{0};    // another host: the socket
  // The server's handle, or one of the values above; kNotTried becomes
  // kAttaching for the one caller that should attach.
  uint64_t handleFor(const net::Endpoint& server);
  void setHandle(const net::Endpoint& server, uint64_t handle);
  // The server no longer knows `handle`: the next read attaches anew. A
  // no-op if the client has attached again meanwhile (a read that used the
  // old handle can end after the new attach).
  void dropHandle(const net::Endpoint& server, uint64_t handle);
  // Every (server, handle) attached, for detaching.
  std::vector<std::pair<net::Endpoint, uint64_t>> attached() const;

 private:
  static constexpr uint64_t kHeaderBytes = 4096;
  ShmSlots() = default;
  // The window that [p, p + n) lies in, if any.
  std::optional<size_t> windowOf(const uint8_t* p, uint64_t n) const;

  int fd_ = -1;
  uint8_t* base_ = nullptr;
  uint64_t bytes_ = 0;
  uint32_t slot_bytes_ = 0;
  std::string token_;
  mutable std::mutex mu_;
  std::vector<int> free_;
  uint8_t* windows_base_ = nullptr;
  uint64_t window_bytes_ = 0;
  enum class WindowState : uint8_t { kFree, kLent, kPoisoned, kRetired };
  std::vector<WindowState> windows_;
  std::map<std::string, std::pair<net::Endpoint, uint64_t>> handles_;  // by endpoint text
};

// A buffer for reads: a window of the client's shared memory when one is
// free (servers on this host read straight into it), else the heap. Movable;
// gives its window back when destroyed.
class ShmWindow {
 public:
  ShmWindow() = default;
  ShmWindow(ShmWindow&& o) noexcept { *this = std::move(o); }
  ShmWindow& operator=(ShmWindow&& o) noexcept;
  ~ShmWindow() { release(); }
  uint8_t* data() const { return shm_window_ >= 0 ? shm_->windowData(shm_window_) : heap_.data(); }
  // A window of the shared memory (not the heap).
  bool shared() const { return shm_window_ >= 0; }
  // Room for `n` bytes: a shared window when `shm` (may be null) has one
  // free and windows hold `n`, else the heap. Contents are not kept.
  void ensure(ShmSlots* shm, size_t n);
  // A shared window for `n` bytes if `shm` has one free (true), else none.
  bool borrow(ShmSlots* shm, size_t n);
  // After a read into it: false when a server may still write into it (its
  // call ended unanswered); the window is then given up for good and heap
  // memory takes its place, and the caller must read again.
  bool intact();

 private:
  void release();
  ShmSlots* shm_ = nullptr;
  int shm_window_ = -1;
  HeapBuffer heap_;
};

}  // namespace cistern::client
