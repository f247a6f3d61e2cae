#include "ckpt/checkpoint.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <lz4.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <functional>
#include <mutex>
#include <set>
#include <thread>
#include <tuple>

#include "client/status_of.h"
#include "common/crc32c.h"

namespace cistern::ckpt {
namespace {

std::string join(const std::string& dir, std::string_view name) {
  return dir.empty() || dir.back() == '/' ? dir + std::string(name) : dir + "/" + std::string(name);
}

// "/a/b/" -> ("/a", "b").
std::pair<std::string, std::string> splitPath(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  size_t slash = path.rfind('/');
  if (slash == std::string::npos) return {".", path};
  return {slash == 0 ? "/" : path.substr(0, slash), path.substr(slash + 1)};
}

std::string hex128(const XXH128_hash_t& h) {
  return fmt::format("{:016x}{:016x}", h.high64, h.low64);
}

// One frame of `codec` holding `in` (zstd level 1: fast, as a checkpoint
// must be; lz4 takes at most ~2 GB per tensor).
Result<std::vector<uint8_t>> compress(const std::string& codec, std::span<const uint8_t> in,
                                      const std::string& name) {
  std::vector<uint8_t> out;
  if (codec == "zstd") {
    out.resize(ZSTD_compressBound(in.size()));
    size_t n = ZSTD_compress(out.data(), out.size(), in.data(), in.size(), 1);
    if (ZSTD_isError(n)) {
      return Status(ErrorCode::kInternal,
                    fmt::format("zstd: tensor {:?}: {}", name, ZSTD_getErrorName(n)));
    }
    out.resize(n);
    return out;
  }
  if (in.size() > static_cast<size_t>(LZ4_MAX_INPUT_SIZE)) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("lz4: tensor {:?} of {} bytes is too large for one frame (zstd "
                              "takes it)",
                              name, in.size()));
  }
  out.resize(static_cast<size_t>(LZ4_compressBound(static_cast<int>(in.size()))));
  int n = LZ4_compress_default(reinterpret_cast<const char*>(in.data()),
                               reinterpret_cast<char*>(out.data()), static_cast<int>(in.size()),
                               static_cast<int>(out.size()));
  if (n <= 0) return Status(ErrorCode::kInternal, fmt::format("lz4: tensor {:?}", name));
  out.resize(static_cast<size_t>(n));
  return out;
}

// Decompresses `frame` into `out`; the bytes it gave (anything but
// out.size() means the frame is bad).
size_t decompress(const std::string& codec, std::span<const uint8_t> frame,
                  std::span<uint8_t> out) {
  if (codec == "zstd") {
    size_t n = ZSTD_decompress(out.data(), out.size(), frame.data(), frame.size());
    return ZSTD_isError(n) ? SIZE_MAX : n;
  }
  if (frame.size() > static_cast<size_t>(INT32_MAX) || out.size() > static_cast<size_t>(INT32_MAX))
    return SIZE_MAX;
  int n = LZ4_decompress_safe(reinterpret_cast<const char*>(frame.data()),
                              reinterpret_cast<char*>(out.data()), static_cast<int>(frame.size()),
                              static_cast<int>(out.size()));
  return n < 0 ? SIZE_MAX : static_cast<size_t>(n);
}

// Runs fn(0..n-1) on up to `threads` threads; the first error stops the
// items not yet started and is returned.
Status parallelFor(size_t n, uint32_t threads, const std::function<Status(size_t)>& fn) {
  std::atomic<size_t> next{0};
  std::mutex mu;
  Status failed;
  auto run = [&] {
    for (size_t i; (i = next.fetch_add(1)) < n;) {
      Status s = fn(i);
      if (!s.ok()) {
        std::lock_guard lock(mu);
        if (failed.ok()) failed = s;
        next = n;
      }
    }
  };
  std::vector<std::thread> pool;
  const size_t count = std::min<size_t>(std::max<uint32_t>(threads, 1), n);
  for (size_t i = 1; i < count; ++i) pool.emplace_back(run);
  run();
  for (auto& t : pool) t.join();
  return failed;
}

std::vector<std::string> hashBlocks(std::span<const uint8_t> bytes, uint64_t block) {
  std::vector<std::string> out;
  for (uint64_t at = 0; at < bytes.size(); at += block) {
    size_t n = static_cast<size_t>(std::min<uint64_t>(block, bytes.size() - at));
    out.push_back(hex128(XXH3_128bits(bytes.data() + at, n)));
  }
  return out;
}

Result<std::string> readWhole(Client& client, const std::string& path) {
  FileInfo info;
  RETURN_ON_ERROR(statusOf(client.stat(path, &info)));
  std::unique_ptr<File> f;
  RETURN_ON_ERROR(statusOf(client.open(path, O_RDONLY, 0, &f)));
  std::string out(info.size, '\0');
  size_t done = 0;
  RETURN_ON_ERROR(statusOf(f->pread(out.data(), out.size(), 0, &done)));
  out.resize(done);
  RETURN_ON_ERROR(statusOf(f->close()));
  return out;
}

// Creates `path` (kAlreadyExists if it exists) with `bytes`, synced.
Status writeNew(Client& client, const std::string& path, std::string_view bytes) {
  std::unique_ptr<File> f;
  RETURN_ON_ERROR(statusOf(client.open(path, O_CREAT | O_EXCL | O_WRONLY, 0644, &f)));
  size_t done = 0;
  RETURN_ON_ERROR(statusOf(f->pwrite(bytes.data(), bytes.size(), 0, &done)));
  RETURN_ON_ERROR(statusOf(f->fsync()));
  return statusOf(f->close());
}

// Replaces `dir`/`name` (the manifest) with `m` atomically (a synced
// temporary renamed over it) and makes the rename durable.
Status commitManifest(Client& client, const std::string& dir, const Manifest& m,
                      std::string_view name = kManifestName) {
  const std::string tmp = join(dir, std::string(name) + ".tmp");
  (void)client.unlink(tmp);  // a crashed commit's
  RETURN_ON_ERROR(writeNew(client, tmp, encodeManifest(m)));
  RETURN_ON_ERROR(statusOf(client.rename(tmp, join(dir, name))));
  return statusOf(client.syncNamespace());
}

std::string fileOf(const std::string& path, const ManifestTensor& t) {
  if (t.in.empty()) return join(path, t.file);
  return join(join(splitPath(path).first, t.in), t.file);
}

Credentials self() {
  Credentials c;
  c.uid = ::geteuid();
  c.gid = ::getegid();
  return c;
}

// Removes a directory's files, then the directory (the manifest first, so
// that a crash halfway leaves nothing listed).
Status removeDir(Client& client, const std::string& dir) {
  Error e = client.unlink(join(dir, kManifestName));
  if (e && e.errno_value != ENOENT) return statusOf(e);
  std::vector<DirEntry> entries;
  RETURN_ON_ERROR(statusOf(client.list(dir, &entries)));
  for (const DirEntry& d : entries) RETURN_ON_ERROR(statusOf(client.unlink(join(dir, d.name))));
  return statusOf(client.rmdir(dir));
}

}  // namespace

std::string dataFileName(uint32_t rank) { return fmt::format("rank-{:05d}.safetensors", rank); }
std::string rankManifestName(uint32_t rank) {
  return fmt::format("manifest.rank-{:05d}.json", rank);
}

Status save(Client& client, const std::string& path, std::span<const TensorData> tensors,
            const SaveOptions& options, SaveStats* stats) {
  SaveStats local;
  SaveStats& st = stats ? *stats : local;
  st = {};
  if (options.block_bytes == 0 || options.block_bytes > kBlockBytesMax)
    return Status(ErrorCode::kInvalidArgument, "checkpoint block_bytes out of range");
  if (options.world_size == 0 || options.rank >= options.world_size) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("rank {} of {}", options.rank, options.world_size));
  }
  const bool alone = options.world_size == 1;
  auto [root, name] = splitPath(path);
  if (!plainName(name))
    return Status(ErrorCode::kInvalidArgument, fmt::format("checkpoint path {:?}", path));
  // Bad input is refused before anything is written.
  std::set<std::string_view> seen;
  for (const TensorData& t : tensors) {
    if (t.name.empty() || !seen.insert(t.name).second) {
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("tensor {:?} {}", t.name, t.name.empty() ? "unnamed" : "twice"));
    }
    TensorInfo ti{t.name, t.dtype, t.shape};
    if (ti.expectedBytes() != t.bytes.size()) {
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("tensor {:?}: {} bytes for a {} of shape [{}]", t.name,
                                t.bytes.size(), dtypeName(t.dtype), fmt::join(t.shape, ", ")));
    }
  }
  Manifest base;
  std::string base_name;
  if (!options.base.empty()) {
    std::string base_root;
    std::tie(base_root, base_name) = splitPath(options.base);
    if (base_root != root || base_name == name) {
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("base {} is not another checkpoint in {}", options.base, root));
    }
    ASSIGN_OR_RETURN(base, readManifest(client, options.base));
  }
  // A committed checkpoint stays; a directory without a manifest is a save
  // that crashed: cleared.
  FileInfo info;
  if (!client.stat(join(path, kManifestName), &info)) {
    return Status(ErrorCode::kAlreadyExists, fmt::format("checkpoint {} exists", path));
  }
  if (!options.codec.empty() && options.codec != "zstd" && options.codec != "lz4") {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("codec {:?}: zstd, lz4 or none", options.codec));
  }
  const bool packed = !options.codec.empty();
  // Compressed tensors are frames back to back, no safetensors header.
  const std::string data_name = packed ? fmt::format("rank-{:05d}.{}", options.rank, options.codec)
                                       : dataFileName(options.rank);
  const std::string data_path = join(path, data_name);
  if (alone) {
    if (!client.stat(path, &info)) RETURN_ON_ERROR(removeDir(client, path).withContext(path));
  } else {
    // The other ranks write next to this one: only this rank's leftovers go.
    for (const std::string& f : {data_name, rankManifestName(options.rank)}) {
      Error e = client.unlink(join(path, f));
      if (e && e.errno_value != ENOENT) return statusOf(e).withContext(path);
    }
  }
  Error made = client.mkdir(path, 0755, /*parents=*/true);
  if (made && !(made.errno_value == EEXIST && !alone)) return statusOf(made).withContext(path);

  Manifest m;
  m.created_ns = std::chrono::duration_cast<std::chrono::nanoseconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
  m.block_bytes = options.block_bytes;
  m.base = base_name;
  m.metadata = options.metadata;
  Header header;
  std::vector<std::pair<const TensorData*, size_t>> written;  // and its manifest entry
  // Block hashes on the writer threads first (they decide what is reused).
  std::vector<std::vector<std::string>> hashes(tensors.size());
  RETURN_ON_ERROR(parallelFor(tensors.size(), options.write_threads, [&](size_t i) -> Status {
    hashes[i] = hashBlocks(tensors[i].bytes, m.block_bytes);
    return Status::OK();
  }));
  for (size_t i = 0; i < tensors.size(); ++i) {
    const TensorData& t = tensors[i];
    TensorInfo ti{t.name, t.dtype, t.shape};
    ManifestTensor mt;
    mt.name = t.name;
    mt.dtype = t.dtype;
    mt.shape = t.shape;
    mt.bytes = t.bytes.size();
    mt.blocks = std::move(hashes[i]);
    const ManifestTensor* old = base.find(t.name);
    if (old && old->dtype == t.dtype && old->shape == t.shape && old->blocks == mt.blocks &&
        base.block_bytes == m.block_bytes) {
      mt.in = old->in.empty() ? base_name : old->in;  // where the base found it
      mt.file = old->file;
      mt.offset = old->offset;
      mt.crc32c = old->crc32c;
      mt.codec = old->codec;
      mt.stored = old->stored;
      ++st.tensors_reused;
      st.bytes_reused += mt.bytes;
      st.reused.push_back(t.name);
    } else {
      mt.file = data_name;  // its CRC32C (and frame) by the thread that writes it
      mt.stored = mt.bytes;
      header.tensors.push_back(ti);
      written.emplace_back(&t, m.tensors.size());
    }
    ++st.tensors;
    m.tensors.push_back(std::move(mt));
  }
  // The data file: header, then the written tensors back to back (or,
  // compressed, their frames in the order they finish).
  std::string head;
  if (!packed) {
    ASSIGN_OR_RETURN(head, encodeHeader(&header));
  }
  {
    std::unique_ptr<File> f;
    // O_DIRECT: no write buffer in the client, so tensors go to storage from
    // the caller's memory, several at once across chains.
    RETURN_ON_ERROR(
        statusOf(client.open(data_path, O_CREAT | O_EXCL | O_WRONLY | O_DIRECT, 0644, &f)));
    size_t done = 0;
    if (!head.empty()) RETURN_ON_ERROR(statusOf(f->pwrite(head.data(), head.size(), 0, &done)));
    for (size_t i = 0; i < written.size(); ++i)
      m.tensors[written[i].second].offset = head.size() + header.tensors[i].begin;
    std::atomic<uint64_t> end{0};  // of the frames written so far
    RETURN_ON_ERROR(parallelFor(written.size(), options.write_threads, [&](size_t i) -> Status {
      const TensorData& t = *written[i].first;
      ManifestTensor& mt = m.tensors[written[i].second];
      mt.crc32c = crc32c(t.bytes.data(), t.bytes.size());
      std::span<const uint8_t> out = t.bytes;
      std::vector<uint8_t> frame;
      if (packed && !t.bytes.empty()) {
        ASSIGN_OR_RETURN(frame, compress(options.codec, t.bytes, t.name));
        out = frame;
        mt.codec = options.codec;
        mt.stored = frame.size();
        mt.offset = end.fetch_add(frame.size());
      }
      size_t n = 0;
      return statusOf(f->pwrite(out.data(), out.size(), mt.offset, &n)).withContext(data_path);
    }));
    for (const auto& w : written) st.bytes_written += m.tensors[w.second].stored;
    RETURN_ON_ERROR(statusOf(f->fsync()));
    RETURN_ON_ERROR(statusOf(f->close()));
  }
  std::sort(m.tensors.begin(), m.tensors.end(),
            [](const ManifestTensor& a, const ManifestTensor& b) { return a.name < b.name; });
  if (alone) return commitManifest(client, path, m);
  return commitManifest(client, path, m, rankManifestName(options.rank));
}

Status commit(Client& client, const std::string& path, uint32_t world_size) {
  if (world_size == 0) return Status(ErrorCode::kInvalidArgument, "a world of 0 ranks");
  FileInfo info;
  if (!client.stat(join(path, kManifestName), &info))
    return Status(ErrorCode::kAlreadyExists, fmt::format("checkpoint {} exists", path));
  Manifest all;
  for (uint32_t r = 0; r < world_size; ++r) {
    auto text = readWhole(client, join(path, rankManifestName(r)));
    if (!text.ok() && text.code() == ErrorCode::kNotFound) {
      return Status(ErrorCode::kNotFound,
                    fmt::format("checkpoint {}: rank {} of {} has not saved", path, r, world_size));
    }
    RETURN_ON_ERROR(text.status());
    auto m = decodeManifest(*text);
    if (!m.ok()) return m.status().withContext(join(path, rankManifestName(r)));
    if (r == 0) {
      all = *m;
      continue;
    }
    if (m->block_bytes != all.block_bytes || m->base != all.base) {
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("checkpoint {}: rank {} saved with other options", path, r));
    }
    for (auto& [k, v] : m->metadata) all.metadata.emplace(k, v);
    all.created_ns = std::max(all.created_ns, m->created_ns);
    for (ManifestTensor& t : m->tensors) all.tensors.push_back(std::move(t));
  }
  std::sort(all.tensors.begin(), all.tensors.end(),
            [](const ManifestTensor& a, const ManifestTensor& b) { return a.name < b.name; });
  for (size_t i = 1; i < all.tensors.size(); ++i) {
    if (all.tensors[i].name == all.tensors[i - 1].name) {
      return Status(
          ErrorCode::kInvalidArgument,
          fmt::format("checkpoint {}: two ranks saved tensor {:?}", path, all.tensors[i].name));
    }
  }
  RETURN_ON_ERROR(commitManifest(client, path, all));
  for (uint32_t r = 0; r < world_size; ++r) (void)client.unlink(join(path, rankManifestName(r)));
  return Status::OK();
}

Result<Manifest> readManifest(Client& client, const std::string& path) {
  auto text = readWhole(client, join(path, kManifestName));
  if (!text.ok() && text.code() == ErrorCode::kNotFound)
    return Status(ErrorCode::kNotFound, fmt::format("no checkpoint at {}", path));
  RETURN_ON_ERROR(text.status());
  auto m = decodeManifest(*text);
  if (!m.ok()) return m.status().withContext(path);
  return m;
}

Status readTensor(Client& client, const std::string& path, const ManifestTensor& t,
                  std::span<uint8_t> out) {
  return TensorReader(client, path).read(t, out);
}

Status TensorReader::read(const ManifestTensor& t, std::span<uint8_t> out) {
  if (out.size() != t.bytes) {
    return Status(ErrorCode::kInvalidArgument,
                  fmt::format("tensor {:?} has {} bytes, not {}", t.name, t.bytes, out.size()));
  }
  const std::string file = fileOf(path_, t);
  std::unique_ptr<File>& f = files_[file];
  if (!f) RETURN_ON_ERROR(statusOf(client_.open(file, O_RDONLY, 0, &f)).withContext(file));
  size_t done = 0;
  if (t.codec.empty()) {
    RETURN_ON_ERROR(statusOf(f->pread(out.data(), out.size(), t.offset, &done)));
  } else {
    std::vector<uint8_t> frame(t.stored);
    RETURN_ON_ERROR(statusOf(f->pread(frame.data(), frame.size(), t.offset, &done)));
    if (done != t.stored) {
      return Status(ErrorCode::kCorruption,
                    fmt::format("tensor {:?} in {}: the file ends before it", t.name, file));
    }
    done = decompress(t.codec, frame, out);
  }
  if (done != t.bytes || crc32c(out.data(), out.size()) != t.crc32c) {
    return Status(ErrorCode::kCorruption,
                  fmt::format("tensor {:?} in {}: {}", t.name, file,
                              done != t.bytes ? "the file ends before it" : "checksum mismatch"));
  }
  return Status::OK();
}

Status verify(Client& client, const std::string& path) {
  ASSIGN_OR_RETURN(Manifest m, readManifest(client, path));
  TensorReader reader(client, path);
  std::vector<uint8_t> buf;
  for (const ManifestTensor& t : m.tensors) {
    buf.resize(t.bytes);
    RETURN_ON_ERROR(reader.read(t, buf));
  }
  return Status::OK();
}

Result<std::vector<std::string>> list(Client& client, const std::string& root) {
  std::vector<DirEntry> entries;
  RETURN_ON_ERROR(statusOf(client.list(root, &entries)));
  std::vector<std::pair<int64_t, std::string>> found;
  for (const DirEntry& d : entries) {
    if (!S_ISDIR(d.info.mode)) continue;
    auto m = readManifest(client, join(root, d.name));
    if (m.code() == ErrorCode::kNotFound) continue;  // a save in progress or one that crashed
    RETURN_ON_ERROR(m.status());
    found.emplace_back(m->created_ns, d.name);
  }
  std::sort(found.begin(), found.end());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

Status remove(Client& client, const std::string& path) {
  auto [root, name] = splitPath(path);
  auto gone = readManifest(client, path);
  if (!gone.ok() && gone.code() != ErrorCode::kNotFound) return gone.status();
  if (gone.ok()) {
    // Newer checkpoints that read files of this one keep them: each file is
    // linked into the newest of them under "<name>.<file>", their manifests
    // rewritten to point there, and only then is anything removed.
    ASSIGN_OR_RETURN(auto names, list(client, root));
    std::vector<std::pair<std::string, Manifest>> users;
    for (const std::string& other : names) {
      if (other == name) continue;
      ASSIGN_OR_RETURN(Manifest m, readManifest(client, join(root, other)));
      if (std::any_of(m.tensors.begin(), m.tensors.end(),
                      [&](const ManifestTensor& t) { return t.in == name; }))
        users.emplace_back(other, std::move(m));
    }
    if (!users.empty()) {
      const std::string keeper = users.back().first;  // the newest
      const std::string keeper_dir = join(root, keeper);
      FileInfo dir_info;
      RETURN_ON_ERROR(statusOf(client.stat(keeper_dir, &dir_info)));
      std::set<std::string> files;
      for (auto& [who, m] : users)
        for (const ManifestTensor& t : m.tensors)
          if (t.in == name) files.insert(t.file);
      for (const std::string& f : files) {
        const std::string moved = name + "." + f;
        FileInfo src, existing;
        if (!client.stat(join(keeper_dir, moved), &existing)) continue;  // an earlier try's
        RETURN_ON_ERROR(statusOf(client.stat(join(path, f), &src)));
        FileInfo linked;
        RETURN_ON_ERROR(statusOf(client.linkAt(self(), src.ino, dir_info.ino, moved, &linked)));
      }
      for (auto& [who, m] : users) {
        for (ManifestTensor& t : m.tensors) {
          if (t.in != name) continue;
          t.file = name + "." + t.file;
          t.in = who == keeper ? "" : keeper;
        }
        RETURN_ON_ERROR(commitManifest(client, join(root, who), m));
      }
    }
  }
  RETURN_ON_ERROR(removeDir(client, path));
  return statusOf(client.syncNamespace());
}

}  // namespace cistern::ckpt
