// A fixed set of threads, each running its own asio::io_context.
//
// Connections are spread over the contexts round-robin and stay on one for
// their lifetime, so a connection's state is touched by one thread only and
// needs no locks. stop() ends every context and joins the threads; it is
// called by the destructor. Thread-safe: next() may be called from any thread.
#pragma once

#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>

#include <atomic>
#include <memory>
#include <string>
#include <thread>
#include <vector>

namespace cistern::net {

class IoPool {
 public:
  // `threads` == 0 means one per core. `name` prefixes the thread names.
  IoPool(uint32_t threads, std::string name);
  ~IoPool();
  IoPool(const IoPool&) = delete;
  IoPool& operator=(const IoPool&) = delete;

  asio::io_context& next();
  asio::io_context& at(size_t i) { return *contexts_[i]; }
  size_t size() const { return contexts_.size(); }
  void stop();

 private:
  using Guard = asio::executor_work_guard<asio::io_context::executor_type>;
  std::vector<std::unique_ptr<asio::io_context>> contexts_;
  std::vector<Guard> guards_;
  std::vector<std::thread> threads_;
  std::atomic<size_t> next_{0};
  bool stopped_ = false;
};

}  // namespace cistern::net
