// HeapBuffer: a reusable heap buffer that only grows (FileImpl's write and
// read buffers, ShmWindow's fallback). Not zeroed; ensure() does not keep
// the contents when it grows, grow() does. Movable: the moved-from buffer
// is empty.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <memory>
#include <utility>

namespace cistern::client {

struct HeapBuffer {
  std::unique_ptr<uint8_t[]> bytes;
  size_t capacity = 0;

  HeapBuffer() = default;
  HeapBuffer(HeapBuffer&& o) noexcept
      : bytes(std::move(o.bytes)), capacity(std::exchange(o.capacity, 0)) {}
  HeapBuffer& operator=(HeapBuffer&& o) noexcept {
    bytes = std::move(o.bytes);
    capacity = std::exchange(o.capacity, 0);
    return *this;
  }
  uint8_t* data() const { return bytes.get(); }
  size_t size() const { return capacity; }
  // Makes room for at least `n` bytes; the contents are not kept.
  void ensure(size_t n) {
    if (n <= capacity) return;
    bytes.reset(new uint8_t[n]);  // default-initialized: not zeroed
    capacity = n;
  }
  // Makes room for at least `n` bytes, keeping the first `keep`.
  void grow(size_t n, size_t keep) {
    if (n <= capacity) return;
    std::unique_ptr<uint8_t[]> bigger(new uint8_t[n]);
    if (keep > 0) std::memcpy(bigger.get(), bytes.get(), keep);
    bytes = std::move(bigger);
    capacity = n;
  }
};

}  // namespace cistern::client
