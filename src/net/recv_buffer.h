// Internal to the RPC code: bytes received ahead of what a connection's
// reader asked for. A small read (a frame header, a message) refills the
// buffer with one recv of up to its capacity, so a header, its message and a
// small payload — often the next frame too — take one system call instead of
// one each; a read at least as large as the buffer goes straight into its
// destination (no copy).
#pragma once

#include <asio/awaitable.hpp>
#include <asio/buffer.hpp>
#include <asio/redirect_error.hpp>
#include <asio/use_awaitable.hpp>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <span>

#include "common/crc32c.h"

namespace cistern::net {

class RecvBuffer {
 public:
  explicit RecvBuffer(size_t capacity = 16 * 1024)
      : data_(std::make_unique<uint8_t[]>(capacity)), capacity_(capacity) {}

  // Fills `out` exactly, from the buffered bytes first. When `crc` is set,
  // extends it over the bytes as they arrive. Returns how many bytes were
  // placed in `out`; fewer than out.size() only with `ec` set (EOF, reset).
  template <typename Socket>
  asio::awaitable<size_t> read(Socket& socket, std::span<uint8_t> out, uint32_t* crc,
                               asio::error_code& ec) {
    ec = {};
    size_t done = 0;
    auto take = [&] {
      size_t n = std::min(out.size() - done, end_ - begin_);
      if (n == 0) return;
      std::memcpy(out.data() + done, data_.get() + begin_, n);
      if (crc) *crc = crc32cExtend(*crc, out.data() + done, n);
      begin_ += n;
      done += n;
    };
    take();
    while (done < out.size()) {
      const size_t want = out.size() - done;
      if (want >= capacity_) {
        size_t n = co_await socket.async_read_some(asio::buffer(out.data() + done, want),
                                                   asio::redirect_error(asio::use_awaitable, ec));
        if (crc) *crc = crc32cExtend(*crc, out.data() + done, n);
        done += n;
      } else {
        begin_ = 0;
        end_ = co_await socket.async_read_some(asio::buffer(data_.get(), capacity_),
                                               asio::redirect_error(asio::use_awaitable, ec));
        take();  // bytes that came with an error are still the stream's
      }
      if (ec) break;
    }
    co_return done;
  }

 private:
  std::unique_ptr<uint8_t[]> data_;
  size_t capacity_;
  size_t begin_ = 0, end_ = 0;
};

}  // namespace cistern::net
