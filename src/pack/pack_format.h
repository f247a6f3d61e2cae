// The pack format (docs/pack_format.md): many samples in a few large shard
// files plus an index, so that a dataset of millions of small files costs
// the metadata service a handful of entries. Pure encoders and decoders —
// no I/O — of the index header, the index entries, the shard header and
// the Bloom filter; the decoders are total (bytes from storage: fuzzed by
// tests/fuzz/pack_index_fuzz.cc). Thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "common/result.h"

namespace cistern::pack {

inline constexpr uint32_t kFormatVersion = 1;
inline constexpr size_t kHeaderBytes = 4096;  // index and shard headers, one block each
inline constexpr size_t kEntryBytes = 48;
inline constexpr int64_t kNoLabel = INT64_MIN;

// `<pack>/shard-<n>.dat` and `<pack>/index-<generation>.idx`.
std::string shardName(uint32_t shard);
std::string indexName(uint64_t generation);
// The generation an index file name carries; nullopt for other names.
std::optional<uint64_t> indexGeneration(std::string_view name);

// WebDataset's split of a member name into sample key and field, exactly
// as its regex `^((?:.*/|)[^.]+)[.]([^/]*)$` does: the key runs to the
// first '.' of the last path component ("d/s001.seg.png" -> "d/s001",
// "seg.png"). nullopt for names WebDataset skips: no '.' in the last
// component, and top-level metadata files "__*__".
struct WebDatasetName {
  std::string_view key;
  std::string_view field;
};
std::optional<WebDatasetName> webdatasetName(std::string_view name);

// IndexHeader::flags.
// The Bloom filter also holds every directory prefix of the names, with its
// trailing '/' ("train/", "train/cat/"): the directory view answers absent
// directory names from it too.
inline constexpr uint64_t kFlagDirsInBloom = 1;
inline constexpr uint64_t kKnownFlags = kFlagDirsInBloom;

struct IndexHeader {
  uint64_t generation = 0;  // 1, 2, ...: each append writes the next
  uint64_t count = 0;       // entries
  uint32_t shards = 0;      // shard files 0 .. shards-1
  uint64_t names_bytes = 0;
  uint64_t bloom_bits = 0;  // a multiple of 64
  uint32_t bloom_hashes = 0;
  int64_t created_unix_ns = 0;
  uint64_t flags = 0;  // kFlag*
  // CRC32C of everything after the header (entries, names, Bloom filter),
  // checked by a verify, not by open.
  uint32_t body_crc = 0;

  // Where the sections start in the file.
  uint64_t entriesOffset() const { return kHeaderBytes; }
  uint64_t namesOffset() const { return kHeaderBytes + count * kEntryBytes; }
  uint64_t bloomOffset() const { return namesOffset() + names_bytes; }
  uint64_t fileBytes() const { return bloomOffset() + bloom_bits / 8; }
};
std::string encodeIndexHeader(const IndexHeader& h);
// kCorruption naming the problem: magic, version, checksum, sizes that do
// not add up (sections past 2^62, a Bloom filter without hashes), flags
// this build does not know.
Result<IndexHeader> decodeIndexHeader(std::string_view bytes);

// One sample. Entries are stored in name order.
struct Entry {
  uint64_t name_offset = 0;  // in the names section
  uint32_t name_len = 0;
  uint32_t shard = 0;
  uint64_t offset = 0;  // in the shard file
  uint32_t length = 0;
  uint32_t crc = 0;  // CRC32C of the sample's bytes
  int64_t mtime_ns = 0;
  int64_t label = kNoLabel;
};
std::string encodeEntry(const Entry& e);
// kCorruption when the bytes are not kEntryBytes long. (Whether the name
// and the bytes lie within their sections is the reader's check.)
Result<Entry> decodeEntry(std::string_view bytes);

struct ShardHeader {
  uint32_t shard = 0;
  uint64_t pack_id = 0;  // random, the same in every shard of a pack
};
std::string encodeShardHeader(const ShardHeader& h);
Result<ShardHeader> decodeShardHeader(std::string_view bytes);

// The directory prefixes of `name` ("a/b/c" -> "a/", "a/b/") that `prev`
// (the name before it in name order, "" for the first) does not have:
// over a sorted list, each directory once.
std::vector<std::string_view> newDirPrefixes(std::string_view prev, std::string_view name);

// The two hashes of a name a Bloom filter probes with: probe i sets or
// tests bit (h1 + i * h2) mod bits, bit k being bit k % 8 of byte k / 8.
std::pair<uint64_t, uint64_t> bloomHashes(std::string_view name);

// A Bloom filter over sample names: `bits` (a multiple of 64) and `hashes`
// probes by double hashing of two CRC32Cs of the name.
class Bloom {
 public:
  // About 10 bits per name and 7 probes: ~1% false positives.
  static Bloom forCount(uint64_t names);
  Bloom(uint64_t bits, uint32_t hashes) : bits_(bits), hashes_(hashes), words_(bits / 64) {}
  void add(std::string_view name);
  bool mayContain(std::string_view name) const;
  uint64_t bits() const { return bits_; }
  uint32_t hashes() const { return hashes_; }
  std::string bytes() const;  // little-endian words
  // kCorruption when `bytes` is not bits/8 long.
  static Result<Bloom> fromBytes(std::string_view bytes, uint64_t bits, uint32_t hashes);

 private:
  uint64_t bits_;
  uint32_t hashes_;
  std::vector<uint64_t> words_;
};

}  // namespace cistern::pack
