// Packs over libcistern (docs/pack_format.md): PackWriter puts samples into
// shard files and writes an index generation; PackReader finds and reads
// them, verifying each sample's CRC32C.
//
// Memory: the writer keeps one entry (48 bytes) and the name of every
// sample of the pack until finish() sorts and writes them (a pack of 10
// million samples with 40-byte names: ~1 GB while writing), plus one shard
// buffer of `buffer_bytes`. The reader keeps only `cache_bytes` of index
// pages (64 KiB each) and reads the rest of the index as it needs it.
// Not thread-safe (one writer or reader per thread; readers are cheap).
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "cistern/client.h"
#include "client/status_of.h"
#include "common/result.h"
#include "pack/pack_format.h"

namespace cistern::pack {

using cistern::statusOf;  // client/status_of.h

struct WriterOptions {
  uint64_t shard_bytes = 256ull << 20;  // a shard is closed once it holds this much
  uint64_t buffer_bytes = 8ull << 20;   // written to the shard a buffer at a time
};

class PackWriter {
 public:
  // A new pack at `dir` (created; kAlreadyExists if it holds an index), or,
  // with `append`, the next generation of the pack there: new samples go to
  // new shards, the old shards stay as they are; a name added again
  // replaces the old sample in the index.
  static Result<std::unique_ptr<PackWriter>> create(Client& client, const std::string& dir,
                                                    WriterOptions options = {},
                                                    bool append = false);
  ~PackWriter();

  // kInvalidArgument for an empty name, one with a NUL byte, or a sample
  // over 4 GiB.
  Status add(std::string_view name, std::span<const uint8_t> bytes, int64_t mtime_ns = 0,
             int64_t label = kNoLabel);
  // Closes the last shard and writes the index (sorted by name, with its
  // Bloom filter) as generation g+1; kInvalidArgument, and no new
  // generation, if one name was added twice. The samples are readable once it
  // returns; nothing is, through this generation, before.
  Status finish();
  uint64_t added() const { return added_; }

 private:
  PackWriter(Client& client, std::string dir, WriterOptions options);
  Status openShard();
  Status flushBuffer();
  Status closeShard();

  Client& client_;
  std::string dir_;
  WriterOptions options_;
  uint64_t pack_id_ = 0;
  uint64_t generation_ = 1;
  uint32_t shards_ = 0;  // shard files so far (the open one included)
  std::unique_ptr<File> shard_;
  uint64_t shard_at_ = 0;  // bytes of the open shard written or buffered
  std::string buffer_;
  uint64_t buffer_at_ = 0;  // the shard offset of buffer_[0]
  struct Pending {
    std::string name;
    Entry entry;
    bool fresh;  // added by this writer (not carried from the previous generation)
  };
  std::vector<Pending> entries_;
  uint64_t added_ = 0;
  bool finished_ = false;
};

// The pack's directory as a reader reaches it: by path through a client,
// or by inode (the mount's directory view, with its caller's credentials).
class PackDir {
 public:
  virtual ~PackDir() = default;
  virtual Error list(std::vector<std::string>* names) = 0;
  // Opens the file `name` of the directory for reading, O_DIRECT: readers
  // read exact ranges at random offsets, from many threads at once (a
  // buffered File serializes its reads and reads ahead of each).
  virtual Error open(const std::string& name, std::unique_ptr<File>* out) = 0;
  // For messages: the path, or what stands for it.
  virtual const std::string& describe() const = 0;
};
std::unique_ptr<PackDir> packDirAtPath(Client& client, std::string path);

// The newest generation in `dir` whose header verifies (kNotFound without one).
using Generation = std::pair<uint64_t, IndexHeader>;
Result<Generation> newestIndex(PackDir& dir);

// kCorruption for a sample whose bytes do not match its CRC32C, naming it,
// its shard and offset (`where`: the pack, as PackDir::describe()).
Status sampleMismatch(std::string_view where, std::string_view name, const Entry& e);

class PackReader {
 public:
  struct Options {
    uint64_t cache_bytes = 64ull << 20;  // index pages kept in memory
  };
  // The newest generation whose header verifies (`newest`: as the caller
  // just found it with newestIndex). kNotFound without one.
  static Result<std::unique_ptr<PackReader>> open(std::unique_ptr<PackDir> dir, Options options,
                                                  std::optional<Generation> newest = {});
  static Result<std::unique_ptr<PackReader>> open(Client& client, const std::string& dir,
                                                  Options options) {
    return open(packDirAtPath(client, dir), options);
  }
  static Result<std::unique_ptr<PackReader>> open(Client& client, const std::string& dir) {
    return open(client, dir, Options());
  }

  const IndexHeader& header() const { return header_; }
  const std::string& describe() const { return dir_->describe(); }  // for messages
  uint64_t size() const { return header_.count; }
  // The i-th sample in name order (kInvalidArgument past the end).
  Result<Entry> entry(uint64_t i);
  Result<std::string> name(const Entry& e);
  // The index of the sample called `name`; nullopt if there is none (the
  // Bloom filter answers most absent names without reading entries).
  Result<std::optional<uint64_t>> find(std::string_view name);
  // The sample's bytes into `out` (e.length bytes), verified: kCorruption
  // naming the sample, its shard and offset if its CRC32C does not match.
  Status read(const Entry& e, std::span<uint8_t> out);
  // Many samples at once, each shard's with one File::preadMany (several
  // samples per storage request): entries[i] into outs[i] (its length).
  // (*statuses)[i]: OK, kCorruption as read() names it, or the I/O error
  // that left it unread.
  void readMany(std::span<const Entry> entries, std::span<const std::span<uint8_t>> outs,
                std::vector<Status>* statuses);
  // WebDataset samples: runs of entries (in name order) whose names share
  // a key (webdatasetName), as [begin, end) entry ranges; entries
  // WebDataset skips belong to none. Reads every name once: O(count).
  Result<std::vector<std::pair<uint64_t, uint64_t>>> webdatasetGroups();
  // The index of the first sample whose name is >= `key` (size() if none).
  Result<uint64_t> lowerBound(std::string_view key);
  // Whether the Bloom filter may hold `key` (true when there is none).
  Result<bool> mayContain(std::string_view key);
  // The shard file, opened on first use; callers may read it from other
  // threads while they hold it (File::pread is thread-safe).
  Result<std::shared_ptr<File>> shardFile(uint32_t s);
  // Reads every sample and checks every checksum: the header's body CRC,
  // each shard's header, each sample's bytes. The first problem found.
  Status verify();

 private:
  PackReader(std::unique_ptr<PackDir> dir, Options options)
      : dir_(std::move(dir)), options_(options) {}
  // `n` bytes of the index file at `offset`, through the page cache.
  Status indexBytes(uint64_t offset, size_t n, char* out);
  Status mismatch(const Entry& e);  // sampleMismatch, with the sample's name read

  std::unique_ptr<PackDir> dir_;
  Options options_;
  IndexHeader header_;
  std::unique_ptr<File> index_;
  static constexpr uint64_t kPageBytes = 64 << 10;
  std::list<uint64_t> lru_;  // page numbers, most recent first
  std::unordered_map<uint64_t, std::pair<std::string, std::list<uint64_t>::iterator>> pages_;
  std::unordered_map<uint32_t, std::shared_ptr<File>> shards_;  // opened on first use
};

}  // namespace cistern::pack
