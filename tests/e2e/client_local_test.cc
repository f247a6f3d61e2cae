// libcistern inside the process of its cluster (as the FUSE mount of
// `cistern up --mount` is): metadata calls and chunk I/O run as local calls
// (net/local_call.h) — one-chunk I/O on the caller's thread, several chunks,
// read-ahead and write-behind on the client's local pool — and give the same
// bytes as a client that goes through the sockets. A failed write is reported.
#include <fcntl.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "cistern/client.h"
#include "common/fault.h"
#include "common/metrics.h"
#include "server/local_cluster.h"
#include "tests/support/client_files.h"

namespace cistern {
namespace {

using testing::fill;
using testing::firstWriteError;
using testing::readAll;
using testing::writeFile;

constexpr uint64_t kChunk = 1 << 20;  // the default layout

uint64_t bytes(const char* name, const char* path) {
  return metrics::Registry::global().counter(name, {{"path", path}}).value();
}

class LocalClient : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() / ("cistern-local-" + std::to_string(getpid()));
    std::filesystem::remove_all(dir_);
    server::LocalClusterOptions o;
    o.data_dir = dir_.string();
    o.targets = 2;
    auto c = server::LocalCluster::start(o);
    ASSERT_TRUE(c.ok()) << c.status().toString();
    cluster_ = std::move(*c);
    local_ = connect(true);
    socket_ = connect(false);
  }
  void TearDown() override {
    fault::disableAll();
    local_.reset();
    socket_.reset();
    cluster_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::unique_ptr<Client> connect(bool local_calls) {
    Client::Options o;
    o.cluster = cluster_->endpoint().toString();
    o.retry_ms = 2000;
    o.local_calls = local_calls;
    auto [c, e] = Client::connect(o);
    EXPECT_FALSE(e) << e.message;
    return std::move(c);
  }

  std::filesystem::path dir_;
  std::unique_ptr<server::LocalCluster> cluster_;
  std::unique_ptr<Client> local_, socket_;
};

TEST_F(LocalClient, FilesRoundTripAsLocalCallsAndMatchWhatTheSocketsSee) {
  const std::vector<size_t> sizes = {
      0, 1, 4095, kChunk - 1, kChunk, kChunk + 1, 3 * kChunk + kChunk / 2, 10 * kChunk};
  const uint64_t shm_read = bytes("client_read_bytes_total", "shm"),
                 socket_read = bytes("client_read_bytes_total", "socket"),
                 shm_written = bytes("client_write_bytes_total", "shm"),
                 socket_written = bytes("client_write_bytes_total", "socket"),
                 local_read = bytes("client_read_bytes_total", "local"),
                 local_written = bytes("client_write_bytes_total", "local");
  uint64_t total = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    SCOPED_TRACE(sizes[i]);
    const std::string path = "/f" + std::to_string(i);
    // Whole chunks written behind, and odd pieces that straddle chunks.
    writeFile(*local_, path, sizes[i], i + 1, i % 2 ? kChunk : 70001);
    std::vector<uint8_t> want(sizes[i]);
    fill(want.data(), want.size(), 0, i + 1);
    EXPECT_TRUE(readAll(*local_, path, 65536) == want);       // read-ahead
    EXPECT_TRUE(readAll(*local_, path, 4 * kChunk) == want);  // several chunks at once
    // Files up to the inline limit (1 and 4095 bytes) keep their bytes in meta.
    if (sizes[i] > Client::Options{}.inline_max_bytes) total += sizes[i];
  }
  // Only local calls so far: nothing through the sockets or shared memory.
  EXPECT_EQ(bytes("client_read_bytes_total", "shm"), shm_read);
  EXPECT_EQ(bytes("client_read_bytes_total", "socket"), socket_read);
  EXPECT_EQ(bytes("client_write_bytes_total", "shm"), shm_written);
  EXPECT_EQ(bytes("client_write_bytes_total", "socket"), socket_written);
  EXPECT_EQ(bytes("client_write_bytes_total", "local") - local_written, total);
  EXPECT_GE(bytes("client_read_bytes_total", "local") - local_read, 2 * total);
  // What a client in another process would read, and the other way round.
  for (size_t i = 0; i < sizes.size(); ++i) {
    SCOPED_TRACE(sizes[i]);
    std::vector<uint8_t> want(sizes[i]);
    fill(want.data(), want.size(), 0, i + 1);
    EXPECT_TRUE(readAll(*socket_, "/f" + std::to_string(i), kChunk) == want);
    writeFile(*socket_, "/g" + std::to_string(i), sizes[i], i + 100, 300000);
    fill(want.data(), want.size(), 0, i + 100);
    EXPECT_TRUE(readAll(*local_, "/g" + std::to_string(i), 3 * kChunk) == want);
  }
  CheckReport report;
  ASSERT_FALSE(local_->fsck(&report));
  EXPECT_TRUE(report.problems.empty()) << report.problems.front();
}

// The engine refuses writes after the first two: a failed write behind (on
// the local pool) or on the caller's thread is reported by a later write,
// fsync or close as EIO; nothing hangs, and the client works once the fault
// is gone.
TEST_F(LocalClient, AFailedLocalWriteIsReportedAndNothingHangs) {
  fault::enable("storage.write.after_data", fault::Spec{.code = ErrorCode::kIOError, .skip = 2});
  std::unique_ptr<File> f;
  ASSERT_FALSE(local_->open("/lost", O_WRONLY | O_CREAT | O_TRUNC, 0644, &f));
  std::vector<uint8_t> buf(kChunk);
  fill(buf.data(), buf.size(), 0, 7);
  Error failed = firstWriteError(*f, buf, 16);
  ASSERT_TRUE(failed) << "no write and no fsync reported the refused writes";
  EXPECT_EQ(failed.errno_value, EIO) << failed.message;
  EXPECT_TRUE(f->close()) << "close reported no error after a lost write";
  // One piece, written on the caller's thread (16 KiB: past the inline limit).
  ASSERT_FALSE(local_->open("/one", O_WRONLY | O_CREAT | O_TRUNC, 0644, &f));
  size_t done = 0;
  Error e = f->pwrite(buf.data(), 16 << 10, 0, &done);
  if (!e) e = f->close();
  EXPECT_EQ(e.errno_value, EIO) << e.message;
  fault::disableAll();
  writeFile(*local_, "/after", 3 * kChunk, 9, kChunk);
  std::vector<uint8_t> want(3 * kChunk);
  fill(want.data(), want.size(), 0, 9);
  EXPECT_TRUE(readAll(*local_, "/after", kChunk) == want);
}

}  // namespace
}  // namespace cistern
