// ShortCircuit against a real chunk engine: what ChunkEngine::locate says
// about a range, read by the client from the engine's files.
#include "client/short_circuit.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <random>
#include <vector>

#include "common/crc32c.h"
#include "common/io_memory.h"
#include "storage.pb.h"
#include "storage/chunk_engine.h"

namespace cistern::client {
namespace {

using storage::ChunkEngine;
using storage::ChunkId;

class ShortCircuitTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = std::filesystem::temp_directory_path() /
           ("cistern-sc-" + std::to_string(getpid()) + "-" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    std::filesystem::remove_all(dir_);
    storage::ChunkEngineOptions o;
    o.path = (dir_ / "target").string();
    auto e = ChunkEngine::open(o);
    ASSERT_TRUE(e.ok()) << e.status().toString();
    engine_ = std::move(*e);
  }
  void TearDown() override {
    engine_.reset();
    std::filesystem::remove_all(dir_);
  }

  std::vector<uint8_t> bytes(size_t n, uint64_t seed) {
    std::vector<uint8_t> v(n);
    std::mt19937_64 rng(seed);
    for (auto& b : v) b = static_cast<uint8_t>(rng());
    return v;
  }
  void write(ChunkId id, const std::vector<uint8_t>& data) {
    auto m = engine_->write(id, 0, data, 1);
    ASSERT_TRUE(m.ok()) << m.status().toString();
  }
  // The engine's answer for one range, as the service sends it.
  storage::LocatedRange locate(ChunkId id, uint64_t offset, size_t n) {
    ChunkEngine::LocateRange r{id, offset, n};
    auto all = engine_->locate({&r, 1});
    storage::LocatedRange out;
    EXPECT_TRUE(all && all->size() == 1);
    if (!all || all->size() != 1) return out;
    auto& loc = (*all)[0];
    out.set_code(static_cast<uint32_t>(loc.code()));
    if (!loc.ok()) return out;
    out.set_path(loc->path);
    out.set_dev(loc->dev);
    out.set_ino(loc->ino);
    out.set_slot_offset(loc->slot_offset);
    out.set_chunk_length(loc->length);
    out.mutable_crcs()->Add(loc->crcs.begin(), loc->crcs.end());
    return out;
  }

  std::filesystem::path dir_;
  std::unique_ptr<ChunkEngine> engine_;
};

TEST_F(ShortCircuitTest, RangesAtEveryAlignmentReadExactlyWhatWasWritten) {
  const ChunkId id{7, 3};
  const auto data = bytes((1 << 20) - 1000, 1);  // a partial last block
  write(id, data);
  ShortCircuit sc;
  // 2 MiB pages (aligned: straight in), plain heap (through the buffer).
  io_memory::Region huge(2 << 20);
  std::vector<uint8_t> heap((1 << 20) + 1);
  std::mt19937_64 rng(2);
  for (int i = 0; i < 300; ++i) {
    const bool aligned = i % 2 == 0;
    uint64_t off = aligned ? (rng() % 256) * 4096 : rng() % data.size();
    uint32_t n = static_cast<uint32_t>(rng() % (1 << 20) + 1);
    if (i == 0) off = 0, n = 1 << 20;  // the whole chunk and past its end
    uint8_t* out = aligned ? huge.data() : heap.data() + 1;
    auto loc = locate(id, off, n);
    ASSERT_EQ(loc.code(), 0u);
    size_t got = 0;
    Status s = sc.read(loc, off, n, out, &got);
    ASSERT_TRUE(s.ok()) << s.toString();
    ASSERT_EQ(got, std::min<uint64_t>(n, data.size() - off)) << "at " << off;
    ASSERT_EQ(0, std::memcmp(out, data.data() + off, got)) << "at " << off << " length " << n;
  }
  // Past the end: nothing, no error.
  auto loc = locate(id, data.size(), 4096);
  size_t got = 1;
  EXPECT_TRUE(sc.read(loc, data.size(), 4096, heap.data(), &got).ok());
  EXPECT_EQ(got, 0u);
  EXPECT_EQ(loc.crcs_size(), 0);
  // A chunk never written.
  EXPECT_EQ(locate(ChunkId{7, 4}, 0, 4096).code(), static_cast<uint32_t>(ErrorCode::kNotFound));
}

// After the Locate the chunk is rewritten elsewhere and its old slot given
// to another chunk: the bytes there fail the CRCs the Locate gave.
TEST_F(ShortCircuitTest, ASlotHandedOutAgainAfterTheLocateFailsItsCrcs) {
  const ChunkId a{1, 0}, b{2, 0};
  const auto first = bytes(100 << 10, 3);  // class 1: the lowest free slot is reused
  write(a, first);
  auto before = locate(a, 0, first.size());
  ASSERT_EQ(before.code(), 0u);
  write(a, bytes(100 << 10, 4));  // copy-on-write: a moves, its slot is freed
  write(b, bytes(100 << 10, 5));  // and b takes it
  auto now = locate(b, 0, first.size());
  ASSERT_EQ(now.slot_offset(), before.slot_offset()) << "b lies where a was";
  ShortCircuit sc;
  std::vector<uint8_t> out(first.size());
  size_t got = 0;
  Status s = sc.read(before, 0, static_cast<uint32_t>(first.size()), out.data(), &got);
  EXPECT_EQ(s.code(), ErrorCode::kCorruption) << s.toString();
  // Where the Locate says a is now, its new bytes.
  auto after = locate(a, 0, first.size());
  EXPECT_TRUE(sc.read(after, 0, static_cast<uint32_t>(first.size()), out.data(), &got).ok());
  EXPECT_EQ(out, bytes(100 << 10, 4));
}

TEST_F(ShortCircuitTest, AFlippedBitOnTheDiskIsACorruptionNotWrongBytes) {
  const ChunkId id{9, 0};
  const auto data = bytes(1 << 20, 6);
  write(id, data);
  auto loc = locate(id, 0, data.size());
  ASSERT_EQ(loc.code(), 0u);
  {
    int fd = ::open(loc.path().c_str(), O_RDWR);
    ASSERT_GE(fd, 0);
    uint8_t byte = data[12345] ^ 0x10;
    ASSERT_EQ(::pwrite(fd, &byte, 1, static_cast<off_t>(loc.slot_offset() + 12345)), 1);
    ASSERT_EQ(::fsync(fd), 0);
    ::close(fd);
  }
  ShortCircuit sc;
  io_memory::Region out(1 << 20);
  size_t got = 0;
  Status s = sc.read(loc, 0, 1 << 20, out.data(), &got);
  EXPECT_EQ(s.code(), ErrorCode::kCorruption) << s.toString();
  EXPECT_NE(s.message().find("block 3 "), std::string::npos) << s.toString();
  // The block's neighbours alone still read.
  EXPECT_TRUE(sc.read(locate(id, 16384, 4096), 16384, 4096, out.data(), &got).ok());
  EXPECT_EQ(0, std::memcmp(out.data(), data.data() + 16384, 4096));
}

TEST_F(ShortCircuitTest, AFileThatCannotBeOpenedOrIsAnotherOneIsNotUsed) {
  const ChunkId id{5, 0};
  const auto data = bytes(64 << 10, 7);
  write(id, data);
  ShortCircuit sc;
  std::vector<uint8_t> out(data.size());
  size_t got = 0;
  auto loc = locate(id, 0, data.size());
  auto missing = loc;
  missing.set_path((dir_ / "nowhere.dat").string());
  EXPECT_EQ(sc.read(missing, 0, 4096, out.data(), &got).code(), ErrorCode::kNotSupported);
  auto other = loc;
  other.set_ino(loc.ino() + 1);  // what a server in another mount namespace would name
  Status s = sc.read(other, 0, 4096, out.data(), &got);
  EXPECT_EQ(s.code(), ErrorCode::kNotSupported) << s.toString();
  auto short_crcs = loc;
  short_crcs.mutable_crcs()->RemoveLast();
  EXPECT_EQ(sc.read(short_crcs, 0, static_cast<uint32_t>(data.size()), out.data(), &got).code(),
            ErrorCode::kNotSupported);
  // The real answer still works after those.
  EXPECT_TRUE(sc.read(loc, 0, static_cast<uint32_t>(data.size()), out.data(), &got).ok());
  EXPECT_EQ(out, data);

  net::Endpoint a = *net::Endpoint::parse("127.0.0.1:1");
  net::Endpoint b = *net::Endpoint::parse("127.0.0.1:2");
  EXPECT_FALSE(sc.anyRefused());
  sc.refuse(a);
  EXPECT_TRUE(sc.refused(a));
  EXPECT_FALSE(sc.refused(b));
  EXPECT_TRUE(sc.anyRefused());
}

}  // namespace
}  // namespace cistern::client
