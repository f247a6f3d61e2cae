// Checkpoints through libcistern on an in-process cluster: exact round
// trips of every dtype (0-d and empty tensors too), the data file read by
// the safetensors rules alone, a crashed save never listed, incremental
// saves that write only what changed, removal that keeps newer checkpoints
// whole, corruption named, bad input refused.
#include "ckpt/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>

#include "client/status_of.h"
#include "common/endian.h"
#include "tests/support/client_files.h"
#include "tests/support/in_process_cluster.h"

namespace cistern::ckpt {
namespace {

using testing::bytesOf;

struct Owned {
  std::string name;
  DType dtype;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> bytes;
};

std::vector<TensorData> views(const std::vector<Owned>& ts) {
  std::vector<TensorData> out;
  for (const Owned& t : ts) out.push_back({t.name, t.dtype, t.shape, t.bytes});
  return out;
}

Owned tensor(std::string name, DType d, std::vector<uint64_t> shape, uint64_t seed) {
  TensorInfo ti{name, d, shape};
  return {std::move(name), d, std::move(shape), bytesOf(*ti.expectedBytes(), seed)};
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cluster_.start("ckpt"));
    client_ = &cluster_.client();
    ASSERT_FALSE(client_->mkdir("/ckpt", 0755, false));
  }

  void expectHolds(const std::string& path, const std::vector<Owned>& want) {
    auto m = readManifest(*client_, path);
    ASSERT_TRUE(m.ok()) << m.status().toString();
    ASSERT_EQ(m->tensors.size(), want.size());
    for (const Owned& w : want) {
      const ManifestTensor* t = m->find(w.name);
      ASSERT_NE(t, nullptr) << w.name;
      EXPECT_EQ(t->dtype, w.dtype);
      EXPECT_EQ(t->shape, w.shape);
      std::vector<uint8_t> got(t->bytes);
      Status s = readTensor(*client_, path, *t, got);
      ASSERT_TRUE(s.ok()) << w.name << ": " << s.toString();
      EXPECT_EQ(got, w.bytes) << w.name;
    }
  }

  std::string readAll(const std::string& path) {
    FileInfo info;
    EXPECT_FALSE(client_->stat(path, &info));
    std::unique_ptr<File> f;
    EXPECT_FALSE(client_->open(path, O_RDONLY, 0, &f));
    std::string out(info.size, '\0');
    size_t done = 0;
    EXPECT_FALSE(f->pread(out.data(), out.size(), 0, &done));
    out.resize(done);
    return out;
  }

  testing::InProcessCluster cluster_;
  Client* client_ = nullptr;
};

std::vector<Owned> everyKind() {
  return {tensor("model.w", DType::kF32, {3, 5}, 1),
          tensor("model.h", DType::kF16, {7}, 2),
          tensor("model.b", DType::kBF16, {4, 2}, 3),
          tensor("step", DType::kI64, {}, 4),
          tensor("q", DType::kI8, {9}, 5),
          tensor("mask", DType::kBool, {6}, 6),
          tensor("empty", DType::kF32, {0, 3}, 7),
          tensor("d", DType::kF64, {2, 1, 2}, 8),
          tensor("big", DType::kU8, {3 << 20}, 9)};
}

TEST_F(CheckpointTest, EveryKindOfTensorRoundTripsAndTheFileIsPlainSafetensors) {
  auto ts = everyKind();
  SaveStats st;
  SaveOptions o;
  o.metadata = {{"step", "100"}};
  o.block_bytes = 1 << 20;
  ASSERT_TRUE(save(*client_, "/ckpt/step-100", views(ts), o, &st).ok());
  EXPECT_EQ(st.tensors, ts.size());
  EXPECT_EQ(st.tensors_reused, 0u);
  expectHolds("/ckpt/step-100", ts);
  auto m = readManifest(*client_, "/ckpt/step-100");
  ASSERT_TRUE(m.ok());
  EXPECT_EQ(m->metadata.at("step"), "100");
  EXPECT_EQ(m->find("big")->blocks.size(), 3u);
  // The data file by the format's rules alone: every tensor where its
  // header says, with the bytes saved.
  std::string file = readAll("/ckpt/step-100/rank-00000.safetensors");
  auto n = decodeHeaderLength(file, file.size());
  ASSERT_TRUE(n.ok()) << n.status().toString();
  auto h = decodeHeader(std::string_view(file).substr(8, *n), file.size() - 8 - *n);
  ASSERT_TRUE(h.ok()) << h.status().toString();
  ASSERT_EQ(h->tensors.size(), ts.size());
  for (const Owned& w : ts) {
    auto it = std::find_if(h->tensors.begin(), h->tensors.end(),
                           [&](const TensorInfo& t) { return t.name == w.name; });
    ASSERT_NE(it, h->tensors.end()) << w.name;
    EXPECT_EQ(it->dtype, w.dtype);
    EXPECT_EQ(it->shape, w.shape);
    EXPECT_EQ(file.substr(8 + *n + it->begin, it->end - it->begin),
              std::string(w.bytes.begin(), w.bytes.end()))
        << w.name;
  }
  EXPECT_TRUE(verify(*client_, "/ckpt/step-100").ok());
}

TEST_F(CheckpointTest, OnlyCommittedCheckpointsAreListedAndACrashedSaveIsCleared) {
  auto ts = everyKind();
  ASSERT_TRUE(save(*client_, "/ckpt/a", views(ts)).ok());
  // A save that crashed before its manifest: a directory with a data file.
  ASSERT_FALSE(client_->mkdir("/ckpt/b", 0755, false));
  std::unique_ptr<File> f;
  ASSERT_FALSE(client_->open("/ckpt/b/rank-00000.safetensors", O_CREAT | O_WRONLY, 0644, &f));
  ASSERT_FALSE(f->close());
  auto names = list(*client_, "/ckpt");
  ASSERT_TRUE(names.ok());
  EXPECT_EQ(*names, std::vector<std::string>{"a"});
  EXPECT_EQ(readManifest(*client_, "/ckpt/b").code(), ErrorCode::kNotFound);
  // Saving it again clears what the crash left.
  ASSERT_TRUE(save(*client_, "/ckpt/b", views(ts)).ok());
  EXPECT_EQ(*list(*client_, "/ckpt"), (std::vector<std::string>{"a", "b"}));
  EXPECT_EQ(save(*client_, "/ckpt/b", views(ts)).code(), ErrorCode::kAlreadyExists);
}

TEST_F(CheckpointTest, AnIncrementalSaveWritesOnlyWhatChanged) {
  std::vector<Owned> ts;
  for (int i = 0; i < 10; ++i)
    ts.push_back(tensor("layer" + std::to_string(i), DType::kF32, {64, 1024}, 100 + i));
  SaveOptions o;
  o.block_bytes = 64 << 10;
  ASSERT_TRUE(save(*client_, "/ckpt/s1", views(ts), o).ok());
  ts[3].bytes[12345] ^= 1;  // one changed tensor
  o.base = "/ckpt/s1";
  SaveStats st;
  ASSERT_TRUE(save(*client_, "/ckpt/s2", views(ts), o, &st).ok());
  EXPECT_EQ(st.tensors_reused, 9u);
  EXPECT_EQ(st.bytes_written, ts[3].bytes.size());
  EXPECT_EQ(st.bytes_reused, 9 * ts[3].bytes.size());
  expectHolds("/ckpt/s2", ts);
  // A third reuses through the second: the unchanged ones still point at s1.
  ts[7].bytes[0] ^= 1;
  o.base = "/ckpt/s2";
  ASSERT_TRUE(save(*client_, "/ckpt/s3", views(ts), o, &st).ok());
  EXPECT_EQ(st.tensors_reused, 9u);
  auto m3 = readManifest(*client_, "/ckpt/s3");
  ASSERT_TRUE(m3.ok());
  EXPECT_EQ(m3->find("layer0")->in, "s1");
  EXPECT_EQ(m3->find("layer3")->in, "s2");
  EXPECT_EQ(m3->find("layer7")->in, "");
  expectHolds("/ckpt/s3", ts);
}

TEST_F(CheckpointTest, RemovingACheckpointKeepsNewerOnesWhole) {
  std::vector<Owned> ts;
  for (int i = 0; i < 4; ++i)
    ts.push_back(tensor("t" + std::to_string(i), DType::kI32, {1000}, 200 + i));
  ASSERT_TRUE(save(*client_, "/ckpt/s1", views(ts)).ok());
  auto v2 = ts;
  v2[0].bytes[0] ^= 1;
  SaveOptions o;
  o.base = "/ckpt/s1";
  ASSERT_TRUE(save(*client_, "/ckpt/s2", views(v2), o).ok());
  auto v3 = v2;
  v3[1].bytes[0] ^= 1;
  o.base = "/ckpt/s2";
  ASSERT_TRUE(save(*client_, "/ckpt/s3", views(v3), o).ok());
  ASSERT_TRUE(remove(*client_, "/ckpt/s1").ok());
  EXPECT_EQ(*list(*client_, "/ckpt"), (std::vector<std::string>{"s2", "s3"}));
  FileInfo info;
  EXPECT_TRUE(client_->stat("/ckpt/s1", &info));  // gone
  expectHolds("/ckpt/s2", v2);
  expectHolds("/ckpt/s3", v3);
  ASSERT_TRUE(remove(*client_, "/ckpt/s2").ok());
  expectHolds("/ckpt/s3", v3);
  EXPECT_TRUE(verify(*client_, "/ckpt/s3").ok());
  ASSERT_TRUE(remove(*client_, "/ckpt/s3").ok());
  EXPECT_TRUE(list(*client_, "/ckpt")->empty());
}

TEST_F(CheckpointTest, AFlippedByteIsNamedOnReadAndVerify) {
  auto ts = everyKind();
  ASSERT_TRUE(save(*client_, "/ckpt/c", views(ts)).ok());
  auto m = readManifest(*client_, "/ckpt/c");
  ASSERT_TRUE(m.ok());
  const ManifestTensor* t = m->find("model.w");
  std::unique_ptr<File> f;
  ASSERT_FALSE(client_->open("/ckpt/c/rank-00000.safetensors", O_RDWR, 0, &f));
  char c = 0;
  size_t done = 0;
  ASSERT_FALSE(f->pread(&c, 1, t->offset + 5, &done));
  c ^= 0x10;
  ASSERT_FALSE(f->pwrite(&c, 1, t->offset + 5, &done));
  ASSERT_FALSE(f->close());
  std::vector<uint8_t> got(t->bytes);
  Status s = readTensor(*client_, "/ckpt/c", *t, got);
  EXPECT_EQ(s.code(), ErrorCode::kCorruption);
  EXPECT_NE(s.toString().find("model.w"), std::string::npos) << s.toString();
  Status v = verify(*client_, "/ckpt/c");
  EXPECT_EQ(v.code(), ErrorCode::kCorruption);
  EXPECT_NE(v.toString().find("model.w"), std::string::npos) << v.toString();
}

TEST_F(CheckpointTest, RanksSaveTheirShardsAndOneCommitsThemAll) {
  std::vector<std::vector<Owned>> shards(3);
  for (int r = 0; r < 3; ++r)
    for (int i = 0; i < 3; ++i)
      shards[r].push_back(
          tensor(fmt::format("r{}.t{}", r, i), DType::kF32, {100u + r}, 300 + 10 * r + i));
  SaveOptions o;
  o.world_size = 3;
  for (int r : {2, 0}) {
    o.rank = r;
    ASSERT_TRUE(save(*client_, "/ckpt/m", views(shards[r]), o).ok()) << r;
  }
  EXPECT_TRUE(list(*client_, "/ckpt")->empty());  // not before commit
  Status missing = commit(*client_, "/ckpt/m", 3);
  EXPECT_EQ(missing.code(), ErrorCode::kNotFound);
  EXPECT_NE(missing.toString().find("rank 1"), std::string::npos) << missing.toString();
  o.rank = 1;
  ASSERT_TRUE(save(*client_, "/ckpt/m", views(shards[1]), o).ok());
  ASSERT_TRUE(commit(*client_, "/ckpt/m", 3).ok());
  EXPECT_EQ(*list(*client_, "/ckpt"), std::vector<std::string>{"m"});
  std::vector<Owned> all;
  for (auto& sh : shards) all.insert(all.end(), sh.begin(), sh.end());
  expectHolds("/ckpt/m", all);
  EXPECT_EQ(commit(*client_, "/ckpt/m", 3).code(), ErrorCode::kAlreadyExists);
  // Two ranks with one name: refused at commit, nothing listed.
  o.world_size = 2;
  for (uint32_t r : {0u, 1u}) {
    o.rank = r;
    ASSERT_TRUE(save(*client_, "/ckpt/dup", views({shards[0][0]}), o).ok());
  }
  Status dup = commit(*client_, "/ckpt/dup", 2);
  EXPECT_EQ(dup.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(dup.toString().find("r0.t0"), std::string::npos) << dup.toString();
  EXPECT_EQ(*list(*client_, "/ckpt"), std::vector<std::string>{"m"});
  o.rank = 2;
  EXPECT_EQ(save(*client_, "/ckpt/x", views({shards[0][0]}), o).code(),
            ErrorCode::kInvalidArgument);  // rank 2 of 2
}

TEST_F(CheckpointTest, CompressedTensorsRoundTripAndAreSmaller) {
  std::vector<Owned> ts = everyKind();
  Owned zeros{"zeros", DType::kF32, {1 << 18}, std::vector<uint8_t>(1 << 20, 0)};
  ts.push_back(zeros);
  for (const char* codec : {"zstd", "lz4"}) {
    const std::string path = std::string("/ckpt/") + codec;
    SaveOptions o;
    o.codec = codec;
    SaveStats st;
    ASSERT_TRUE(save(*client_, path, views(ts), o, &st).ok()) << codec;
    uint64_t raw = 0;
    for (const Owned& t : ts) raw += t.bytes.size();
    EXPECT_LT(st.bytes_written, raw - (1 << 19)) << codec;  // the zeros shrink
    expectHolds(path, ts);
    auto m = readManifest(*client_, path);
    ASSERT_TRUE(m.ok());
    const ManifestTensor* z = m->find("zeros");
    EXPECT_EQ(z->codec, codec);
    EXPECT_EQ(z->file, std::string("rank-00000.") + codec);
    EXPECT_LT(z->stored, z->bytes / 10);
    // A flipped byte of a frame: named, never returned.
    std::unique_ptr<File> f;
    ASSERT_FALSE(client_->open(path + "/" + z->file, O_RDWR, 0, &f));
    char c = 0;
    size_t done = 0;
    ASSERT_FALSE(f->pread(&c, 1, z->offset + z->stored / 2, &done));
    c ^= 0x55;
    ASSERT_FALSE(f->pwrite(&c, 1, z->offset + z->stored / 2, &done));
    ASSERT_FALSE(f->close());
    std::vector<uint8_t> got(z->bytes);
    Status s = readTensor(*client_, path, *z, got);
    EXPECT_EQ(s.code(), ErrorCode::kCorruption) << codec;
    EXPECT_NE(s.toString().find("zeros"), std::string::npos) << s.toString();
  }
  SaveOptions bad;
  bad.codec = "gzip";
  EXPECT_EQ(save(*client_, "/ckpt/g", views(ts), bad).code(), ErrorCode::kInvalidArgument);
  // An incremental save over a compressed one reuses its frames (the
  // changed tensor is written, compressed with this save's codec).
  SaveOptions o;
  o.codec = "zstd";
  o.base = "/ckpt/lz4";
  ts[0].bytes[0] ^= 1;
  SaveStats st;
  ASSERT_TRUE(save(*client_, "/ckpt/z2", views(ts), o, &st).ok());
  EXPECT_EQ(st.tensors_reused, ts.size() - 1);
  auto m2 = readManifest(*client_, "/ckpt/z2");
  ASSERT_TRUE(m2.ok());
  EXPECT_EQ(m2->find("q")->codec, "lz4");
  EXPECT_EQ(m2->find("q")->in, "lz4");
  EXPECT_EQ(m2->find(ts[0].name)->codec, "zstd");
  ts.pop_back();  // the zeros, whose frame in lz4 was flipped above
  for (const Owned& t : ts) {
    const ManifestTensor* mt = m2->find(t.name);
    ASSERT_NE(mt, nullptr);
    std::vector<uint8_t> got(mt->bytes);
    ASSERT_TRUE(readTensor(*client_, "/ckpt/z2", *mt, got).ok()) << t.name;
    EXPECT_EQ(got, t.bytes) << t.name;
  }
}

TEST_F(CheckpointTest, BadInputIsRefusedAndWritesNothing) {
  std::vector<uint8_t> three(3);
  std::vector<TensorData> wrong{{"w", DType::kF32, {1}, three}};
  EXPECT_EQ(save(*client_, "/ckpt/x", wrong).code(), ErrorCode::kInvalidArgument);
  auto t = tensor("w", DType::kF32, {1}, 1);
  std::vector<TensorData> twice{{t.name, t.dtype, t.shape, t.bytes},
                                {t.name, t.dtype, t.shape, t.bytes}};
  EXPECT_EQ(save(*client_, "/ckpt/y", twice).code(), ErrorCode::kInvalidArgument);
  SaveOptions o;
  o.base = "/ckpt/none";
  EXPECT_EQ(save(*client_, "/ckpt/z", views({t}), o).code(), ErrorCode::kNotFound);
  o.base = "/elsewhere/a";
  EXPECT_EQ(save(*client_, "/ckpt/z", views({t}), o).code(), ErrorCode::kInvalidArgument);
  EXPECT_TRUE(list(*client_, "/ckpt")->empty());
  std::vector<DirEntry> left;
  ASSERT_FALSE(client_->list("/ckpt", &left));
  EXPECT_TRUE(left.empty()) << left.front().name;
  EXPECT_EQ(readManifest(*client_, "/ckpt/none").code(), ErrorCode::kNotFound);
}

}  // namespace
}  // namespace cistern::ckpt
