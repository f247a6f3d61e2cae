// Internal to the RPC code (both connection kinds): bytes received ahead of
// what a connection's reader asked for. A small read (a frame header, a message) refills the
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

  bool empty() const { return begin_ == end_; }
  void clear() { begin_ = end_ = 0; }

  // The steps of a read, for readers of either kind (a coroutine on a
  // socket, a blocking recv): take() what is buffered; while bytes are still
  // wanted (`rest`), receive into target(rest) and pass what came to landed().
  //
  // Copies buffered bytes into the front of `out`; returns how many.
  size_t take(std::span<uint8_t> out, uint32_t* crc) {
    size_t n = std::min(out.size(), end_ - begin_);
    if (n == 0) return 0;
    std::memcpy(out.data(), data_.get() + begin_, n);
    if (crc) *crc = crc32cExtend(*crc, out.data(), n);
    begin_ += n;
    return n;
  }
  // Where to receive the next bytes of `rest`: straight into it when it is
  // at least as large as the buffer, else into the (empty) buffer.
  std::span<uint8_t> target(std::span<uint8_t> rest) {
    if (rest.size() >= capacity_) return rest;
    begin_ = end_ = 0;
    return {data_.get(), capacity_};
  }
  // `n` bytes arrived in `into` (from target(rest)); returns how many of
  // them are now in the front of `rest`.
  size_t landed(std::span<uint8_t> rest, std::span<uint8_t> into, size_t n, uint32_t* crc) {
    if (into.data() != data_.get()) {
      if (crc) *crc = crc32cExtend(*crc, rest.data(), n);
      return n;
    }
    end_ = n;
    return take(rest, crc);
  }

  // Fills `out` exactly from `socket`. When `crc` is set, extends it over the
  // bytes as they arrive. Returns how many bytes were placed in `out`; fewer
  // than out.size() only with `ec` set (EOF, reset).
  template <typename Socket>
  asio::awaitable<size_t> read(Socket& socket, std::span<uint8_t> out, uint32_t* crc,
                               asio::error_code& ec) {
    ec = {};
    size_t done = take(out, crc);
    while (done < out.size() && !ec) {
      std::span<uint8_t> rest = out.subspan(done);
      std::span<uint8_t> into = target(rest);
      size_t n = co_await socket.async_read_some(asio::buffer(into.data(), into.size()),
                                                 asio::redirect_error(asio::use_awaitable, ec));
      done += landed(rest, into, n, crc);  // bytes that came with an error are the stream's
    }
    co_return done;
  }

 private:
  std::unique_ptr<uint8_t[]> data_;
  size_t capacity_;
  size_t begin_ = 0, end_ = 0;
};

}  // namespace cistern::net
