// Pack writer and reader over libcistern (pack.h).
#include "pack/pack.h"

#include <fcntl.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <random>

#include "common/crc32c.h"

namespace cistern::pack {

namespace {

std::string join(const std::string& dir, const std::string& name) {
  return dir.back() == '/' ? dir + name : dir + "/" + name;
}

// Writes all of `bytes` at `offset`.
Status writeAll(File& f, const void* bytes, size_t n, uint64_t offset) {
  size_t done = 0;
  return statusOf(f.pwrite(bytes, n, offset, &done));
}

class PathDir final : public PackDir {
 public:
  PathDir(Client& c, std::string path) : c_(c), path_(std::move(path)) {}
  Error list(std::vector<std::string>* names) override {
    std::vector<DirEntry> entries;
    if (Error e = c_.list(path_, &entries)) return e;  // the message names the path
    for (auto& e : entries) names->push_back(std::move(e.name));
    return {};
  }
  Error open(const std::string& name, std::unique_ptr<File>* out) override {
    return c_.open(join(path_, name), O_RDONLY | O_DIRECT, 0, out);
  }
  const std::string& describe() const override { return path_; }

 private:
  Client& c_;
  std::string path_;
};

}  // namespace

std::unique_ptr<PackDir> packDirAtPath(Client& client, std::string path) {
  return std::make_unique<PathDir>(client, std::move(path));
}

Result<Generation> newestIndex(PackDir& dir) {
  std::vector<std::string> names;
  RETURN_ON_ERROR(statusOf(dir.list(&names)));
  std::vector<uint64_t> gens;
  for (const auto& n : names) {
    if (auto g = indexGeneration(n)) gens.push_back(*g);
  }
  std::sort(gens.rbegin(), gens.rend());
  for (uint64_t g : gens) {
    // A generation whose writer died before its header was written reads
    // as zeros there: skipped for the one before.
    std::unique_ptr<File> f;
    if (dir.open(indexName(g), &f)) continue;
    std::string head(kHeaderBytes, '\0');
    size_t done = 0;
    if (f->pread(head.data(), head.size(), 0, &done) || done != head.size()) continue;
    auto h = decodeIndexHeader(head);
    if (h.ok() && h->generation == g) return std::make_pair(g, *h);
  }
  return Status(ErrorCode::kNotFound,
                fmt::format("{}: no pack index (index-*.idx)", dir.describe()));
}

PackWriter::PackWriter(Client& client, std::string dir, WriterOptions options)
    : client_(client), dir_(std::move(dir)), options_(options) {}

PackWriter::~PackWriter() {
  if (shard_) (void)shard_->close();
}

Result<std::unique_ptr<PackWriter>> PackWriter::create(Client& client, const std::string& dir,
                                                       WriterOptions options, bool append) {
  if (options.shard_bytes < kHeaderBytes + 1 || options.buffer_bytes == 0)
    return Status(ErrorCode::kInvalidArgument, "pack shard_bytes and buffer_bytes too small");
  std::unique_ptr<PackWriter> w(new PackWriter(client, dir, options));
  RETURN_ON_ERROR(statusOf(client.mkdir(dir, 0755, /*parents=*/true)).withContext(dir));
  PathDir at(client, dir);
  auto existing = newestIndex(at);
  if (existing.ok() && !append) {
    return Status(ErrorCode::kAlreadyExists,
                  fmt::format("{} holds a pack already (generation {}); append to it instead", dir,
                              existing->first));
  }
  w->pack_id_ = std::random_device{}() | uint64_t{std::random_device{}()} << 32;
  if (existing.ok()) {  // append: everything the newest generation has, kept
    w->generation_ = existing->first + 1;
    w->shards_ = existing->second.shards;
    ASSIGN_OR_RETURN(auto reader, PackReader::open(packDirAtPath(client, dir), {}, *existing));
    w->entries_.reserve(reader->size());
    for (uint64_t i = 0; i < reader->size(); ++i) {
      ASSIGN_OR_RETURN(Entry e, reader->entry(i));
      ASSIGN_OR_RETURN(std::string name, reader->name(e));
      w->entries_.push_back({std::move(name), e, false});
    }
  } else if (existing.code() != ErrorCode::kNotFound) {
    return existing.status();
  }
  w->buffer_.reserve(options.buffer_bytes);
  return w;
}

Status PackWriter::openShard() {
  const std::string path = join(dir_, shardName(shards_));
  RETURN_ON_ERROR(
      statusOf(client_.open(path, O_CREAT | O_EXCL | O_WRONLY, 0644, &shard_)).withContext(path));
  ++shards_;
  buffer_ = encodeShardHeader({shards_ - 1, pack_id_});
  buffer_at_ = 0;
  shard_at_ = kHeaderBytes;
  return Status::OK();
}

Status PackWriter::flushBuffer() {
  if (buffer_.empty()) return Status::OK();
  RETURN_ON_ERROR(writeAll(*shard_, buffer_.data(), buffer_.size(), buffer_at_));
  buffer_at_ += buffer_.size();
  buffer_.clear();
  return Status::OK();
}

Status PackWriter::closeShard() {
  if (!shard_) return Status::OK();
  RETURN_ON_ERROR(flushBuffer());
  RETURN_ON_ERROR(statusOf(shard_->close()));
  shard_.reset();
  return Status::OK();
}

Status PackWriter::add(std::string_view name, std::span<const uint8_t> bytes, int64_t mtime_ns,
                       int64_t label) {
  if (finished_) return Status(ErrorCode::kInvalidArgument, "pack writer already finished");
  if (name.empty() || name.find('\0') != std::string_view::npos)
    return Status(ErrorCode::kInvalidArgument, "a sample name must be non-empty, without NUL");
  if (bytes.size() > UINT32_MAX) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("sample {} of {} bytes: at most 4 GiB", name, bytes.size()));
  }
  if (shard_ && shard_at_ + bytes.size() > options_.shard_bytes && shard_at_ > kHeaderBytes)
    RETURN_ON_ERROR(closeShard());
  if (!shard_) RETURN_ON_ERROR(openShard());
  Entry e;
  e.shard = shards_ - 1;
  e.offset = shard_at_;
  e.length = static_cast<uint32_t>(bytes.size());
  e.crc = crc32c(bytes.data(), bytes.size());
  e.mtime_ns = mtime_ns;
  e.label = label;
  if (buffer_.size() + bytes.size() > options_.buffer_bytes) {
    RETURN_ON_ERROR(flushBuffer());
    if (bytes.size() >= options_.buffer_bytes) {  // large: straight to the shard
      RETURN_ON_ERROR(writeAll(*shard_, bytes.data(), bytes.size(), buffer_at_));
      buffer_at_ += bytes.size();
    }
  }
  if (buffer_at_ + buffer_.size() == shard_at_)
    buffer_.append(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  shard_at_ += bytes.size();
  entries_.push_back({std::string(name), e, true});
  ++added_;
  return Status::OK();
}

Status PackWriter::finish() {
  if (finished_) return Status::OK();
  RETURN_ON_ERROR(closeShard());
  finished_ = true;
  // Name order; of a name in the previous generation and added again (an
  // append replacing a sample), the one added. A name added twice by this
  // writer (two tar shards holding the same member) is an error: which
  // one a reader should get is not for the writer to guess.
  std::stable_sort(entries_.begin(), entries_.end(),
                   [](const Pending& a, const Pending& b) { return a.name < b.name; });
  std::vector<Pending*> kept;
  kept.reserve(entries_.size());
  for (size_t i = 0; i < entries_.size(); ++i) {
    if (i + 1 < entries_.size() && entries_[i + 1].name == entries_[i].name) {
      if (entries_[i].fresh) {
        return Status(ErrorCode::kInvalidArgument,
                      fmt::format("sample name {:?} added twice", entries_[i].name));
      }
      continue;
    }
    kept.push_back(&entries_[i]);
  }
  // The Bloom filter holds the names and their directory prefixes.
  uint64_t dirs = 0;
  for (size_t i = 0; i < kept.size(); ++i)
    dirs += newDirPrefixes(i ? kept[i - 1]->name : "", kept[i]->name).size();
  std::string names;
  std::string body;
  body.reserve(kept.size() * kEntryBytes);
  Bloom bloom = Bloom::forCount(kept.size() + dirs);
  for (size_t i = 0; i < kept.size(); ++i) {
    Pending* p = kept[i];
    p->entry.name_offset = names.size();
    p->entry.name_len = static_cast<uint32_t>(p->name.size());
    names += p->name;
    bloom.add(p->name);
    for (std::string_view d : newDirPrefixes(i ? kept[i - 1]->name : "", p->name)) bloom.add(d);
    body += encodeEntry(p->entry);
  }
  body += names;
  body += bloom.bytes();
  IndexHeader h;
  h.generation = generation_;
  h.count = kept.size();
  h.shards = shards_;
  h.names_bytes = names.size();
  h.bloom_bits = bloom.bits();
  h.bloom_hashes = bloom.hashes();
  h.flags = kFlagDirsInBloom;
  h.created_unix_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                          std::chrono::system_clock::now().time_since_epoch())
                          .count();
  h.body_crc = crc32c(body.data(), body.size());
  // The body first, the header last: a generation whose writer dies
  // midway has no valid header and readers keep the one before.
  const std::string path = join(dir_, indexName(generation_));
  std::unique_ptr<File> f;
  RETURN_ON_ERROR(
      statusOf(client_.open(path, O_CREAT | O_EXCL | O_WRONLY, 0644, &f)).withContext(path));
  RETURN_ON_ERROR(writeAll(*f, body.data(), body.size(), kHeaderBytes));
  RETURN_ON_ERROR(statusOf(f->fsync()));
  const std::string head = encodeIndexHeader(h);
  RETURN_ON_ERROR(writeAll(*f, head.data(), head.size(), 0));
  return statusOf(f->close()).withContext(path);
}

Result<std::unique_ptr<PackReader>> PackReader::open(std::unique_ptr<PackDir> dir, Options options,
                                                     std::optional<Generation> known) {
  if (!known) {
    ASSIGN_OR_RETURN(known, newestIndex(*dir));
  }
  const Generation& newest = *known;
  const std::string path = join(dir->describe(), indexName(newest.first));
  std::unique_ptr<PackReader> r(new PackReader(std::move(dir), options));
  r->header_ = newest.second;
  RETURN_ON_ERROR(statusOf(r->dir_->open(indexName(newest.first), &r->index_)).withContext(path));
  if (r->index_->size() < r->header_.fileBytes()) {
    return Status(ErrorCode::kCorruption, fmt::format("{}: {} bytes, its header describes {}", path,
                                                      r->index_->size(), r->header_.fileBytes()));
  }
  return r;
}

Status PackReader::indexBytes(uint64_t offset, size_t n, char* out) {
  while (n > 0) {
    const uint64_t page = offset / kPageBytes;
    auto it = pages_.find(page);
    if (it == pages_.end()) {
      std::string bytes(kPageBytes, '\0');
      size_t done = 0;
      RETURN_ON_ERROR(statusOf(index_->pread(bytes.data(), kPageBytes, page * kPageBytes, &done)));
      bytes.resize(done);
      while (!lru_.empty() && (pages_.size() + 1) * kPageBytes > options_.cache_bytes) {
        pages_.erase(lru_.back());
        lru_.pop_back();
      }
      lru_.push_front(page);
      it = pages_.emplace(page, std::make_pair(std::move(bytes), lru_.begin())).first;
    } else {
      lru_.splice(lru_.begin(), lru_, it->second.second);
    }
    const std::string& bytes = it->second.first;
    const uint64_t at = offset - page * kPageBytes;
    if (at >= bytes.size())
      return Status(ErrorCode::kCorruption,
                    fmt::format("{}: index shorter than its header says", dir_->describe()));
    const size_t take = std::min<size_t>(n, bytes.size() - at);
    std::memcpy(out, bytes.data() + at, take);
    out += take;
    offset += take;
    n -= take;
  }
  return Status::OK();
}

Result<Entry> PackReader::entry(uint64_t i) {
  if (i >= header_.count) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("sample {} of a pack of {}", i, header_.count));
  }
  char raw[kEntryBytes];
  RETURN_ON_ERROR(indexBytes(header_.entriesOffset() + i * kEntryBytes, kEntryBytes, raw));
  ASSIGN_OR_RETURN(Entry e, decodeEntry(std::string_view(raw, kEntryBytes)));
  if (e.name_offset + e.name_len > header_.names_bytes || e.shard >= header_.shards) {
    return Status(ErrorCode::kCorruption,
                  fmt::format("{}: entry {} points outside the pack", dir_->describe(), i));
  }
  return e;
}

Result<std::string> PackReader::name(const Entry& e) {
  std::string out(e.name_len, '\0');
  RETURN_ON_ERROR(indexBytes(header_.namesOffset() + e.name_offset, e.name_len, out.data()));
  return out;
}

Result<std::optional<uint64_t>> PackReader::find(std::string_view want) {
  ASSIGN_OR_RETURN(bool maybe, mayContain(want));
  if (!maybe) return std::optional<uint64_t>();
  ASSIGN_OR_RETURN(uint64_t i, lowerBound(want));
  if (i < header_.count) {
    ASSIGN_OR_RETURN(Entry e, entry(i));
    ASSIGN_OR_RETURN(std::string n, name(e));
    if (n == want) return std::optional<uint64_t>(i);
  }
  return std::optional<uint64_t>();
}

Result<std::shared_ptr<File>> PackReader::shardFile(uint32_t s) {
  auto it = shards_.find(s);
  if (it != shards_.end()) return it->second;
  // A bound on open handles (a holder keeps its own alive).
  if (shards_.size() >= 64) shards_.clear();
  std::unique_ptr<File> f;
  RETURN_ON_ERROR(
      statusOf(dir_->open(shardName(s), &f)).withContext(join(dir_->describe(), shardName(s))));
  std::shared_ptr<File> shared(std::move(f));
  shards_[s] = shared;
  return shared;
}

Result<uint64_t> PackReader::lowerBound(std::string_view key) {
  uint64_t lo = 0, hi = header_.count;
  while (lo < hi) {
    const uint64_t mid = lo + (hi - lo) / 2;
    ASSIGN_OR_RETURN(Entry e, entry(mid));
    ASSIGN_OR_RETURN(std::string n, name(e));
    if (n < key) {
      lo = mid + 1;
    } else {
      hi = mid;
    }
  }
  return lo;
}

Result<bool> PackReader::mayContain(std::string_view key) {
  if (header_.bloom_bits == 0) return true;
  // Only the bytes the probes touch are read (through the page cache).
  const auto [h1, h2] = bloomHashes(key);
  for (uint32_t i = 0; i < header_.bloom_hashes; ++i) {
    const uint64_t bit = (h1 + i * h2) % header_.bloom_bits;
    char byte = 0;
    RETURN_ON_ERROR(indexBytes(header_.bloomOffset() + bit / 8, 1, &byte));
    if (!(static_cast<uint8_t>(byte) >> (bit % 8) & 1)) return false;
  }
  return true;
}

Status sampleMismatch(std::string_view where, std::string_view name, const Entry& e) {
  return Status(ErrorCode::kCorruption,
                fmt::format("{}: sample {} ({} bytes at {} of {}) does not match its checksum",
                            where, name, e.length, e.offset, shardName(e.shard)));
}

Status PackReader::mismatch(const Entry& e) {
  auto n = name(e);
  return sampleMismatch(dir_->describe(), n.ok() ? *n : std::string("?"), e);
}

Status PackReader::read(const Entry& e, std::span<uint8_t> out) {
  std::vector<Status> status;
  readMany({&e, 1}, {&out, 1}, &status);
  return status[0];
}

void PackReader::readMany(std::span<const Entry> entries, std::span<const std::span<uint8_t>> outs,
                          std::vector<Status>* statuses) {
  statuses->assign(entries.size(), Status::OK());
  std::vector<bool> started(entries.size(), false);
  std::vector<FileRange> ranges;
  std::vector<size_t> which;
  for (size_t i = 0; i < entries.size(); ++i) {
    if (started[i]) continue;
    // Every sample of entries[i]'s shard, from i on.
    const uint32_t shard = entries[i].shard;
    ranges.clear();
    which.clear();
    for (size_t j = i; j < entries.size(); ++j) {
      if (started[j] || entries[j].shard != shard) continue;
      started[j] = true;
      if (outs[j].size() < entries[j].length) {
        (*statuses)[j] = Status(ErrorCode::kInvalidArgument, "buffer smaller than the sample");
        continue;
      }
      ranges.push_back({outs[j].data(), entries[j].length, entries[j].offset, 0});
      which.push_back(j);
    }
    auto f = shardFile(shard);
    Status s = f.ok() ? statusOf((*f)->preadMany(ranges)) : f.status();
    for (size_t k = 0; k < which.size(); ++k) {
      const size_t j = which[k];
      const Entry& e = entries[j];
      if (!s.ok()) {
        (*statuses)[j] = s;
      } else if (ranges[k].done != e.length || crc32c(outs[j].data(), e.length) != e.crc) {
        (*statuses)[j] = mismatch(e);
      }
    }
  }
}

Result<std::vector<std::pair<uint64_t, uint64_t>>> PackReader::webdatasetGroups() {
  std::vector<std::pair<uint64_t, uint64_t>> groups;
  std::string key;  // of the open group (the last of `groups`)
  bool open = false;
  for (uint64_t i = 0; i < size(); ++i) {
    ASSIGN_OR_RETURN(Entry e, entry(i));
    ASSIGN_OR_RETURN(std::string n, name(e));
    auto w = webdatasetName(n);
    if (!w) {
      open = false;
      continue;
    }
    if (open && w->key == key) {
      groups.back().second = i + 1;
    } else {
      key.assign(w->key);
      groups.emplace_back(i, i + 1);
      open = true;
    }
  }
  return groups;
}

Status PackReader::verify() {
  // The index body against its CRC, a page at a time.
  uint32_t crc = 0;
  std::string page;
  for (uint64_t at = kHeaderBytes; at < header_.fileBytes();) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kPageBytes, header_.fileBytes() - at));
    page.resize(n);
    RETURN_ON_ERROR(indexBytes(at, n, page.data()));
    crc = crc32cExtend(crc, page.data(), n);
    at += n;
  }
  if (crc != header_.body_crc)
    return Status(ErrorCode::kCorruption,
                  fmt::format("{}: index body checksum mismatch", dir_->describe()));
  for (uint32_t s = 0; s < header_.shards; ++s) {
    ASSIGN_OR_RETURN(std::shared_ptr<File> f, shardFile(s));
    std::string head(kHeaderBytes, '\0');
    size_t done = 0;
    RETURN_ON_ERROR(statusOf(f->pread(head.data(), head.size(), 0, &done)));
    auto h = decodeShardHeader(head);
    if (!h.ok() || h->shard != s) {
      return Status(ErrorCode::kCorruption,
                    fmt::format("{}: {} header: {}", dir_->describe(), shardName(s),
                                h.ok() ? std::string("another shard's") : h.status().message()));
    }
  }
  std::vector<uint8_t> buf;
  for (uint64_t i = 0; i < header_.count; ++i) {
    ASSIGN_OR_RETURN(Entry e, entry(i));
    buf.resize(e.length);
    RETURN_ON_ERROR(read(e, buf));
  }
  return Status::OK();
}

}  // namespace cistern::pack
