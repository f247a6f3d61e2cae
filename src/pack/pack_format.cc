// The pack format's encoders and decoders (pack_format.h).
#include "pack/pack_format.h"

#include <fmt/format.h>

#include <cstring>

#include "common/crc32c.h"

namespace cistern::pack {
namespace {

constexpr char kIndexMagic[8] = {'C', 'S', 'T', 'N', 'P', 'I', 'D', 'X'};
constexpr char kShardMagic[8] = {'C', 'S', 'T', 'N', 'P', 'S', 'H', 'D'};
// Header fields end here; the header's CRC32C (over bytes 0..kCrcAt) follows.
constexpr size_t kIndexCrcAt = 76;
constexpr size_t kShardCrcAt = 24;

template <typename T>
void put(std::string& out, size_t at, T v) {
  for (size_t i = 0; i < sizeof(T); ++i)
    out[at + i] = static_cast<char>((static_cast<uint64_t>(v) >> (8 * i)) & 0xff);
}
template <typename T>
T get(std::string_view in, size_t at) {
  uint64_t v = 0;
  for (size_t i = 0; i < sizeof(T); ++i) v |= uint64_t{static_cast<uint8_t>(in[at + i])} << (8 * i);
  return static_cast<T>(v);
}

Status corrupt(const std::string& what) { return Status(ErrorCode::kCorruption, what); }

}  // namespace

std::string shardName(uint32_t shard) { return fmt::format("shard-{:05}.dat", shard); }
std::string indexName(uint64_t generation) { return fmt::format("index-{:06}.idx", generation); }

std::optional<WebDatasetName> webdatasetName(std::string_view name) {
  if (name.find('/') == std::string_view::npos && name.size() >= 4 && name.starts_with("__") &&
      name.ends_with("__"))
    return std::nullopt;
  const size_t last = name.rfind('/');
  const size_t c = last == std::string_view::npos ? 0 : last + 1;  // the last component
  const size_t dot = name.find('.', c);
  if (dot == std::string_view::npos) return std::nullopt;
  if (dot > c) return WebDatasetName{name.substr(0, dot), name.substr(dot + 1)};
  // The last component starts with '.': the regex backtracks, and the key
  // is the directory part ("d/.x" -> "d/") when the component before it
  // holds no '.' (nothing earlier can: `[^.]+` would span it).
  if (c == 0) return std::nullopt;
  const size_t prev = c >= 2 ? name.rfind('/', c - 2) : std::string_view::npos;
  const size_t from = prev == std::string_view::npos ? 0 : prev + 1;
  if (name.substr(from, c - from).find('.') != std::string_view::npos) return std::nullopt;
  return WebDatasetName{name.substr(0, c), name.substr(c + 1)};
}

std::vector<std::string_view> newDirPrefixes(std::string_view prev, std::string_view name) {
  size_t common = 0;
  while (common < prev.size() && common < name.size() && prev[common] == name[common]) ++common;
  std::vector<std::string_view> out;
  for (size_t p = name.find('/'); p != std::string_view::npos; p = name.find('/', p + 1)) {
    // prev has the prefix name[0..p] iff it shares all p+1 bytes.
    if (p + 1 > common) out.push_back(name.substr(0, p + 1));
  }
  return out;
}

std::optional<uint64_t> indexGeneration(std::string_view name) {
  if (name.size() < 11 || name.substr(0, 6) != "index-" || name.substr(name.size() - 4) != ".idx")
    return std::nullopt;
  uint64_t g = 0;
  for (char c : name.substr(6, name.size() - 10)) {
    if (c < '0' || c > '9' || g > (UINT64_MAX - 9) / 10) return std::nullopt;
    g = g * 10 + static_cast<uint64_t>(c - '0');
  }
  return g;
}

// Layout (little-endian): 0 magic "CSTNPIDX" | 8 u32 version | 12 u32 header
// bytes | 16 u64 generation | 24 u64 count | 32 u32 shards | 36 u32 Bloom
// hashes | 40 u64 names bytes | 48 u64 Bloom bits | 56 i64 created (ns) |
// 64 u32 body CRC32C | 68 u64 flags | 76 u32 CRC32C of bytes 0..75 |
// zeros to 4096.
std::string encodeIndexHeader(const IndexHeader& h) {
  std::string out(kHeaderBytes, '\0');
  std::memcpy(out.data(), kIndexMagic, 8);
  put<uint32_t>(out, 8, kFormatVersion);
  put<uint32_t>(out, 12, kHeaderBytes);
  put<uint64_t>(out, 16, h.generation);
  put<uint64_t>(out, 24, h.count);
  put<uint32_t>(out, 32, h.shards);
  put<uint32_t>(out, 36, h.bloom_hashes);
  put<uint64_t>(out, 40, h.names_bytes);
  put<uint64_t>(out, 48, h.bloom_bits);
  put<int64_t>(out, 56, h.created_unix_ns);
  put<uint32_t>(out, 64, h.body_crc);
  put<uint64_t>(out, 68, h.flags);
  put<uint32_t>(out, kIndexCrcAt, crc32c(out.data(), kIndexCrcAt));
  return out;
}

Result<IndexHeader> decodeIndexHeader(std::string_view in) {
  if (in.size() < kIndexCrcAt + 4)
    return corrupt(fmt::format("index header of {} bytes", in.size()));
  if (std::memcmp(in.data(), kIndexMagic, 8) != 0) return corrupt("not a pack index (magic)");
  if (get<uint32_t>(in, kIndexCrcAt) != crc32c(in.data(), kIndexCrcAt))
    return corrupt("index header checksum mismatch");
  const uint32_t version = get<uint32_t>(in, 8);
  if (version != kFormatVersion)
    return corrupt(
        fmt::format("pack index version {} (this build reads {})", version, kFormatVersion));
  if (get<uint32_t>(in, 12) != kHeaderBytes)
    return corrupt(fmt::format("index header of {} bytes", get<uint32_t>(in, 12)));
  IndexHeader h;
  h.generation = get<uint64_t>(in, 16);
  h.count = get<uint64_t>(in, 24);
  h.shards = get<uint32_t>(in, 32);
  h.bloom_hashes = get<uint32_t>(in, 36);
  h.names_bytes = get<uint64_t>(in, 40);
  h.bloom_bits = get<uint64_t>(in, 48);
  h.created_unix_ns = get<int64_t>(in, 56);
  h.body_crc = get<uint32_t>(in, 64);
  h.flags = get<uint64_t>(in, 68);
  if (h.flags & ~kKnownFlags)
    return corrupt(fmt::format("index flags {:#x} (this build knows {:#x})", h.flags, kKnownFlags));
  constexpr uint64_t kMax = 1ull << 62;
  if (h.count > kMax / kEntryBytes || h.names_bytes > kMax || h.bloom_bits > kMax)
    return corrupt("index sections too large");
  if (h.bloom_bits % 64 != 0 || (h.bloom_bits > 0) != (h.bloom_hashes > 0) || h.bloom_hashes > 64)
    return corrupt(
        fmt::format("Bloom filter of {} bits and {} hashes", h.bloom_bits, h.bloom_hashes));
  if (h.generation == 0) return corrupt("index generation 0");
  return h;
}

// Layout: 0 u64 name offset | 8 u32 name length | 12 u32 shard | 16 u64
// offset | 24 u32 length | 28 u32 CRC32C | 32 i64 mtime (ns) | 40 i64 label.
std::string encodeEntry(const Entry& e) {
  std::string out(kEntryBytes, '\0');
  put<uint64_t>(out, 0, e.name_offset);
  put<uint32_t>(out, 8, e.name_len);
  put<uint32_t>(out, 12, e.shard);
  put<uint64_t>(out, 16, e.offset);
  put<uint32_t>(out, 24, e.length);
  put<uint32_t>(out, 28, e.crc);
  put<int64_t>(out, 32, e.mtime_ns);
  put<int64_t>(out, 40, e.label);
  return out;
}

Result<Entry> decodeEntry(std::string_view in) {
  if (in.size() != kEntryBytes) return corrupt(fmt::format("index entry of {} bytes", in.size()));
  Entry e;
  e.name_offset = get<uint64_t>(in, 0);
  e.name_len = get<uint32_t>(in, 8);
  e.shard = get<uint32_t>(in, 12);
  e.offset = get<uint64_t>(in, 16);
  e.length = get<uint32_t>(in, 24);
  e.crc = get<uint32_t>(in, 28);
  e.mtime_ns = get<int64_t>(in, 32);
  e.label = get<int64_t>(in, 40);
  return e;
}

// Layout: 0 magic "CSTNPSHD" | 8 u32 version | 12 u32 shard | 16 u64 pack
// id | 24 u32 CRC32C of bytes 0..23 | zeros to 4096.
std::string encodeShardHeader(const ShardHeader& h) {
  std::string out(kHeaderBytes, '\0');
  std::memcpy(out.data(), kShardMagic, 8);
  put<uint32_t>(out, 8, kFormatVersion);
  put<uint32_t>(out, 12, h.shard);
  put<uint64_t>(out, 16, h.pack_id);
  put<uint32_t>(out, kShardCrcAt, crc32c(out.data(), kShardCrcAt));
  return out;
}

Result<ShardHeader> decodeShardHeader(std::string_view in) {
  if (in.size() < kShardCrcAt + 4)
    return corrupt(fmt::format("shard header of {} bytes", in.size()));
  if (std::memcmp(in.data(), kShardMagic, 8) != 0) return corrupt("not a pack shard (magic)");
  if (get<uint32_t>(in, kShardCrcAt) != crc32c(in.data(), kShardCrcAt))
    return corrupt("shard header checksum mismatch");
  if (get<uint32_t>(in, 8) != kFormatVersion)
    return corrupt(fmt::format("pack shard version {}", get<uint32_t>(in, 8)));
  ShardHeader h;
  h.shard = get<uint32_t>(in, 12);
  h.pack_id = get<uint64_t>(in, 16);
  return h;
}

Bloom Bloom::forCount(uint64_t names) {
  const uint64_t bits = std::max<uint64_t>(64, (names * 10 + 63) / 64 * 64);
  return Bloom(bits, 7);
}

std::pair<uint64_t, uint64_t> bloomHashes(std::string_view name) {
  const uint64_t a = crc32c(name);
  const uint64_t b = crc32cExtend(0x9e3779b9u, name.data(), name.size());
  const uint64_t c = crc32cExtend(0x7f4a7c15u, name.data(), name.size());
  return {a << 32 | b, (c << 32 | a) | 1};
}

void Bloom::add(std::string_view name) {
  auto [h1, h2] = bloomHashes(name);
  for (uint32_t i = 0; i < hashes_; ++i) {
    const uint64_t bit = (h1 + i * h2) % bits_;
    words_[bit / 64] |= uint64_t{1} << (bit % 64);
  }
}

bool Bloom::mayContain(std::string_view name) const {
  if (bits_ == 0) return true;
  auto [h1, h2] = bloomHashes(name);
  for (uint32_t i = 0; i < hashes_; ++i) {
    const uint64_t bit = (h1 + i * h2) % bits_;
    if (!(words_[bit / 64] >> (bit % 64) & 1)) return false;
  }
  return true;
}

std::string Bloom::bytes() const {
  std::string out(words_.size() * 8, '\0');
  for (size_t i = 0; i < words_.size(); ++i) put<uint64_t>(out, i * 8, words_[i]);
  return out;
}

Result<Bloom> Bloom::fromBytes(std::string_view in, uint64_t bits, uint32_t hashes) {
  if (in.size() != bits / 8)
    return corrupt(fmt::format("Bloom filter of {} bytes, expected {}", in.size(), bits / 8));
  Bloom b(bits, hashes);
  for (size_t i = 0; i < b.words_.size(); ++i) b.words_[i] = get<uint64_t>(in, i * 8);
  return b;
}

}  // namespace cistern::pack
