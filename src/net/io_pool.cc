#include "net/io_pool.h"

#include <pthread.h>

#include "common/log.h"

namespace cistern::net {

IoPool::IoPool(uint32_t threads, std::string name) {
  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
  for (uint32_t i = 0; i < threads; ++i) {
    contexts_.push_back(std::make_unique<asio::io_context>(1));
    guards_.emplace_back(contexts_.back()->get_executor());
  }
  for (uint32_t i = 0; i < threads; ++i) {
    threads_.emplace_back([this, i, name] {
      std::string tname = (name + "-" + std::to_string(i)).substr(0, 15);
      pthread_setname_np(pthread_self(), tname.c_str());
      contexts_[i]->run();
    });
  }
}

IoPool::~IoPool() { stop(); }

asio::io_context& IoPool::next() {
  return *contexts_[next_.fetch_add(1, std::memory_order_relaxed) % contexts_.size()];
}

void IoPool::stop() {
  if (stopped_) return;
  stopped_ = true;
  for (auto& g : guards_) g.reset();
  for (auto& c : contexts_) c->stop();
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
}

}  // namespace cistern::net
