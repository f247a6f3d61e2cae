// BufferPool: reusable byte buffers for payloads.
//
// Touching fresh memory is slow and allocation per request grows RSS in
// bursts, so payload buffers are recycled. get(n) returns a buffer of at
// least n bytes (contents undefined) from a power-of-two size class; dropping
// the PooledBuffer returns it to the pool unless the pool already caches
// cached_bytes_max. Thread-safe. Buffers may outlive the BufferPool object
// (the shared state stays until the last buffer is gone). Buffers are 4 KiB
// aligned, so that O_DIRECT reads can land in them without a bounce copy;
// those of 1 MiB and more lie in 2 MiB pages (common/io_memory.h) where the
// kernel has them, so that such a read is one segment: a 1 MiB buffer is half
// of a 2 MiB region whose other half goes to the pool (the region is
// unmapped when both halves are dropped).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

namespace cistern::net {

class BufferPool;

class PooledBuffer {
 public:
  PooledBuffer() = default;
  PooledBuffer(PooledBuffer&&) noexcept = default;
  PooledBuffer& operator=(PooledBuffer&& o) noexcept {
    release();
    data_ = std::move(o.data_);
    capacity_ = o.capacity_;
    size_ = o.size_;
    state_ = std::move(o.state_);
    return *this;
  }
  ~PooledBuffer() { release(); }

  uint8_t* data() { return data_.get(); }
  const uint8_t* data() const { return data_.get(); }
  size_t size() const { return size_; }
  size_t capacity() const { return capacity_; }
  std::span<uint8_t> span() { return {data_.get(), size_}; }
  std::span<const uint8_t> span() const { return {data_.get(), size_}; }

 private:
  friend class BufferPool;
  struct State;
  void release();
  struct Slab;
  struct Free {
    Free() noexcept {}
    Free(Slab* s, size_t region) noexcept : slab(s), region_bytes(region) {}
    Slab* slab = nullptr;     // one of the buffers a region was cut into
    size_t region_bytes = 0;  // else a region of its own, or 0: malloc'ed
    void operator()(uint8_t* p) const;
  };
  using Bytes = std::unique_ptr<uint8_t, Free>;
  Bytes data_;
  size_t capacity_ = 0;
  size_t size_ = 0;
  std::shared_ptr<State> state_;
};

class BufferPool {
 public:
  // Default: cache up to 256 MiB of free buffers.
  explicit BufferPool(size_t cached_bytes_max = 256u << 20);
  PooledBuffer get(size_t n);

 private:
  void allocateHuge(PooledBuffer& b, size_t size_class);
  std::shared_ptr<PooledBuffer::State> state_;
};

}  // namespace cistern::net
