// The storage service over RPC on loopback: writes carry their bytes as the
// frame payload, batch reads return many ranges in one payload, errors per range.
#include "storage/storage_service.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <algorithm>
#include <cstring>

#include <filesystem>
#include <future>
#include <span>
#include <thread>

#include "common/fault.h"
#include "common/host.h"
#include "common/metrics.h"

#include "common/random.h"
#include "net/rpc_client.h"
#include "storage.pb.h"
#include "tests/support/both_callers.h"

namespace cistern::storage {
namespace {

std::vector<uint8_t> bytes(size_t n, uint64_t seed) {
  Xoshiro256 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng.next());
  return v;
}

class StorageServiceTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/cistern-storage-svc-XXXXXX";
    dir_ = mkdtemp(tmpl);
    ChunkEngineOptions o;
    o.path = dir_;
    o.reserved_bytes = 0;
    o.sync_interval_ms = 600000;  // unsynced writes wait for a Sync
    engine_ = std::move(ChunkEngine::open(o)).value();
    server_ = std::make_unique<net::RpcServer>(net::ServerOptions{.threads = 1});
    service_ = std::make_unique<StorageService>(
        *engine_, *server_,
        StorageServiceOptions{
            .blocking_threads = 4, .batch_read_bytes_max = 1 << 20, .queued_bytes_max = 4 << 20});
    ASSERT_TRUE(server_->start().ok());
  }
  void TearDown() override {
    client_.reset();
    server_->stop();
    service_.reset();
    server_.reset();
    engine_.reset();
    std::filesystem::remove_all(dir_);
  }
  net::Method m(const char* name) {
    return net::Method::of(std::string("cistern.storage.StorageService.") + name);
  }

  Status write(uint64_t inode, uint32_t index, uint64_t offset, const std::vector<uint8_t>& data,
               WriteResp* resp, bool unsynced = false) {
    WriteReq req;
    req.mutable_chunk()->set_inode(inode);
    req.mutable_chunk()->set_index(index);
    req.set_offset(offset);
    req.set_chain_version(3);
    req.set_unsynced(unsynced);
    return client_->callSync(server_->endpoint(), m("Write"), req, resp, {.request_payload = data});
  }

  static void addRange(BatchReadReq* req, uint64_t inode, uint32_t index, uint64_t offset,
                       uint32_t length) {
    auto* r = req->add_ranges();
    r->mutable_chunk()->set_inode(inode);
    r->mutable_chunk()->set_index(index);
    r->set_offset(offset);
    r->set_length(length);
  }
  // The ranges' bytes land in `payload`; `*got` is how many.
  Status batchRead(const BatchReadReq& req, BatchReadResp* resp, std::span<uint8_t> payload,
                   size_t* got) {
    return client_->callSync(server_->endpoint(), m("BatchRead"), req, resp,
                             {.response_payload = payload, .response_payload_len = got});
  }

  // The first n bytes of a chunk, by a batch read of one range (empty if it fails).
  std::vector<uint8_t> readChunk(uint64_t inode, uint32_t index, uint32_t n) {
    BatchReadReq req;
    addRange(&req, inode, index, 0, n);
    std::vector<uint8_t> payload(n);
    size_t got = 0;
    BatchReadResp resp;
    Status s = batchRead(req, &resp, payload, &got);
    EXPECT_TRUE(s.ok()) << s.toString();
    payload.resize(s.ok() ? got : 0);
    return payload;
  }

  // A batch read's code and length per range.
  static void expectRanges(const BatchReadResp& resp, const std::vector<ErrorCode>& codes,
                           const std::vector<uint32_t>& lengths) {
    ASSERT_EQ(resp.codes_size(), static_cast<int>(codes.size()));
    ASSERT_EQ(resp.lengths_size(), static_cast<int>(lengths.size()));
    for (size_t i = 0; i < codes.size(); ++i) {
      EXPECT_EQ(resp.codes(static_cast<int>(i)), static_cast<uint32_t>(codes[i])) << "range " << i;
      EXPECT_EQ(resp.lengths(static_cast<int>(i)), lengths[i]) << "range " << i;
    }
  }

  std::string dir_;
  std::unique_ptr<ChunkEngine> engine_;
  std::unique_ptr<net::RpcServer> server_;
  std::unique_ptr<StorageService> service_;
  std::unique_ptr<net::RpcClient> client_ = std::make_unique<net::RpcClient>();
};

// The requests that a client may send from the server's own process (the
// FUSE mount of `cistern up --mount`, net/local_call.h) run both ways: over
// the socket, and on the caller's thread with the caller's buffers.
using StorageServiceCallers = testing::BothCallers<StorageServiceTest>;
INSTANTIATE_TEST_SUITE_P(From, StorageServiceCallers, ::testing::Bool(), testing::callerName);

uint64_t counter(const char* name) { return metrics::Registry::global().counter(name).value(); }

TEST_P(StorageServiceCallers, WriteThenBatchReadManyRanges) {
  const uint64_t connections = counter("rpc_server_connections_total");
  auto a = bytes(100000, 1), b = bytes(5000, 2);
  WriteResp w;
  ASSERT_TRUE(write(1, 0, 0, a, &w).ok());
  EXPECT_EQ(w.info().length(), 100000u);
  EXPECT_EQ(w.info().chain_version(), 3u);
  ASSERT_TRUE(write(1, 1, 4096, b, &w).ok());

  BatchReadReq req;
  addRange(&req, 1, 0, 10, 1000);    // inside chunk 0
  addRange(&req, 1, 1, 4096, 5000);  // all of chunk 1's data
  addRange(&req, 1, 7, 0, 100);      // missing chunk
  addRange(&req, 1, 0, 99990, 100);  // short at the end
  std::vector<uint8_t> payload(1 << 20);
  size_t got = 0;
  BatchReadResp resp;
  ASSERT_TRUE(batchRead(req, &resp, payload, &got).ok());
  constexpr ErrorCode kOk = ErrorCode::kOk;
  expectRanges(resp, {kOk, kOk, ErrorCode::kNotFound, kOk}, {1000, 5000, 0, 10});
  ASSERT_EQ(got, 1000u + 5000 + 10);
  EXPECT_TRUE(std::equal(payload.begin(), payload.begin() + 1000, a.begin() + 10));
  EXPECT_TRUE(std::equal(payload.begin() + 1000, payload.begin() + 6000, b.begin()));
  EXPECT_TRUE(std::equal(payload.begin() + 6000, payload.begin() + 6010, a.begin() + 99990));
  // Local calls open no connection.
  EXPECT_EQ(counter("rpc_server_connections_total") == connections, local());
}

// An unsynced write answers with its host's boot id (one the target makes
// durable anyway, with none). A Sync naming that
// boot makes the target's writes durable: the slot of the overwritten
// version, held until then, is released. One naming another boot is
// kIOError saying why (the writes may have been lost with that boot), and
// syncs nothing.
TEST_P(StorageServiceCallers, UnsyncedWritesNameTheHostBootAndSyncChecksIt) {
  auto a = bytes(100000, 3), b = bytes(100000, 4);
  WriteResp w;
  ASSERT_TRUE(write(2, 0, 0, a, &w).ok());
  EXPECT_EQ(w.host_boot_id(), "") << "a durable write needs no sync";
  ASSERT_TRUE(write(2, 0, 0, b, &w, /*unsynced=*/true).ok());
  EXPECT_EQ(w.host_boot_id(), hostBootId());
  const uint32_t c = w.info().size_class();
  EXPECT_EQ(engine_->usedSlots(c), 2u) << "a's slot is held until the sync";
  SyncReq req;
  SyncResp resp;
  req.set_host_boot_id("some-earlier-boot");
  Status bad = client_->callSync(server_->endpoint(), m("Sync"), req, &resp);
  EXPECT_EQ(bad.code(), ErrorCode::kIOError);
  EXPECT_NE(bad.message().find("booted after the unsynced writes"), std::string_view::npos)
      << bad.toString();
  EXPECT_EQ(engine_->usedSlots(c), 2u);
  req.set_host_boot_id(w.host_boot_id());
  ASSERT_TRUE(client_->callSync(server_->endpoint(), m("Sync"), req, &resp).ok());
  EXPECT_EQ(engine_->usedSlots(c), 1u);
  EXPECT_EQ(readChunk(2, 0, 100000), b);
  WriteResp small;
  ASSERT_TRUE(write(3, 0, 0, bytes(5000, 5), &small, /*unsynced=*/true).ok());
  EXPECT_EQ(small.host_boot_id(), "") << "its bytes are in the log record: durable anyway";
}

// A Sync waits for a device flush, which may take long: it runs on a thread
// of its own, so reads and writes that need the service's blocking threads
// (one here) go on meanwhile.
TEST_F(StorageServiceTest, ASyncHoldsNoThreadThatReadsAndWritesNeed) {
  server_->stop();
  service_.reset();
  server_ = std::make_unique<net::RpcServer>(net::ServerOptions{.threads = 1});
  service_ = std::make_unique<StorageService>(
      *engine_, *server_,
      StorageServiceOptions{
          .blocking_threads = 1, .batch_read_bytes_max = 1 << 20, .queued_bytes_max = 4 << 20});
  ASSERT_TRUE(server_->start().ok());
  auto a = bytes(200000, 31), b = bytes(200000, 32);
  WriteResp w;
  ASSERT_TRUE(write(4, 0, 0, a, &w, /*unsynced=*/true).ok());
  ASSERT_FALSE(w.host_boot_id().empty());
  fault::enable("storage.sync.queued",
                fault::Spec{.action = fault::Action::kDelay, .delay = std::chrono::seconds(3)});
  std::atomic<bool> synced{false};
  std::thread syncer([&] {
    SyncReq req;
    SyncResp resp;
    req.set_host_boot_id(w.host_boot_id());
    net::RpcClient client;
    EXPECT_TRUE(client.callSync(server_->endpoint(), m("Sync"), req, &resp).ok());
    synced = true;
  });
  while (fault::fired("storage.sync.queued") == 0)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  // The Sync is held up; a write and a read of over 64 KiB (on the blocking
  // thread) are served meanwhile.
  WriteResp w2;
  EXPECT_TRUE(write(4, 1, 0, b, &w2, /*unsynced=*/true).ok());
  EXPECT_EQ(readChunk(4, 0, 200000), a);
  EXPECT_FALSE(synced.load()) << "the write and the read waited for the Sync";
  syncer.join();
  fault::disableAll();
  EXPECT_TRUE(synced.load());
}

// Small batch reads are served on the I/O thread, through its io_uring, with
// the same answers as the pool gives; larger ones and batches of many ranges
// go to the pool.
TEST_F(StorageServiceTest, SmallBatchReadsAreServedOnTheIoThread) {
  auto a = bytes(100000, 21), b = bytes(5000, 22);
  WriteResp w;
  ASSERT_TRUE(write(2, 0, 0, a, &w).ok());
  ASSERT_TRUE(write(2, 1, 0, b, &w).ok());
  const uint64_t served = counter("storage_loop_reads_total");
  BatchReadReq req;
  addRange(&req, 2, 0, 4095, 8193);  // odd edges, in the 128 KiB class
  addRange(&req, 2, 7, 0, 100);      // missing chunk
  addRange(&req, 2, 1, 4000, 2000);  // short at the end
  addRange(&req, 2, 1, 6000, 10);    // past the end
  addRange(&req, 2, 0, 0, 0);        // nothing
  std::vector<uint8_t> payload(1 << 20);
  size_t got = 0;
  BatchReadResp resp;
  ASSERT_TRUE(batchRead(req, &resp, payload, &got).ok());
  EXPECT_EQ(counter("storage_loop_reads_total"), served + 1);
  constexpr ErrorCode kOk = ErrorCode::kOk;
  expectRanges(resp, {kOk, ErrorCode::kNotFound, kOk, kOk, kOk}, {8193, 0, 1000, 0, 0});
  ASSERT_EQ(got, 8193u + 1000);
  EXPECT_TRUE(std::equal(payload.begin(), payload.begin() + 8193, a.begin() + 4095));
  EXPECT_TRUE(std::equal(payload.begin() + 8193, payload.begin() + 9193, b.begin() + 4000));

  // A range over 64 KiB, and nine ranges, are read on the pool.
  BatchReadReq big;
  addRange(&big, 2, 0, 0, 100000);
  ASSERT_TRUE(batchRead(big, &resp, payload, &got).ok());
  ASSERT_EQ(got, a.size());
  EXPECT_TRUE(std::equal(a.begin(), a.end(), payload.begin()));
  BatchReadReq many;
  for (int i = 0; i < 9; ++i) addRange(&many, 2, 0, i * 4096, 4096);
  ASSERT_TRUE(batchRead(many, &resp, payload, &got).ok());
  ASSERT_EQ(got, 9u * 4096);
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + 9 * 4096, payload.begin()));
  EXPECT_EQ(counter("storage_loop_reads_total"), served + 1);
}

// Readers on the I/O thread while a writer rewrites the chunks (each
// rewrite moves a chunk to another slot, which the next rewrite takes): every read
// returns the bytes of one whole version, never a mix or another chunk's.
TEST_F(StorageServiceTest, SmallReadsOnTheIoThreadSeeWholeVersionsUnderRewrites) {
  constexpr uint32_t kChunks = 4, kVersions = 40;
  constexpr size_t kLen = 20 * 4096;  // the 128 KiB class: freed slots are reused at once
  auto version = [](uint32_t chunk, uint32_t v) { return bytes(kLen, chunk * 1000 + v); };
  WriteResp w;
  for (uint32_t c = 0; c < kChunks; ++c) ASSERT_TRUE(write(3, c, 0, version(c, 0), &w).ok());
  const uint64_t served = counter("storage_loop_reads_total");
  std::atomic<bool> done{false};
  std::atomic<int> reads{0}, bad{0};
  std::vector<std::thread> readers;
  for (int t = 0; t < 3; ++t) {
    readers.emplace_back([&, t] {
      net::RpcClient client;
      Xoshiro256 rng(t + 1);
      std::vector<uint8_t> payload(kLen);
      while (!done) {
        uint32_t c = static_cast<uint32_t>(rng.next() % kChunks);
        uint64_t off = (rng.next() % 20) * 4096 + rng.next() % 100;
        uint32_t len =
            static_cast<uint32_t>(1 + rng.next() % std::min<uint64_t>(kLen - off, 65536));
        BatchReadReq req;
        addRange(&req, 3, c, off, len);
        BatchReadResp resp;
        size_t got = 0;
        Status s = client.callSync(server_->endpoint(), m("BatchRead"), req, &resp,
                                   {.response_payload = payload, .response_payload_len = &got});
        if (!s.ok() || resp.codes(0) != 0 || got != len) {
          ++bad;
          continue;
        }
        bool whole = false;
        for (uint32_t v = 0; v < kVersions && !whole; ++v) {
          auto want = version(c, v);
          whole = std::equal(payload.begin(), payload.begin() + len, want.begin() + off);
        }
        if (!whole) ++bad;
        ++reads;
      }
    });
  }
  for (uint32_t v = 1; v < kVersions; ++v) {
    for (uint32_t c = 0; c < kChunks; ++c) ASSERT_TRUE(write(3, c, 0, version(c, v), &w).ok());
  }
  while (reads < 200) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  done = true;
  for (auto& t : readers) t.join();
  EXPECT_EQ(bad, 0);
  EXPECT_GT(counter("storage_loop_reads_total"), served);
}

// A payload of whole blocks lands in the request's own aligned buffer, which
// the engine writes from without a copy: it reads back exactly, verified.
TEST_P(StorageServiceCallers, WholeBlockPayloadsReadBackExactly) {
  auto whole = bytes(1 << 20, 9), grown = bytes((1 << 20) + 8192, 10);
  WriteResp w;
  ASSERT_TRUE(write(9, 0, 0, whole, &w).ok());
  ASSERT_TRUE(write(9, 1, 0, grown, &w).ok());
  EXPECT_EQ(w.info().length(), (1u << 20) + 8192);
  // Reads at most batch_read_bytes_max (1 MiB) per call.
  auto read = [&](uint32_t index, uint64_t offset, uint32_t length) {
    BatchReadReq req;
    addRange(&req, 9, index, offset, length);
    std::vector<uint8_t> payload(length);
    size_t got = 0;
    BatchReadResp resp;
    EXPECT_TRUE(batchRead(req, &resp, payload, &got).ok());
    EXPECT_EQ(resp.codes_size() == 1 ? resp.codes(0) : 1u, 0u);
    payload.resize(got);
    return payload;
  };
  EXPECT_EQ(read(0, 0, 1 << 20), whole);
  auto head = read(1, 0, 1 << 20), tail = read(1, 1 << 20, 8192);
  head.insert(head.end(), tail.begin(), tail.end());
  EXPECT_EQ(head, grown);
  auto bad = engine_->scrub();
  ASSERT_TRUE(bad.ok());
  EXPECT_TRUE(bad->empty());
}

TEST_P(StorageServiceCallers, QueryRemoveAndLimits) {
  WriteResp w;
  ASSERT_TRUE(write(2, 0, 0, bytes(10, 3), &w).ok());
  QueryReq q;
  q.mutable_chunk()->set_inode(2);
  QueryResp qr;
  ASSERT_TRUE(client_->callSync(server_->endpoint(), m("Query"), q, &qr).ok());
  EXPECT_TRUE(qr.exists());
  EXPECT_EQ(qr.info().chunk_version(), 1u);
  RemoveReq rm;
  rm.add_chunks()->set_inode(2);
  rm.add_chunks()->set_inode(99);  // missing: removing is idempotent
  RemoveResp rr;
  ASSERT_TRUE(client_->callSync(server_->endpoint(), m("Remove"), rm, &rr).ok());
  EXPECT_EQ(rr.codes(0), 0u);
  EXPECT_EQ(rr.codes(1), 0u);
  ASSERT_TRUE(client_->callSync(server_->endpoint(), m("Query"), q, &qr).ok());
  EXPECT_FALSE(qr.exists());
  // The range form: every chunk of inode 4 from index 1 on, two per call.
  for (uint32_t i = 0; i < 4; ++i) ASSERT_TRUE(write(4, i, 0, bytes(10, 5), &w).ok());
  RemoveReq range;
  range.mutable_from()->set_inode(4);
  range.mutable_from()->set_index(1);
  range.set_limit(2);
  ASSERT_TRUE(client_->callSync(server_->endpoint(), m("Remove"), range, &rr).ok());
  EXPECT_EQ(rr.removed(), 2u);
  EXPECT_TRUE(rr.more());
  ASSERT_TRUE(client_->callSync(server_->endpoint(), m("Remove"), range, &rr).ok());
  EXPECT_EQ(rr.removed(), 1u);
  EXPECT_FALSE(rr.more());
  for (uint32_t i = 0; i < 4; ++i) {
    q.mutable_chunk()->set_inode(4);
    q.mutable_chunk()->set_index(i);
    ASSERT_TRUE(client_->callSync(server_->endpoint(), m("Query"), q, &qr).ok());
    EXPECT_EQ(qr.exists(), i == 0) << "chunk 4:" << i;
  }
  // Too much in one batch read, and a write past 64 MiB.
  BatchReadReq big;
  for (int i = 0; i < 3; ++i) big.add_ranges()->set_length(512 * 1024);
  BatchReadResp br;
  EXPECT_EQ(client_->callSync(server_->endpoint(), m("BatchRead"), big, &br).code(),
            ErrorCode::kPayloadTooLarge);
  EXPECT_EQ(write(3, 0, kMaxChunkBytes, bytes(1, 4), &w).code(), ErrorCode::kInvalidArgument);
}

TEST_P(StorageServiceCallers, TruncateListAndSpace) {
  WriteResp w;
  for (uint32_t i = 0; i < 5; ++i) ASSERT_TRUE(write(4, i, 0, bytes(70000, i), &w).ok());
  TruncateReq t;
  t.mutable_chunk()->set_inode(4);
  t.mutable_chunk()->set_index(2);
  t.set_length(100);
  t.set_chain_version(3);
  TruncateResp tr;
  ASSERT_TRUE(client_->callSync(server_->endpoint(), m("Truncate"), t, &tr).ok());
  EXPECT_EQ(tr.info().length(), 100u);
  EXPECT_EQ(tr.info().size_class(), 0u);

  ListReq l;
  l.mutable_from()->set_inode(4);
  l.set_limit(3);
  ListResp lr;
  ASSERT_TRUE(client_->callSync(server_->endpoint(), m("List"), l, &lr).ok());
  ASSERT_EQ(lr.chunks_size(), 3);
  EXPECT_TRUE(lr.more());
  EXPECT_EQ(lr.chunks(2).chunk().index(), 2u);
  EXPECT_EQ(lr.chunks(2).info().length(), 100u);
  l.mutable_from()->set_index(3);
  ASSERT_TRUE(client_->callSync(server_->endpoint(), m("List"), l, &lr).ok());
  ASSERT_EQ(lr.chunks_size(), 2);
  EXPECT_FALSE(lr.more());

  SpaceResp sr;
  ASSERT_TRUE(client_->callSync(server_->endpoint(), m("Space"), SpaceReq(), &sr).ok());
  EXPECT_EQ(sr.path(), dir_);
  EXPECT_EQ(sr.chunks(), 5u);
  EXPECT_EQ(sr.data_bytes(), 4u * 70000 + 100);
  ASSERT_EQ(sr.classes_size(), static_cast<int>(kClassCount));
  EXPECT_EQ(sr.classes(1).slots_used(), 4u);
  EXPECT_EQ(sr.classes(0).data_bytes(), 100u);
  EXPECT_GT(sr.fs_total_bytes(), 0u);
  EXPECT_FALSE(sr.failed());

  // A writer with an older chain version is refused and changes nothing.
  WriteReq stale;
  stale.mutable_chunk()->set_inode(4);
  stale.set_chain_version(2);
  auto one = bytes(1, 9);
  EXPECT_EQ(client_->callSync(server_->endpoint(), m("Write"), stale, &w, {.request_payload = one})
                .code(),
            ErrorCode::kStaleChainVersion);
}

// The lease fence travels in Write, Truncate and Remove (the engine's test
// covers the clock's edge): past it nothing changes, within it all go ahead.
TEST_P(StorageServiceCallers, CallsPastTheirLeaseAreRefused) {
  WriteResp w;
  ASSERT_TRUE(write(6, 0, 0, bytes(300, 1), &w).ok());
  const auto now_ns = static_cast<uint64_t>(SystemClock::instance().wallMicros()) * 1000;
  for (uint64_t fence : {now_ns - 1'000'000'000, now_ns + 60'000'000'000}) {
    const bool expired = fence < now_ns;
    WriteReq wr;
    wr.mutable_chunk()->set_inode(6);
    wr.set_chain_version(3);
    wr.set_not_after_unix_ns(fence);
    auto other = bytes(500, 2);
    Status s =
        client_->callSync(server_->endpoint(), m("Write"), wr, &w, {.request_payload = other});
    EXPECT_EQ(s.code(), expired ? ErrorCode::kLeaseExpired : ErrorCode::kOk) << s.toString();
    TruncateReq t;
    t.mutable_chunk()->set_inode(6);
    t.set_length(100);
    t.set_chain_version(3);
    t.set_not_after_unix_ns(fence);
    TruncateResp tr;
    s = client_->callSync(server_->endpoint(), m("Truncate"), t, &tr);
    EXPECT_EQ(s.code(), expired ? ErrorCode::kLeaseExpired : ErrorCode::kOk) << s.toString();
    RemoveReq rm;
    rm.add_chunks()->set_inode(6);
    rm.set_not_after_unix_ns(fence);
    RemoveResp rr;
    ASSERT_TRUE(client_->callSync(server_->endpoint(), m("Remove"), rm, &rr).ok());
    ASSERT_EQ(rr.codes_size(), 1);
    EXPECT_EQ(rr.codes(0),
              static_cast<uint32_t>(expired ? ErrorCode::kLeaseExpired : ErrorCode::kOk));
    auto q = engine_->query({6, 0});
    ASSERT_TRUE(q.ok());
    if (expired) {
      ASSERT_TRUE(q->has_value());
      EXPECT_EQ((*q)->length, 300u);  // untouched
      EXPECT_EQ((*q)->chunk_version, 1u);
    } else {
      EXPECT_FALSE(q->has_value());
    }
  }
}

// With writes parked in the engine, the queued bytes reach the budget and
// further requests are refused with kTargetBusy instead of queuing; a
// background request is refused earlier than a foreground one.
TEST_P(StorageServiceCallers, QueuedBytesAreBoundedPerTarget) {
  fault::enable("storage.write.after_data", fault::Spec{.action = fault::Action::kDelay,
                                                        .delay = std::chrono::milliseconds(300)});
  auto data = bytes(1 << 20, 5);
  std::vector<std::future<Status>> inflight;
  for (uint32_t i = 0; i < 4; ++i) {
    inflight.push_back(std::async(std::launch::async, [&, i] {
      WriteResp w;
      return write(5, i, 0, data, &w);
    }));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(service_->queuedBytes(), 4u << 20);
  WriteResp w;
  WriteReq bg;
  bg.mutable_chunk()->set_inode(6);
  bg.set_qos(QOS_BACKGROUND);
  auto small = bytes(4096, 1);
  EXPECT_EQ(
      client_->callSync(server_->endpoint(), m("Write"), bg, &w, {.request_payload = small}).code(),
      ErrorCode::kTargetBusy);                                         // background budget: 1 MiB
  EXPECT_EQ(write(5, 9, 0, data, &w).code(), ErrorCode::kTargetBusy);  // the 4 MiB budget is full
  for (auto& f : inflight) EXPECT_TRUE(f.get().ok());
  fault::disableAll();
  EXPECT_EQ(service_->queuedBytes(), 0u);
  EXPECT_TRUE(write(5, 9, 0, data, &w).ok());
}

TEST_P(StorageServiceCallers, BatchReadsAndWritesUseAttachedSharedMemory) {
  auto a = bytes(300000, 7);
  WriteResp w;
  ASSERT_TRUE(write(9, 0, 0, a, &w).ok());
  // The client's memory: a header page with the token, then room for reads.
  const uint64_t kBytes = 1 << 20;
  int fd = ::memfd_create("test-reads", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::ftruncate(fd, kBytes), 0);
  ASSERT_EQ(::fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
  auto* mem =
      static_cast<uint8_t*>(::mmap(nullptr, kBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
  ASSERT_NE(mem, MAP_FAILED);
  const std::string token = "a-token-of-at-least-16-bytes";
  std::memcpy(mem, token.data(), token.size());
  ShmAttachReq attach;
  attach.set_boot_id(hostBootId());
  attach.set_pid(static_cast<uint32_t>(::getpid()));
  attach.set_fd(static_cast<uint32_t>(fd));
  attach.set_bytes(kBytes);
  attach.set_token(token);
  ShmAttachResp attached;
  ASSERT_TRUE(client_->callSync(server_->endpoint(), m("ShmAttach"), attach, &attached).ok());

  BatchReadReq req;
  auto* r = req.add_ranges();
  r->mutable_chunk()->set_inode(9);
  r->set_offset(4096);
  r->set_length(200000);
  r = req.add_ranges();
  r->mutable_chunk()->set_inode(9);
  r->set_offset(299000);
  r->set_length(5000);  // 1,000 bytes left in the chunk
  req.set_shm_handle(attached.handle());
  req.set_shm_offset(8192);
  BatchReadResp resp;
  size_t payload = 123;
  std::vector<uint8_t> buf(16);
  ASSERT_TRUE(client_
                  ->callSync(server_->endpoint(), m("BatchRead"), req, &resp,
                             {.response_payload = buf, .response_payload_len = &payload})
                  .ok());
  EXPECT_EQ(payload, 0u) << "the bytes went to shared memory, not the socket";
  ASSERT_EQ(resp.lengths_size(), 2);
  EXPECT_EQ(resp.lengths(0), 200000u);
  EXPECT_EQ(resp.lengths(1), 1000u);
  EXPECT_EQ(0, std::memcmp(mem + 8192, a.data() + 4096, 200000));
  EXPECT_EQ(0, std::memcmp(mem + 8192 + 200000, a.data() + 299000, 1000));

  // A write from the memory: the bytes at 8192 + 10 become chunk 10 from 4095.
  WriteReq wr;
  wr.mutable_chunk()->set_inode(10);
  wr.set_offset(4095);
  wr.set_shm_handle(attached.handle());
  wr.set_shm_offset(8192 + 10);
  wr.set_shm_length(150001);
  ASSERT_TRUE(client_->callSync(server_->endpoint(), m("Write"), wr, &w).ok());
  EXPECT_EQ(w.info().length(), 4095u + 150001u);
  std::vector<uint8_t> got(4095 + 150001, 0xee);
  size_t n = 0;
  BatchReadReq rr;
  r = rr.add_ranges();
  r->mutable_chunk()->set_inode(10);
  r->set_length(static_cast<uint32_t>(got.size()));
  BatchReadResp rresp;
  ASSERT_TRUE(client_
                  ->callSync(server_->endpoint(), m("BatchRead"), rr, &rresp,
                             {.response_payload = got, .response_payload_len = &n})
                  .ok());
  ASSERT_EQ(n, got.size());
  EXPECT_TRUE(std::all_of(got.begin(), got.begin() + 4095, [](uint8_t b) { return b == 0; }));
  EXPECT_EQ(0, std::memcmp(got.data() + 4095, mem + 8192 + 10, 150001));
  // Shared memory and a payload at once; past the end of the memory.
  EXPECT_EQ(
      client_->callSync(server_->endpoint(), m("Write"), wr, &w, {.request_payload = a}).code(),
      ErrorCode::kInvalidArgument);
  wr.set_shm_offset(kBytes - 150000);
  EXPECT_EQ(client_->callSync(server_->endpoint(), m("Write"), wr, &w).code(),
            ErrorCode::kInvalidArgument);
  wr.set_shm_offset(8192 + 10);
  EXPECT_EQ(service_->queuedBytes(), 0u);

  // Past the end of the memory; a handle the server does not know.
  req.set_shm_offset(kBytes - 4096);
  EXPECT_EQ(client_->callSync(server_->endpoint(), m("BatchRead"), req, &resp).code(),
            ErrorCode::kInvalidArgument);
  req.set_shm_offset(~0ull - 10);
  EXPECT_EQ(client_->callSync(server_->endpoint(), m("BatchRead"), req, &resp).code(),
            ErrorCode::kInvalidArgument);
  ShmDetachReq detach;
  detach.set_handle(attached.handle());
  ShmDetachResp detached;
  ASSERT_TRUE(client_->callSync(server_->endpoint(), m("ShmDetach"), detach, &detached).ok());
  req.set_shm_offset(8192);
  EXPECT_EQ(client_->callSync(server_->endpoint(), m("BatchRead"), req, &resp).code(),
            ErrorCode::kNotFound);
  EXPECT_EQ(client_->callSync(server_->endpoint(), m("Write"), wr, &w).code(),
            ErrorCode::kNotFound);
  // The failed writes changed nothing.
  n = 0;
  std::fill(got.begin(), got.end(), 0xee);
  ASSERT_TRUE(client_
                  ->callSync(server_->endpoint(), m("BatchRead"), rr, &rresp,
                             {.response_payload = got, .response_payload_len = &n})
                  .ok());
  ASSERT_EQ(n, got.size());
  EXPECT_EQ(0, std::memcmp(got.data() + 4095, mem + 8192 + 10, 150001));
  // Another host's offer is refused.
  attach.set_boot_id("some-other-host");
  EXPECT_EQ(client_->callSync(server_->endpoint(), m("ShmAttach"), attach, &attached).code(),
            ErrorCode::kNotFound);
  ::munmap(mem, kBytes);
  ::close(fd);
}

}  // namespace
}  // namespace cistern::storage
