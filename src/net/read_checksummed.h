// Internal to the RPC code: reads a payload and checksums each piece as soon
// as it arrives, while it is still in the CPU cache, instead of re-reading the
// whole payload from memory afterwards.
#pragma once

#include <asio/awaitable.hpp>
#include <asio/redirect_error.hpp>
#include <asio/use_awaitable.hpp>

#include <span>

#include "common/crc32c.h"

namespace cistern::net {

// Reads exactly buf.size() bytes. When `crc` is set, extends it over the bytes.
template <typename Socket>
asio::awaitable<asio::error_code> readChecksummed(Socket& socket, std::span<uint8_t> buf,
                                                  uint32_t* crc) {
  asio::error_code ec;
  size_t done = 0;
  while (done < buf.size()) {
    size_t n = co_await socket.async_read_some(asio::buffer(buf.data() + done, buf.size() - done),
                                               asio::redirect_error(asio::use_awaitable, ec));
    if (crc) *crc = crc32cExtend(*crc, buf.data() + done, n);
    done += n;
    if (ec) co_return ec;
  }
  co_return ec;
}

}  // namespace cistern::net
