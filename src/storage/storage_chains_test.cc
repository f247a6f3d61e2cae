// Chain replication in the storage service (storage_chains.cc): three
// replicas of one chain in this process, each its own engine, RPC server and
// chain table, routed by hand as mgmtd would route them.
#include <gtest/gtest.h>

#include <filesystem>
#include <thread>

#include "common/fault.h"
#include "common/metrics.h"
#include "common/random.h"
#include "mgmt.pb.h"
#include "net/rpc_client.h"
#include "storage.pb.h"
#include "storage/scrub_worker.h"
#include "storage/storage_service.h"
#include "tests/support/flip_bytes.h"

namespace cistern::storage {
namespace {

constexpr uint32_t kChain = 7;

std::vector<uint8_t> bytes(size_t n, uint64_t seed) {
  Xoshiro256 rng(seed);
  std::vector<uint8_t> v(n);
  for (auto& b : v) b = static_cast<uint8_t>(rng.next());
  return v;
}

net::Method m(const char* name) {
  return net::Method::of(std::string("cistern.storage.StorageService.") + name);
}

struct Replica {
  uint32_t target = 0;
  std::string dir;
  std::unique_ptr<ChunkEngine> engine;
  std::unique_ptr<net::RpcServer> server;
  ManualClock clock;
  ChainTable table{clock};
  std::unique_ptr<StorageService> service;
  std::string endpoint;
};

class StorageChainsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (uint32_t t = 1; t <= 3; ++t) start(t);
    // A fresh cluster: routing without chains first (the restart fence
    // leaves alone chains made after it), then the chain, all SERVING.
    route({}, 1);
    route({{1, mgmt::SERVING}, {2, mgmt::SERVING}, {3, mgmt::SERVING}}, 1);
  }
  void TearDown() override {
    for (uint32_t t = 1; t <= 3; ++t) stop(t);
    for (auto& [t, dir] : dirs_) std::filesystem::remove_all(dir);
  }

  void start(uint32_t t, bool fresh_disk = false) {
    auto r = std::make_unique<Replica>();
    r->target = t;
    if (!dirs_.count(t) || fresh_disk) {
      if (dirs_.count(t)) std::filesystem::remove_all(dirs_[t]);
      char tmpl[] = "/tmp/cistern-chains-XXXXXX";
      dirs_[t] = mkdtemp(tmpl);
    }
    ChunkEngineOptions o;
    o.path = dirs_[t];
    o.reserved_bytes = 0;
    r->engine = std::move(ChunkEngine::open(o)).value();
    r->server = std::make_unique<net::RpcServer>(net::ServerOptions{.threads = 1});
    r->table.setTarget(t);
    r->table.renewLease(r->clock.now(), 2000);
    r->service = std::make_unique<StorageService>(
        *r->engine, *r->server, StorageServiceOptions{.blocking_threads = 2}, &r->table, &peers_);
    ASSERT_TRUE(r->server->start().ok());
    r->endpoint = r->server->endpoint().toString();
    replicas_[t] = std::move(r);
  }
  void stop(uint32_t t) {
    auto it = replicas_.find(t);
    if (it == replicas_.end()) return;
    it->second->server->stop();
    replicas_.erase(it);
  }
  Replica& at(uint32_t t) { return *replicas_.at(t); }
  // Every chunk target t holds fails verification: stopped, its data files'
  // bytes flipped, started again with the chain as it was (all SERVING).
  void corrupt(uint32_t t) {
    stop(t);
    EXPECT_GT(testing::flipBytesEvery4K(dirs_[t]), 0);
    start(t);
    route({{1, mgmt::SERVING}, {2, mgmt::SERVING}, {3, mgmt::SERVING}}, 1);
  }

  // Routing version `version_` + 1 with chain kChain at `chain_version`.
  void route(std::vector<std::pair<uint32_t, mgmt::TargetState>> members, uint64_t chain_version) {
    mgmt::Routing r;
    r.set_version(++version_);
    for (auto& [t, rep] : replicas_) {
      auto* target = r.add_targets();
      target->set_id(t);
      target->set_endpoint(rep->endpoint);
    }
    if (!members.empty()) {
      auto* c = r.add_chains();
      c->set_id(kChain);
      c->set_version(chain_version);
      for (auto [t, state] : members) {
        auto* cm = c->add_members();
        cm->set_target(t);
        cm->set_state(state);
        if (state == mgmt::SERVING) c->add_targets(t);
      }
    }
    for (auto& [t, rep] : replicas_) ASSERT_TRUE(rep->table.update(r).ok());
  }

  Status write(uint32_t to, uint64_t chain_version, uint32_t index, uint64_t offset,
               const std::vector<uint8_t>& data, uint64_t seq = 0, WriteResp* out = nullptr) {
    WriteReq req;
    req.mutable_chunk()->set_inode(42);
    req.mutable_chunk()->set_index(index);
    req.set_offset(offset);
    req.set_chain(kChain);
    req.set_chain_version(chain_version);
    req.set_update_client(seq ? 99 : 0);
    req.set_update_seq(seq);
    WriteResp resp;
    return client_.callSync(*net::Endpoint::parse(at(to).endpoint), m("Write"), req,
                            out ? out : &resp, {.request_payload = data});
  }
  // Reads chunk `index` whole from target `from`; the range's code.
  ErrorCode read(uint32_t from, uint64_t chain_version, uint32_t index, std::vector<uint8_t>* out) {
    BatchReadReq req;
    auto* r = req.add_ranges();
    r->mutable_chunk()->set_inode(42);
    r->mutable_chunk()->set_index(index);
    r->set_length(1 << 20);
    r->set_chain(kChain);
    r->set_chain_version(chain_version);
    BatchReadResp resp;
    out->assign(1 << 20, 0);
    size_t got = 0;
    Status s = client_.callSync(*net::Endpoint::parse(at(from).endpoint), m("BatchRead"), req,
                                &resp, {.response_payload = *out, .response_payload_len = &got});
    if (!s.ok()) return s.code();
    out->resize(got);
    return static_cast<ErrorCode>(resp.codes(0));
  }
  std::optional<ChunkMeta> meta(uint32_t t, uint32_t index) {
    return *at(t).engine->query(ChunkId{42, index});
  }

  std::map<uint32_t, std::string> dirs_;
  std::map<uint32_t, std::unique_ptr<Replica>> replicas_;
  net::RpcClient peers_;
  net::RpcClient client_;
  uint64_t version_ = 0;
};

TEST_F(StorageChainsTest, AWriteIsOnEveryReplicaWhenItIsAnswered) {
  auto a = bytes(100000, 1);
  WriteResp resp;
  ASSERT_TRUE(write(1, 1, 0, 0, a, 1, &resp).ok());
  EXPECT_EQ(resp.info().chunk_version(), 1u);
  EXPECT_EQ(resp.info().chain(), kChain);
  auto b = bytes(5000, 2);
  ASSERT_TRUE(write(1, 1, 0, 70000, b).ok());
  std::copy(b.begin(), b.end(), a.begin() + 70000);
  for (uint32_t t = 1; t <= 3; ++t) {
    auto mt = meta(t, 0);
    ASSERT_TRUE(mt.has_value()) << "target " << t;
    EXPECT_EQ(mt->chunk_version, 2u) << "target " << t;
    EXPECT_EQ(mt->chain, kChain);
    std::vector<uint8_t> got;
    ASSERT_EQ(read(t, 1, 0, &got), ErrorCode::kOk) << "target " << t;
    EXPECT_EQ(got, a) << "target " << t;
  }
}

TEST_F(StorageChainsTest, RequestsOffTheRoutingAreRefusedWithDistinctErrors) {
  auto a = bytes(4096, 3);
  EXPECT_EQ(write(1, 2, 0, 0, a).code(), ErrorCode::kStaleChainVersion);
  EXPECT_EQ(write(2, 1, 0, 0, a).code(), ErrorCode::kNotServing) << "not the head";
  ASSERT_TRUE(write(1, 1, 0, 0, a).ok());
  std::vector<uint8_t> got;
  EXPECT_EQ(read(2, 5, 0, &got), ErrorCode::kStaleChainVersion);
  // Cut off from mgmtd for half the timeout: serves nothing.
  at(3).clock.advance(std::chrono::milliseconds(1000));
  at(1).clock.advance(std::chrono::milliseconds(1000));
  EXPECT_EQ(read(3, 1, 0, &got), ErrorCode::kNotServing);
  EXPECT_EQ(read(2, 1, 0, &got), ErrorCode::kOk);
  EXPECT_EQ(write(1, 1, 0, 0, a).code(), ErrorCode::kNotServing);
}

// The tail dies after the head and middle applied a write: the write is
// not answered, the chunk is dirty on both (reads there say so), and once
// mgmtd takes the tail out the client's retry (same update id) commits it.
// The tail comes back SYNCING and catches up through a resync while writes
// go on, then serves at the tail.
TEST_F(StorageChainsTest, ATailThatDiesIsRoutedAroundAndSyncsBack) {
  auto a = bytes(64 << 10, 4);
  ASSERT_TRUE(write(1, 1, 0, 0, a, 1).ok());
  ASSERT_TRUE(write(1, 1, 1, 0, a, 2).ok());  // chunk 1: removed while 3 is away
  stop(3);
  auto b = bytes(4096, 5);
  Status s = write(1, 1, 0, 8192, b, 3);
  EXPECT_FALSE(s.ok());
  std::vector<uint8_t> got;
  EXPECT_EQ(read(1, 1, 0, &got), ErrorCode::kChunkNotCommitted);
  EXPECT_EQ(read(2, 1, 0, &got), ErrorCode::kChunkNotCommitted);
  route({{1, mgmt::SERVING}, {2, mgmt::SERVING}, {3, mgmt::OFFLINE}}, 2);
  EXPECT_EQ(write(1, 1, 0, 8192, b, 3).code(), ErrorCode::kStaleChainVersion);
  WriteResp resp;
  ASSERT_TRUE(write(1, 2, 0, 8192, b, 3, &resp).ok());
  std::copy(b.begin(), b.end(), a.begin() + 8192);
  EXPECT_EQ(meta(1, 0)->chunk_version, meta(2, 0)->chunk_version);
  for (uint32_t t : {1u, 2u}) {
    ASSERT_EQ(read(t, 2, 0, &got), ErrorCode::kOk);
    EXPECT_EQ(got, a);
  }
  // A retry of an answered update is answered again, not applied again.
  const uint64_t v = meta(1, 0)->chunk_version;
  ASSERT_TRUE(write(1, 2, 0, 8192, b, 3).ok());
  EXPECT_EQ(meta(1, 0)->chunk_version, v);
  // Chunk 1 goes; chunk 2 is new.
  RemoveReq rm;
  rm.set_chain(kChain);
  rm.set_chain_version(2);
  auto* c = rm.add_chunks();
  c->set_inode(42);
  c->set_index(1);
  RemoveResp rm_resp;
  ASSERT_TRUE(
      client_.callSync(*net::Endpoint::parse(at(1).endpoint), m("Remove"), rm, &rm_resp).ok());
  ASSERT_TRUE(write(1, 2, 2, 0, a).ok());
  EXPECT_FALSE(meta(2, 1).has_value());

  // Back, with its old disk: SYNCING at the end of the chain.
  start(3);
  route({}, 0);  // its first routing (the restart fence), then the chain's
  route({{1, mgmt::SERVING}, {2, mgmt::SERVING}, {3, mgmt::SYNCING}}, 3);
  EXPECT_EQ(read(3, 3, 0, &got), ErrorCode::kNotServing) << "a syncing target is not read";
  auto d = bytes(4096, 6);
  ASSERT_TRUE(write(1, 3, 0, 0, d).ok());  // forwarded to 3 too: its copy is older
  std::copy(d.begin(), d.end(), a.begin());
  auto pos = at(2).table.syncsToRun();
  ASSERT_EQ(pos.size(), 1u);
  EXPECT_EQ(pos[0].successor, 3u);
  ASSERT_TRUE(at(2).service->resync(pos[0]).ok());
  auto synced = at(3).service->takeSynced();
  ASSERT_EQ(synced.size(), 1u);
  EXPECT_EQ(synced[0], std::make_pair(kChain, 3u));
  for (uint32_t index : {0u, 2u}) {
    ASSERT_TRUE(meta(3, index).has_value()) << index;
    EXPECT_EQ(meta(3, index)->chunk_version, meta(1, index)->chunk_version) << index;
  }
  EXPECT_FALSE(meta(3, 1).has_value()) << "removed while it was away";
  route({{1, mgmt::SERVING}, {2, mgmt::SERVING}, {3, mgmt::SERVING}}, 4);
  ASSERT_EQ(read(3, 4, 0, &got), ErrorCode::kOk);
  EXPECT_EQ(got, a);
}

// A head that applied a write and died before forwarding it leaves a
// version the chain never had; back, the resync replaces it (same chunk
// version, older chain version) with the chain's.
TEST_F(StorageChainsTest, AResyncReplacesAVersionTheChainNeverCommitted) {
  auto a = bytes(8192, 7);
  ASSERT_TRUE(write(1, 1, 0, 0, a).ok());
  stop(2);
  stop(3);
  auto lost = bytes(8192, 8);
  EXPECT_FALSE(write(1, 1, 0, 0, lost).ok());  // applied on 1 only
  stop(1);
  start(2);
  start(3);
  route({}, 0);
  route({{2, mgmt::SERVING}, {3, mgmt::SERVING}, {1, mgmt::OFFLINE}}, 2);
  auto b = bytes(8192, 9);
  ASSERT_TRUE(write(2, 2, 0, 0, b).ok());
  EXPECT_EQ(meta(2, 0)->chunk_version, 2u);
  start(1);
  route({}, 0);
  route({{2, mgmt::SERVING}, {3, mgmt::SERVING}, {1, mgmt::SYNCING}}, 3);
  EXPECT_EQ(meta(1, 0)->chunk_version, 2u) << "its own version 2, not the chain's";
  auto pos = at(3).table.syncsToRun();
  ASSERT_EQ(pos.size(), 1u);
  ASSERT_TRUE(at(3).service->resync(pos[0]).ok());
  route({{2, mgmt::SERVING}, {3, mgmt::SERVING}, {1, mgmt::SERVING}}, 4);
  std::vector<uint8_t> got;
  ASSERT_EQ(read(1, 4, 0, &got), ErrorCode::kOk);
  EXPECT_EQ(got, b);
}

// The chain moves while a write is under way (every replica's apply held up
// by a fault delay): the write is not acknowledged — a new member's resync
// may have listed the chunks meanwhile — and the client's retry under the
// new version is answered without applying it a second time.
TEST_F(StorageChainsTest, AWriteUnderWayWhenTheChainMovesIsNotAcknowledged) {
  auto a = bytes(8192, 11);
  fault::enable("storage.write.queued",
                {.action = fault::Action::kDelay, .delay = std::chrono::milliseconds(300)});
  std::thread mover([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    route({{1, mgmt::SERVING}, {2, mgmt::SERVING}, {3, mgmt::SERVING}}, 2);
  });
  Status s = write(1, 1, 0, 0, a, 7);
  mover.join();
  fault::disable("storage.write.queued");
  EXPECT_EQ(s.code(), ErrorCode::kStaleChainVersion) << s.toString();
  std::vector<uint8_t> got;
  EXPECT_EQ(read(1, 2, 0, &got), ErrorCode::kChunkNotCommitted) << "the head holds it dirty";
  WriteResp resp;
  ASSERT_TRUE(write(1, 2, 0, 0, a, 7, &resp).ok());
  for (uint32_t t = 1; t <= 3; ++t) {
    ASSERT_TRUE(meta(t, 0).has_value()) << "target " << t;
    EXPECT_EQ(meta(t, 0)->chunk_version, 1u) << "target " << t << ": applied once";
    ASSERT_EQ(read(t, 2, 0, &got), ErrorCode::kOk) << "target " << t;
    EXPECT_EQ(got, a);
  }
}

// The head's disk fails a change its successors took (and a reader of the
// tail may have seen): taking it back would un-commit a version a reader
// saw. The head's target fails instead — read-only, refusing changes —
// and the successors keep the change; once mgmtd has taken the head out,
// the client's retry reaches the new head, which remembers the update and
// answers without applying it again.
TEST_F(StorageChainsTest, AHeadWhoseDiskFailsAChangeItsSuccessorsTookFailsItsTarget) {
  auto a = bytes(8192, 21), b = bytes(8192, 22);
  ASSERT_TRUE(write(1, 1, 0, 0, a).ok());
  fault::enable("storage.head.apply", {.code = ErrorCode::kIOError, .times = 1});
  Status s = write(1, 1, 0, 0, b, 9);
  fault::disable("storage.head.apply");
  EXPECT_EQ(s.code(), ErrorCode::kIOError) << s.toString();
  EXPECT_TRUE(at(1).engine->failed()) << "the head's target failed";
  // Another change at the failed head is refused before it goes anywhere
  // (its copy no longer moves: the change would reach the successors under
  // the version they hold with the first change's bytes).
  auto c = bytes(8192, 23);
  EXPECT_EQ(write(1, 1, 0, 0, c, 10).code(), ErrorCode::kIOError);
  std::vector<uint8_t> got;
  ASSERT_EQ(read(3, 1, 0, &got), ErrorCode::kOk);
  EXPECT_EQ(got, b) << "the tail keeps the change";
  EXPECT_EQ(meta(3, 0)->chunk_version, 2u);
  route({{2, mgmt::SERVING}, {3, mgmt::SERVING}, {1, mgmt::OFFLINE}}, 2);
  WriteResp resp;
  ASSERT_TRUE(write(2, 2, 0, 0, b, 9, &resp).ok()) << "the retry, at the new head";
  for (uint32_t t : {2u, 3u}) {
    EXPECT_EQ(meta(t, 0)->chunk_version, 2u) << "target " << t << ": applied once";
    ASSERT_EQ(read(t, 2, 0, &got), ErrorCode::kOk);
    EXPECT_EQ(got, b);
  }
  EXPECT_EQ(meta(1, 0)->chunk_version, 1u) << "the failed head kept its old copy";
}

// A replica's copy fails verification (bits flipped on its disk): a read
// there answers kCorruption (never the bad bytes) and queues a repair,
// which replaces the copy with a peer's of the same versions; the next read
// there returns the right bytes. A repair with no other serving replica
// has nothing to repair from.
TEST_F(StorageChainsTest, ACorruptCopyIsRepairedFromAPeerAfterAReadFindsIt) {
  auto a = bytes(8192, 31);
  ASSERT_TRUE(write(1, 1, 0, 0, a).ok());
  corrupt(3);
  std::vector<uint8_t> got;
  ASSERT_EQ(read(3, 1, 0, &got), ErrorCode::kCorruption);
  bool repaired = false;
  for (int i = 0; i < 100 && !repaired; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    repaired = read(3, 1, 0, &got) == ErrorCode::kOk;
  }
  ASSERT_TRUE(repaired) << "the copy on target 3 was not repaired";
  EXPECT_EQ(got, a);
  EXPECT_EQ(meta(3, 0)->chunk_version, 1u) << "the same version, good bytes";
  // With no other serving replica there is nothing to repair from.
  route({{3, mgmt::SERVING}, {1, mgmt::OFFLINE}, {2, mgmt::OFFLINE}}, 2);
  Status alone = at(3).service->repair(ChunkId{42, 0}, kChain);
  EXPECT_EQ(alone.code(), ErrorCode::kNotFound) << alone.toString();
}

// The scrub finds a bad copy before any reader does and has it repaired.
TEST_F(StorageChainsTest, AScrubFindsABadCopyAndHasItRepaired) {
  auto a = bytes(8192, 33);
  ASSERT_TRUE(write(1, 1, 0, 0, a).ok());
  corrupt(2);
  auto& repaired = metrics::Registry::global().counter("storage_chunks_repaired_total");
  const uint64_t before = repaired.value();
  {
    ScrubWorker scrub(*at(2).engine, 1ull << 30, std::chrono::hours(1),
                      [&](ChunkId id) { at(2).service->repairLater(id, kChain); });
    for (int i = 0; i < 200 && repaired.value() == before; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    EXPECT_EQ(scrub.lastBad().size(), 1u);
  }
  EXPECT_EQ(repaired.value(), before + 1) << "repaired before any read";
  std::vector<uint8_t> got;
  ASSERT_EQ(read(2, 1, 0, &got), ErrorCode::kOk);
  EXPECT_EQ(got, a);
}

// A change that failed down the chain and that nobody retries is pushed
// down by the head's background settle: the chunk is readable again.
TEST_F(StorageChainsTest, TheHeadSettlesADirtyChunkNobodyRetries) {
  auto a = bytes(8192, 12);
  ASSERT_TRUE(write(1, 1, 0, 0, a).ok());
  stop(3);
  auto b = bytes(8192, 13);
  EXPECT_FALSE(write(1, 1, 0, 0, b).ok());  // the tail is gone: dirty on 1 and 2
  route({{1, mgmt::SERVING}, {2, mgmt::SERVING}, {3, mgmt::OFFLINE}}, 2);
  std::vector<uint8_t> got;
  EXPECT_EQ(read(2, 2, 0, &got), ErrorCode::kChunkNotCommitted);
  ASSERT_TRUE(at(2).service->settleDirty().ok());  // not its to settle: 1 heads the chain
  EXPECT_EQ(read(2, 2, 0, &got), ErrorCode::kChunkNotCommitted);
  ASSERT_TRUE(at(1).service->settleDirty().ok());
  for (uint32_t t : {1u, 2u}) {
    ASSERT_EQ(read(t, 2, 0, &got), ErrorCode::kOk) << "target " << t;
    EXPECT_EQ(got, b) << "target " << t << ": the head's copy, which took the change";
  }
}

}  // namespace
}  // namespace cistern::storage
