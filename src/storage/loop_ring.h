// LoopRing: an io_uring whose completions an asio I/O thread's own event loop
// picks up (through an eventfd), so that a coroutine on that thread waits
// for disk I/O without blocking the thread or handing the work to another
// one and back. StorageService serves small reads this way (docs/chunk_format.md,
// "Small reads on the I/O threads").
//
// One ring per thread, made on first use by forThread(); it lives until its
// io_context shuts down (its eventfd is registered there) and, before it
// goes, waits for the I/O still in flight (whose buffers the kernel may
// still be writing). Used only by its own thread.
#pragma once

#include <asio/any_io_executor.hpp>
#include <asio/awaitable.hpp>

#include <cstdint>
#include <span>

#include "storage/io_backend.h"

namespace cistern::storage {

class LoopRing {
 public:
  // The calling thread's ring; `ex` is the executor of the io_context this
  // thread runs. Null where io_uring cannot be set up, or where the thread's
  // ring belongs to another io_context: the caller then uses a thread pool.
  static LoopRing* forThread(const asio::any_io_executor& ex);

  virtual ~LoopRing() = default;
  // Performs `requests` and stores each one's result (bytes transferred or
  // -errno) in `results`, then resumes the caller on its executor; -EBUSY
  // for every request when the ring has no room for them all (then nothing
  // was submitted). The requests and buffers must stay valid until then.
  virtual asio::awaitable<void> run(std::span<IoRequest> requests, std::span<int> results) = 0;
  // Requests submitted and not completed.
  virtual uint32_t inFlight() const = 0;
};

}  // namespace cistern::storage
