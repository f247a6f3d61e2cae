// runBlocking: runs a blocking function (a KV transaction, a sync file call)
// on a thread pool and resumes the calling coroutine on its own executor with
// the result, so I/O threads never block. runOn: the same for a coroutine run
// on another executor (a connection's I/O thread).
//
// Both hold the caller's context open (tracked work) while the other side
// runs, and hand that work to the posted completion, which drops it on the
// caller's thread: after its post the other thread touches nothing of the
// caller's context, so a server that has answered its calls may stop and
// destroy its contexts while that thread is still leaving its task.
// (asio::co_spawn onto another executor with use_awaitable releases a
// work-tracked executor of the caller's context on the other thread after
// the post — a use after free when the context is gone by then.)
#pragma once

#include <asio/async_result.hpp>
#include <asio/awaitable.hpp>
#include <asio/co_spawn.hpp>
#include <asio/dispatch.hpp>
#include <asio/execution/outstanding_work.hpp>
#include <asio/post.hpp>
#include <asio/prefer.hpp>
#include <asio/this_coro.hpp>
#include <asio/thread_pool.hpp>
#include <asio/use_awaitable.hpp>

#include <exception>
#include <optional>
#include <utility>

namespace cistern::net {

// Suspends the calling coroutine and calls `start(resume)`; `resume()`,
// called once from any thread, resumes the coroutine on its own executor.
template <typename Start>
asio::awaitable<void> suspendUntilResumed(Start start) {
  auto ex = co_await asio::this_coro::executor;
  auto back = asio::prefer(ex, asio::execution::outstanding_work.untracked);
  auto work = asio::prefer(ex, asio::execution::outstanding_work.tracked);
  co_await asio::async_initiate<const asio::use_awaitable_t<>&, void()>(
      [&](auto handler) {
        start([back, work = std::move(work), h = std::move(handler)]() mutable {
          // The last touch of the caller's context: `work` is dropped there.
          // On the caller's own thread (runOn to the same context) the
          // coroutine resumes at once.
          asio::dispatch(back,
                         [work = std::move(work), h = std::move(h)]() mutable { std::move(h)(); });
        });
      },
      asio::use_awaitable);
}

template <typename F>
auto runBlocking(asio::thread_pool& pool, F f) -> asio::awaitable<decltype(f())> {
  // In this coroutine's frame, which the suspended coroutine keeps alive.
  std::optional<decltype(f())> result;
  std::exception_ptr error;
  co_await suspendUntilResumed([&](auto resume) {
    asio::post(pool, [&, resume = std::move(resume)]() mutable {
      try {
        result.emplace(f());
      } catch (...) {
        error = std::current_exception();
      }
      resume();
    });
  });
  if (error) std::rethrow_exception(error);
  co_return std::move(*result);
}

// Runs `a` on `target` (another context) and returns its result here.
template <typename T, typename Executor>
asio::awaitable<T> runOn(Executor target, asio::awaitable<T> a) {
  std::optional<T> result;
  std::exception_ptr error;
  co_await suspendUntilResumed([&](auto resume) {
    asio::co_spawn(target, std::move(a),
                   [&, resume = std::move(resume)](std::exception_ptr e, T t) mutable {
                     if (e) {
                       error = e;
                     } else {
                       result.emplace(std::move(t));
                     }
                     resume();
                   });
  });
  if (error) std::rethrow_exception(error);
  co_return std::move(*result);
}

}  // namespace cistern::net
