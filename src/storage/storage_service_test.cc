// The storage service over RPC on loopback: writes carry their bytes as the
// frame payload, batch reads return many ranges in one payload, errors per range.
#include "storage/storage_service.h"

#include <gtest/gtest.h>

#include <filesystem>

#include "common/random.h"
#include "net/rpc_client.h"
#include "storage.pb.h"

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
    engine_ = std::move(ChunkEngine::open(o)).value();
    server_ = std::make_unique<net::RpcServer>(net::ServerOptions{.threads = 1});
    service_ = std::make_unique<StorageService>(*engine_, *server_, 4, 1 << 20);
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
               WriteResp* resp) {
    WriteReq req;
    req.mutable_chunk()->set_inode(inode);
    req.mutable_chunk()->set_index(index);
    req.set_offset(offset);
    req.set_chain_version(3);
    return client_->callSync(server_->endpoint(), m("Write"), req, resp, {.request_payload = data});
  }

  std::string dir_;
  std::unique_ptr<ChunkEngine> engine_;
  std::unique_ptr<net::RpcServer> server_;
  std::unique_ptr<StorageService> service_;
  std::unique_ptr<net::RpcClient> client_ = std::make_unique<net::RpcClient>();
};

TEST_F(StorageServiceTest, WriteThenBatchReadManyRanges) {
  auto a = bytes(100000, 1), b = bytes(5000, 2);
  WriteResp w;
  ASSERT_TRUE(write(1, 0, 0, a, &w).ok());
  EXPECT_EQ(w.info().length(), 100000u);
  EXPECT_EQ(w.info().chain_version(), 3u);
  ASSERT_TRUE(write(1, 1, 4096, b, &w).ok());

  BatchReadReq req;
  auto add = [&](uint32_t index, uint64_t off, uint32_t len) {
    auto* r = req.add_ranges();
    r->mutable_chunk()->set_inode(1);
    r->mutable_chunk()->set_index(index);
    r->set_offset(off);
    r->set_length(len);
  };
  add(0, 10, 1000);    // inside chunk 0
  add(1, 4096, 5000);  // all of chunk 1's data
  add(7, 0, 100);      // missing chunk
  add(0, 99990, 100);  // short at the end
  std::vector<uint8_t> payload(1 << 20);
  size_t got = 0;
  BatchReadResp resp;
  ASSERT_TRUE(client_
                  ->callSync(server_->endpoint(), m("BatchRead"), req, &resp,
                             {.response_payload = payload, .response_payload_len = &got})
                  .ok());
  ASSERT_EQ(resp.codes_size(), 4);
  EXPECT_EQ(resp.codes(0), 0u);
  EXPECT_EQ(resp.codes(2), static_cast<uint32_t>(ErrorCode::kNotFound));
  EXPECT_EQ(resp.lengths(0), 1000u);
  EXPECT_EQ(resp.lengths(1), 5000u);
  EXPECT_EQ(resp.lengths(2), 0u);
  EXPECT_EQ(resp.lengths(3), 10u);
  ASSERT_EQ(got, 1000u + 5000 + 10);
  EXPECT_TRUE(std::equal(payload.begin(), payload.begin() + 1000, a.begin() + 10));
  EXPECT_TRUE(std::equal(payload.begin() + 1000, payload.begin() + 6000, b.begin()));
  EXPECT_TRUE(std::equal(payload.begin() + 6000, payload.begin() + 6010, a.begin() + 99990));
}

TEST_F(StorageServiceTest, QueryRemoveAndLimits) {
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
  // Too much in one batch read, and a write past 64 MiB.
  BatchReadReq big;
  for (int i = 0; i < 3; ++i) big.add_ranges()->set_length(512 * 1024);
  BatchReadResp br;
  EXPECT_EQ(client_->callSync(server_->endpoint(), m("BatchRead"), big, &br).code(),
            ErrorCode::kPayloadTooLarge);
  EXPECT_EQ(write(3, 0, kMaxChunkBytes, bytes(1, 4), &w).code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace cistern::storage
