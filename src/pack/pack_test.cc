// Packs written and read through libcistern on an in-process cluster: round
// trips across shards, lookups of present and absent names, an appended
// generation, a crashed append, and a flipped byte named by verify.
#include "pack/pack.h"
#include "pack/prefetch.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <regex>

#include "common/random.h"
#include "tests/support/client_files.h"
#include "tests/support/in_process_cluster.h"

namespace cistern::pack {
namespace {

using testing::bytesOf;

class PackTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(cluster_.start("pack"));
    client_ = &cluster_.client();
  }
  // Writes `n` samples "s<i>" of seeded sizes; returns name -> bytes.
  std::map<std::string, std::vector<uint8_t>> write(const std::string& pack, int n, int from,
                                                    bool append, WriterOptions o) {
    std::map<std::string, std::vector<uint8_t>> out;
    auto w = PackWriter::create(*client_, pack, o, append);
    EXPECT_TRUE(w.ok()) << w.status().toString();
    if (!w.ok()) return out;
    for (int i = from; i < from + n; ++i) {
      std::string name = "dir" + std::to_string(i % 3) + "/s" + std::to_string(i);
      auto b = bytesOf(static_cast<size_t>(1 + (i * 7919) % 20000), static_cast<uint64_t>(i));
      EXPECT_TRUE((*w)->add(name, b, i, i % 10).ok());
      out[name] = b;
    }
    EXPECT_TRUE((*w)->finish().ok());
    return out;
  }
  void expectHolds(const std::string& pack,
                   const std::map<std::string, std::vector<uint8_t>>& want) {
    auto r = PackReader::open(*client_, pack);
    ASSERT_TRUE(r.ok()) << r.status().toString();
    ASSERT_EQ((*r)->size(), want.size());
    uint64_t i = 0;
    for (const auto& [name, bytes] : want) {  // name order
      auto e = (*r)->entry(i);
      ASSERT_TRUE(e.ok());
      EXPECT_EQ(*(*r)->name(*e), name);
      std::vector<uint8_t> got(e->length);
      ASSERT_TRUE((*r)->read(*e, got).ok()) << name;
      EXPECT_EQ(got, bytes) << name;
      auto found = (*r)->find(name);
      ASSERT_TRUE(found.ok());
      EXPECT_EQ(found->value_or(~0ull), i) << name;
      ++i;
    }
    EXPECT_TRUE((*r)->verify().ok());
  }

  testing::InProcessCluster cluster_;
  Client* client_ = nullptr;
};

TEST_F(PackTest, SamplesRoundTripAcrossShardsAndAreFoundByName) {
  WriterOptions o;
  o.shard_bytes = 256 << 10;  // many shards
  o.buffer_bytes = 64 << 10;
  auto want = write("/p", 500, 0, false, o);
  auto r = PackReader::open(*client_, "/p");
  ASSERT_TRUE(r.ok());
  EXPECT_GT((*r)->header().shards, 10u);
  expectHolds("/p", want);
  // Absent names: not found, most without a binary search (the Bloom filter).
  for (const char* absent : {"nope", "dir0/s1", "dir9/s0", ""}) {
    auto f = (*r)->find(absent);
    ASSERT_TRUE(f.ok());
    EXPECT_FALSE(f->has_value()) << absent;
  }
  auto e = (*r)->entry(3);
  EXPECT_EQ(e->label, static_cast<int64_t>(std::stoi((*r)->name(*e)->substr(6)) % 10));
  EXPECT_EQ((*r)->entry(500).code(), ErrorCode::kInvalidArgument);
  // The Bloom filter holds the directory prefixes too (the directory view
  // answers absent directories from it): all present, ~1% of absent ones.
  EXPECT_TRUE((*r)->header().flags & kFlagDirsInBloom);
  for (const char* dir : {"dir0/", "dir1/", "dir2/"}) EXPECT_TRUE(*(*r)->mayContain(dir)) << dir;
  int maybe = 0;
  for (int i = 0; i < 1000; ++i) maybe += *(*r)->mayContain(fmt::format("absent{}/", i));
  EXPECT_LT(maybe, 50);
  // lowerBound: the first name under "dir1/", the one before it outside.
  const uint64_t lb = *(*r)->lowerBound("dir1/");
  ASSERT_GT(lb, 0u);
  EXPECT_TRUE((*r)->name(*(*r)->entry(lb))->starts_with("dir1/"));
  EXPECT_FALSE((*r)->name(*(*r)->entry(lb - 1))->starts_with("dir1/"));
  EXPECT_EQ(*(*r)->lowerBound("zzz"), (*r)->size());
}

TEST(PackFormat, EachDirectoryPrefixOnceOverSortedNames) {
  std::vector<std::string> got;
  std::string prev;
  for (const char* n : {"a/b/c", "a/b/d", "a/c", "a/cd/e", "b", "b/x/y/z"}) {
    for (auto d : newDirPrefixes(prev, n)) got.emplace_back(d);
    prev = n;
  }
  EXPECT_EQ(got, (std::vector<std::string>{"a/", "a/b/", "a/cd/", "b/", "b/x/", "b/x/y/"}));
  // Unknown header flags are refused, naming them.
  IndexHeader h;
  h.generation = 1;
  h.flags = 6;
  auto d = decodeIndexHeader(encodeIndexHeader(h));
  ASSERT_FALSE(d.ok());
  EXPECT_NE(d.status().message().find("flags"), std::string::npos);
}

TEST_F(PackTest, AnAppendWritesANewGenerationAndReplacesNamesAddedAgain) {
  WriterOptions o;
  o.shard_bytes = 1 << 20;
  auto want = write("/p", 100, 0, false, o);
  EXPECT_EQ(PackWriter::create(*client_, "/p", o).code(), ErrorCode::kAlreadyExists);
  auto more = write("/p", 100, 50, true, o);  // 50..149: 50 replaced, 50 new
  for (auto& [k, v] : more) want[k] = v;
  expectHolds("/p", want);
  auto r = PackReader::open(*client_, "/p");
  EXPECT_EQ((*r)->header().generation, 2u);
  // A third generation whose writer died before its header: generation 2 reads.
  std::unique_ptr<File> f;
  ASSERT_FALSE(client_->open("/p/" + indexName(3), O_CREAT | O_WRONLY, 0644, &f));
  std::string junk(8192, 'j');
  size_t done = 0;
  ASSERT_FALSE(f->pwrite(junk.data(), junk.size(), kHeaderBytes, &done));
  ASSERT_FALSE(f->close());
  r = PackReader::open(*client_, "/p");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ((*r)->header().generation, 2u);
}

TEST_F(PackTest, AFlippedByteIsDetectedAndNamed) {
  auto want = write("/p", 20, 0, false, WriterOptions{});
  auto r = PackReader::open(*client_, "/p");
  ASSERT_TRUE(r.ok());
  auto e = (*r)->entry(5);
  const std::string name = *(*r)->name(*e);
  std::unique_ptr<File> f;
  ASSERT_FALSE(client_->open("/p/" + shardName(e->shard), O_RDWR, 0, &f));
  uint8_t b = 0;
  size_t done = 0;
  ASSERT_FALSE(f->pread(&b, 1, e->offset + e->length / 2, &done));
  b ^= 0x10;
  ASSERT_FALSE(f->pwrite(&b, 1, e->offset + e->length / 2, &done));
  ASSERT_FALSE(f->close());
  r = PackReader::open(*client_, "/p");
  std::vector<uint8_t> got(e->length);
  Status s = (*r)->read(*e, got);
  EXPECT_EQ(s.code(), ErrorCode::kCorruption);
  EXPECT_NE(s.message().find(name), std::string::npos) << s.toString();
  s = (*r)->verify();
  EXPECT_EQ(s.code(), ErrorCode::kCorruption);
  EXPECT_NE(s.message().find(name), std::string::npos) << s.toString();
}

TEST_F(PackTest, BadInputIsRefusedWithAClearError) {
  auto w = PackWriter::create(*client_, "/p", WriterOptions{});
  ASSERT_TRUE(w.ok());
  std::vector<uint8_t> b(10);
  EXPECT_EQ((*w)->add("", b).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ((*w)->add(std::string("a\0b", 3), b).code(), ErrorCode::kInvalidArgument);
  EXPECT_EQ(PackReader::open(*client_, "/nowhere").code(), ErrorCode::kNotFound);
  ASSERT_FALSE(client_->mkdir("/empty", 0755, false));
  EXPECT_EQ(PackReader::open(*client_, "/empty").code(), ErrorCode::kNotFound);
  EXPECT_EQ(PackWriter::create(*client_, "/q", WriterOptions{.shard_bytes = 10}).code(),
            ErrorCode::kInvalidArgument);
  // One name added twice by one writer (two tars holding the same member):
  // refused at finish, naming it, and no generation is written.
  ASSERT_TRUE((*w)->add("x.jpg", b).ok());
  ASSERT_TRUE((*w)->add("y.jpg", b).ok());
  ASSERT_TRUE((*w)->add("x.jpg", b).ok());
  Status dup = (*w)->finish();
  EXPECT_EQ(dup.code(), ErrorCode::kInvalidArgument);
  EXPECT_NE(dup.toString().find("\"x.jpg\" added twice"), std::string::npos) << dup.toString();
  EXPECT_EQ(PackReader::open(*client_, "/p").code(), ErrorCode::kNotFound);
}

// webdatasetName splits names exactly as WebDataset's regex does, odd
// names (dots in directories, hidden files, "//") included.
TEST(WebDatasetName, MatchesWebDatasetsRegex) {
  const std::regex re(R"(^((?:.*/|)[^.]+)[.]([^/]*)$)");
  auto check = [&](const std::string& n) {
    std::smatch m;
    auto got = webdatasetName(n);
    const bool meta = n.find('/') == std::string::npos && n.size() >= 4 && n.starts_with("__") &&
                      n.ends_with("__");
    if (meta || !std::regex_match(n, m, re)) {
      EXPECT_FALSE(got) << n;
      return;
    }
    ASSERT_TRUE(got) << n;
    EXPECT_EQ(got->key, m[1].str()) << n;
    EXPECT_EQ(got->field, m[2].str()) << n;
  };
  for (const char* n : {"s001.jpg", "d/s001.seg.png", "d.x/s.cls", "a.", ".x", "d/.x", "a//.x",
                        "/.x", "d.e/.x", "noext", "d/noext", "__key__", "__a.b__", "d/__k__"})
    check(n);
  auto got = webdatasetName("train/s001.seg.png");
  ASSERT_TRUE(got);
  EXPECT_EQ(got->key, "train/s001");
  EXPECT_EQ(got->field, "seg.png");
  Xoshiro256 rng(7);
  const char alphabet[] = "ab./_";
  for (int i = 0; i < 20000; ++i) {
    std::string n(1 + rng.next() % 8, 'a');
    for (auto& ch : n) ch = alphabet[rng.next() % 5];
    check(n);
  }
}

// A WebDataset pack's groups: each key's fields, in name order.
TEST_F(PackTest, WebDatasetGroupsAreTheRunsOfOneKey) {
  auto w = PackWriter::create(*client_, "/w", WriterOptions{});
  ASSERT_TRUE(w.ok());
  std::vector<uint8_t> b(3);
  for (const char* n : {"a/s1.jpg", "a/s1.cls", "a/s10.jpg", "a/s2.json", "README", "a/s2.jpg"})
    ASSERT_TRUE((*w)->add(n, b).ok());
  ASSERT_TRUE((*w)->finish().ok());
  auto r = PackReader::open(*client_, "/w");
  ASSERT_TRUE(r.ok());
  // README, a/s1.cls, a/s1.jpg, a/s10.jpg, a/s2.jpg, a/s2.json
  auto g = (*r)->webdatasetGroups();
  ASSERT_TRUE(g.ok());
  using G = std::vector<std::pair<uint64_t, uint64_t>>;
  EXPECT_EQ(*g, (G{{1, 3}, {3, 4}, {4, 6}}));
}

// File::preadMany on an O_DIRECT file: ranges across chunk boundaries, at
// the end of the file and past it, several per storage request, read
// exactly as one pread each would.
TEST_F(PackTest, ManyRangesReadAsOnePreadEach) {
  std::unique_ptr<File> f;
  ASSERT_FALSE(client_->open("/many", O_CREAT | O_WRONLY, 0644, &f));
  const auto data = bytesOf(9 << 20, 11);
  size_t done = 0;
  ASSERT_FALSE(f->pwrite(data.data(), data.size(), 0, &done));
  ASSERT_FALSE(f->close());
  const uint64_t chunk = f->info().chunk_size;
  ASSERT_GT(chunk, 0u);
  ASSERT_FALSE(client_->open("/many", O_RDONLY | O_DIRECT, 0, &f));
  std::vector<std::pair<uint64_t, size_t>> want = {
      {0, 100},          {chunk - 10, 20},      {5 << 20, 4096},  {1, 1},
      {chunk * 2, 7000}, {data.size() - 5, 10}, {data.size(), 8}, {data.size() + 100, 8},
      {123456, 65536},   {chunk + 1, 3 * 4096}};
  std::vector<std::vector<uint8_t>> bufs;
  std::vector<FileRange> ranges;
  for (auto [off, n] : want) bufs.emplace_back(n, 0xEE);
  for (size_t i = 0; i < want.size(); ++i)
    ranges.push_back({bufs[i].data(), want[i].second, want[i].first, 99});
  ASSERT_FALSE(f->preadMany(ranges));
  for (size_t i = 0; i < want.size(); ++i) {
    const auto [off, n] = want[i];
    const size_t expect = off >= data.size() ? 0 : std::min<size_t>(n, data.size() - off);
    EXPECT_EQ(ranges[i].done, expect) << i;
    EXPECT_TRUE(std::equal(bufs[i].begin(), bufs[i].begin() + static_cast<long>(expect),
                           data.begin() + static_cast<long>(std::min<size_t>(off, data.size()))))
        << i;
  }
  // A handle that cannot read: EBADF, nothing read.
  ASSERT_FALSE(client_->open("/many", O_WRONLY | O_DIRECT, 0, &f));
  EXPECT_EQ(f->preadMany(ranges).errno_value, EBADF);
  EXPECT_EQ(ranges[0].done, 0u);
}

// The prefetcher returns the samples in the order asked (a permutation),
// holding at most its byte bound (plus the one sample the consumer waits
// for) whatever the thread count.
TEST_F(PackTest, ThePrefetcherFollowsTheOrderWithinItsMemoryBound) {
  auto want = write("/p", 300, 0, false, WriterOptions{.shard_bytes = 512 << 10});
  std::vector<std::string> names;
  for (auto& [k, v] : want) names.push_back(k);
  std::vector<uint64_t> order(names.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = (i * 7919) % order.size();  // a permutation
  for (uint64_t bound : {uint64_t{1}, uint64_t{64} << 10, uint64_t{16} << 20}) {
    Prefetcher::Options o;
    o.threads = 3;
    o.max_bytes = bound;
    auto p = Prefetcher::start(*client_, "/p", order, o);
    ASSERT_TRUE(p.ok()) << p.status().toString();
    for (size_t i = 0; i < order.size(); ++i) {
      auto s = (*p)->next();
      ASSERT_TRUE(s.ok() && s->has_value()) << i;
      EXPECT_EQ((*s)->index, order[i]);
      EXPECT_EQ((*s)->name, names[order[i]]);
      EXPECT_EQ((*s)->bytes, want[names[order[i]]]);
    }
    auto end = (*p)->next();
    ASSERT_TRUE(end.ok());
    EXPECT_FALSE(end->has_value());
    EXPECT_LE((*p)->peakBytes(), bound + 3 * 20000) << "bound " << bound;
  }
  EXPECT_EQ(Prefetcher::start(*client_, "/p", {5, 300}, {}).code(), ErrorCode::kInvalidArgument);
}

}  // namespace
}  // namespace cistern::pack
