// The meta GC wired to real storage: files are created in a MetaStore, their
// chunks written to two storage services on loopback (one per chain), then
// the files are unlinked and the GcWorker removes exactly their chunks
// through RemoteChunkRemover (behind server::GcRemover); and the remover's cut from an index, as a
// truncating client uses it.
#include "client/remote_chunk_remover.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "kv/engine.h"
#include "meta/meta_store.h"
#include "meta/schema.h"
#include "server/gc_remover.h"
#include "storage/storage_service.h"

namespace cistern::storage {
namespace {

struct Target {
  std::string dir;
  std::unique_ptr<ChunkEngine> engine;
  std::unique_ptr<net::RpcServer> server;
  std::unique_ptr<StorageService> service;
  ~Target() {
    if (server) server->stop();
    service.reset();
    server.reset();
    engine.reset();
    std::filesystem::remove_all(dir);
  }
};

class RemoteChunkRemoverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (auto& t : targets_) {
      char tmpl[] = "/tmp/cistern-gc-XXXXXX";
      t.dir = mkdtemp(tmpl);
      ChunkEngineOptions o;
      o.path = t.dir;
      o.reserved_bytes = 0;
      t.engine = std::move(ChunkEngine::open(o)).value();
      t.server = std::make_unique<net::RpcServer>(net::ServerOptions{.threads = 1});
      t.service = std::make_unique<StorageService>(*t.engine, *t.server);
      ASSERT_TRUE(t.server->start().ok());
    }
    kv_ = kv::openMemEngine();
    ASSERT_TRUE(kv::runTransaction(*kv_, [](kv::Transaction& t) {
                  for (uint32_t id = 1; id <= 2; ++id) t.set(meta::chainKey(id), "");
                  return Status::OK();
                }).ok());
    store_ = std::make_unique<meta::MetaStore>(*kv_);
    ASSERT_TRUE(store_->init().ok());
    root_.set_uid(0);
    root_.set_gid(0);
  }
  // Chain c is served by targets_[c - 1].
  Result<net::Endpoint> route(uint32_t chain) {
    if (chain < 1 || chain > 2)
      return Status(ErrorCode::kNotFound, "no chain " + std::to_string(chain));
    return targets_[chain - 1].server->endpoint();
  }
  // Writes chunks [0, n) of `f` where its layout puts them.
  void writeChunks(const meta::Inode& f, uint32_t n) {
    std::vector<uint8_t> data(1000, 7);
    for (uint32_t i = 0; i < n; ++i) {
      uint32_t chain = f.layout().chains(static_cast<int>(i % f.layout().chains_size()));
      ASSERT_TRUE(targets_[chain - 1].engine->write({f.ino(), i}, 0, data, 1).ok());
    }
  }
  bool exists(const meta::Inode& f, uint32_t i) {
    uint32_t chain = f.layout().chains(static_cast<int>(i % f.layout().chains_size()));
    return targets_[chain - 1].engine->query({f.ino(), i})->has_value();
  }

  Target targets_[2];
  std::unique_ptr<kv::Engine> kv_;
  std::unique_ptr<meta::MetaStore> store_;
  meta::Caller root_;
  net::RpcClient client_;
};

TEST_F(RemoteChunkRemoverTest, GcRemovesEveryChunkOfUnlinkedFiles) {
  auto a = store_->create(root_, 1, "a", 0644, true);
  auto b = store_->create(root_, 1, "b", 0644, true);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_EQ(a->layout().chains_size(), 2);
  ASSERT_TRUE(store_->setattr(root_, a->ino(), {.size = 6u << 20}).ok());
  ASSERT_TRUE(store_->setattr(root_, b->ino(), {.size = 2u << 20}).ok());
  writeChunks(*a, 6);
  // b's writer wrote 5 chunks and died before it recorded more than 2 MiB:
  // the chunks past the length go too.
  writeChunks(*b, 5);
  ASSERT_TRUE(store_->unlink(root_, 1, "a").ok());
  ASSERT_TRUE(store_->unlink(root_, 1, "b").ok());
  auto c = store_->create(root_, 1, "c", 0644, true);  // stays
  ASSERT_TRUE(c.ok());
  writeChunks(*c, 3);

  client::RemoteChunkRemover remover(client_, [this](uint32_t c) { return route(c); },
                                     {.batch = 2});
  server::GcRemover gc_remover(remover);
  meta::GcWorker gc(*kv_, gc_remover);
  auto done = gc.runOnce();
  ASSERT_TRUE(done.ok()) << done.status().toString();
  EXPECT_EQ(*done, 2u);
  for (uint32_t i = 0; i < 6; ++i) EXPECT_FALSE(exists(*a, i)) << "chunk " << i << " of a";
  for (uint32_t i = 0; i < 5; ++i) EXPECT_FALSE(exists(*b, i)) << "chunk " << i << " of b";
  for (uint32_t i = 0; i < 3; ++i) EXPECT_TRUE(exists(*c, i)) << "chunk " << i << " of c";
  EXPECT_EQ(targets_[0].engine->space().chunks + targets_[1].engine->space().chunks, 3u);
  EXPECT_EQ(*gc.runOnce(), 0u);
}

TEST_F(RemoteChunkRemoverTest, RemovesFromAnIndexOnEveryChainInBatches) {
  auto a = store_->create(root_, 1, "a", 0644, true);
  auto b = store_->create(root_, 1, "b", 0644, true);
  ASSERT_TRUE(a.ok() && b.ok());
  writeChunks(*a, 9);
  writeChunks(*b, 2);
  client::RemoteChunkRemover remover(client_, [this](uint32_t c) { return route(c); },
                                     {.batch = 2});
  ASSERT_TRUE(remover.removeFrom(a->ino(), a->layout(), 3).ok());
  for (uint32_t i = 0; i < 9; ++i) EXPECT_EQ(exists(*a, i), i < 3) << "chunk " << i;
  for (uint32_t i = 0; i < 2; ++i) EXPECT_TRUE(exists(*b, i)) << "the next inode's chunk " << i;
  ASSERT_TRUE(remover.removeFrom(a->ino(), a->layout(), 3).ok());  // again: nothing left, fine
  ASSERT_TRUE(remover.removeFrom(a->ino(), a->layout(), 0).ok());
  for (uint32_t i = 0; i < 3; ++i) EXPECT_FALSE(exists(*a, i)) << "chunk " << i;
  EXPECT_EQ(targets_[0].engine->space().chunks + targets_[1].engine->space().chunks, 2u);
}

// How far a file's chunks reach in storage, from an index on, across both
// chains and in pages: what the session reaper grows a dead writer's file to.
TEST_F(RemoteChunkRemoverTest, StoredEndIsTheEndOfTheFilesLastChunkFromAnIndexOn) {
  auto a = store_->create(root_, 1, "a", 0644, true);
  auto b = store_->create(root_, 1, "b", 0644, true);
  auto c = store_->create(root_, 1, "c", 0644, true);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  const uint64_t chunk = a->layout().chunk_size();
  writeChunks(*a, 9);  // 1,000 bytes each
  writeChunks(*c, 2);  // the next inode's: not a's
  // Chunk 3 of b only: a file with a hole before its bytes.
  uint32_t chain3 = b->layout().chains(3 % b->layout().chains_size());
  std::vector<uint8_t> tail(4321, 9);
  ASSERT_TRUE(targets_[chain3 - 1].engine->write({b->ino(), 3}, 100, tail, 1).ok());
  client::RemoteChunkRemover probe(client_, [this](uint32_t ch) { return route(ch); },
                                   {.batch = 2});
  EXPECT_EQ(*probe.storedEnd(a->ino(), a->layout(), 0), 8 * chunk + 1000);
  EXPECT_EQ(*probe.storedEnd(a->ino(), a->layout(), 8), 8 * chunk + 1000);
  EXPECT_EQ(*probe.storedEnd(a->ino(), a->layout(), 9), 0u);
  EXPECT_EQ(*probe.storedEnd(b->ino(), b->layout(), 0), 3 * chunk + 100 + 4321);
  EXPECT_EQ(*probe.storedEnd(b->ino(), b->layout(), 4), 0u);
  // A chain nobody serves: the error names the inode.
  meta::Layout gone = a->layout();
  gone.add_chains(7);
  auto e = probe.storedEnd(a->ino(), gone, 0);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("no chain 7"), std::string::npos) << e.status().toString();
}

TEST_F(RemoteChunkRemoverTest, UnreachableStorageKeepsTheEntryQueued) {
  auto a = store_->create(root_, 1, "a", 0644, true);
  ASSERT_TRUE(store_->setattr(root_, a->ino(), {.size = 2u << 20}).ok());
  writeChunks(*a, 2);
  ASSERT_TRUE(store_->unlink(root_, 1, "a").ok());
  uint32_t down_chain = a->layout().chains(1);
  net::Endpoint dead = targets_[down_chain - 1].server->endpoint();
  targets_[down_chain - 1].server->stop();
  client::RemoteChunkRemover remover(client_, [&](uint32_t c) -> Result<net::Endpoint> {
    return c == down_chain ? dead : route(c);
  });
  server::GcRemover gc_remover(remover);
  meta::GcWorker gc(*kv_, gc_remover);
  auto failed = gc.runOnce();
  EXPECT_FALSE(failed.ok());
  EXPECT_EQ(failed.code(), ErrorCode::kConnectionFailed) << failed.status().toString();
  // The entry is still queued: a worker with a working route finishes it.
  client::RemoteChunkRemover other(client_, [&](uint32_t c) -> Result<net::Endpoint> {
    if (c == down_chain) return Status(ErrorCode::kNotFound, "chain down");
    return route(c);
  });
  server::GcRemover other_gc(other);
  EXPECT_FALSE(meta::GcWorker(*kv_, other_gc).runOnce().ok());
  EXPECT_FALSE(exists(*a, 0));  // the reachable chain's chunk is gone (idempotent later)
}

TEST_F(RemoteChunkRemoverTest, LayoutWithoutChainsIsAnError) {
  meta::Layout empty;
  client::RemoteChunkRemover remover(client_, [this](uint32_t c) { return route(c); });
  EXPECT_EQ(remover.removeFrom(5, empty, 0).code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace cistern::storage
