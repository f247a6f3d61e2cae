// HeapBuffer: a reusable heap buffer that only grows (FileImpl's write and
// read buffers, ShmWindow's fallback). Not zeroed; ensure() does not keep
// the contents when it grows, grow() does. Movable: the moved-from buffer
// is empty. ensure(n, /*huge=*/true) of at least kHugeMin bytes maps it in
// 2 MiB pages, aligned to them (common/io_memory.h): what a short-circuit
// read's direct I/O lands in fastest (docs/client.md). Such buffers, once
// dropped, are kept for the next (at most kHugeKeptBytes in the process):
// touching fresh memory is slow here, and handles come and go.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <new>
#include <utility>

#include "common/io_memory.h"

namespace cistern::client {

struct HeapBuffer {
  static constexpr size_t kHugeMin = size_t{1} << 20;
  static constexpr size_t kHugeKeptBytes = size_t{64} << 20;

  HeapBuffer() = default;
  HeapBuffer(HeapBuffer&& o) noexcept
      : bytes_(std::exchange(o.bytes_, nullptr)),
        capacity_(std::exchange(o.capacity_, 0)),
        huge_(std::exchange(o.huge_, false)) {}
  HeapBuffer& operator=(HeapBuffer&& o) noexcept {
    if (this != &o) {
      reset();
      bytes_ = std::exchange(o.bytes_, nullptr);
      capacity_ = std::exchange(o.capacity_, 0);
      huge_ = std::exchange(o.huge_, false);
    }
    return *this;
  }
  HeapBuffer(const HeapBuffer&) = delete;
  HeapBuffer& operator=(const HeapBuffer&) = delete;
  ~HeapBuffer() { reset(); }

  uint8_t* data() const { return bytes_; }
  size_t size() const { return capacity_; }
  // Makes room for at least `n` bytes; the contents are not kept. `huge`:
  // from kHugeMin bytes on, in 2 MiB pages (when they cannot be mapped, the
  // plain heap).
  void ensure(size_t n, bool huge = false) {
    if (n <= capacity_ && (huge_ || !huge || n < kHugeMin)) return;
    reset();
    if (huge && n >= kHugeMin) {
      if (uint8_t* p = takeHuge(n)) {
        bytes_ = p;
        capacity_ = n;
        huge_ = true;
        return;
      }
    }
    bytes_ = new uint8_t[n];  // default-initialized: not zeroed
    capacity_ = n;
  }
  // Makes room for at least `n` bytes, keeping the first `keep`.
  void grow(size_t n, size_t keep) {
    if (n <= capacity_) return;
    auto* bigger = new uint8_t[n];
    if (keep > 0) std::memcpy(bigger, bytes_, keep);
    reset();
    bytes_ = bigger;
    capacity_ = n;
  }

 private:
  // A kept buffer of exactly `n` bytes, else a new one (null if none can be mapped).
  static uint8_t* takeHuge(size_t n);
  // Keeps the buffer for takeHuge() while under kHugeKeptBytes, else unmaps it.
  static void giveHuge(uint8_t* p, size_t n);
  void reset() {
    if (huge_) {
      giveHuge(bytes_, capacity_);
    } else {
      delete[] bytes_;
    }
    bytes_ = nullptr;
    capacity_ = 0;
    huge_ = false;
  }

  uint8_t* bytes_ = nullptr;
  size_t capacity_ = 0;
  bool huge_ = false;
};

}  // namespace cistern::client
