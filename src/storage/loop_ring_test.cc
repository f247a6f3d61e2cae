// LoopRing: reads submitted from coroutines on one io_context thread complete
// through its event loop, with each request's own result.
#include "storage/loop_ring.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <asio/co_spawn.hpp>
#include <asio/detached.hpp>
#include <asio/io_context.hpp>
#include <asio/post.hpp>
#include <asio/this_coro.hpp>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <thread>
#include <vector>

namespace cistern::storage {
namespace {

class LoopRingTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/cistern-loop-ring-XXXXXX";
    fd_ = ::mkstemp(tmpl);
    ASSERT_GE(fd_, 0);
    path_ = tmpl;
    content_.resize(kFileBytes);
    for (size_t i = 0; i < content_.size(); ++i)
      content_[i] = static_cast<uint8_t>(i * 7 + i / 4096);
    ASSERT_EQ(::pwrite(fd_, content_.data(), content_.size(), 0),
              static_cast<ssize_t>(content_.size()));
  }
  void TearDown() override {
    ::close(fd_);
    std::filesystem::remove(path_);
  }
  // Runs `body` as a coroutine on a fresh thread with its own io_context
  // (a thread's ring serves the first io_context it is used with).
  template <typename Body>
  void onLoop(Body body) {
    std::thread t([&] {
      asio::io_context ctx(1);
      asio::co_spawn(ctx, body, asio::detached);
      ctx.run();
    });
    t.join();
  }

  static constexpr size_t kFileBytes = 1 << 20;
  int fd_ = -1;
  std::string path_;
  std::vector<uint8_t> content_;
};

TEST_F(LoopRingTest, ConcurrentReadsCompleteWithTheirOwnBytes) {
  constexpr int kReaders = 600;  // together more than the ring holds
  std::vector<std::vector<uint8_t>> bufs(kReaders, std::vector<uint8_t>(4096));
  std::vector<int> results(kReaders, -1);
  int done = 0;
  onLoop([&]() -> asio::awaitable<void> {
    auto ex = co_await asio::this_coro::executor;
    LoopRing* ring = LoopRing::forThread(ex);
    if (!ring) co_return;
    for (int i = 0; i < kReaders; ++i) {
      asio::co_spawn(
          ex,
          [&, i, ring]() -> asio::awaitable<void> {
            IoRequest q = IoRequest::readOf(fd_, bufs[i].data(), 4096, (i % 256) * 4096);
            co_await ring->run({&q, 1}, {&results[i], 1});
            ++done;
          },
          asio::detached);
    }
  });
  ASSERT_EQ(done, kReaders) << "every reader resumed";
  for (int i = 0; i < kReaders; ++i) {
    ASSERT_EQ(results[i], 4096) << i;
    EXPECT_EQ(std::memcmp(bufs[i].data(), content_.data() + (i % 256) * 4096, 4096), 0) << i;
  }
}

TEST_F(LoopRingTest, EachRequestGetsItsResultOrErrno) {
  std::vector<uint8_t> a(8192), b(4096), c(4096), d(4096);
  int results[4] = {0, 0, 0, 0};
  bool ran = false;
  onLoop([&]() -> asio::awaitable<void> {
    LoopRing* ring = LoopRing::forThread(co_await asio::this_coro::executor);
    if (!ring) co_return;
    IoRequest q[4] = {
        IoRequest::readOf(fd_, a.data(), a.size(), 4096),               // whole
        IoRequest::readOf(fd_, b.data(), b.size(), kFileBytes - 100),   // short at the end
        IoRequest::readOf(fd_, c.data(), c.size(), kFileBytes + 4096),  // past the end
        IoRequest::readOf(-1, d.data(), d.size(), 0),                   // a bad descriptor
    };
    co_await ring->run(q, results);
    EXPECT_EQ(ring->inFlight(), 0u);
    ran = true;
  });
  ASSERT_TRUE(ran) << "io_uring is available here";
  EXPECT_EQ(results[0], 8192);
  EXPECT_EQ(std::memcmp(a.data(), content_.data() + 4096, a.size()), 0);
  EXPECT_EQ(results[1], 100);
  EXPECT_EQ(std::memcmp(b.data(), content_.data() + kFileBytes - 100, 100), 0);
  EXPECT_EQ(results[2], 0);
  EXPECT_EQ(results[3], -EBADF);
}

TEST_F(LoopRingTest, MoreRequestsThanTheRingHoldsAreRefusedUnsubmitted) {
  constexpr size_t kMany = 300;
  std::vector<uint8_t> buf(kMany * 16);
  std::vector<IoRequest> q;
  for (size_t i = 0; i < kMany; ++i) q.push_back(IoRequest::readOf(fd_, &buf[i * 16], 16, i * 16));
  std::vector<int> results(kMany, 1);
  bool ran = false;
  onLoop([&]() -> asio::awaitable<void> {
    LoopRing* ring = LoopRing::forThread(co_await asio::this_coro::executor);
    if (!ring) co_return;
    co_await ring->run(q, results);
    EXPECT_EQ(ring->inFlight(), 0u);
    // The ring still works afterwards.
    int one = 0;
    co_await ring->run({q.data(), 1}, {&one, 1});
    EXPECT_EQ(one, 16);
    ran = true;
  });
  ASSERT_TRUE(ran);
  for (size_t i = 0; i < kMany; ++i) ASSERT_EQ(results[i], -EBUSY) << i;
}

// Requests queued by handlers that run one after another are submitted
// together once the loop has run them all, or as soon as 8 of them wait: a
// handler that runs after 7 queued reads sees none in flight yet, one that
// runs after 8 sees all 8 submitted. (Reads of an empty pipe stay in flight
// until bytes are written to it.)
TEST_F(LoopRingTest, EightQueuedRequestsGoToTheKernelWithoutWaitingForTheLoop) {
  for (int readers : {7, 8, 9}) {
    int p[2];
    ASSERT_EQ(::pipe2(p, O_CLOEXEC), 0);
    std::vector<uint8_t> got(static_cast<size_t>(readers), 0);
    std::vector<int> results(static_cast<size_t>(readers), -1);
    uint32_t seen_in_flight = 1000;
    int done = 0;
    onLoop([&]() -> asio::awaitable<void> {
      auto ex = co_await asio::this_coro::executor;
      LoopRing* ring = LoopRing::forThread(ex);
      if (!ring) co_return;
      // Each reader starts from a handler of its own, queued ahead of the
      // check (co_spawn on the loop's own thread runs a coroutine at once).
      for (int i = 0; i < readers; ++i) {
        asio::post(ex, [&, i, ring, ex] {
          asio::co_spawn(
              ex,
              [&, i, ring]() -> asio::awaitable<void> {
                IoRequest q = IoRequest::readOf(p[0], &got[static_cast<size_t>(i)], 1, 0);
                co_await ring->run({&q, 1}, {&results[static_cast<size_t>(i)], 1});
                ++done;
              },
              asio::detached);
        });
      }
      asio::post(ex, [&, ring] {
        seen_in_flight = ring->inFlight();
        std::vector<uint8_t> bytes(static_cast<size_t>(readers), 0x5a);
        EXPECT_EQ(::write(p[1], bytes.data(), bytes.size()), readers);
      });
    });
    ::close(p[0]);
    ::close(p[1]);
    ASSERT_EQ(done, readers) << "io_uring is available here, and every read ended";
    EXPECT_EQ(seen_in_flight, readers >= 8 ? 8u : 0u) << readers << " readers";
    for (int i = 0; i < readers; ++i) {
      EXPECT_EQ(results[static_cast<size_t>(i)], 1) << i;
      EXPECT_EQ(got[static_cast<size_t>(i)], 0x5a) << i;
    }
  }
}

// A thread's ring serves the io_context it was made for, not another one
// the thread runs later (whose completions its event loop would not see).
TEST_F(LoopRingTest, ARingServesOnlyItsOwnIoContext) {
  bool first = false, second = true;
  std::thread t([&] {
    asio::io_context a(1), b(1);
    asio::co_spawn(
        a,
        [&]() -> asio::awaitable<void> {
          first = LoopRing::forThread(co_await asio::this_coro::executor) != nullptr;
        },
        asio::detached);
    a.run();
    asio::co_spawn(
        b,
        [&]() -> asio::awaitable<void> {
          second = LoopRing::forThread(co_await asio::this_coro::executor) != nullptr;
        },
        asio::detached);
    b.run();
  });
  t.join();
  EXPECT_TRUE(first);
  EXPECT_FALSE(second);
}

}  // namespace
}  // namespace cistern::storage
