// runBlocking: runs a blocking function (a KV transaction, a sync file call)
// on a thread pool and resumes the calling coroutine on its own executor with
// the result, so I/O threads never block.
#pragma once

#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/thread_pool.hpp>
#include <asio/use_awaitable.hpp>

#include <utility>

namespace cistern::net {

template <typename F>
auto runBlocking(asio::thread_pool& pool, F f) -> asio::awaitable<decltype(f())> {
  using R = decltype(f());
  co_return co_await asio::co_spawn(
      pool, [f = std::move(f)]() mutable -> asio::awaitable<R> { co_return f(); },
      asio::use_awaitable);
}

}  // namespace cistern::net
