// Both I/O backends against a real file: two-buffer writes and reads, reads
// past the end of the file (zeros), many requests in one run, many threads
// reading at once, and errors.
#include "storage/io_backend.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>
#include <vector>

namespace cistern::storage {
namespace {

class IoBackendTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/cistern-io-XXXXXX";
    fd_ = mkstemp(tmpl);
    path_ = tmpl;
    ASSERT_GE(fd_, 0);
    auto io = makeIoBackend(GetParam());
    ASSERT_TRUE(io.ok()) << io.status().toString();
    io_ = std::move(io).value();
    EXPECT_EQ(io_->name(), GetParam());
  }
  void TearDown() override {
    ::close(fd_);
    ::unlink(path_.c_str());
  }
  int fd_;
  std::string path_;
  std::unique_ptr<IoBackend> io_;
};

TEST_P(IoBackendTest, WritesAndReadsManyRequestsAndZeroFillsPastTheEnd) {
  std::vector<uint8_t> a(5000, 'a'), b(3000, 'b');
  IoRequest w = IoRequest::writeOf(fd_, a.data(), a.size(), 100);
  w.iov[1] = {b.data(), b.size()};
  w.iovcnt = 2;
  std::vector<IoRequest> writes{w};
  std::vector<std::vector<uint8_t>> blocks;
  for (int i = 0; i < 40; ++i) blocks.emplace_back(512, static_cast<uint8_t>(i));
  for (int i = 0; i < 40; ++i)  // more than one ring's worth
    writes.push_back(IoRequest::writeOf(fd_, blocks[i].data(), 512, 10000 + 512 * i));
  ASSERT_TRUE(io_->run(writes).ok());
  EXPECT_EQ(::lseek(fd_, 0, SEEK_END), 10000 + 512 * 40);

  std::vector<uint8_t> x(5000), y(3000), tail(2000, 0xff);
  IoRequest r = IoRequest::readOf(fd_, x.data(), x.size(), 100);
  r.iov[1] = {y.data(), y.size()};
  r.iovcnt = 2;
  IoRequest past = IoRequest::readOf(fd_, tail.data(), tail.size(), 10000 + 512 * 40 - 1000);
  IoRequest rs[2] = {r, past};
  ASSERT_TRUE(io_->run(rs).ok());
  EXPECT_EQ(x, a);
  EXPECT_EQ(y, b);
  EXPECT_TRUE(std::all_of(tail.begin(), tail.begin() + 488, [](uint8_t c) { return c == 38; }));
  EXPECT_TRUE(std::all_of(tail.begin() + 1000, tail.end(), [](uint8_t c) { return c == 0; }))
      << "bytes past the end of the file must read as zeros";
}

// A direct read over the end of a file whose last block is partial (the
// last slot's CRC page, written buffered) comes back short in the middle of
// a block: the rest reads as zeros. (What made this matter, the file growing
// between the short read and a retry from the unaligned place, which then
// fails with EINVAL, is a race this test cannot stage.)
TEST_P(IoBackendTest, DirectReadsEndingInsideABlockZeroFillTheRest) {
  std::vector<uint8_t> data(8192 + 64, 'd');
  ASSERT_EQ(::pwrite(fd_, data.data(), data.size(), 0), static_cast<ssize_t>(data.size()));
  ASSERT_EQ(::fsync(fd_), 0);
  int dfd = ::open(path_.c_str(), O_RDONLY | O_DIRECT);
  if (dfd < 0) GTEST_SKIP() << "no O_DIRECT on this filesystem";
  auto* a = static_cast<uint8_t*>(std::aligned_alloc(4096, 8192));
  auto* b = static_cast<uint8_t*>(std::aligned_alloc(4096, 4096));
  std::memset(a, 0xEE, 8192);
  std::memset(b, 0xEE, 4096);
  IoRequest r = IoRequest::readOf(dfd, a, 8192, 0);
  r.iov[1] = {b, 4096};
  r.iovcnt = 2;
  Status s = io_->run({&r, 1});
  ::close(dfd);
  EXPECT_TRUE(s.ok()) << s.toString();
  EXPECT_TRUE(std::all_of(a, a + 8192, [](uint8_t c) { return c == 'd'; }));
  EXPECT_TRUE(std::all_of(b, b + 64, [](uint8_t c) { return c == 'd'; }));
  EXPECT_TRUE(std::all_of(b + 64, b + 4096, [](uint8_t c) { return c == 0; }));
  std::free(a);
  std::free(b);
}

TEST_P(IoBackendTest, ErrorsNameTheOperation) {
  std::vector<uint8_t> buf(10);
  IoRequest bad = IoRequest::readOf(-1, buf.data(), buf.size(), 0);
  Status s = io_->run({&bad, 1});
  EXPECT_EQ(s.code(), ErrorCode::kIOError);
  EXPECT_NE(s.message().find("read of 10 bytes"), std::string::npos) << s.toString();
  int ro = ::open(path_.c_str(), O_RDONLY);
  IoRequest w = IoRequest::writeOf(ro, buf.data(), buf.size(), 0);
  EXPECT_EQ(io_->run({&w, 1}).code(), ErrorCode::kIOError);
  ::close(ro);
}

// Many threads reading small pieces at once: every read gets its own bytes,
// and reads past the end zeros.
TEST_P(IoBackendTest, ConcurrentSmallReadsGetTheirOwnBytes) {
  constexpr size_t kFile = 1 << 20;
  std::vector<uint8_t> content(kFile);
  for (size_t i = 0; i < kFile; ++i) content[i] = static_cast<uint8_t>(i * 131 + i / 4096);
  ASSERT_EQ(::pwrite(fd_, content.data(), kFile, 0), static_cast<ssize_t>(kFile));
  constexpr int kThreads = 16, kReads = 500;
  std::atomic<int> bad{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<uint8_t> a(4096), b(512);
      for (int i = 0; i < kReads; ++i) {
        // Two pieces in one call; every 50th reads over the end of the file.
        uint64_t at = (static_cast<uint64_t>(t) * 7919 + static_cast<uint64_t>(i) * 4099) %
                      (kFile - a.size());
        uint64_t past = i % 50 == 0 ? kFile - 100 : at / 2;
        IoRequest q[2] = {IoRequest::readOf(fd_, a.data(), a.size(), at),
                          IoRequest::readOf(fd_, b.data(), b.size(), past)};
        if (!io_->run(q).ok() || std::memcmp(a.data(), &content[at], a.size()) != 0) {
          ++bad;
          continue;
        }
        size_t in_file = std::min<uint64_t>(b.size(), kFile - past);
        if (std::memcmp(b.data(), &content[past], in_file) != 0 ||
            !std::all_of(b.begin() + static_cast<std::ptrdiff_t>(in_file), b.end(),
                         [](uint8_t c) { return c == 0; }))
          ++bad;
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(bad.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Backends, IoBackendTest, ::testing::Values("io_uring", "psync"),
                         [](const auto& info) { return info.param; });

TEST(IoBackend, UnknownNameIsRefused) {
  auto io = makeIoBackend("aio");
  EXPECT_EQ(io.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(io.status().message().find("'aio'"), std::string::npos);
}

}  // namespace
}  // namespace cistern::storage
