#include "net/buffer_pool.h"

#include <bit>
#include <cstdlib>
#include <new>

namespace cistern::net {

struct PooledBuffer::State {
  std::mutex mu;
  size_t cached_bytes_max;
  size_t cached_bytes = 0;
  // free_[c] holds buffers of capacity 4 KiB << c.
  std::vector<std::vector<Bytes>> free = std::vector<std::vector<Bytes>>(40);
};

namespace {
constexpr size_t kMinClass = 4096;
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
  // Not value-initialized: no page touching here. Capacities are multiples
  // of 4 KiB, as aligned_alloc requires.
  b.data_.reset(static_cast<uint8_t*>(std::aligned_alloc(kMinClass, b.capacity_)));
  if (!b.data_) throw std::bad_alloc();
  return b;
}

void PooledBuffer::Free::operator()(uint8_t* p) const { std::free(p); }

}  // namespace cistern::net
