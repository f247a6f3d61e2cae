#include "net/buffer_pool.h"

#include <atomic>
#include <bit>
#include <cstdlib>
#include <new>

#include "common/io_memory.h"

namespace cistern::net {

struct PooledBuffer::Slab {
  uint8_t* base;
  std::atomic<uint32_t> live;  // its buffers not yet dropped
};

struct PooledBuffer::State {
  std::mutex mu;
  size_t cached_bytes_max;
  size_t cached_bytes = 0;
  // free_[c] holds buffers of capacity 4 KiB << c.
  std::vector<std::vector<Bytes>> free = std::vector<std::vector<Bytes>>(40);
};

namespace {
constexpr size_t kMinClass = 4096;
// Buffers at least this large come from 2 MiB pages.
constexpr size_t kHugeMin = 1 << 20;
size_t classOf(size_t n) {
  if (n <= kMinClass) return 0;
  return static_cast<size_t>(std::bit_width(n - 1)) - 12;  // ceil(log2 n) - 12
}
}  // namespace

void PooledBuffer::release() {
  if (!data_ || !state_) return;
  std::lock_guard lock(state_->mu);
  if (state_->cached_bytes + capacity_ <= state_->cached_bytes_max) {
    state_->cached_bytes += capacity_;
    state_->free[classOf(capacity_)].push_back(std::move(data_));
  }
  data_.reset();
  state_.reset();
}

BufferPool::BufferPool(size_t cached_bytes_max) : state_(std::make_shared<PooledBuffer::State>()) {
  state_->cached_bytes_max = cached_bytes_max;
}

PooledBuffer BufferPool::get(size_t n) {
  PooledBuffer b;
  size_t c = classOf(n);
  b.capacity_ = kMinClass << c;
  b.size_ = n;
  b.state_ = state_;
  {
    std::lock_guard lock(state_->mu);
    auto& list = state_->free[c];
    if (!list.empty()) {
      b.data_ = std::move(list.back());
      list.pop_back();
      state_->cached_bytes -= b.capacity_;
      return b;
    }
  }
  if (b.capacity_ >= kHugeMin && io_memory::hugePagesEnabled()) {
    allocateHuge(b, c);
    return b;
  }
  // Not value-initialized: no page touching here. Capacities are multiples
  // of 4 KiB, as aligned_alloc requires.
  b.data_.reset(static_cast<uint8_t*>(std::aligned_alloc(kMinClass, b.capacity_)));
  if (!b.data_) throw std::bad_alloc();
  return b;
}

void BufferPool::allocateHuge(PooledBuffer& b, size_t c) {
  const size_t cap = b.capacity_;
  if (cap >= io_memory::kPageBytes) {
    uint8_t* p = io_memory::allocate(cap);
    if (!p) throw std::bad_alloc();
    b.data_ = PooledBuffer::Bytes(p, PooledBuffer::Free{nullptr, cap});
    return;
  }
  // Cut one 2 MiB region into buffers of this class: the first is b's, the
  // others are cached while the pool has room (dropped otherwise).
  uint8_t* base = io_memory::allocate(io_memory::kPageBytes);
  if (!base) throw std::bad_alloc();
  const auto pieces = static_cast<uint32_t>(io_memory::kPageBytes / cap);
  auto* slab = new PooledBuffer::Slab{base, pieces};
  b.data_ = PooledBuffer::Bytes(base, PooledBuffer::Free{slab, 0});
  std::vector<PooledBuffer::Bytes> dropped;  // freed outside the lock
  std::lock_guard lock(state_->mu);
  for (uint32_t i = 1; i < pieces; ++i) {
    PooledBuffer::Bytes piece(base + i * cap, PooledBuffer::Free{slab, 0});
    if (state_->cached_bytes + cap <= state_->cached_bytes_max) {
      state_->cached_bytes += cap;
      state_->free[c].push_back(std::move(piece));
    } else {
      dropped.push_back(std::move(piece));
    }
  }
}

void PooledBuffer::Free::operator()(uint8_t* p) const {
  if (slab) {
    if (slab->live.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      io_memory::free(slab->base, io_memory::kPageBytes);
      delete slab;
    }
  } else if (region_bytes > 0) {
    io_memory::free(p, region_bytes);
  } else {
    std::free(p);
  }
}

}  // namespace cistern::net
