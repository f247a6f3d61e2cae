#include "client/heap_buffer.h"

#include <mutex>
#include <utility>
#include <vector>

namespace cistern::client {

namespace {

struct Kept {
  std::mutex mu;
  std::vector<std::pair<uint8_t*, size_t>> buffers;
  size_t bytes = 0;
};
Kept& kept() {
  static auto* k = new Kept;  // never destroyed: buffers may be dropped at exit
  return *k;
}

}  // namespace

uint8_t* HeapBuffer::takeHuge(size_t n) {
  {
    Kept& k = kept();
    std::lock_guard lock(k.mu);
    for (auto it = k.buffers.begin(); it != k.buffers.end(); ++it) {
      if (it->second != n) continue;
      uint8_t* p = it->first;
      k.bytes -= n;
      k.buffers.erase(it);
      return p;
    }
  }
  return io_memory::allocate(n);
}

void HeapBuffer::giveHuge(uint8_t* p, size_t n) {
  {
    Kept& k = kept();
    std::lock_guard lock(k.mu);
    if (k.bytes + n <= kHugeKeptBytes) {
      k.buffers.emplace_back(p, n);
      k.bytes += n;
      return;
    }
  }
  io_memory::free(p, n);
}

}  // namespace cistern::client
