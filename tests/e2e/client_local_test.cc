// libcistern inside the process of its cluster (as the FUSE mount of
// `cistern up --mount` is): metadata calls and chunk I/O run as local calls
// (net/local_call.h) — one-chunk I/O on the caller's thread, several chunks,
// read-ahead and write-behind on the client's local pool — and give the same
// bytes as a client that goes through the sockets. A failed write is reported.
#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <thread>

#include "cistern/client.h"
#include "common/fault.h"
#include "common/metrics.h"
#include "net/rpc_client.h"
#include "server/local_cluster.h"
#include "storage.pb.h"
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
    server::LocalClusterOptions o;
    o.targets = 2;
    ASSERT_NO_FATAL_FAILURE(start(o));
    local_ = connect(true);
    socket_ = connect(false);
  }
  // A fresh cluster in dir_ (the clients of one before it are dropped).
  void start(server::LocalClusterOptions o) {
    local_.reset();
    socket_.reset();
    cluster_.reset();
    std::filesystem::remove_all(dir_);
    o.data_dir = dir_.string();
    auto c = server::LocalCluster::start(o);
    ASSERT_TRUE(c.ok()) << c.status().toString();
    cluster_ = std::move(*c);
  }
  void TearDown() override {
    fault::disableAll();
    local_.reset();
    socket_.reset();
    cluster_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::unique_ptr<Client> connect(bool local_calls, uint32_t session_renew_ms = 20000,
                                  uint32_t call_timeout_ms = 30000) {
    Client::Options o;
    o.cluster = cluster_->endpoint().toString();
    o.retry_ms = 2000;
    o.local_calls = local_calls;
    o.session_renew_ms = session_renew_ms;
    o.call_timeout_ms = call_timeout_ms;
    auto [c, e] = Client::connect(o);
    EXPECT_FALSE(e) << e.message;
    return std::move(c);
  }

  // A cluster whose sessions end 1.5 s after their client stops renewing, a
  // client that renews every 200 ms, and one that never does (as if dead).
  void startWithADyingClient(std::unique_ptr<Client>* live, std::unique_ptr<Client>* silent) {
    server::LocalClusterOptions o;
    o.targets = 2;
    o.session_timeout_ms = 1500;
    ASSERT_NO_FATAL_FAILURE(start(o));
    *live = connect(true, /*session_renew_ms=*/200);
    *silent = connect(true, /*session_renew_ms=*/0);
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

// A client moving an inline file's bytes to chunk 0 that stalls past its
// lease (here a delay at a fault point; in life a paused process or a call
// stuck in a queue) must not put those old bytes back once the next client
// has taken the inode, moved the bytes and written new ones: its storage
// calls are fenced by the lease (docs/meta_kv_schema.md). Without the fence
// the stalled write lands and the file reads as the old bytes.
TEST_F(LocalClient, AConversionStalledPastItsLeaseCannotPutOldBytesBack) {
  server::LocalClusterOptions o;
  // The converter's fence is the lease's end less 2 s: 600 ms after it begins.
  o.inline_convert_lease_ms = 2600;
  ASSERT_NO_FATAL_FAILURE(start(o));
  auto a = connect(true), b = connect(true);
  writeFile(*a, "/f", 100, 1);  // inline: 100 bytes in the KV
  const std::vector<uint8_t> old = readAll(*a, "/f");
  fault::Spec stall;
  stall.action = fault::Action::kDelay;
  stall.delay = std::chrono::seconds(4);
  stall.times = 1;
  fault::enable("client.inline.before_move", stall);
  std::jthread stalled([&] {  // joined on every way out, a failed ASSERT too
    // Begins, stalls past the lease, is refused, begins again: the bytes
    // were moved meanwhile, so the open goes ahead.
    std::unique_ptr<File> f;
    Error e = a->open("/f", O_WRONLY, 0, &f);
    EXPECT_FALSE(e) << e.message;
    if (f) {
      EXPECT_FALSE(f->close());
    }
  });
  while (fault::fired("client.inline.before_move") == 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // B waits out A's lease (kInodeBusy), moves the bytes and overwrites them.
  std::unique_ptr<File> g;
  ASSERT_FALSE(b->open("/f", O_WRONLY, 0, &g));
  std::vector<uint8_t> fresh(100);
  fill(fresh.data(), fresh.size(), 0, 0x5A5A5A5A5A5A5A5Aull);
  ASSERT_NE(fresh, old);
  size_t done = 0;
  ASSERT_FALSE(g->pwrite(fresh.data(), fresh.size(), 0, &done));
  ASSERT_FALSE(g->close());
  stalled.join();
  fault::disableAll();
  EXPECT_EQ(readAll(*a, "/f"), fresh);
  EXPECT_EQ(readAll(*b, "/f"), fresh);
}

// Calls to storage that were refused for arriving past their not-after time.
uint64_t refusedLate(const char* method) {
  return metrics::Registry::global()
      .counter("rpc_server_errors_by_code_total",
               {{"method", std::string("cistern.storage.StorageService.") + method},
                {"code", std::string(errorCodeName(ErrorCode::kLeaseExpired))}})
      .value();
}

// Holds up the next call at storage fault point `name` (a call stuck in a
// server's queue, a stalled thread) for 1.5 s: a client whose calls time out
// after 400 ms gives up on it meanwhile.
void stallOnce(const char* name) {
  fault::Spec stall;
  stall.action = fault::Action::kDelay;
  stall.delay = std::chrono::milliseconds(1500);
  stall.times = 1;
  fault::enable(name, stall);
}

// Waits (up to 10 s) for a stalled call of `method` to reach its chunk and
// be refused; returns whether it was.
bool lateCallRefused(const char* method, uint64_t before) {
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (refusedLate(method) == before && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  return refusedLate(method) > before;
}

// A storage call its client gave up on — timed out, then tried again or
// reported as failed — may still reach its chunk later. Each attempt that
// changes a chunk carries a fence (when its client stops waiting, less a
// clock margin; ClientImpl::attemptFence), so a late one is refused instead
// of undoing the acknowledged writes that followed it. Without the fence
// each late call below lands: the file reads as the stalled write's older
// bytes, or cut by the stalled truncate or remove.
TEST_F(LocalClient, AStorageCallItsClientGaveUpOnCannotUndoTheWritesAfterIt) {
  auto c = connect(false, 20000, /*call_timeout_ms=*/400);
  const size_t n = 64 << 10;  // past the inline limit: in chunk 0
  writeFile(*c, "/f", n, 0x1111111111111111ull);
  std::vector<uint8_t> first(n), second(n);
  fill(first.data(), n, 0, 0x2222222222222222ull);
  fill(second.data(), n, 0, 0x3333333333333333ull);
  ASSERT_NE(first, second);
  // A write: its first attempt stalls, the client tries again, and the
  // writes after it are acknowledged before the stalled one gets there.
  uint64_t before = refusedLate("Write");
  stallOnce("storage.write.queued");
  std::unique_ptr<File> f;
  ASSERT_FALSE(c->open("/f", O_WRONLY, 0, &f));
  size_t done = 0;
  ASSERT_FALSE(f->pwrite(first.data(), n, 0, &done));
  ASSERT_FALSE(f->fsync());
  EXPECT_EQ(fault::fired("storage.write.queued"), 1u);
  ASSERT_FALSE(f->pwrite(second.data(), n, 0, &done));
  ASSERT_FALSE(f->close());
  EXPECT_TRUE(lateCallRefused("Write", before)) << "the stalled write was not refused";
  EXPECT_EQ(readAll(*c, "/f"), second);
  fault::disableAll();

  // A truncate's cut of chunk 0, then a write past the cut.
  const uint64_t cut = 10000;
  before = refusedLate("Truncate");
  stallOnce("storage.truncate.queued");
  ASSERT_FALSE(c->truncate("/f", cut));
  ASSERT_FALSE(c->open("/f", O_WRONLY, 0, &f));
  ASSERT_FALSE(f->pwrite(first.data(), n, cut, &done));
  ASSERT_FALSE(f->close());
  EXPECT_TRUE(lateCallRefused("Truncate", before)) << "the stalled truncate was not refused";
  std::vector<uint8_t> want(second.begin(), second.begin() + cut);
  want.insert(want.end(), first.begin(), first.end());
  EXPECT_EQ(readAll(*c, "/f"), want);
  fault::disableAll();

  // An inline file's conversion: its write of the old bytes to chunk 0 is
  // given up on (inside the conversion's lease), and the writes that follow
  // the conversion are acknowledged before it gets there.
  std::vector<uint8_t> small(100);
  fill(small.data(), small.size(), 0, 0x5555555555555555ull);
  ASSERT_FALSE(c->open("/i", O_WRONLY | O_CREAT | O_TRUNC, 0644, &f));
  ASSERT_FALSE(f->pwrite(small.data(), small.size(), 0, &done));
  ASSERT_FALSE(f->close());  // inline: the bytes in the KV
  before = refusedLate("Write");
  stallOnce("storage.write.queued");
  ASSERT_FALSE(c->open("/i", O_WRONLY, 0, &f));  // moves the bytes to chunk 0
  EXPECT_EQ(fault::fired("storage.write.queued"), 1u);
  ASSERT_FALSE(f->pwrite(second.data(), n, 0, &done));
  ASSERT_FALSE(f->close());
  EXPECT_TRUE(lateCallRefused("Write", before)) << "the conversion's stalled write was not refused";
  EXPECT_EQ(readAll(*c, "/i"), second);
}

// The same for a truncate's removal of the chunks past the new end, on one
// chain (with two, the other chain's removal goes ahead and zeros may show
// past the new end, as after any truncate that failed part way): the
// removal times out, the truncate fails and the file keeps its size, and a
// write into chunk 1 that follows is acknowledged before the stalled removal
// gets there.
TEST_F(LocalClient, ARemovalItsClientGaveUpOnCannotUndoTheWritesAfterIt) {
  server::LocalClusterOptions o;
  o.targets = 1;
  ASSERT_NO_FATAL_FAILURE(start(o));
  auto c = connect(false, 20000, /*call_timeout_ms=*/400);
  const size_t n = 64 << 10;
  std::vector<uint8_t> second(n);
  fill(second.data(), n, 0, 0x3333333333333333ull);
  writeFile(*c, "/g", 3 * kChunk, 0x4444444444444444ull);
  std::vector<uint8_t> g = readAll(*c, "/g");
  const uint64_t before = refusedLate("Remove");
  stallOnce("storage.remove.queued");
  Error e = c->truncate("/g", kChunk);
  EXPECT_EQ(e.errno_value, ETIMEDOUT) << e.message;
  std::unique_ptr<File> f;
  size_t done = 0;
  ASSERT_FALSE(c->open("/g", O_WRONLY, 0, &f));
  ASSERT_FALSE(f->pwrite(second.data(), n, kChunk, &done));
  ASSERT_FALSE(f->close());
  EXPECT_TRUE(lateCallRefused("Remove", before)) << "the stalled removal was not refused";
  std::copy(second.begin(), second.end(), g.begin() + kChunk);
  EXPECT_EQ(readAll(*c, "/g"), g);
}

// A truncate cuts storage first and commits the size second (ClientImpl::
// cutData), so one that stops between the two (the client died, meta was
// unreachable) leaves the old size reading zeros from the new end on — what
// truncating and growing the file again gives — and never an old byte past
// the new end for a later extension to show.
TEST_F(LocalClient, ATruncateStoppedBeforeItsCommitLeavesNoOldBytePastTheNewEnd) {
  const uint64_t size = 3 * kChunk + kChunk / 2;
  const uint64_t cut = kChunk + 100;  // inside chunk 1
  writeFile(*local_, "/f", size, 7);
  std::vector<uint8_t> want = readAll(*local_, "/f");
  ASSERT_EQ(want.size(), size);
  fault::enable("client.truncate.before_commit", fault::Spec{});
  Error e = local_->truncate("/f", cut);
  EXPECT_TRUE(e);
  EXPECT_NE(e.message.find("/f"), std::string::npos) << e.message;
  fault::disableAll();
  std::fill(want.begin() + static_cast<std::ptrdiff_t>(cut), want.end(), 0);
  EXPECT_EQ(readAll(*connect(false), "/f"), want);
  // Done again, then grown: zeros past the cut.
  ASSERT_FALSE(local_->truncate("/f", cut));
  ASSERT_FALSE(local_->truncate("/f", size + kChunk));
  want.resize(size + kChunk, 0);
  EXPECT_EQ(readAll(*connect(false), "/f"), want);
  // O_TRUNC stopped the same way: the old size, all zeros.
  fault::enable("client.truncate.before_commit", fault::Spec{});
  std::unique_ptr<File> f;
  EXPECT_TRUE(local_->open("/f", O_WRONLY | O_TRUNC, 0, &f));
  fault::disableAll();
  EXPECT_EQ(readAll(*connect(false), "/f"), std::vector<uint8_t>(size + kChunk, 0));
}

// O_TRUNC cuts every chunk of the file, also those a writer of another
// client wrote but has not yet made part of the length (by fsync or close),
// as truncating a local file cuts whatever was written to it: none of their
// bytes shows through a hole of the new contents.
TEST_F(LocalClient, OTruncCutsBytesAWriterHasNotRecordedYet) {
  auto a = connect(true), b = connect(false);
  std::unique_ptr<File> fa;
  ASSERT_FALSE(a->open("/f", O_CREAT | O_RDWR, 0644, &fa));
  std::vector<uint8_t> old(2 * kChunk);
  fill(old.data(), old.size(), 0, 11);
  size_t done = 0;
  ASSERT_FALSE(fa->pwrite(old.data(), old.size(), 0, &done));
  uint8_t one = 0;
  ASSERT_FALSE(fa->pread(&one, 1, 0, &done));  // the buffers reach storage; meta says 0 bytes
  FileInfo info;
  ASSERT_FALSE(b->stat("/f", &info));
  ASSERT_EQ(info.size, 0u);
  std::unique_ptr<File> fb;
  ASSERT_FALSE(b->open("/f", O_WRONLY | O_TRUNC, 0, &fb));
  const char tail[] = "xyz";
  ASSERT_FALSE(fb->pwrite(tail, 3, 2 * kChunk + 10, &done));
  ASSERT_FALSE(fb->close());
  std::vector<uint8_t> want(2 * kChunk + 13, 0);
  std::copy(tail, tail + 3, want.end() - 3);
  EXPECT_EQ(readAll(*connect(false), "/f"), want);
  EXPECT_FALSE(fa->close());
}

// A client that dies never closes its files. Its sessions end once it has
// not renewed them for the service's session timeout, as its close would:
// a file it held open after an unlink goes, chunks and all. A client that
// renews keeps its own.
TEST_F(LocalClient, AClientThatStopsRenewingLosesItsSessionsAndItsUnlinkedFileGoes) {
  std::unique_ptr<Client> live, silent;
  ASSERT_NO_FATAL_FAILURE(startWithADyingClient(&live, &silent));
  std::unique_ptr<File> kept, held;
  ASSERT_FALSE(live->open("/kept", O_CREAT | O_WRONLY, 0644, &kept));
  ASSERT_FALSE(silent->open("/held", O_CREAT | O_WRONLY, 0644, &held));
  std::vector<uint8_t> data(2 * kChunk);
  fill(data.data(), data.size(), 0, 3);
  size_t done = 0;
  ASSERT_FALSE(held->pwrite(data.data(), data.size(), 0, &done));
  ASSERT_FALSE(held->fsync());
  ASSERT_FALSE(live->unlink("/held"));  // stays while its writer holds it
  auto chunks = [&] {
    std::vector<TargetInfo> targets;
    EXPECT_FALSE(live->targets(&targets));
    uint64_t n = 0;
    for (const auto& t : targets) n += t.chunks;
    return n;
  };
  EXPECT_EQ(chunks(), 2u);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (chunks() > 0 && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(chunks(), 0u);
  CheckReport report;
  ASSERT_FALSE(live->fsck(&report));
  EXPECT_EQ(report.sessions, 1u);  // the live client's
  EXPECT_TRUE(report.problems.empty());
  ASSERT_FALSE(kept->pwrite("abc", 3, 0, &done));
  ASSERT_FALSE(kept->close());
  FileInfo info;
  ASSERT_FALSE(live->stat("/kept", &info));
  EXPECT_EQ(info.size, 3u);
  Error e = held->close();  // the silent client comes back: its file is gone
  EXPECT_EQ(e.errno_value, ENOENT) << e.message;
}

// A client that dies after its bytes reached storage but before it recorded
// the length (no fsync, no close: here its write-behind sent three whole
// chunks, the last 100 bytes were still in its buffer) would leave them
// past the file's end, unseen. The reaper that ends its session asks
// storage how far they reach and grows the length to that, as a local file
// keeps what a killed process wrote.
TEST_F(LocalClient, AClientThatDiesWithoutClosingLeavesTheBytesItStoredInItsFile) {
  std::unique_ptr<Client> live, silent;
  ASSERT_NO_FATAL_FAILURE(startWithADyingClient(&live, &silent));
  std::unique_ptr<File> held;
  ASSERT_FALSE(silent->open("/ckpt", O_CREAT | O_WRONLY, 0644, &held));
  std::vector<uint8_t> data(3 * kChunk + 100);
  fill(data.data(), data.size(), 0, 0x7777777777777777ull);
  size_t done = 0;
  ASSERT_FALSE(held->pwrite(data.data(), data.size(), 0, &done));
  FileInfo info;
  ASSERT_FALSE(live->stat("/ckpt", &info));
  EXPECT_EQ(info.size, 0u);  // nothing recorded yet
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (info.size == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    ASSERT_FALSE(live->stat("/ckpt", &info));
  }
  ASSERT_EQ(info.size, 3 * kChunk);
  data.resize(3 * kChunk);
  EXPECT_TRUE(readAll(*live, "/ckpt") == data);
  CheckReport report;
  ASSERT_FALSE(live->fsck(&report));
  EXPECT_EQ(report.sessions, 0u);
  EXPECT_EQ(report.chunks_past_end, 0u);
  EXPECT_TRUE(report.problems.empty()) << report.problems.front();
}

// fsck holds the chunks in storage against the namespace: one that belongs
// to no file (here a write for an inode nobody has, as one delayed past its
// file's deletion would land) is a problem, and `remove_orphan_chunks`
// removes it, leaving every file's chunks alone.
TEST_F(LocalClient, FsckFindsAndRemovesChunksOfNoFile) {
  const uint32_t crc = writeFile(*local_, "/f", 3 * kChunk, 5);
  CheckReport r;
  ASSERT_FALSE(local_->fsck(&r));
  EXPECT_EQ(r.chunks, 3u);
  EXPECT_EQ(r.orphan_chunks, 0u);
  EXPECT_TRUE(r.problems.empty());
  net::RpcClient rpc;
  storage::WriteReq w;
  w.mutable_chunk()->set_inode(900000);
  w.mutable_chunk()->set_index(2);
  std::vector<uint8_t> bytes(100, 1);
  storage::WriteResp wr;
  net::CallOptions co;
  co.request_payload = bytes;
  ASSERT_TRUE(rpc.callSync(cluster_->storageEndpoints()[0],
                           net::Method::of("cistern.storage.StorageService.Write"), w, &wr, co)
                  .ok());
  ASSERT_FALSE(local_->fsck(&r));
  EXPECT_EQ(r.chunks, 4u);
  EXPECT_EQ(r.orphan_chunks, 1u);
  ASSERT_EQ(r.problems.size(), 1u);
  EXPECT_EQ(r.problems[0], "chunk 900000:2 on target 1 belongs to no file");
  ASSERT_FALSE(local_->fsck(&r, /*remove_orphan_chunks=*/true));
  EXPECT_EQ(r.orphan_chunks_removed, 1u);
  EXPECT_TRUE(r.problems.empty());
  ASSERT_FALSE(local_->fsck(&r));
  EXPECT_EQ(r.chunks, 3u);
  EXPECT_EQ(r.orphan_chunks, 0u);
  EXPECT_TRUE(r.problems.empty());
  EXPECT_EQ(testing::readFile(*local_, "/f"), std::make_pair(crc, 3 * kChunk));
}

// The handle API (Client::openAt, createAt): every handle of one inode in
// one client shares its buffers, so a read through one sees a write through
// another before any flush, and stat in that client sees the length it has
// not recorded; another client sees it once a handle flushes.
TEST_F(LocalClient, HandlesOfOneInodeShareItsBuffersAndOthersSeeThemAtFlush) {
  const Credentials root;
  FileInfo dir;
  ASSERT_FALSE(local_->mkdirAt(root, Client::kRootIno, "d", 0755, &dir));
  std::unique_ptr<File> a, b;
  FileInfo info;
  bool created = false;
  ASSERT_FALSE(local_->createAt(root, dir.ino, "f", 0644, O_RDWR, &a, &info, &created));
  EXPECT_TRUE(created);
  EXPECT_TRUE(info.isRegular());
  EXPECT_EQ(a->ino(), info.ino);
  ASSERT_FALSE(local_->createAt(root, dir.ino, "f", 0644, O_RDWR, &b, &info, &created));
  EXPECT_FALSE(created) << "the second create opened the file the first made";
  EXPECT_EQ(b->ino(), a->ino());
  EXPECT_EQ(a->openHandles(), 2u);
  Error e = local_->createAt(root, dir.ino, "f", 0644, O_RDWR | O_EXCL, &b, &info, &created);
  EXPECT_EQ(e.errno_value, EEXIST) << e.message;
  ASSERT_FALSE(local_->openAt(root, a->ino(), O_RDWR, &b, &info));

  std::vector<uint8_t> data(100000);
  fill(data.data(), data.size(), 0, 3);
  size_t done = 0;
  ASSERT_FALSE(a->pwrite(data.data(), data.size(), 0, &done));
  std::vector<uint8_t> got(data.size());
  ASSERT_FALSE(b->pread(got.data(), got.size(), 0, &done));
  EXPECT_EQ(done, data.size());
  EXPECT_EQ(got, data);
  ASSERT_FALSE(local_->stat("/d/f", &info));
  EXPECT_EQ(info.size, data.size()) << "this client's own unrecorded length";
  ASSERT_FALSE(socket_->getattr(a->ino(), &info));
  EXPECT_EQ(info.size, 0u) << "nothing recorded yet";
  ASSERT_FALSE(b->flush());
  ASSERT_FALSE(socket_->getattr(a->ino(), &info));
  EXPECT_EQ(info.size, data.size());
  EXPECT_EQ(readAll(*connect(false), "/d/f"), data);
  EXPECT_EQ(b->info().size, data.size());
  EXPECT_EQ(b->info().mode, S_IFREG | 0644u);

  // A chmod through the client is what its handles report.
  ASSERT_FALSE(local_->setattr(root, a->ino(), {.mode = 0600}, &info));
  EXPECT_EQ(a->info().mode, S_IFREG | 0600u);
  // A truncate through the client cuts what its handles hold too.
  ASSERT_FALSE(a->pwrite("tail", 4, 200000, &done));
  ASSERT_FALSE(local_->setattr(root, a->ino(), {.size = 10}, &info));
  EXPECT_EQ(b->size(), 10u);
  ASSERT_FALSE(b->pread(got.data(), got.size(), 0, &done));
  EXPECT_EQ(done, 10u);
  EXPECT_FALSE(a->close());
  EXPECT_EQ(b->openHandles(), 1u);
  EXPECT_EQ(a->close().errno_value, EBADF);
  EXPECT_FALSE(b->close());
  ASSERT_FALSE(socket_->getattr(b->ino(), &info));
  EXPECT_EQ(info.size, 10u);
}

// Each handle keeps its access mode and its errors, with an errno and the
// file's name in the message.
TEST_F(LocalClient, HandlesRefuseWhatTheirOpenDidNotAllow) {
  const Credentials root;
  writeFile(*local_, "/f", 1000, 1);
  FileInfo f, d;
  ASSERT_FALSE(local_->stat("/f", &f));
  ASSERT_FALSE(local_->mkdirAt(root, Client::kRootIno, "d", 0755, &d));
  std::unique_ptr<File> r, w;
  ASSERT_FALSE(local_->openAt(root, f.ino, O_RDONLY, &r));
  ASSERT_FALSE(local_->openAt(root, f.ino, O_WRONLY, &w));
  size_t done = 0;
  uint8_t byte = 0;
  Error e = r->pwrite("x", 1, 0, &done);
  EXPECT_EQ(e.errno_value, EBADF);
  EXPECT_NE(e.message.find("inode"), std::string::npos) << e.message;
  EXPECT_EQ(w->pread(&byte, 1, 0, &done).errno_value, EBADF);
  EXPECT_EQ(r->allocate(5000).errno_value, EBADF);
  std::unique_ptr<File> x;
  EXPECT_EQ(local_->openAt(root, d.ino, O_RDONLY, &x).errno_value, EISDIR);
  EXPECT_EQ(local_->openAt(root, f.ino, O_ACCMODE, &x).errno_value, EINVAL);
  EXPECT_EQ(local_->openAt(root, 987654321, O_RDONLY, &x).errno_value, ENOENT);
  FileInfo fifo;
  ASSERT_FALSE(local_->mknodAt(root, Client::kRootIno, "p", S_IFIFO | 0644, 0, &fifo));
  EXPECT_EQ(local_->openAt(root, fifo.ino, O_RDONLY, &x).errno_value, ENXIO);
  // Another user: the file's mode decides (0644: read, not write).
  const Credentials user{.uid = 1000, .gid = 1000};
  EXPECT_FALSE(local_->openAt(user, f.ino, O_RDONLY, &x));
  EXPECT_EQ(local_->openAt(user, f.ino, O_WRONLY, &x).errno_value, EACCES);
  EXPECT_EQ(local_->openAt(user, f.ino, O_RDONLY | O_TRUNC, &x).errno_value, EACCES)
      << "O_TRUNC needs write permission, as on Linux";
  // A file created by a call opens whatever its mode says (open(2) with
  // O_CREAT and mode 0); an existing one does not.
  FileInfo pub;
  ASSERT_FALSE(local_->mkdirAt(root, Client::kRootIno, "pub", 0777, &pub));
  bool created = false;
  FileInfo info;
  EXPECT_FALSE(local_->createAt(user, pub.ino, "mine", 0, O_WRONLY, &x, &info, &created));
  EXPECT_TRUE(created);
  EXPECT_FALSE(x->pwrite("ok", 2, 0, &done));
  EXPECT_FALSE(x->close());
  EXPECT_EQ(local_->createAt(user, pub.ino, "mine", 0, O_WRONLY, &x, &info, &created).errno_value,
            EACCES);
  EXPECT_FALSE(r->close());
  EXPECT_FALSE(w->close());
}

// A file this client unlinks or renames over while it is open here stays
// readable through its handles until the last one closes; then it goes.
TEST_F(LocalClient, AFileRemovedWhileOpenHereStaysReadableUntilItsLastClose) {
  writeFile(*local_, "/gone", 3 * kChunk, 5);
  writeFile(*local_, "/over", 1000, 6);
  writeFile(*local_, "/new", 2000, 7);
  std::unique_ptr<File> f, g;
  ASSERT_FALSE(local_->open("/gone", O_RDONLY, 0, &f));
  ASSERT_FALSE(local_->open("/over", O_RDONLY, 0, &g));
  const uint64_t gone = f->ino(), over = g->ino();
  ASSERT_FALSE(local_->unlink("/gone"));
  ASSERT_FALSE(local_->rename("/new", "/over"));
  FileInfo info;
  EXPECT_EQ(local_->stat("/gone", &info).errno_value, ENOENT);
  std::vector<uint8_t> want(3 * kChunk), got(3 * kChunk);
  fill(want.data(), want.size(), 0, 5);
  size_t done = 0;
  ASSERT_FALSE(f->pread(got.data(), got.size(), 0, &done));
  EXPECT_EQ(done, got.size());
  EXPECT_EQ(got, want);
  want.resize(1000);
  fill(want.data(), want.size(), 0, 6);
  ASSERT_FALSE(g->pread(got.data(), 1000, 0, &done));
  EXPECT_EQ(std::vector<uint8_t>(got.begin(), got.begin() + 1000), want);
  EXPECT_FALSE(local_->getattr(gone, &info)) << "held while open";
  EXPECT_FALSE(f->close());
  EXPECT_FALSE(g->close());
  EXPECT_EQ(local_->getattr(gone, &info).errno_value, ENOENT);
  EXPECT_EQ(local_->getattr(over, &info).errno_value, ENOENT);
  CheckReport report;
  ASSERT_FALSE(local_->fsck(&report));
  EXPECT_EQ(report.sessions, 0u);
  EXPECT_TRUE(report.problems.empty()) << report.problems.front();
}

// allocate() (fallocate): the length grows to at least the end asked for,
// holes read as zeros, and a file another client made longer keeps its
// length.
TEST_F(LocalClient, AllocateExtendsTheLengthAndNeverShrinksIt) {
  std::unique_ptr<File> f, other;
  ASSERT_FALSE(local_->open("/a", O_CREAT | O_RDWR, 0644, &f));
  size_t done = 0;
  ASSERT_FALSE(f->pwrite("abc", 3, 0, &done));
  ASSERT_FALSE(f->allocate(3 * kChunk + 5));
  EXPECT_EQ(f->size(), 3 * kChunk + 5);
  FileInfo info;
  ASSERT_FALSE(socket_->getattr(f->ino(), &info));
  EXPECT_EQ(info.size, 3 * kChunk + 5) << "recorded at once";
  std::vector<uint8_t> want(3 * kChunk + 5, 0);
  std::memcpy(want.data(), "abc", 3);
  EXPECT_EQ(readAll(*socket_, "/a"), want);
  ASSERT_FALSE(socket_->open("/a", O_WRONLY, 0, &other));
  ASSERT_FALSE(other->pwrite("z", 1, 5 * kChunk, &done));
  ASSERT_FALSE(other->close());
  ASSERT_FALSE(f->allocate(4 * kChunk));
  ASSERT_FALSE(socket_->getattr(f->ino(), &info));
  EXPECT_EQ(info.size, 5 * kChunk + 1);
  EXPECT_EQ(f->allocate(uint64_t{1} << 50).errno_value, EFBIG);
  EXPECT_FALSE(f->close());
}

// O_DIRECT handles read into memory shared with same-host servers
// (borrowSharedBuffer) and give the bytes a buffered read gives.
TEST_F(LocalClient, DirectReadsIntoSharedMemoryGiveTheFilesBytes) {
  writeFile(*local_, "/d", 2 * kChunk + 77, 8);
  std::unique_ptr<File> f;
  ASSERT_FALSE(local_->open("/d", O_RDONLY | O_DIRECT, 0, &f));
  auto buf = local_->borrowSharedBuffer(kChunk);
  ASSERT_NE(buf, nullptr) << "shared memory is on by default";
  EXPECT_EQ(buf->size(), kChunk);
  std::vector<uint8_t> want(kChunk);
  fill(want.data(), want.size(), kChunk + 77, 8);
  size_t done = 0;
  ASSERT_FALSE(f->pread(buf->data(), kChunk, kChunk + 77, &done));
  EXPECT_EQ(done, kChunk);
  EXPECT_TRUE(buf->intact());
  EXPECT_EQ(std::vector<uint8_t>(buf->data(), buf->data() + kChunk), want);
  EXPECT_EQ(local_->borrowSharedBuffer(uint64_t{1} << 40), nullptr) << "larger than any window";
  EXPECT_FALSE(f->close());
}

}  // namespace
}  // namespace cistern

namespace cistern {
namespace {

// Eight writers at a quota's edge (docs/quota.md): each writes 3 MiB
// files in 1 MiB writes into a directory with a 40 MiB quota until one is
// refused. The use never passes the limit (writers reserve before they
// write), a refused write is EDQUOT, and every file whose writes and close
// were all answered OK reads back whole.
TEST_F(LocalClient, EightWritersAtAQuotasEdgeNeverPassItAndLoseNothing) {
  constexpr uint64_t kLimit = 40ull << 20, kFile = 3ull << 20, kPiece = 1ull << 20;
  ASSERT_FALSE(local_->mkdir("/q", 0777, false));
  FileInfo dir;
  ASSERT_FALSE(local_->stat("/q", &dir));
  QuotaInfo q;
  ASSERT_FALSE(local_->quotaSet(dir.ino, kLimit, 0, &q));
  std::mutex mu;
  std::vector<std::pair<std::string, uint64_t>> whole;  // path, seed
  std::atomic<int> refused{0}, other_errors{0};
  std::string first_other;
  std::vector<std::thread> writers;
  for (int w = 0; w < 8; ++w) {
    writers.emplace_back([&, w] {
      Client& c = w % 2 ? *local_ : *socket_;
      std::vector<uint8_t> piece(kPiece);
      for (int i = 0;; ++i) {
        const std::string path = fmt::format("/q/w{}-{}", w, i);
        const uint64_t seed = static_cast<uint64_t>(w * 1000 + i + 1);
        std::unique_ptr<File> f;
        if (Error e = c.open(path, O_CREAT | O_WRONLY, 0644, &f)) {
          ++other_errors;
          return;
        }
        Error failed;
        for (uint64_t at = 0; at < kFile && !failed; at += kPiece) {
          fill(piece.data(), piece.size(), at, seed);
          size_t done = 0;
          failed = f->pwrite(piece.data(), piece.size(), at, &done);
        }
        Error closed = f->close();
        if (!failed) failed = closed;
        if (!failed) {
          std::lock_guard lock(mu);
          whole.emplace_back(path, seed);
          continue;
        }
        if (failed.errno_value == EDQUOT) {
          ++refused;
        } else {
          std::lock_guard lock(mu);
          ++other_errors;
          first_other = failed.message;
        }
        return;
      }
    });
  }
  for (auto& t : writers) t.join();
  EXPECT_EQ(other_errors.load(), 0) << first_other;
  EXPECT_EQ(refused.load(), 8);  // every writer reached the edge
  ASSERT_FALSE(local_->quotaGet(dir.ino, &q));
  EXPECT_LE(q.bytes_used, kLimit);
  // At most each writer's reservation step (4 MiB) short of the limit.
  EXPECT_GE(q.bytes_used + 8 * (4ull << 20) + 8 * kFile, kLimit);
  EXPECT_LE(whole.size() * kFile, kLimit);
  EXPECT_GE(whole.size(), 6u);
  std::vector<uint8_t> want(kFile);
  for (const auto& [path, seed] : whole) {
    fill(want.data(), want.size(), 0, seed);
    EXPECT_TRUE(readAll(*socket_, path, 1 << 20) == want) << path;
  }
  // df of the directory shows the quota.
  SpaceInfo space;
  ASSERT_FALSE(local_->statfs(&space, dir.ino));
  EXPECT_EQ(space.bytes_total, kLimit);
  EXPECT_EQ(space.bytes_free, kLimit - q.bytes_used);
  // Removing what was written frees it all.
  std::vector<DirEntry> entries;
  ASSERT_FALSE(local_->list("/q", &entries));
  for (const auto& e : entries) ASSERT_FALSE(local_->unlink("/q/" + e.name));
  ASSERT_FALSE(local_->quotaGet(dir.ino, &q));
  EXPECT_EQ(q.bytes_used, 0u);
  EXPECT_EQ(q.inodes_used, 0u);
}

}  // namespace
}  // namespace cistern
