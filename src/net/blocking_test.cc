// runBlocking and runOn: the work runs on the pool (the other context), the
// coroutine resumes on its own context with the result or the exception, the
// caller's context stays open meanwhile, and once the coroutine has resumed
// the other thread no longer touches the caller's context.
#include "net/blocking.h"

#include <gtest/gtest.h>
#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/executor_work_guard.hpp>
#include <asio/io_context.hpp>

#include <chrono>
#include <future>
#include <memory>
#include <stdexcept>
#include <thread>
#include <vector>

namespace cistern::net {
namespace {

TEST(RunBlocking, RunsOnThePoolAndResumesOnTheCallersThread) {
  asio::thread_pool pool(2);
  asio::io_context ctx;
  std::thread::id io_thread, ran_on, resumed_on;
  int got = 0;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        got = co_await runBlocking(pool, [&] {
          ran_on = std::this_thread::get_id();
          std::this_thread::sleep_for(std::chrono::milliseconds(50));
          return 42;
        });
        resumed_on = std::this_thread::get_id();
      },
      asio::detached);
  // No work guard: run() returns only once the coroutine is done, so the
  // pending blocking call keeps the context open.
  std::thread t([&] {
    io_thread = std::this_thread::get_id();
    ctx.run();
  });
  t.join();
  EXPECT_EQ(got, 42);
  EXPECT_NE(ran_on, io_thread);
  EXPECT_EQ(resumed_on, io_thread);
  pool.join();
}

TEST(RunBlocking, AnExceptionIsRethrownInTheCoroutine) {
  asio::thread_pool pool(1);
  asio::io_context ctx;
  std::string what;
  asio::co_spawn(
      ctx,
      [&]() -> asio::awaitable<void> {
        try {
          co_await runBlocking(pool, []() -> int { throw std::runtime_error("disk on fire"); });
        } catch (const std::runtime_error& e) {
          what = e.what();
        }
      },
      asio::detached);
  ctx.run();
  EXPECT_EQ(what, "disk on fire");
  pool.join();
}

// A server answers a call and is stopped at once: its context is destroyed
// while the other thread may still be returning from its task. `await(round)`
// is what the server's coroutine awaits. Several "servers" run at once so
// that the other threads get preempted in the middle of returning; a thread
// that still held the context then crashed, hung a later round, or ASan
// reported a use after free.
template <typename Await>
void serversStopRightAfterAnswering(Await await) {
  auto rounds = [&await](int server) {
    for (int round = 0; round < 1000; ++round) {
      auto ctx = std::make_unique<asio::io_context>(1);
      auto guard = asio::make_work_guard(*ctx);
      std::thread t([&] { ctx->run(); });
      std::promise<int> answered;
      asio::co_spawn(
          *ctx, [&]() -> asio::awaitable<void> { answered.set_value(co_await await(round)); },
          asio::detached);
      auto got = answered.get_future();
      // A stale thread finishing work on a freed context that a new one
      // reused stops the new one early: the answer never comes.
      bool ready = got.wait_for(std::chrono::seconds(10)) == std::future_status::ready;
      EXPECT_TRUE(ready) << "server " << server << " round " << round;
      if (ready) {
        EXPECT_EQ(got.get(), round);
      }
      guard.reset();
      ctx->stop();
      t.join();
      ctx.reset();
      if (!ready) return;
    }
  };
  std::vector<std::thread> servers;
  for (int i = 0; i < 4; ++i) servers.emplace_back(rounds, i);
  for (auto& s : servers) s.join();
}

TEST(RunBlocking, TheCallersContextMayGoAwayOnceTheCoroutineResumed) {
  asio::thread_pool pool(4);
  serversStopRightAfterAnswering(
      [&pool](int round) { return runBlocking(pool, [round] { return round; }); });
  pool.join();
}

asio::awaitable<int> valueOnThisThread(int v, std::thread::id* ran_on) {
  if (ran_on) *ran_on = std::this_thread::get_id();
  co_return v;
}

asio::awaitable<int> peerGone() {
  throw std::runtime_error("peer gone");
  co_return 0;
}

TEST(RunOn, RunsOnTheTargetAndResumesOnTheCallersThread) {
  asio::io_context caller, target;
  auto guard = asio::make_work_guard(target);
  std::thread::id caller_thread, target_thread, ran_on, resumed_on;
  std::thread t([&] {
    target_thread = std::this_thread::get_id();
    target.run();
  });
  int got = 0;
  std::string what;
  asio::co_spawn(
      caller,
      [&]() -> asio::awaitable<void> {
        got = co_await runOn(target.get_executor(), valueOnThisThread(7, &ran_on));
        resumed_on = std::this_thread::get_id();
        try {
          co_await runOn(target.get_executor(), peerGone());
        } catch (const std::runtime_error& e) {
          what = e.what();
        }
      },
      asio::detached);
  caller_thread = std::this_thread::get_id();
  caller.run();  // no guard: returns once the coroutine is done
  guard.reset();
  t.join();
  EXPECT_EQ(got, 7);
  EXPECT_EQ(ran_on, target_thread);
  EXPECT_EQ(resumed_on, caller_thread);
  EXPECT_EQ(what, "peer gone");
}

TEST(RunOn, TheCallersContextMayGoAwayOnceTheCoroutineResumed) {
  asio::io_context target;
  auto guard = asio::make_work_guard(target);
  std::thread t([&] { target.run(); });
  serversStopRightAfterAnswering([&target](int round) {
    return runOn(target.get_executor(), valueOnThisThread(round, nullptr));
  });
  guard.reset();
  t.join();
}

}  // namespace
}  // namespace cistern::net
