// End to end: `cistern up` as a child process on free ports, driven through
// libcistern and the `cistern` CLI.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>

#include <fcntl.h>
#include <unistd.h>
#include <atomic>
#include <filesystem>

#include <fstream>
#include <map>
#include <random>
#include <regex>
#include <thread>

#include "cistern/client.h"
#include "common/crc32c.h"
#include "common/fault.h"
#include "common/host.h"
#include "common/metrics.h"
#include "net/endpoint.h"
#include "net/rpc_client.h"
#include "storage.pb.h"
#include "tests/support/client_files.h"
#include "tests/support/cluster_process.h"
#include "tests/support/http_get.h"

namespace cistern {
namespace {

using testing::clusterChunks;
using testing::ClusterProcess;
using testing::fill;
using testing::firstWriteError;
using testing::httpGet;
using testing::readAll;
using testing::readFile;
using testing::runProgram;
using testing::writeFile;

constexpr uint64_t kChunk = 1 << 20;  // the default layout

class E2E : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("cistern-e2e-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    cluster_ = std::make_unique<ClusterProcess>(CISTERN_BIN, (dir_ / "data").string(), 2);
    ASSERT_TRUE(cluster_->start());
    client_ = connect();
    ASSERT_NE(client_, nullptr);
  }
  void TearDown() override {
    client_.reset();
    if (cluster_) {
      EXPECT_EQ(cluster_->stop(), 0) << cluster_->log();
    }
    std::filesystem::remove_all(dir_);
  }

  // Stops the cluster and starts it again with `faults` (CISTERN_FAULTS)
  // enabled in it; client_ is connected anew. False if that failed.
  bool restartWithFaults(const char* faults) {
    client_.reset();
    if (cluster_->stop() != 0) return false;
    setenv("CISTERN_FAULTS", faults, 1);
    bool started = cluster_->start();
    unsetenv("CISTERN_FAULTS");
    if (!started) return false;
    client_ = connect();
    return client_ != nullptr;
  }

  std::unique_ptr<Client> connect(uint32_t uid = ~0u, uint32_t gid = ~0u,
                                  uint64_t shm_bytes = Client::Options{}.shm_bytes,
                                  bool short_circuit = true) {
    Client::Options o;
    o.cluster = cluster_->cluster();
    o.uid = uid;
    o.gid = gid;
    o.shm_bytes = shm_bytes;
    o.short_circuit_reads = short_circuit;
    auto [c, err] = Client::connect(o);
    EXPECT_FALSE(err) << err.message;
    return std::move(c);
  }

  // Makes every storage server forget every shared memory this test's
  // clients attached, as a restart or an eviction would.
  void detachAllSharedMemory() {
    std::regex storage_line(R"(storage target \d+ at \S+ on (\S+))");
    net::RpcClient raw;
    int servers = 0;
    for (std::sregex_iterator it(cluster_->log().begin(), cluster_->log().end(), storage_line), end;
         it != end; ++it, ++servers) {
      auto ep = net::Endpoint::parse((*it)[1].str());
      ASSERT_TRUE(ep.ok()) << (*it)[1].str();
      for (uint64_t h = 1; h <= 8; ++h) {  // every handle this test's clients can have
        storage::ShmDetachReq req;
        req.set_handle(h);
        storage::ShmDetachResp resp;
        ASSERT_TRUE(raw.callSync(*ep, net::Method::of("cistern.storage.StorageService.ShmDetach"),
                                 req, &resp)
                        .ok());
      }
    }
    EXPECT_EQ(servers, 2);
  }

  // Writes a file with a hole (chunks 1 and 2), a short last chunk and odd
  // edges through client_; `*want` is what it holds.
  void writeHoleyFile(const std::string& path, std::vector<uint8_t>* want) {
    std::unique_ptr<File> f;
    ASSERT_FALSE(client_->open(path, O_WRONLY | O_CREAT, 0644, &f));
    want->assign(5 * kChunk + 4321, 0);
    fill(want->data(), kChunk + 17, 0, 7);
    fill(want->data() + 3 * kChunk + 5, 2 * kChunk + 4316, 3 * kChunk + 5, 8);
    size_t done = 0;
    ASSERT_FALSE(f->pwrite(want->data(), kChunk + 17, 0, &done));
    ASSERT_FALSE(f->pwrite(want->data() + 3 * kChunk + 5, want->size() - 3 * kChunk - 5,
                           3 * kChunk + 5, &done));
    ASSERT_FALSE(f->close());
  }
  static uint64_t readBytesBy(const char* path) {
    return metrics::Registry::global().counter("client_read_bytes_total", {{"path", path}}).value();
  }

  // 200 reads of 1 byte to 2 chunks at random offsets of `path` match `want`.
  static void expectRandomReadsMatch(Client& c, const std::string& path,
                                     const std::vector<uint8_t>& want, uint64_t seed) {
    std::unique_ptr<File> r;
    ASSERT_FALSE(c.open(path, O_RDONLY, 0, &r));
    std::mt19937_64 rng(seed);
    for (int i = 0; i < 200; ++i) {
      uint64_t off = rng() % want.size();
      size_t n =
          static_cast<size_t>(std::min<uint64_t>(rng() % (2 * kChunk) + 1, want.size() - off));
      std::vector<uint8_t> got(n);
      size_t g = 0;
      ASSERT_FALSE(r->pread(got.data(), n, off, &g));
      ASSERT_EQ(g, n);
      ASSERT_TRUE(std::equal(got.begin(), got.end(), want.begin() + static_cast<long>(off)))
          << "at " << off << " length " << n;
    }
    EXPECT_FALSE(r->close());
  }

  testing::CliResult cli(std::vector<std::string> args) {
    args.push_back("--cluster");
    args.push_back(cluster_->cluster());
    return runProgram(CISTERN_BIN, args);
  }

  std::filesystem::path dir_;
  std::unique_ptr<ClusterProcess> cluster_;
  std::unique_ptr<Client> client_;
};

TEST_F(E2E, FilesOfEverySizeRoundTripByteExact) {
  const std::vector<uint64_t> sizes = {0,      1,          4095,           kChunk - 1,
                                       kChunk, kChunk + 1, kChunk * 7 / 2, 1ull << 30};
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::string path = "/f" + std::to_string(i);
    uint32_t crc = writeFile(*client_, path, sizes[i], i);
    FileInfo info;
    ASSERT_FALSE(client_->stat(path, &info));
    EXPECT_EQ(info.size, sizes[i]);
    EXPECT_TRUE(info.isRegular());
    // Odd read sizes cross chunk boundaries at every alignment.
    auto [rcrc, rsize] = readFile(*client_, path, sizes[i] > kChunk * 4 ? 4 << 20 : 333333);
    EXPECT_EQ(rsize, sizes[i]) << path;
    EXPECT_EQ(rcrc, crc) << path;
  }
  // Small writes are coalesced and still land byte-exact.
  std::unique_ptr<File> f;
  ASSERT_FALSE(client_->open("/small-writes", O_WRONLY | O_CREAT, 0644, &f));
  std::vector<uint8_t> want(3 * kChunk + 123);
  fill(want.data(), want.size(), 0, 99);
  for (size_t off = 0; off < want.size(); off += 1000) {
    size_t n = std::min<size_t>(1000, want.size() - off), done = 0;
    ASSERT_FALSE(f->pwrite(want.data() + off, n, off, &done));
  }
  ASSERT_FALSE(f->close());
  EXPECT_EQ(readAll(*client_, "/small-writes"), want);
}

TEST_F(E2E, SparseFilesOverwriteAndTruncate) {
  std::unique_ptr<File> f;
  ASSERT_FALSE(client_->open("/sparse", O_RDWR | O_CREAT, 0644, &f));
  std::vector<uint8_t> tail(5000);
  fill(tail.data(), tail.size(), 0, 7);
  size_t done = 0;
  const uint64_t at = 5 * kChunk + 17;
  ASSERT_FALSE(f->pwrite(tail.data(), tail.size(), at, &done));
  ASSERT_FALSE(f->close());
  auto got = readAll(*client_, "/sparse");
  ASSERT_EQ(got.size(), at + tail.size());
  EXPECT_TRUE(std::all_of(got.begin(), got.begin() + at, [](uint8_t b) { return b == 0; }));
  EXPECT_TRUE(std::equal(tail.begin(), tail.end(), got.begin() + at));

  // Overwrite in the middle, across a chunk boundary.
  std::vector<uint8_t> model(3 * kChunk);
  fill(model.data(), model.size(), 0, 1);
  writeFile(*client_, "/mid", model.size(), 1);
  std::vector<uint8_t> patch(10000);
  fill(patch.data(), patch.size(), 0, 2);
  ASSERT_FALSE(client_->open("/mid", O_WRONLY, 0, &f));
  ASSERT_FALSE(f->pwrite(patch.data(), patch.size(), kChunk - 5000, &done));
  ASSERT_FALSE(f->close());
  std::copy(patch.begin(), patch.end(), model.begin() + (kChunk - 5000));
  EXPECT_EQ(readAll(*client_, "/mid"), model);

  // Truncate down into the second chunk, then up: the cut bytes read as zeros.
  ASSERT_FALSE(client_->truncate("/mid", kChunk + 100));
  model.resize(kChunk + 100);
  EXPECT_EQ(readAll(*client_, "/mid"), model);
  ASSERT_FALSE(client_->truncate("/mid", 2 * kChunk + 5));
  model.resize(2 * kChunk + 5, 0);
  EXPECT_EQ(readAll(*client_, "/mid"), model);

  // O_TRUNC then a write past a hole: nothing of the old contents shows through.
  ASSERT_FALSE(client_->open("/mid", O_WRONLY | O_TRUNC, 0, &f));
  ASSERT_FALSE(f->pwrite(patch.data(), 100, kChunk + 50, &done));
  ASSERT_FALSE(f->close());
  got = readAll(*client_, "/mid");
  ASSERT_EQ(got.size(), kChunk + 150);
  EXPECT_TRUE(
      std::all_of(got.begin(), got.begin() + kChunk + 50, [](uint8_t b) { return b == 0; }));

  // O_APPEND writes at the end whatever the offset.
  ASSERT_FALSE(client_->open("/mid", O_WRONLY | O_APPEND, 0, &f));
  ASSERT_FALSE(f->pwrite("xyz", 3, 0, &done));
  ASSERT_FALSE(f->close());
  got = readAll(*client_, "/mid");
  ASSERT_EQ(got.size(), kChunk + 153);
  EXPECT_EQ(std::string(got.end() - 3, got.end()), "xyz");
}

// O_TRUNC trims from the file's current size, not from a size this client cached.
TEST_F(E2E, TruncatingOpenRemovesBytesAnotherClientWrote) {
  writeFile(*client_, "/t", 10, 1);
  FileInfo info;
  ASSERT_FALSE(client_->stat("/t", &info));  // cached: 10 bytes
  auto other = connect();
  ASSERT_NE(other, nullptr);
  writeFile(*other, "/t", 3 * kChunk, 2);
  std::unique_ptr<File> f;
  ASSERT_FALSE(client_->open("/t", O_WRONLY | O_TRUNC, 0, &f));
  size_t done = 0;
  ASSERT_FALSE(f->pwrite("abc", 3, 0, &done));
  ASSERT_FALSE(f->close());
  ASSERT_FALSE(client_->truncate("/t", 3 * kChunk));
  auto got = readAll(*client_, "/t");
  ASSERT_EQ(got.size(), 3 * kChunk);
  EXPECT_EQ(std::string(got.begin(), got.begin() + 3), "abc");
  EXPECT_TRUE(std::all_of(got.begin() + 3, got.end(), [](uint8_t b) { return b == 0; }));
}

TEST_F(E2E, ConcurrentClientsOnFilesAndOnDisjointRangesOfOneFile) {
  constexpr int kClients = 8;
  constexpr uint64_t kEach = 3 * kChunk + 4321;
  std::vector<std::thread> threads;
  std::vector<uint32_t> crcs(kClients);
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      auto c = connect();
      if (c)
        crcs[static_cast<size_t>(i)] =
            writeFile(*c, "/own-" + std::to_string(i), kEach, 100 + i, 777777);
    });
  }
  for (auto& t : threads) t.join();
  threads.clear();
  for (int i = 0; i < kClients; ++i)
    EXPECT_EQ(readFile(*client_, "/own-" + std::to_string(i)).first, crcs[static_cast<size_t>(i)]);

  // Disjoint ranges of one file, each range not chunk-aligned.
  constexpr uint64_t kRange = kChunk + 12345;
  std::unique_ptr<File> f;
  ASSERT_FALSE(client_->open("/shared", O_WRONLY | O_CREAT, 0644, &f));
  ASSERT_FALSE(f->close());
  for (int i = 0; i < kClients; ++i) {
    threads.emplace_back([&, i] {
      auto c = connect();
      if (!c) return;
      std::unique_ptr<File> h;
      Error e = c->open("/shared", O_WRONLY, 0, &h);
      ASSERT_FALSE(e) << e.message;
      std::vector<uint8_t> buf(kRange);
      fill(buf.data(), buf.size(), static_cast<uint64_t>(i) * kRange, 5);
      for (uint64_t off = 0; off < kRange; off += 100000) {
        size_t n = static_cast<size_t>(std::min<uint64_t>(100000, kRange - off)), done = 0;
        e = h->pwrite(buf.data() + off, n, static_cast<uint64_t>(i) * kRange + off, &done);
        ASSERT_FALSE(e) << e.message;
      }
      e = h->close();
      ASSERT_FALSE(e) << e.message;
    });
  }
  for (auto& t : threads) t.join();
  std::vector<uint8_t> want(kRange * kClients);
  fill(want.data(), want.size(), 0, 5);
  EXPECT_EQ(readAll(*client_, "/shared"), want);
}

// Full 1 MiB buffers are written behind while the writer goes on: a rewrite
// of bytes still on their way must land after them, a read must see every
// write before it, and a write behind that fails must be reported, not lost.
TEST_F(E2E, WritesBehindLandInOrderAndAFailureIsReported) {
  constexpr size_t kMiB = 1 << 20;
  std::vector<uint8_t> model(10 * kMiB), buf(kMiB);
  std::unique_ptr<File> f;
  ASSERT_FALSE(client_->open("/behind", O_RDWR | O_CREAT | O_TRUNC, 0644, &f));
  auto put = [&](uint64_t off, size_t n, uint64_t seed) {
    fill(buf.data(), n, off, seed);
    std::memcpy(model.data() + off, buf.data(), n);
    size_t done = 0;
    Error e = f->pwrite(buf.data(), n, off, &done);
    ASSERT_FALSE(e) << e.message;
    ASSERT_EQ(done, n);
  };
  for (uint64_t i = 0; i < 8; ++i) put(i * kMiB, kMiB, 1);  // whole chunks, behind
  put(2 * kMiB, kMiB, 2);                                   // the same bytes again
  put(5 * kMiB + 4093, 70000, 3);                           // inside a chunk on its way
  for (uint64_t off = 8 * kMiB; off < 10 * kMiB; off += 65536) put(off, 65536, 4);
  // A read of bytes just written, some of them maybe still on their way.
  std::vector<uint8_t> got(3 * kMiB);
  size_t n = 0;
  ASSERT_FALSE(f->pread(got.data(), got.size(), 1 * kMiB + 17, &n));
  ASSERT_EQ(n, got.size());
  EXPECT_TRUE(std::equal(got.begin(), got.end(), model.begin() + kMiB + 17));
  put(9 * kMiB, kMiB, 5);
  ASSERT_FALSE(f->close());
  EXPECT_EQ(readAll(*client_, "/behind"), model);

  // Storage refuses writes after the first two while meta keeps working: a
  // write behind that fails is reported by a later write or fsync, and by
  // close, and the file keeps the length of what was acknowledged before.
  ASSERT_TRUE(restartWithFaults("storage.write.after_data=error:kIOError@skip=2"))
      << cluster_->log();
  std::unique_ptr<File> g;
  ASSERT_FALSE(client_->open("/lost", O_WRONLY | O_CREAT | O_TRUNC, 0644, &g));
  Error failed = firstWriteError(*g, buf, 16);
  EXPECT_TRUE(failed) << "no write and no fsync reported the refused writes";
  EXPECT_EQ(failed.errno_value, EIO) << failed.message;
  EXPECT_NE(failed.message.find("/lost"), std::string::npos) << failed.message;
  EXPECT_TRUE(g->close()) << "close of a file whose writes were lost succeeded";
}

// Small files go to storage in one blocking call from the writer's thread
// (no driver thread): a busy target is retried there, a failing one is
// reported by close with the path, and nothing else is lost. (16 KiB: past
// the inline limit, which keeps smaller new files out of storage.)
TEST_F(E2E, SmallPieceWritesRetryBusyTargetsAndReportFailures) {
  std::vector<uint8_t> small((16 << 10) + 13);
  fill(small.data(), small.size(), 0, 21);
  auto writeSmall = [&](const std::string& path) -> Error {
    std::unique_ptr<File> f;
    if (Error e = client_->open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644, &f)) return e;
    size_t done = 0;
    if (Error e = f->pwrite(small.data(), small.size(), 0, &done)) return e;
    return f->close();
  };
  ASSERT_FALSE(writeSmall("/before"));
  // The first three writes find the target busy, then it takes them.
  ASSERT_TRUE(restartWithFaults("storage.write.after_data=error:kTargetBusy@times=3"))
      << cluster_->log();
  Error e = writeSmall("/busy");
  ASSERT_FALSE(e) << e.message;
  EXPECT_EQ(readAll(*client_, "/busy"), small);
  // Every write fails: close reports it, naming the file.
  ASSERT_TRUE(restartWithFaults("storage.write.after_data=error:kIOError")) << cluster_->log();
  e = writeSmall("/failed");
  EXPECT_EQ(e.errno_value, EIO) << e.message;
  EXPECT_NE(e.message.find("/failed"), std::string::npos) << e.message;
  EXPECT_EQ(readAll(*client_, "/before"), small);
  EXPECT_EQ(readAll(*client_, "/busy"), small);
}

// Chunk writes are acknowledged unsynced and made durable by fsync() and
// close(): one Sync per target written since the last one, none for a
// handle that only read, none from a client that syncs each write.
TEST_F(E2E, WritesAreSyncedAtFsyncAndCloseOncePerTargetWritten) {
  client_.reset();
  ASSERT_EQ(cluster_->stop(), 0) << cluster_->log();
  cluster_->setSync(true);  // a cluster without sync has nothing to sync
  ASSERT_TRUE(cluster_->start());
  client_ = connect();
  ASSERT_NE(client_, nullptr);
  auto& syncs = metrics::Registry::global().counter("client_syncs_total");
  std::vector<uint8_t> want(4 * kChunk);
  fill(want.data(), want.size(), 0, 21);
  std::unique_ptr<File> f;
  ASSERT_FALSE(client_->open("/synced", O_WRONLY | O_CREAT, 0644, &f));
  size_t done = 0;
  ASSERT_FALSE(f->pwrite(want.data(), want.size(), 0, &done));  // both targets
  const uint64_t before = syncs.value();
  ASSERT_FALSE(f->fsync());
  EXPECT_EQ(syncs.value() - before, 2u);
  ASSERT_FALSE(f->fsync());
  EXPECT_EQ(syncs.value() - before, 2u) << "nothing new to sync";
  fill(want.data(), kChunk, 0, 22);
  ASSERT_FALSE(f->pwrite(want.data(), kChunk, 0, &done));  // chunk 0: one target
  ASSERT_FALSE(f->close());
  EXPECT_EQ(syncs.value() - before, 3u);
  std::unique_ptr<File> r;
  ASSERT_FALSE(client_->open("/synced", O_RDONLY, 0, &r));
  std::vector<uint8_t> got(want.size());
  ASSERT_FALSE(r->pread(got.data(), got.size(), 0, &done));
  EXPECT_EQ(got, want);
  ASSERT_FALSE(r->close());
  EXPECT_EQ(syncs.value() - before, 3u) << "a reader syncs nothing";

  Client::Options o;
  o.cluster = cluster_->cluster();
  o.sync_each_write = true;
  auto [each, err] = Client::connect(o);
  ASSERT_FALSE(err) << err.message;
  ASSERT_FALSE(each->open("/synced", O_WRONLY, 0, &f));
  fill(want.data(), want.size(), 0, 23);
  ASSERT_FALSE(f->pwrite(want.data(), want.size(), 0, &done));
  ASSERT_FALSE(f->fsync());
  ASSERT_FALSE(f->close());
  EXPECT_EQ(syncs.value() - before, 3u) << "each write was durable already";
  ASSERT_FALSE(client_->open("/synced", O_RDONLY, 0, &r));
  ASSERT_FALSE(r->pread(got.data(), got.size(), 0, &done));
  EXPECT_EQ(got, want);
}

TEST_F(E2E, EveryByteSurvivesARestart) {
  std::map<std::string, std::pair<uint64_t, uint32_t>> files;
  ASSERT_FALSE(client_->mkdir("/keep/a/b", 0755, true));
  for (int i = 0; i < 6; ++i) {
    std::string p = "/keep/a/b/file" + std::to_string(i);
    uint64_t size = static_cast<uint64_t>(i) * 777777 + 3;
    files[p] = {size, writeFile(*client_, p, size, 1000 + i)};
  }
  client_.reset();
  ASSERT_EQ(cluster_->stop(), 0) << cluster_->log();
  ASSERT_TRUE(cluster_->start());  // new ports, same data
  client_ = connect();
  ASSERT_NE(client_, nullptr);
  for (const auto& [p, want] : files) {
    auto [crc, size] = readFile(*client_, p);
    EXPECT_EQ(size, want.first) << p;
    EXPECT_EQ(crc, want.second) << p;
  }
  auto r = cli({"fsck"});
  EXPECT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("clean"), std::string::npos) << r.out;
}

// The durability contract (docs/fuse.md, "Durability"): meta commits
// namespace changes unsynced. With kv.log.unsynced_in_memory, a SIGKILL of
// the server loses what a power loss would: the changes since the last
// sync (an fsync, or the first chunk write of a file, which makes its
// create durable first). After the restart the namespace is the state after
// some prefix of the changes, at least up to the last fsync; every file
// there has its bytes; fsck is clean (no chunks of a lost file).
TEST_F(E2E, ACrashLosesOnlyASuffixOfUnsyncedNamespaceChanges) {
  client_.reset();
  ASSERT_EQ(cluster_->stop(), 0);
  std::string config = (dir_ / "lazy.toml").string();
  std::ofstream(config) << "[kv.rocksdb]\nlazy_sync_ms = 600000\n";
  cluster_->setSync(true);
  cluster_->setExtraArgs({"--config", config});
  setenv("CISTERN_FAULTS", "kv.log.unsynced_in_memory=error", 1);
  bool started = cluster_->start();
  unsetenv("CISTERN_FAULTS");
  ASSERT_TRUE(started);
  client_ = connect();
  ASSERT_NE(client_, nullptr);
  ASSERT_FALSE(client_->mkdir("/d", 0755, false));
  ASSERT_FALSE(client_->syncNamespace());

  // states[k]: the directory after the first k changes (name -> crc, size).
  using State = std::map<std::string, std::pair<uint32_t, uint64_t>>;
  std::vector<State> states{State{}};
  size_t synced = 0;  // changes known durable
  auto change = [&](auto fn) {
    State next = states.back();
    fn(next);
    states.push_back(std::move(next));
  };
  for (int i = 0; i < 66; ++i) {
    const std::string name = "f" + std::to_string(i);
    // Every 8th file goes to chunks (its first chunk write syncs what came
    // before); the rest stay inline in the KV.
    const uint64_t size = i % 8 == 3 ? 300'000 : 1 + (i * 331) % 3000;
    const bool fsync = i % 20 == 10;
    change([&](State& st) {
      std::unique_ptr<File> f;
      ASSERT_FALSE(client_->open("/d/" + name, O_WRONLY | O_CREAT | O_EXCL, 0644, &f));
      std::vector<uint8_t> data(size);
      fill(data.data(), size, 0, static_cast<uint32_t>(i));
      size_t done = 0;
      ASSERT_FALSE(f->pwrite(data.data(), size, 0, &done));
      if (fsync) {
        ASSERT_FALSE(f->fsync());
      }
      ASSERT_FALSE(f->close());
      st["/d/" + name] = {crc32cExtend(0, data.data(), size), size};
    });
    if (fsync || size > 8192) synced = states.size() - 1;
    if (i % 6 == 5) {  // a rename of an inline file
      const std::string from = "/d/f" + std::to_string(i - 1);
      change([&](State& st) {
        ASSERT_FALSE(client_->rename(from, from + ".r"));
        st[from + ".r"] = st[from];
        st.erase(from);
      });
    }
    if (i % 9 == 8) {  // an unlink of an inline file
      const std::string gone = "/d/f" + std::to_string(i - 2);
      change([&](State& st) {
        if (!st.count(gone)) return;
        ASSERT_FALSE(client_->unlink(gone));
        st.erase(gone);
      });
    }
    if (HasFailure()) return;
  }
  ASSERT_GT(states.size() - 1, synced + 5) << "the test ends with unsynced changes";

  client_.reset();
  ASSERT_EQ(kill(cluster_->pid(), SIGKILL), 0);
  (void)cluster_->stop();
  cluster_->setExtraArgs({});
  ASSERT_TRUE(cluster_->start());
  client_ = connect();
  ASSERT_NE(client_, nullptr);

  std::vector<DirEntry> entries;
  ASSERT_FALSE(client_->list("/d", &entries));
  State found;
  for (const auto& e : entries) found["/d/" + e.name] = readFile(*client_, "/d/" + e.name);
  size_t prefix = states.size();
  for (size_t k = 0; k < states.size(); ++k) {
    if (states[k] == found) prefix = k;
  }
  auto show = [](const State& st) {
    std::string out;
    for (const auto& [name, v] : st) out += " " + name.substr(3) + ":" + std::to_string(v.second);
    return out;
  };
  ASSERT_LT(prefix, states.size())
      << "the namespace after the crash is no prefix of the "
         "changes; it holds"
      << show(found) << "\nafter the last fsync:" << show(states[synced])
      << "\nat the end:" << show(states.back());
  EXPECT_GE(prefix, synced) << "a change made durable was lost";
  // What the simulated power loss took: the unsynced tail.
  EXPECT_LT(prefix, states.size() - 1) << "nothing unsynced was lost: the test tests nothing";
  CheckReport report;
  ASSERT_FALSE(client_->fsck(&report));
  EXPECT_TRUE(report.problems.empty()) << report.problems.front();
  EXPECT_EQ(report.orphan_chunks, 0u);
}

TEST_F(E2E, BadInputGetsTheRightErrnoAndWritesNothing) {
  std::unique_ptr<File> f;
  FileInfo info;
  std::vector<DirEntry> before, after;
  ASSERT_FALSE(client_->mkdir("/dir", 0755, false));
  writeFile(*client_, "/dir/file", 10, 1);
  ASSERT_FALSE(client_->list("/", &before));

  Error e = client_->open("/missing", O_RDONLY, 0, &f);
  EXPECT_EQ(e.errno_value, ENOENT);
  EXPECT_EQ(e.message, "/missing: No such file or directory");
  EXPECT_EQ(client_->stat("/dir/nope/x", &info).errno_value, ENOENT);
  EXPECT_EQ(client_->open("/dir", O_WRONLY, 0, &f).errno_value, EISDIR);
  EXPECT_EQ(client_->open("/dir", O_RDONLY, 0, &f).errno_value, EISDIR);
  EXPECT_EQ(client_->open("/dir/file/x", O_WRONLY | O_CREAT, 0644, &f).errno_value, ENOTDIR);
  EXPECT_EQ(client_->list("/dir/file", &after).errno_value, ENOTDIR);
  EXPECT_EQ(client_->open("/dir/file", O_WRONLY | O_CREAT | O_EXCL, 0644, &f).errno_value, EEXIST);
  EXPECT_EQ(client_->mkdir("/dir", 0755, false).errno_value, EEXIST);
  EXPECT_EQ(client_->mkdir("/dir/file/sub", 0755, true).errno_value, ENOTDIR);
  EXPECT_EQ(client_->rmdir("/dir").errno_value, ENOTEMPTY);
  EXPECT_EQ(client_->unlink("/dir").errno_value, EISDIR);
  EXPECT_EQ(client_->truncate("/dir", 0).errno_value, EISDIR);
  EXPECT_EQ(client_->stat("relative/path", &info).errno_value, EINVAL);
  EXPECT_EQ(client_->open(std::string("/a\0b", 4), O_WRONLY | O_CREAT, 0644, &f).errno_value,
            EINVAL);
  EXPECT_EQ(client_->open("/" + std::string(256, 'n'), O_WRONLY | O_CREAT, 0644, &f).errno_value,
            ENAMETOOLONG);
  EXPECT_EQ(client_->rename("/dir", "/dir/file/inside").errno_value, ENOTDIR);
  EXPECT_EQ(client_->rename("/dir", "/dir/sub").errno_value, EINVAL);

  // A read-only handle cannot write and a write-only one cannot read.
  ASSERT_FALSE(client_->open("/dir/file", O_RDONLY, 0, &f));
  size_t done = 0;
  EXPECT_EQ(f->pwrite("x", 1, 0, &done).errno_value, EBADF);
  ASSERT_FALSE(f->close());
  EXPECT_EQ(f->close().errno_value, EBADF);

  // Permissions: an unprivileged caller in a root-owned private directory.
  ASSERT_FALSE(client_->mkdir("/private", 0700, false));
  auto user = connect(1000, 1000);
  ASSERT_NE(user, nullptr);
  EXPECT_EQ(user->open("/private/x", O_WRONLY | O_CREAT, 0644, &f).errno_value, EACCES);
  EXPECT_EQ(user->mkdir("/private/d", 0755, false).errno_value, EACCES);
  EXPECT_EQ(user->open("/dir/file", O_WRONLY, 0, &f).errno_value, EACCES);
  EXPECT_EQ(user->open("/dir/new", O_WRONLY | O_CREAT, 0644, &f).errno_value, EACCES);
  EXPECT_EQ(user->unlink("/dir/file").errno_value, EACCES);
  auto [crc, size] = readFile(*user, "/dir/file");  // 0644: others may read
  EXPECT_EQ(size, 10u);
  // Truncates are checked before they cut storage: a chunked file the user
  // may not write keeps every byte (and one it may write but not read stays
  // whole under an O_RDWR | O_TRUNC open).
  uint32_t big_crc = writeFile(*client_, "/dir/big", 3 * kChunk + 5, 9);
  EXPECT_EQ(user->truncate("/dir/big", 1).errno_value, EACCES);
  EXPECT_EQ(user->open("/dir/big", O_WRONLY | O_TRUNC, 0, &f).errno_value, EACCES);
  EXPECT_EQ(readFile(*client_, "/dir/big"), std::make_pair(big_crc, 3 * kChunk + 5));
  ASSERT_FALSE(client_->unlink("/dir/big"));
  std::vector<uint8_t> bytes(2 * kChunk + 5, 0x3C);
  ASSERT_FALSE(client_->open("/dir/wo", O_WRONLY | O_CREAT | O_EXCL, 0602, &f));
  ASSERT_FALSE(f->pwrite(bytes.data(), bytes.size(), 0, &done));
  ASSERT_FALSE(f->close());
  EXPECT_EQ(user->open("/dir/wo", O_RDWR | O_TRUNC, 0, &f).errno_value, EACCES);
  EXPECT_EQ(readAll(*client_, "/dir/wo"), bytes);
  ASSERT_FALSE(client_->unlink("/dir/wo"));

  // Nothing was created by the failed calls.
  ASSERT_FALSE(client_->list("/", &after));
  std::vector<std::string> names;
  for (const auto& d : after) names.push_back(d.name);
  EXPECT_EQ(names, (std::vector<std::string>{"dir", "private"}));
  std::vector<DirEntry> in_dir, in_private;
  ASSERT_FALSE(client_->list("/dir", &in_dir));
  EXPECT_EQ(in_dir.size(), 1u);
  ASSERT_FALSE(client_->list("/private", &in_private));
  EXPECT_TRUE(in_private.empty());

  // An unreachable cluster: ENOTCONN after the retry budget, with the address in the message.
  int s = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(s, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  socklen_t len = sizeof a;
  getsockname(s, reinterpret_cast<sockaddr*>(&a), &len);
  std::string dead = "127.0.0.1:" + std::to_string(ntohs(a.sin_port));  // bound, not listening
  Client::Options o;
  o.cluster = dead;
  o.retry_ms = 300;
  auto [none, err] = Client::connect(o);
  close(s);
  EXPECT_EQ(none, nullptr);
  EXPECT_EQ(err.errno_value, ENOTCONN);
  EXPECT_NE(err.message.find(dead), std::string::npos) << err.message;
}

TEST_F(E2E, SpecialFilesThroughTheClientAndTheCli) {
  Client& c = *client_;
  ASSERT_FALSE(c.mkdir("/sp", 0777, false));
  ASSERT_FALSE(c.mknod("/sp/fifo", S_IFIFO | 0640, 0));
  ASSERT_FALSE(c.mknod("/sp/sock", S_IFSOCK | 0600, 0));
  ASSERT_FALSE(c.mknod("/sp/reg", S_IFREG | 0600, 0));
  ASSERT_FALSE(c.symlink("fifo", "/sp/link"));
  FileInfo info;
  ASSERT_FALSE(c.stat("/sp/fifo", &info));
  EXPECT_EQ(info.mode, uint32_t{S_IFIFO | 0640});
  ASSERT_FALSE(c.stat("/sp/reg", &info));
  EXPECT_TRUE(info.isRegular());
  ASSERT_FALSE(c.stat("/sp/link", &info));  // the link itself
  EXPECT_EQ(info.mode & S_IFMT, uint32_t{S_IFLNK});
  std::string target;
  ASSERT_FALSE(c.readlink("/sp/link", &target));
  EXPECT_EQ(target, "fifo");
  EXPECT_EQ(c.readlink("/sp/fifo", &target).errno_value, EINVAL);
  std::unique_ptr<File> f;
  Error e = c.open("/sp/fifo", O_RDONLY, 0, &f);
  EXPECT_EQ(e.errno_value, ENXIO) << e.message;
  EXPECT_NE(e.message.find("through a mount"), std::string::npos) << e.message;
  EXPECT_EQ(c.mknod("/sp/fifo", S_IFIFO | 0640, 0).errno_value, EEXIST);
  EXPECT_EQ(c.mknod("/sp/dir", S_IFDIR | 0755, 0).errno_value, EINVAL);
  EXPECT_EQ(c.mknod("/nodir/x", S_IFIFO | 0640, 0).errno_value, ENOENT);
  EXPECT_EQ(c.mknod("/sp/reg/x", S_IFIFO | 0640, 0).errno_value, ENOTDIR);
  EXPECT_EQ(c.symlink("x", "/sp/fifo").errno_value, EEXIST);
  if (::geteuid() == 0) {
    ASSERT_FALSE(c.mknod("/sp/null", S_IFCHR | 0666, makedev(1, 3)));
    ASSERT_FALSE(c.stat("/sp/null", &info));
    EXPECT_EQ(info.rdev, makedev(1, 3));
    auto r = cli({"mknod", "/sp/blk", "b", "8", "16"});
    EXPECT_EQ(r.exit_code, 0) << r.err;
  }
  auto r = cli({"mknod", "/sp/p2", "p"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = cli({"mknod", "/sp/p3", "p", "1", "2"});
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("no device numbers"), std::string::npos) << r.err;
  r = cli({"ln", "-s", "reg", "/sp/l2"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = cli({"ls", "-l", "/sp"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("prw-r----- "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("srw------- "), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("link -> fifo"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("l2 -> reg"), std::string::npos) << r.out;
  if (::geteuid() == 0) {
    EXPECT_NE(r.out.find("crw-rw-rw- "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("1, 3 "), std::string::npos) << r.out;
    EXPECT_NE(r.out.find("8, 16 "), std::string::npos) << r.out;
  }
  r = cli({"stat", "/sp/sock"});
  EXPECT_NE(r.out.find("Type: socket"), std::string::npos) << r.out;
}

// The inode API (FUSE, Python): every call by inode number, as the given
// credentials, with the permission rules and errnos of the path calls.
TEST_F(E2E, TheInodeApiActsAsItsCallerOnInodeNumbers) {
  Client& c = *client_;
  const Credentials root;
  const Credentials alice{1000, 1000, {}};
  const Credentials bob{1001, 1001, {}};
  FileInfo dir, info;
  ASSERT_FALSE(c.mkdirAt(root, Client::kRootIno, "ia", 0755, &dir));
  EXPECT_TRUE(dir.isDir());
  EXPECT_EQ(dir.parent, Client::kRootIno);
  ASSERT_FALSE(c.setattr(root, dir.ino, {.uid = 1000, .gid = 1000}, &dir));
  EXPECT_EQ(dir.uid, 1000u);
  // Alice owns the directory; bob may not create in it.
  EXPECT_EQ(c.mkdirAt(bob, dir.ino, "x", 0755, &info).errno_value, EACCES);
  ASSERT_FALSE(c.mknodAt(alice, dir.ino, "f", S_IFREG | 0640, 0, &info));
  const uint64_t f = info.ino;
  EXPECT_TRUE(info.isRegular());
  EXPECT_EQ(info.uid, 1000u);
  ASSERT_FALSE(c.mknodAt(alice, dir.ino, "p", S_IFIFO | 0600, 0, &info));
  EXPECT_EQ(info.mode, uint32_t{S_IFIFO | 0600});
  EXPECT_EQ(c.mknodAt(alice, dir.ino, "c", S_IFCHR | 0600, makedev(1, 3), &info).errno_value,
            EPERM);
  ASSERT_FALSE(c.symlinkAt(alice, dir.ino, "l", "f", &info));
  std::string target;
  ASSERT_FALSE(c.readlinkAt(info.ino, &target));
  EXPECT_EQ(target, "f");
  EXPECT_EQ(c.readlinkAt(f, &target).errno_value, EINVAL);
  ASSERT_FALSE(c.lookup(bob, dir.ino, "f", &info));
  EXPECT_EQ(info.ino, f);
  EXPECT_EQ(c.lookup(bob, dir.ino, "missing", &info).errno_value, ENOENT);
  EXPECT_EQ(c.lookup(bob, f, "x", &info).errno_value, ENOTDIR);
  // Permissions of the caller: bob reads nothing of a 0640 file of alice's.
  EXPECT_EQ(c.access(bob, f, R_OK).errno_value, EACCES);
  EXPECT_FALSE(c.access(alice, f, R_OK | W_OK));
  EXPECT_EQ(c.setattr(bob, f, {.mode = 0777}, &info).errno_value, EPERM);
  EXPECT_EQ(c.setattr(bob, f, {.size = 0}, &info).errno_value, EACCES);
  // A size through setattr: the bytes past it are gone, as with truncate().
  std::unique_ptr<File> w;
  ASSERT_FALSE(c.open("/ia/f", O_WRONLY, 0, &w));
  size_t n = 0;
  ASSERT_FALSE(w->pwrite("0123456789", 10, 0, &n));
  ASSERT_FALSE(w->close());
  ASSERT_FALSE(c.setattr(alice, f, {.size = 4}, &info));
  EXPECT_EQ(info.size, 4u);
  ASSERT_FALSE(c.setattr(alice, f, {.size = 8}, &info));
  std::unique_ptr<File> r;
  ASSERT_FALSE(c.open("/ia/f", O_RDONLY, 0, &r));
  char buf[16] = {};
  ASSERT_FALSE(r->pread(buf, sizeof buf, 0, &n));
  EXPECT_EQ(std::string(buf, n), std::string("0123\0\0\0\0", 8));
  ASSERT_FALSE(r->close());
  ASSERT_FALSE(c.getattr(f, &info));
  EXPECT_EQ(info.size, 8u);
  // Links, renames, xattrs, a paged listing, removal.
  ASSERT_FALSE(c.linkAt(alice, f, dir.ino, "g", &info));
  EXPECT_EQ(info.nlink, 2u);
  ASSERT_FALSE(c.renameAt(alice, dir.ino, "g", dir.ino, "h", 0));
  EXPECT_EQ(c.renameAt(alice, dir.ino, "h", dir.ino, "f", RENAME_NOREPLACE).errno_value, EEXIST);
  ASSERT_FALSE(c.setxattr(alice, f, "user.k", "v", 0));
  EXPECT_EQ(c.setxattr(alice, f, "user.k", "w", XATTR_CREATE).errno_value, EEXIST);
  std::string value;
  ASSERT_FALSE(c.getxattr(alice, f, "user.k", &value));
  EXPECT_EQ(value, "v");
  std::vector<std::string> names;
  ASSERT_FALSE(c.listxattr(alice, f, &names));
  EXPECT_EQ(names, std::vector<std::string>{"user.k"});
  ASSERT_FALSE(c.removexattr(alice, f, "user.k"));
  EXPECT_EQ(c.getxattr(alice, f, "user.k", &value).errno_value, ENODATA);
  std::vector<std::string> listed;
  std::string cookie;
  do {
    DirPage page;
    ASSERT_FALSE(c.readdirAt(alice, dir.ino, cookie, 2, /*attributes=*/true, &page));
    for (const auto& e : page.entries) EXPECT_NE(e.info.nlink, 0u) << e.name;
    EXPECT_LE(page.entries.size(), 2u);
    for (const auto& e : page.entries) listed.push_back(e.name);
    cookie = page.next_cookie;
  } while (!cookie.empty());
  EXPECT_EQ(listed, (std::vector<std::string>{"f", "h", "l", "p"}));
  DirPage bare;
  ASSERT_FALSE(c.readdirAt(alice, dir.ino, "", 10, /*attributes=*/false, &bare));
  ASSERT_EQ(bare.entries.size(), 4u);
  EXPECT_EQ(bare.entries[3].info.mode, uint32_t{S_IFIFO});  // "p": type bits only
  EXPECT_EQ(bare.entries[3].info.nlink, 0u);
  EXPECT_EQ(c.rmdirAt(alice, dir.ino, "f").errno_value, ENOTDIR);
  EXPECT_EQ(c.unlinkAt(bob, dir.ino, "f").errno_value, EACCES);
  for (const char* name : {"f", "h", "l", "p"}) ASSERT_FALSE(c.unlinkAt(alice, dir.ino, name));
  EXPECT_EQ(c.getattr(f, &info).errno_value, ENOENT);
  EXPECT_EQ(c.rmdirAt(alice, Client::kRootIno, "ia").errno_value, EACCES);  // root's 0755 root
  ASSERT_FALSE(c.rmdirAt(root, Client::kRootIno, "ia"));
}

TEST_F(E2E, CliCommands) {
  auto local = dir_ / "local";
  std::filesystem::create_directories(local / "tree" / "sub");
  auto put_file = [](const std::filesystem::path& p, const std::string& text) {
    std::ofstream(p, std::ios::binary) << text;
  };
  std::string big(3 * kChunk + 77, '\0');
  fill(reinterpret_cast<uint8_t*>(big.data()), big.size(), 0, 3);
  put_file(local / "tree" / "a.txt", "hello\n");
  put_file(local / "tree" / "sub" / "big.bin", big);
  put_file(local / "one.txt", "just one\n");

  auto r = cli({"mkdir", "-p", "/x/y/z"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = cli({"put", (local / "tree").string(), "/x"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = cli({"put", (local / "one.txt").string(), "/x/y/one.txt"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = cli({"ls", "/x"});
  EXPECT_EQ(r.out, "tree\ny\n");
  r = cli({"ls", "-l", "/x/tree/sub"});
  EXPECT_NE(r.out.find(std::to_string(big.size()) + " "), std::string::npos) << r.out;
  r = cli({"cat", "/x/tree/a.txt", "/x/y/one.txt"});
  EXPECT_EQ(r.out, "hello\njust one\n");
  r = cli({"stat", "/x/tree/sub/big.bin"});
  EXPECT_NE(r.out.find("Size: " + std::to_string(big.size())), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("regular file"), std::string::npos) << r.out;

  r = cli({"get", "/x/tree", (local / "back").string()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  std::ifstream in(local / "back" / "sub" / "big.bin", std::ios::binary);
  std::string back((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_TRUE(back == big);

  r = cli({"mv", "/x/y/one.txt", "/x/tree"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = cli({"cat", "/x/tree/one.txt"});
  EXPECT_EQ(r.out, "just one\n");

  // Errors read like coreutils and exit non-zero.
  r = cli({"cat", "/nope"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "cistern: /nope: No such file or directory\n");
  r = cli({"get", "/nope", (local / "nope").string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_FALSE(std::filesystem::exists(local / "nope"));  // nothing written
  r = cli({"put", (local / "missing").string(), "/m"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "cistern: " + (local / "missing").string() + ": No such file or directory\n");
  r = cli({"rm", "/x"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_EQ(r.err, "cistern: /x: Is a directory\n");
  r = cli({"mkdir", "/x"});
  EXPECT_EQ(r.err, "cistern: /x: File exists\n");
  r = runProgram(CISTERN_BIN, {"ls", "/", "--retry-ms", "200", "--cluster", "127.0.0.1:1"});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("cistern: cluster 127.0.0.1:1: Transport endpoint is not connected"),
            std::string::npos)
      << r.err;
  r = runProgram(CISTERN_BIN, {"ls", "/"}, {"CISTERN_CLUSTER=" + cluster_->cluster()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.out, "x\n");

  r = cli({"rm", "-r", "/x"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = cli({"ls", "/"});
  EXPECT_EQ(r.out, "");
  r = cli({"df"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("Avail"), std::string::npos) << r.out;
  r = cli({"status"});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("2 targets, 2 chains"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find(" kept "), std::string::npos) << r.out;  // freed slots' blocks
  EXPECT_NE(r.out.find("healthy"), std::string::npos) << r.out;
  r = cli({"fsck"});
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_NE(r.out.find("chunks (0 past their file's end, 0 of no file): clean"), std::string::npos)
      << r.out;
  r = cli({"fsck", "--remove-orphan-chunks"});
  EXPECT_EQ(r.exit_code, 0) << r.out;
  EXPECT_EQ(r.out.find("removed"), std::string::npos) << r.out;  // nothing to remove
}

// Parses Prometheus text format 0.0.4; fails the test on a malformed line.
std::map<std::string, double> parseMetrics(const std::string& text) {
  static const std::regex sample(
      R"(^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{([a-zA-Z_][a-zA-Z0-9_]*="([^"\\]|\\.)*",?)*\})? ([-+]?([0-9.eE+-]+|Inf|NaN))$)");
  static const std::regex comment(R"(^# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .*$)");
  std::map<std::string, double> out;
  size_t pos = 0;
  while (pos < text.size()) {
    size_t nl = text.find('\n', pos);
    std::string line = text.substr(pos, nl - pos);
    pos = nl == std::string::npos ? text.size() : nl + 1;
    if (line.empty()) continue;
    if (line[0] == '#') {
      EXPECT_TRUE(std::regex_match(line, comment)) << line;
      continue;
    }
    std::smatch m;
    EXPECT_TRUE(std::regex_match(line, m, sample)) << line;
    if (m.size() > 1)
      out[line.substr(0, line.rfind(' '))] = std::stod(line.substr(line.rfind(' ') + 1));
  }
  return out;
}

double sumOf(const std::map<std::string, double>& m, const std::string& prefix) {
  double s = 0;
  for (const auto& [k, v] : m)
    if (k.rfind(prefix, 0) == 0) s += v;
  return s;
}

TEST_F(E2E, SameHostReadsComeThroughSharedMemoryAndMatchSocketReads) {
  std::vector<uint8_t> want;
  ASSERT_NO_FATAL_FAILURE(writeHoleyFile("/shm", &want));
  // 1 MiB of shared memory: 64 KiB slots, so every chunk takes many reads.
  // (Short-circuit reads, which take the place of shared memory for reads
  // where a client can open the servers' files, are off.)
  auto with_shm = connect(~0u, ~0u, 1 << 20, /*short_circuit=*/false);
  ASSERT_NE(with_shm, nullptr);
  // The first read attaches to each server (pieces that find an attach in
  // progress use the socket meanwhile); after that every byte comes through
  // shared memory.
  EXPECT_EQ(readAll(*with_shm, "/shm"), want);
  uint64_t shm0 = readBytesBy("shm"), sock0 = readBytesBy("socket");
  EXPECT_EQ(readAll(*with_shm, "/shm"), want);
  uint64_t shm1 = readBytesBy("shm"), sock1 = readBytesBy("socket");
  EXPECT_GE(shm1 - shm0, 3 * kChunk) << "the written chunks came through shared memory";
  EXPECT_EQ(sock1, sock0);
  // A server that forgot the memory (restarted, or evicted it for newer
  // clients) answers kNotFound: the client attaches again and goes on.
  detachAllSharedMemory();
  // The first read finds the handles gone, the next attaches anew (pieces
  // that find the attach in progress use the socket), then all is shared.
  EXPECT_EQ(readAll(*with_shm, "/shm"), want);
  EXPECT_EQ(readAll(*with_shm, "/shm"), want);
  shm0 = readBytesBy("shm");
  sock0 = readBytesBy("socket");
  EXPECT_EQ(readAll(*with_shm, "/shm"), want);
  shm1 = readBytesBy("shm");
  sock1 = readBytesBy("socket");
  EXPECT_GE(shm1 - shm0, 3 * kChunk) << "shared memory again after attaching anew";
  EXPECT_EQ(sock1, sock0);
  // The same bytes over the socket when it is off.
  auto without = connect(~0u, ~0u, 0, /*short_circuit=*/false);
  ASSERT_NE(without, nullptr);
  EXPECT_EQ(readAll(*without, "/shm"), want);
  EXPECT_EQ(readBytesBy("shm"), shm1);
  EXPECT_GE(readBytesBy("socket") - sock1, 3 * kChunk);
  // Random reads at every alignment through the default (64 MiB) memory.
  auto full = connect(~0u, ~0u, Client::Options{}.shm_bytes, /*short_circuit=*/false);
  ASSERT_NE(full, nullptr);
  expectRandomReadsMatch(*full, "/shm", want, 5);
}

// A client on the servers' host that can open their files (root here)
// reads chunk bytes from them itself, verified against the CRCs each
// server's Locate gives; the same bytes as through the server, holes and
// odd edges included. A flipped bit on the disk fails the check, and the
// read through the server then reports the corruption (EIO), never the
// wrong bytes. A Locate from another host is refused.
TEST_F(E2E, ShortCircuitReadsComeFromTheServersFilesAndMatchServerReads) {
  std::vector<uint8_t> want;
  ASSERT_NO_FATAL_FAILURE(writeHoleyFile("/sc", &want));
  auto& fallbacks = metrics::Registry::global().counter("client_short_circuit_fallbacks_total");
  auto sc = connect();
  ASSERT_NE(sc, nullptr);
  uint64_t sc0 = readBytesBy("short_circuit"), shm0 = readBytesBy("shm"),
           sock0 = readBytesBy("socket");
  EXPECT_EQ(readAll(*sc, "/sc"), want);
  EXPECT_GE(readBytesBy("short_circuit") - sc0, 3 * kChunk) << "the written chunks, from the files";
  EXPECT_EQ(readBytesBy("shm"), shm0);
  EXPECT_EQ(readBytesBy("socket"), sock0);
  // Sequential reads in small steps: read-ahead windows filled the same way.
  sc0 = readBytesBy("short_circuit");
  EXPECT_EQ(readAll(*sc, "/sc", 64 << 10), want);
  EXPECT_GE(readBytesBy("short_circuit") - sc0, 3 * kChunk);
  // Random reads at every alignment.
  sc0 = readBytesBy("short_circuit");
  expectRandomReadsMatch(*sc, "/sc", want, 6);
  EXPECT_GT(readBytesBy("short_circuit"), sc0);
  std::unique_ptr<File> r;
  // A piece of a window read ahead fails: the reader reads those bytes
  // again, and gets them. Failing for good, it reports the error at the
  // first byte it cannot read, and every byte before that is right.
  auto& rereads = metrics::Registry::global().counter("client_readahead_rereads_total");
  const uint64_t rr0 = rereads.value();
  fault::enable("client.short_circuit.read", {.skip = 3, .times = 1});
  EXPECT_EQ(readAll(*sc, "/sc", 64 << 10), want);
  EXPECT_EQ(fault::fired("client.short_circuit.read"), 1u);
  EXPECT_EQ(rereads.value(), rr0 + 1) << "the window taken over while read failed";
  fault::enable("client.short_circuit.read", {.skip = 3});
  {
    std::unique_ptr<File> h;
    ASSERT_FALSE(sc->open("/sc", O_RDONLY, 0, &h));
    std::vector<uint8_t> got(want.size());
    uint64_t at = 0;
    Error e;
    while (at < got.size()) {
      size_t n = 0;
      e = h->pread(got.data() + at, std::min<uint64_t>(64 << 10, got.size() - at), at, &n);
      if (e) break;
      at += n;
    }
    EXPECT_EQ(e.errno_value, EIO) << e.message;
    EXPECT_LT(at, want.size());
    EXPECT_TRUE(std::equal(got.begin(), got.begin() + static_cast<long>(at), want.begin()));
    EXPECT_FALSE(h->close());
  }
  fault::disable("client.short_circuit.read");
  // Off: through the servers.
  auto off = connect(~0u, ~0u, Client::Options{}.shm_bytes, /*short_circuit=*/false);
  ASSERT_NE(off, nullptr);
  sc0 = readBytesBy("short_circuit");
  EXPECT_EQ(readAll(*off, "/sc"), want);
  EXPECT_EQ(readBytesBy("short_circuit"), sc0);

  // Where chunk 0 lies, from its server, as a client elsewhere would ask.
  FileInfo info;
  ASSERT_FALSE(client_->stat("/sc", &info));
  std::regex storage_line(R"(storage target \d+ at \S+ on (\S+))");
  net::RpcClient raw;
  const net::Method locate = net::Method::of("cistern.storage.StorageService.Locate");
  std::optional<storage::LocatedRange> chunk0;
  for (std::sregex_iterator it(cluster_->log().begin(), cluster_->log().end(), storage_line), end;
       it != end; ++it) {
    auto ep = net::Endpoint::parse((*it)[1].str());
    ASSERT_TRUE(ep.ok());
    storage::LocateReq req;
    auto* range = req.add_ranges();
    range->mutable_chunk()->set_inode(info.ino);
    range->mutable_chunk()->set_index(0);
    range->set_length(kChunk);
    storage::LocateResp resp;
    req.set_boot_id("another host");
    EXPECT_EQ(raw.callSync(*ep, locate, req, &resp).code(), ErrorCode::kNotFound);
    req.set_boot_id(hostBootId());
    ASSERT_TRUE(raw.callSync(*ep, locate, req, &resp).ok());
    ASSERT_EQ(resp.ranges_size(), 1);
    if (resp.ranges(0).code() == 0) chunk0 = resp.ranges(0);
  }
  ASSERT_TRUE(chunk0.has_value()) << "one of the two servers holds chunk 0";
  EXPECT_EQ(chunk0->chunk_length(), kChunk);
  EXPECT_EQ(chunk0->crcs_size(), static_cast<int>(kChunk / 4096));
  // A bit flipped in its block 5 on the disk.
  auto flip = [&] {
    int fd = ::open(chunk0->path().c_str(), O_RDWR);
    ASSERT_GE(fd, 0) << chunk0->path();
    uint8_t byte = 0;
    const off_t at = static_cast<off_t>(chunk0->slot_offset() + 5 * 4096 + 77);
    ASSERT_EQ(::pread(fd, &byte, 1, at), 1);
    byte ^= 0x04;
    ASSERT_EQ(::pwrite(fd, &byte, 1, at), 1);
    ASSERT_EQ(::fsync(fd), 0);
    ::close(fd);
  };
  flip();
  const uint64_t fb0 = fallbacks.value();
  ASSERT_FALSE(sc->open("/sc", O_RDONLY, 0, &r));
  std::vector<uint8_t> got(kChunk);
  size_t done = 0;
  Error e = r->pread(got.data(), kChunk, 0, &done);
  EXPECT_EQ(e.errno_value, EIO) << e.message;
  EXPECT_GE(fallbacks.value(), fb0 + 1) << "tried through the server after the CRC failed";
  EXPECT_FALSE(r->close());
  flip();  // back as it was
  EXPECT_EQ(readAll(*sc, "/sc"), want);
}

// Sequential reads read ahead into windows of the client's shared memory,
// which servers on this host fill directly. A call into a window that ends
// before the server answered (here: a read the server holds past the call's
// deadline) retires the window: the handle reads those bytes again into the
// heap, and the server's late write lands where nobody looks.
TEST_F(E2E, ReadAheadWindowsInSharedMemoryAndAWindowAServerMayStillWriteIsRetired) {
  std::vector<uint8_t> want(6 * kChunk + 999);
  fill(want.data(), want.size(), 0, 11);
  {
    std::unique_ptr<File> f;
    ASSERT_FALSE(client_->open("/ra", O_WRONLY | O_CREAT, 0644, &f));
    size_t done = 0;
    ASSERT_FALSE(f->pwrite(want.data(), want.size(), 0, &done));
    ASSERT_FALSE(f->close());
  }
  auto& windowed = metrics::Registry::global().counter("client_shm_window_read_bytes_total");
  auto& retired = metrics::Registry::global().counter("client_shm_windows_retired_total");
  auto sequential = [&](Client& c) {
    std::unique_ptr<File> f;
    EXPECT_FALSE(c.open("/ra", O_RDONLY, 0, &f));
    if (!f) return std::vector<uint8_t>{};
    std::vector<uint8_t> out(want.size());
    for (uint64_t at = 0; at < out.size();) {
      size_t got = 0;
      Error e = f->pread(out.data() + at, std::min<uint64_t>(64 << 10, out.size() - at), at, &got);
      EXPECT_FALSE(e) << e.message;
      if (e || got == 0) break;
      at += got;
    }
    EXPECT_FALSE(f->close());
    return out;
  };
  // (Short-circuit reads, which read ahead into the heap, are off.)
  auto windows = connect(~0u, ~0u, Client::Options{}.shm_bytes, /*short_circuit=*/false);
  ASSERT_NE(windows, nullptr);
  uint64_t w0 = windowed.value();
  EXPECT_EQ(sequential(*windows), want);
  EXPECT_GE(windowed.value() - w0, 4 * kChunk) << "read-ahead went straight into the windows";
  // Without windows the same bytes come through slots and a copy.
  Client::Options o;
  o.cluster = cluster_->cluster();
  o.short_circuit_reads = false;
  o.shm_readahead_windows = 0;
  auto [plain, err] = Client::connect(o);
  ASSERT_FALSE(err) << err.message;
  w0 = windowed.value();
  EXPECT_EQ(sequential(*plain), want);
  EXPECT_EQ(windowed.value(), w0);

  // The first chunk read in the restarted cluster is held 2.5 s; calls time
  // out after 1 s (wide of what an ordinary read takes on a busy machine, so
  // that only the held one ends unanswered) and are retried.
  ASSERT_TRUE(restartWithFaults("storage.read.after_meta=delay:2500ms@times=1")) << cluster_->log();
  o.cluster = cluster_->cluster();  // a new port
  o.shm_readahead_windows = 8;
  o.call_timeout_ms = 1000;
  o.retry_ms = 10000;
  auto [slow, err2] = Client::connect(o);
  ASSERT_FALSE(err2) << err2.message;
  uint64_t r0 = retired.value();
  EXPECT_EQ(sequential(*slow), want);
  EXPECT_EQ(retired.value(), r0 + 1);
  // The late write into the retired window changes nothing that is read.
  std::this_thread::sleep_for(std::chrono::milliseconds(2500));
  EXPECT_EQ(sequential(*slow), want);
  EXPECT_EQ(retired.value(), r0 + 1);
}

TEST_F(E2E, SameHostWritesGoThroughSharedMemoryAndMatchSocketWrites) {
  auto counter = [](const char* path) {
    return metrics::Registry::global()
        .counter("client_write_bytes_total", {{"path", path}})
        .value();
  };
  std::vector<uint8_t> want(3 * kChunk + 4321);
  fill(want.data(), want.size(), 0, 11);
  // Whole chunks, pieces of chunks at odd edges, and a rewrite in the middle.
  auto writeAll = [&](Client& c, const std::string& path) {
    std::unique_ptr<File> f;
    ASSERT_FALSE(c.open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644, &f));
    size_t done = 0;
    ASSERT_FALSE(f->pwrite(want.data(), 17, 0, &done));
    ASSERT_FALSE(f->pwrite(want.data() + 17, want.size() - 17, 17, &done));
    ASSERT_FALSE(f->fsync());
    ASSERT_FALSE(f->pwrite(want.data() + kChunk + 5, 100000, kChunk + 5, &done));
    ASSERT_FALSE(f->close());
  };
  auto with_shm = connect();  // the default memory: 4 MiB slots, a chunk fits
  ASSERT_NE(with_shm, nullptr);
  writeAll(*with_shm, "/attach");  // the first write attaches to each server
  uint64_t shm0 = counter("shm"), sock0 = counter("socket");
  writeAll(*with_shm, "/shm");
  // A small piece alone in its call (the 4,321-byte tail that fsync
  // flushes) goes over the socket from the calling thread; every other byte
  // through shared memory.
  const uint64_t lone = 4321;
  EXPECT_GE(counter("shm") - shm0, want.size() - lone) << "through shared memory";
  EXPECT_EQ(counter("socket") - sock0, lone);
  // Without shared memory the same writes go over the socket.
  auto without = connect(~0u, ~0u, 0);
  ASSERT_NE(without, nullptr);
  shm0 = counter("shm");
  writeAll(*without, "/socket");
  EXPECT_EQ(counter("shm"), shm0);
  EXPECT_GE(counter("socket") - sock0, want.size());
  // Memory the servers forgot: those pieces go over the socket, later ones
  // through memory attached anew.
  detachAllSharedMemory();
  writeAll(*with_shm, "/again");
  writeAll(*with_shm, "/again");
  shm0 = counter("shm");
  sock0 = counter("socket");
  writeAll(*with_shm, "/again");
  EXPECT_GE(counter("shm") - shm0, want.size() - lone)
      << "shared memory again after attaching anew";
  EXPECT_EQ(counter("socket") - sock0, lone);
  for (const char* path : {"/attach", "/shm", "/socket", "/again"})
    EXPECT_EQ(readAll(*without, path), want) << path;
}

// Inline files (docs/client.md): a new file written whole by its creator and
// no larger than the limit keeps its bytes in the metadata service; writers
// that come later move them to chunk 0 first. Every path reads the same
// bytes as a file in chunks would, before and after a restart.
TEST_F(E2E, SmallNewFilesStayInlineUntilALaterWriterMovesThem) {
  const uint64_t limit = Client::Options{}.inline_max_bytes;
  auto storageWrites = [&] {
    auto m = parseMetrics(httpGet(cluster_->metricsPort(), "/metrics"));
    return sumOf(m, "rpc_server_calls_total{method=\"cistern.storage.StorageService.Write\"");
  };
  double writes0 = storageWrites();
  std::map<std::string, std::vector<uint8_t>> model;
  for (uint64_t size : {uint64_t{1}, uint64_t{4095}, limit}) {
    std::string path = "/in" + std::to_string(size);
    model[path].resize(size);
    fill(model[path].data(), size, 0, static_cast<uint32_t>(size));
    writeFile(*client_, path, size, static_cast<uint32_t>(size));
    EXPECT_EQ(readAll(*client_, path), model[path]) << path;
  }
  EXPECT_EQ(storageWrites(), writes0) << "inline files reached storage";
  // One byte more goes to a chunk.
  writeFile(*client_, "/over", limit + 1, 5);
  EXPECT_GT(storageWrites(), writes0);

  // Another client's reader, a hard link, and a restart see the same bytes.
  auto other = connect();
  EXPECT_EQ(readAll(*other, "/in4095"), model["/in4095"]);
  ASSERT_TRUE(restartWithFaults("")) << cluster_->log();
  other = connect();
  for (auto& [path, want] : model) EXPECT_EQ(readAll(*client_, path), want) << path;

  // A writer moves the bytes to chunk 0, then patches the middle.
  std::unique_ptr<File> f;
  size_t done = 0;
  ASSERT_FALSE(client_->open("/in4095", O_RDWR, 0, &f));
  ASSERT_FALSE(f->pwrite("PATCH", 5, 100, &done));
  ASSERT_FALSE(f->close());
  std::memcpy(model["/in4095"].data() + 100, "PATCH", 5);
  EXPECT_EQ(readAll(*other, "/in4095"), model["/in4095"]);
  // Appends past the limit, and a reader that opened before the writer
  // still reads what it opened (close-to-open).
  std::unique_ptr<File> early;
  ASSERT_FALSE(other->open("/in1", O_RDONLY, 0, &early));
  ASSERT_FALSE(client_->open("/in1", O_WRONLY | O_APPEND, 0, &f));
  std::vector<uint8_t> tail(limit * 2);
  fill(tail.data(), tail.size(), 0, 77);
  ASSERT_FALSE(f->pwrite(tail.data(), tail.size(), 0, &done));
  ASSERT_FALSE(f->close());
  model["/in1"].insert(model["/in1"].end(), tail.begin(), tail.end());
  EXPECT_EQ(readAll(*other, "/in1"), model["/in1"]);
  uint8_t first = 0;
  ASSERT_FALSE(early->pread(&first, 1, 0, &done));
  EXPECT_EQ(done, 1u);
  EXPECT_EQ(first, model["/in1"][0]);
  ASSERT_FALSE(early->close());

  // An empty inline file opened for writing later: nothing to move (the
  // conversion only makes sure no chunk 0 is left), then a write past a hole.
  writeFile(*client_, "/empty", 0, 1);
  ASSERT_FALSE(client_->open("/empty", O_WRONLY, 0, &f));
  ASSERT_FALSE(f->pwrite("X", 1, 5000, &done));
  ASSERT_FALSE(f->close());
  std::vector<uint8_t> holed(5001, 0);
  holed[5000] = 'X';
  EXPECT_EQ(readAll(*other, "/empty"), holed);

  // Truncates: in place below the limit (cut bytes come back as zeros),
  // through a move to chunks past it.
  writeFile(*client_, "/t", 3000, 9);
  std::vector<uint8_t> t(3000);
  fill(t.data(), t.size(), 0, 9);
  ASSERT_FALSE(client_->truncate("/t", 1000));
  t.resize(1000);
  EXPECT_EQ(readAll(*client_, "/t"), t);
  ASSERT_FALSE(client_->truncate("/t", 2000));
  t.resize(2000, 0);
  EXPECT_EQ(readAll(*client_, "/t"), t);
  ASSERT_FALSE(client_->truncate("/t", 3 * kChunk));
  t.resize(3 * kChunk, 0);
  EXPECT_EQ(readAll(*client_, "/t"), t);
  // O_TRUNC and a write past a hole: nothing of the inline bytes shows through.
  writeFile(*client_, "/o", 4000, 3);
  ASSERT_FALSE(client_->open("/o", O_WRONLY | O_TRUNC, 0, &f));
  ASSERT_FALSE(f->pwrite("z", 1, 5000, &done));
  ASSERT_FALSE(f->close());
  std::vector<uint8_t> o(5001, 0);
  o[5000] = 'z';
  EXPECT_EQ(readAll(*client_, "/o"), o);

  // Eight clients open one inline file for writing at once and each patches
  // its own bytes: one of them moves the bytes, the others wait for it, and
  // every patch lands on them.
  writeFile(*client_, "/shared", 4096, 11);
  std::vector<uint8_t> shared(4096);
  fill(shared.data(), shared.size(), 0, 11);
  std::vector<std::thread> writers;
  std::atomic<int> failures{0};
  for (int i = 0; i < 8; ++i) {
    writers.emplace_back([&, i] {
      auto c = connect();
      std::unique_ptr<File> w;
      size_t n = 0;
      uint8_t mark[16];
      std::memset(mark, 'a' + i, sizeof(mark));
      if (c->open("/shared", O_WRONLY, 0, &w) || w->pwrite(mark, 16, 1000 + 100 * i, &n) ||
          w->close())
        failures++;
    });
  }
  for (auto& w : writers) w.join();
  EXPECT_EQ(failures.load(), 0);
  for (int i = 0; i < 8; ++i) std::memset(shared.data() + 1000 + 100 * i, 'a' + i, 16);
  EXPECT_EQ(readAll(*client_, "/shared"), shared);

  // Unlinked while open for reading: still readable through the handle.
  ASSERT_FALSE(client_->open("/in" + std::to_string(limit), O_RDONLY, 0, &f));
  ASSERT_FALSE(client_->unlink("/in" + std::to_string(limit)));
  std::vector<uint8_t> back(limit);
  ASSERT_FALSE(f->pread(back.data(), back.size(), 0, &done));
  EXPECT_EQ(done, limit);
  EXPECT_EQ(back, model["/in" + std::to_string(limit)]);
  ASSERT_FALSE(f->close());

  // Turned off in the client: small files go to chunks.
  Client::Options o2;
  o2.cluster = cluster_->cluster();
  o2.inline_max_bytes = 0;
  auto [plain, err] = Client::connect(o2);
  ASSERT_FALSE(err) << err.message;
  double before = storageWrites();
  writeFile(*plain, "/plain", 100, 1);
  EXPECT_GT(storageWrites(), before);

  CheckReport report;
  ASSERT_FALSE(client_->fsck(&report));
  EXPECT_TRUE(report.problems.empty()) << report.problems.front();
  EXPECT_GT(report.chunks, 0u);
  EXPECT_EQ(report.orphan_chunks, 0u);
}

TEST_F(E2E, MetricsParseAndMoveWithTheWorkload) {
  EXPECT_EQ(httpGet(cluster_->metricsPort(), "/healthz").substr(0, 2), "ok");
  auto before = parseMetrics(httpGet(cluster_->metricsPort(), "/metrics"));
  ASSERT_FALSE(before.empty());
  writeFile(*client_, "/m", 5 * kChunk, 1);
  readFile(*client_, "/m");
  // A small file's read is served on the storage server's I/O thread (16
  // KiB: past the inline limit).
  uint32_t small_crc = writeFile(*client_, "/small", 16 << 10, 2);
  EXPECT_EQ(readFile(*client_, "/small").first, small_crc);
  auto after = parseMetrics(httpGet(cluster_->metricsPort(), "/metrics"));
  const char* moving[] = {"rpc_server_calls_total{method=\"cistern.storage.StorageService.Write\"",
                          "rpc_server_calls_total{method=\"cistern.meta.MetaService.Create\"",
                          "rpc_server_request_bytes_total",
                          "rpc_server_latency_us_count",
                          "storage_write_bytes_total",
                          "storage_read_bytes_total",
                          "storage_loop_reads_total",
                          "kv_commits_total",
                          "kv_log_latency_us_count"};
  for (const char* name : moving) EXPECT_GT(sumOf(after, name), sumOf(before, name)) << name;
  EXPECT_GE(sumOf(after, "storage_write_bytes_total") - sumOf(before, "storage_write_bytes_total"),
            5.0 * kChunk);
}

// `cistern up --config`: the storage keys reach every target's engine.
TEST_F(E2E, AConfigFileSetsTheStorageIoEngineOfEveryTarget) {
  auto engines = [&] {
    std::string text = httpGet(cluster_->metricsPort(), "/metrics");
    std::map<std::string, std::string> out;  // target -> engine
    std::regex line(R"re(storage_io_engine\{target="([^"]+)",engine="([^"]+)"\} 1)re");
    for (std::sregex_iterator it(text.begin(), text.end(), line), end; it != end; ++it)
      out[(*it)[1].str()] = (*it)[2].str();
    return out;
  };
  auto before = engines();
  ASSERT_EQ(before.size(), 2u);
  for (const auto& [target, engine] : before) {
    // io_uring unless the kernel refuses it (the engine then falls back).
    EXPECT_TRUE(engine == "io_uring" || engine == "psync") << target << " " << engine;
  }
  uint32_t crc = writeFile(*client_, "/kept", 3 * kChunk + 5, 7);

  std::string config = (dir_ / "cistern.toml").string();
  std::ofstream(config) << "# storage read and write with pread/pwrite\n"
                           "storage.io_engine = \"psync\"\n"
                           "storage.crc_cache_bytes = 0\n"
                           "storage.blocking_threads = 2\n";
  client_.reset();
  ASSERT_EQ(cluster_->stop(), 0);
  cluster_->setExtraArgs({"--config", config});
  ASSERT_TRUE(cluster_->start());
  client_ = connect();
  ASSERT_NE(client_, nullptr);
  auto after = engines();
  ASSERT_EQ(after.size(), 2u);
  for (const auto& [target, engine] : after) EXPECT_EQ(engine, "psync") << target;
  // Bytes written before read back through the other engine, and new ones
  // round-trip.
  auto [rcrc, rsize] = readFile(*client_, "/kept", 333333);
  EXPECT_EQ(rsize, 3 * kChunk + 5);
  EXPECT_EQ(rcrc, crc);
  uint32_t crc2 = writeFile(*client_, "/new", kChunk + 1, 8);
  auto [rcrc2, rsize2] = readFile(*client_, "/new", 4096);
  EXPECT_EQ(rsize2, kChunk + 1);
  EXPECT_EQ(rcrc2, crc2);
}

// The rpc.* keys reach the cluster's RPC servers: their I/O threads (named
// rpc-srv-N), the connection limit (connections past it are closed when
// accepted), and response payloads without a checksum still carry the bytes.
TEST_F(E2E, AConfigFileSetsTheRpcServers) {
  client_.reset();
  ASSERT_EQ(cluster_->stop(), 0);
  std::string config = (dir_ / "rpc.toml").string();
  std::ofstream(config) << "[rpc]\nmeta_threads = 1\nstorage_threads = 3\n"
                           "connections_max = 16\npayload_crc = false\n";
  cluster_->setExtraArgs({"--config", config});
  ASSERT_TRUE(cluster_->start());

  // 1 meta + mgmt thread, 3 for each of the 2 targets.
  int threads = 0;
  for (const auto& task :
       std::filesystem::directory_iterator("/proc/" + std::to_string(cluster_->pid()) + "/task")) {
    std::string comm;
    std::ifstream(task.path() / "comm") >> comm;
    if (comm.rfind("rpc-srv-", 0) == 0) ++threads;
  }
  EXPECT_EQ(threads, 1 + 2 * 3);

  // 20 connections to the meta server, before any client: 4 are closed.
  auto ep = net::Endpoint::parse(cluster_->cluster());
  ASSERT_TRUE(ep.ok());
  std::vector<int> fds;
  for (int i = 0; i < 20; ++i) {
    int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(ep->port);
    ::inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0) << i;
    fds.push_back(fd);
  }
  // A closed connection polls readable and reads end-of-file (or a reset);
  // an open one has nothing to read: the server waits for a request. Wait
  // until 4 are closed (or 5 s), then a little more for any further one.
  auto countClosed = [&fds] {
    std::vector<pollfd> ps;
    for (int fd : fds) ps.push_back({fd, POLLIN, 0});
    ::poll(ps.data(), ps.size(), 0);
    int n = 0;
    for (const auto& p : ps) n += (p.revents & (POLLIN | POLLHUP | POLLERR)) != 0;
    return n;
  };
  for (auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
       countClosed() < 4 && std::chrono::steady_clock::now() < until;)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  int closed = 0;
  for (int fd : fds) {
    char b;
    ssize_t n = ::recv(fd, &b, 1, MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) ++closed;
    ::close(fd);
  }
  EXPECT_EQ(closed, 20 - 16);

  client_ = connect();
  ASSERT_NE(client_, nullptr);
  uint32_t crc = writeFile(*client_, "/rpc", 2 * kChunk + 9, 11);
  auto [rcrc, rsize] = readFile(*client_, "/rpc", 65536);
  EXPECT_EQ(rsize, 2 * kChunk + 9);
  EXPECT_EQ(rcrc, crc);
}

// `cistern put/get ... --config FILE`: the file's client.* keys reach the
// command's client (a small file takes a chunk with inline files off), and a
// file that cannot work stops the command before it writes anything.
TEST_F(E2E, AClientConfigFileSetsTheClientOfTheCommands) {
  const std::string c = cluster_->cluster();
  const std::string small = (dir_ / "small").string(), back = (dir_ / "back").string();
  std::ofstream(small) << std::string(100, 'c');
  const std::string config = (dir_ / "client.toml").string();
  std::ofstream(config) << "[client]\ninline_max_bytes = 0\nio_parallel_max = 2\n";
  const uint64_t before = clusterChunks(CISTERN_BIN, c);
  auto put = runProgram(CISTERN_BIN, {"put", "--cluster", c, "--config", config, small, "/cfg"});
  ASSERT_EQ(put.exit_code, 0) << put.err;
  EXPECT_EQ(clusterChunks(CISTERN_BIN, c), before + 1);  // not inline: in a chunk
  put = runProgram(CISTERN_BIN, {"put", "--cluster", c, small, "/plain"});
  ASSERT_EQ(put.exit_code, 0) << put.err;
  EXPECT_EQ(clusterChunks(CISTERN_BIN, c), before + 1);  // inline by default
  auto get = runProgram(CISTERN_BIN, {"get", "--cluster", c, "--config", config, "/cfg", back});
  ASSERT_EQ(get.exit_code, 0) << get.err;
  std::ifstream in(back);
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(in), {}), std::string(100, 'c'));

  for (const auto& [text, named] : std::vector<std::pair<std::string, std::string>>{
           {"client.io_parallel_max = 0\n", "client.io_parallel_max 0 is not"},
           {"mount.allow_other = true\n", "key 'mount.allow_other': unknown key"},
           {"client.readahead_max_bytes = \"big\"\n", "client.readahead_max_bytes"}}) {
    std::ofstream(config, std::ios::trunc) << text;
    put = runProgram(CISTERN_BIN, {"put", "--cluster", c, "--config", config, small, "/bad"});
    EXPECT_EQ(put.exit_code, 2) << text << put.err;
    EXPECT_NE(put.err.find(named), std::string::npos) << put.err;
    auto check = runProgram(CISTERN_BIN, {"config", "--client", "--check", config});
    EXPECT_EQ(check.exit_code, 1) << text;
    EXPECT_NE(check.err.find(named), std::string::npos) << check.err;
  }
  FileInfo info;
  EXPECT_EQ(client_->stat("/bad", &info).errno_value, ENOENT);  // nothing written
  // A library client's defaults (not the mount's), and a valid file.
  auto defaults = runProgram(CISTERN_BIN, {"config", "--defaults", "--client"});
  ASSERT_EQ(defaults.exit_code, 0);
  EXPECT_NE(defaults.out.find("client.readahead_max_bytes = 8388608"), std::string::npos)
      << defaults.out;
  EXPECT_EQ(defaults.out.find("mount."), std::string::npos) << defaults.out;
  std::ofstream(config, std::ios::trunc) << defaults.out;
  EXPECT_EQ(runProgram(CISTERN_BIN, {"config", "--client", "--check", config}).exit_code, 0);
  EXPECT_NE(runProgram(CISTERN_BIN, {"config", "--client", "--mount"}).exit_code, 0);
}

// A config file `cistern up` cannot use stops it with a message naming the
// file and the key, before it creates its data directory; `cistern config
// --check` reports the same.
TEST_F(E2E, ABadConfigFileStopsCisternUpBeforeItCreatesAnything) {
  struct Case {
    const char* text;
    const char* message;
  };
  const Case cases[] = {
      {"storage.io_engine = \"aio\"\n", "unknown storage I/O engine 'aio'"},
      {"storage.blocking_threads = 0\n", "blocking_threads must be at least 1"},
      {"storage.background_share = 1.5\n", "background_share 1.5 is not in (0, 1]"},
      {"storage.group_bytes = 1048576\n", "key 'storage.group_bytes': unknown key"},
      {"storage.crc_cache_bytes = -1\n", "key 'storage.crc_cache_bytes'"},
      {"meta.session_timeout_ms = 10\n", "session_timeout_ms 10 is below 1000"},
      {"log.level = \"loud\"\n", "unknown level 'loud'"},
      {"storage.io_engine = \n", "bad.toml:1"},
      // The keys of the mount of `cistern up --mount`, checked also without one.
      {"mount.attr_timeout = -1.0\n", "mount.attr_timeout -1 is not"},
      {"client.io_parallel_max = 0\n", "client.io_parallel_max 0 is not"},
      {"rpc.storage_threads = 0\n", "rpc.storage_threads 0 is not in 1..256"},
      {"rpc.connections_max = 1\n", "rpc.connections_max 1 is not in 16..16384"},
      {"meta.session_timeout_ms = 30000\nclient.session_renew_ms = 20000\n",
       "client.session_renew_ms 20000 is not under half of meta.session_timeout_ms 30000"},
  };
  std::string config = (dir_ / "bad.toml").string();
  std::string data = (dir_ / "never").string();
  for (const Case& c : cases) {
    std::ofstream(config, std::ios::trunc) << c.text;
    auto up = runProgram(CISTERN_BIN,
                         {"up", "--data", data, "--listen", "127.0.0.1:0", "--config", config});
    EXPECT_EQ(up.exit_code, 2) << c.text << up.err;
    EXPECT_NE(up.err.find(config), std::string::npos) << up.err;
    EXPECT_NE(up.err.find(c.message), std::string::npos) << c.text << up.err;
    EXPECT_FALSE(std::filesystem::exists(data)) << c.text;
    auto check = runProgram(CISTERN_BIN, {"config", "--check", config});
    EXPECT_EQ(check.exit_code, 1) << c.text;
    EXPECT_NE(check.err.find(c.message), std::string::npos) << c.text << check.err;
  }
  auto missing = runProgram(CISTERN_BIN, {"up", "--data", data, "--config", config + ".none"});
  EXPECT_EQ(missing.exit_code, 2);
  EXPECT_NE(missing.err.find("cannot open config file"), std::string::npos) << missing.err;
  EXPECT_FALSE(std::filesystem::exists(data));
  // Every key `cistern config --defaults` lists is one a file may set.
  auto defaults = runProgram(CISTERN_BIN, {"config", "--defaults"});
  ASSERT_EQ(defaults.exit_code, 0);
  EXPECT_NE(defaults.out.find("storage.io_engine = \"io_uring\""), std::string::npos)
      << defaults.out;
  std::ofstream(config, std::ios::trunc) << defaults.out;
  auto round_trip = runProgram(CISTERN_BIN, {"config", "--check", config});
  EXPECT_EQ(round_trip.exit_code, 0) << round_trip.err;
}

}  // namespace
}  // namespace cistern
