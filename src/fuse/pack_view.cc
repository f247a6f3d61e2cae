// The directory view of packs (pack_view.h).
#include "fuse/pack_view.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/stat.h>

#include <cstring>
#include <vector>

#include "common/crc32c.h"
#include "common/log.h"
#include "fuse/fuse_fs.h"
#include "pack/pack.h"

namespace cistern::fuse {

namespace {

constexpr uint64_t kIndexBits = 43;
constexpr uint64_t kLevelBits = 8;
constexpr uint64_t kSlotBits = 12;
constexpr uint32_t kFileLevel = 255;
constexpr uint32_t kMaxLevel = 254;

struct Node {
  uint32_t slot;
  uint32_t level;  // kFileLevel: a file
  uint64_t index;
};

uint64_t encode(Node n) {
  return (uint64_t{1} << 63) | (uint64_t{n.slot} << (kIndexBits + kLevelBits)) |
         (uint64_t{n.level} << kIndexBits) | n.index;
}

Node decode(uint64_t id) {
  return {static_cast<uint32_t>((id >> (kIndexBits + kLevelBits)) & ((1u << kSlotBits) - 1)),
          static_cast<uint32_t>((id >> kIndexBits) & ((1u << kLevelBits) - 1)),
          id & ((uint64_t{1} << kIndexBits) - 1)};
}

int errnoOf(const Status& s) {
  switch (s.code()) {
    case ErrorCode::kNotFound:
      return ENOENT;
    case ErrorCode::kPermissionDenied:
      return EACCES;
    default:
      return EIO;
  }
}

Error errorOf(const Status& s) { return Error{errnoOf(s), s.toString()}; }

// The pack's directory by inode, with the credentials of the caller that
// first looked up its view.
class InodeDir final : public pack::PackDir {
 public:
  InodeDir(Client& c, Credentials who, uint64_t ino)
      : c_(c), who_(std::move(who)), ino_(ino), describe_(fmt::format("pack (inode {})", ino)) {}
  Error list(std::vector<std::string>* names) override {
    std::string cookie;
    do {
      DirPage page;
      if (Error e = c_.readdirAt(who_, ino_, cookie, 1024, false, &page)) return e;
      for (auto& d : page.entries) names->push_back(std::move(d.name));
      cookie = std::move(page.next_cookie);
    } while (!cookie.empty());
    return {};
  }
  Error open(const std::string& name, std::unique_ptr<File>* out) override {
    FileInfo info;
    if (Error e = c_.lookup(who_, ino_, name, &info)) return e;
    return c_.openAt(who_, info.ino, O_RDONLY | O_DIRECT, out);
  }
  const std::string& describe() const override { return describe_; }

 private:
  Client& c_;
  Credentials who_;
  uint64_t ino_;
  std::string describe_;
};

// A sample, open. Small ones are read whole (and checked) at open; larger
// ones by range, their CRC checked when read in order to the end.
class ViewFile final : public File {
 public:
  // `where`: the pack, for messages.
  ViewFile(std::shared_ptr<File> shard, const pack::Entry& e, std::string where, std::string name,
           FileInfo info)
      : shard_(std::move(shard)),
        e_(e),
        where_(std::move(where)),
        name_(std::move(name)),
        info_(info) {}

  Error readWhole() {
    bytes_.resize(e_.length);
    size_t done = 0;
    if (Error err = shard_->pread(bytes_.data(), e_.length, e_.offset, &done)) return err;
    if (done != e_.length || crc32c(bytes_.data(), e_.length) != e_.crc) return corrupt();
    whole_ = true;
    return {};
  }

  Error pread(void* buf, size_t n, uint64_t offset, size_t* done) override {
    *done = 0;
    if (offset >= e_.length) return {};
    n = static_cast<size_t>(std::min<uint64_t>(n, e_.length - offset));
    if (whole_) {
      std::memcpy(buf, bytes_.data() + offset, n);
      *done = n;
      return {};
    }
    if (Error err = shard_->pread(buf, n, e_.offset + offset, done)) return err;
    if (*done != n) return corrupt();
    std::lock_guard lock(mu_);
    if (offset == crc_at_) {
      crc_ = crc32cExtend(crc_, buf, n);
      crc_at_ += n;
      if (crc_at_ == e_.length && crc_ != e_.crc) return corrupt();
    }
    return {};
  }
  Error pwrite(const void*, size_t, uint64_t, size_t*) override { return {EROFS, "read-only"}; }
  Error fsync() override { return {}; }
  Error flush(bool) override { return {}; }
  Error close() override { return {}; }
  uint64_t size() const override { return e_.length; }
  uint64_t ino() const override { return info_.ino; }
  FileInfo info() const override { return info_; }
  Error allocate(uint64_t) override { return {EROFS, "read-only"}; }
  uint32_t openHandles() const override { return 1; }
  bool wholeContents(std::string* out) const override {
    if (!whole_) return false;
    out->assign(reinterpret_cast<const char*>(bytes_.data()), bytes_.size());
    return true;
  }

 private:
  Error corrupt() const {
    const Status s = pack::sampleMismatch(where_, name_, e_);
    const std::string m(s.message());
    CLOG_WARN("fuse", "{}", m);
    return {EIO, m};
  }

  std::shared_ptr<File> shard_;
  pack::Entry e_;
  std::string where_;
  std::string name_;
  FileInfo info_;
  std::vector<uint8_t> bytes_;
  bool whole_ = false;
  std::mutex mu_;
  uint64_t crc_at_ = 0;  // bytes checked so far, read in order
  uint32_t crc_ = 0;
};

}  // namespace

struct PackViews::Slot {
  std::mutex mu;  // the reader (not thread-safe)
  std::unique_ptr<pack::PackReader> reader;
  uint64_t dir_ino = 0;
  uint64_t generation = 0;
  FileInfo dir;          // the pack directory's attributes (directories show them)
  FileInfo index;        // the index file's (samples show them)
  uint64_t lookups = 0;  // under PackViews::mu_

  // "a/b/" for a directory node of level 2 at an entry "a/b/c..."; "" for the root.
  Result<std::string> prefix(uint32_t level, uint64_t index) {
    if (level == 0) return std::string();
    ASSIGN_OR_RETURN(pack::Entry e, reader->entry(index));
    ASSIGN_OR_RETURN(std::string n, reader->name(e));
    size_t at = 0;
    for (uint32_t l = 0; l < level; ++l) {
      const size_t slash = n.find('/', at);
      if (slash == std::string::npos) return Status(ErrorCode::kNotFound, "stale view node");
      at = slash + 1;
    }
    n.resize(at);
    return n;
  }

  // A node's attributes: samples have the index file's read bits and
  // owner, directories the pack directory's read and search bits.
  FileInfo attrs(uint64_t node, bool is_dir, const pack::Entry* e) const {
    FileInfo i;
    i.ino = node;
    i.mode = is_dir ? (S_IFDIR | (dir.mode & 0555)) : (S_IFREG | (index.mode & 0444));
    i.nlink = is_dir ? 2 : 1;
    i.uid = is_dir ? dir.uid : index.uid;
    i.gid = is_dir ? dir.gid : index.gid;
    i.size = is_dir ? 0 : e->length;
    i.ctime_ns = reader->header().created_unix_ns;
    i.mtime_ns = !is_dir && e->mtime_ns != 0 ? e->mtime_ns : i.ctime_ns;
    i.atime_ns = i.mtime_ns;
    return i;
  }
  void fillStat(uint64_t node, bool is_dir, const pack::Entry* e, struct stat* st) const {
    infoToStat(attrs(node, is_dir, e), st);
  }

  // The attributes of a node of this slot (whose mutex the caller holds).
  Status stat(uint64_t node, struct stat* st) {
    const Node n = decode(node);
    if (n.level == kFileLevel) {
      ASSIGN_OR_RETURN(pack::Entry e, reader->entry(n.index));
      fillStat(node, false, &e, st);
    } else {
      ASSIGN_OR_RETURN(std::string p, prefix(n.level, n.index));
      fillStat(node, true, nullptr, st);
    }
    return Status::OK();
  }
};

PackViews::PackViews(Client& client)
    : client_(client), slots_(std::make_unique<Slot[]>(kMaxViews)) {}

PackViews::~PackViews() = default;

namespace {

void fillEntry(const struct stat& st, fuse_entry_param* out) {
  std::memset(out, 0, sizeof(*out));
  out->ino = st.st_ino;
  out->generation = 1;
  out->attr = st;
  out->attr_timeout = PackViews::kTimeoutS;
  out->entry_timeout = PackViews::kTimeoutS;
}

}  // namespace

Error PackViews::lookupRoot(const Credentials& who, const FileInfo& dir_info,
                            double entry_timeout_s, fuse_entry_param* out) {
  if (!dir_info.isDir()) return {ENOENT, "not a directory"};
  auto dir = std::make_unique<InodeDir>(client_, who, dir_info.ino);
  auto newest = pack::newestIndex(*dir);
  if (!newest.ok()) return errorOf(newest.status());
  // Samples show the index file's read bits and owner: who cannot read
  // the pack's files cannot read its view either (the kernel checks).
  FileInfo index;
  if (Error e = client_.lookup(who, dir_info.ino, pack::indexName(newest->first), &index)) return e;
  std::lock_guard lock(mu_);
  uint32_t found = kMaxViews, free = kMaxViews;
  for (uint32_t s = 0; s < kMaxViews; ++s) {
    Slot& slot = slots_[s];
    if (slot.reader && slot.dir_ino == dir_info.ino && slot.generation == newest->first) {
      found = s;
      break;
    }
    // A free slot: one never used, else one the kernel holds nothing of.
    if (slot.lookups == 0 && (free == kMaxViews || (!slot.reader && slots_[free].reader))) free = s;
  }
  if (found == kMaxViews) {
    if (free == kMaxViews)
      return {EMFILE, fmt::format("{} pack views open at once already", kMaxViews)};
    Slot& slot = slots_[free];
    std::lock_guard slot_lock(slot.mu);
    slot.reader.reset();
    auto r = pack::PackReader::open(std::move(dir), {.cache_bytes = kViewCacheBytes}, *newest);
    if (!r.ok()) return errorOf(r.status());
    slot.reader = std::move(*r);
    slot.dir_ino = dir_info.ino;
    slot.generation = slot.reader->header().generation;
    found = free;
  }
  Slot& slot = slots_[found];
  std::lock_guard slot_lock(slot.mu);
  if (slot.lookups == 0) {  // the kernel caches nothing of it: attributes as now
    slot.dir = dir_info;
    slot.index = index;
  }
  ++slot.lookups;
  struct stat st;
  slot.fillStat(encode({found, 0, 0}), true, nullptr, &st);
  fillEntry(st, out);
  out->entry_timeout = entry_timeout_s;
  return {};
}

void PackViews::forget(uint64_t node, uint64_t n) {
  const Node d = decode(node);
  if (d.slot >= kMaxViews) return;
  std::lock_guard lock(mu_);
  Slot& slot = slots_[d.slot];
  slot.lookups = slot.lookups > n ? slot.lookups - n : 0;
  // The reader (its index cache) is dropped when the slot is taken again.
}

Error PackViews::lookup(uint64_t parent, const std::string& name, fuse_entry_param* out) {
  const Node p = decode(parent);
  if (p.slot >= kMaxViews) return {ENOENT, "no such view"};
  if (p.level == kFileLevel) return {ENOTDIR, "a sample is not a directory"};
  Slot& slot = slots_[p.slot];
  Node found{};
  struct stat st;
  {
    std::lock_guard slot_lock(slot.mu);
    if (!slot.reader) return {ENOENT, "no such view"};
    pack::PackReader& r = *slot.reader;
    auto prefix = slot.prefix(p.level, p.index);
    if (!prefix.ok()) return errorOf(prefix.status());
    const std::string full = *prefix + name;
    // A sample of that name (a file wins over a directory of the same name).
    auto file = r.find(full);
    if (!file.ok()) return errorOf(file.status());
    if (*file) {
      found = {p.slot, kFileLevel, **file};
      auto e = r.entry(**file);
      if (!e.ok()) return errorOf(e.status());
      slot.fillStat(encode(found), false, &*e, &st);
    } else {
      // A directory: the first name under "<full>/", if any (the Bloom
      // filter answers most absent names when it holds directories).
      const std::string dir = full + "/";
      if (r.header().flags & pack::kFlagDirsInBloom) {
        auto maybe = r.mayContain(dir);
        if (!maybe.ok()) return errorOf(maybe.status());
        if (!*maybe) return {ENOENT, "no such sample"};
      }
      auto at = r.lowerBound(dir);
      if (!at.ok()) return errorOf(at.status());
      if (*at >= r.size() || p.level + 1 > kMaxLevel) return {ENOENT, "no such sample"};
      auto e = r.entry(*at);
      if (!e.ok()) return errorOf(e.status());
      auto n = r.name(*e);
      if (!n.ok()) return errorOf(n.status());
      if (!n->starts_with(dir)) return {ENOENT, "no such sample"};
      found = {p.slot, p.level + 1, *at};
      slot.fillStat(encode(found), true, nullptr, &st);
    }
  }
  fillEntry(st, out);
  std::lock_guard lock(mu_);
  ++slot.lookups;
  return {};
}

Error PackViews::getattr(uint64_t node, struct stat* out) {
  const Node n = decode(node);
  if (n.slot >= kMaxViews) return {ENOENT, "no such view"};
  Slot& slot = slots_[n.slot];
  std::lock_guard slot_lock(slot.mu);
  if (!slot.reader) return {ENOENT, "no such view"};
  Status s = slot.stat(node, out);
  return s.ok() ? Error{} : errorOf(s);
}

Error PackViews::open(uint64_t node, int flags, std::unique_ptr<File>* out) {
  const Node n = decode(node);
  if (n.slot >= kMaxViews) return {ENOENT, "no such view"};
  if (n.level != kFileLevel) return {EISDIR, "a directory of a pack view"};
  if ((flags & O_ACCMODE) != O_RDONLY || (flags & O_TRUNC)) return {EROFS, "a pack view"};
  Slot& slot = slots_[n.slot];
  std::unique_ptr<ViewFile> file;
  {
    std::lock_guard slot_lock(slot.mu);
    if (!slot.reader) return {ENOENT, "no such view"};
    auto e = slot.reader->entry(n.index);
    if (!e.ok()) return errorOf(e.status());
    auto name = slot.reader->name(*e);
    if (!name.ok()) return errorOf(name.status());
    auto shard = slot.reader->shardFile(e->shard);
    if (!shard.ok()) return errorOf(shard.status());
    file = std::make_unique<ViewFile>(std::move(*shard), *e, slot.reader->describe(),
                                      std::move(*name), slot.attrs(node, false, &*e));
  }
  // (Outside the slot's mutex: the file holds its shard; opens run in parallel.)
  if (file->size() <= kWholeReadBytes) {
    if (Error e = file->readWhole()) return e;
  }
  *out = std::move(file);
  return {};
}

Error PackViews::readdir(fuse_req_t req, uint64_t node, off_t off, bool plus, char* buf,
                         size_t size, size_t* used) {
  *used = 0;
  const Node d = decode(node);
  if (d.slot >= kMaxViews) return {ENOENT, "no such view"};
  if (d.level == kFileLevel) return {ENOTDIR, "a sample is not a directory"};
  Slot& slot = slots_[d.slot];
  uint64_t added_lookups = 0;
  {
    std::lock_guard slot_lock(slot.mu);
    if (!slot.reader) return {ENOENT, "no such view"};
    pack::PackReader& r = *slot.reader;
    auto prefix = slot.prefix(d.level, d.index);
    if (!prefix.ok()) return errorOf(prefix.status());
    const std::string& p = *prefix;
    // Offsets: 0 ".", 1 "..", then 2 + the entry index the next child
    // starts at (this directory's entries are [d.index, end)).
    uint64_t pos = static_cast<uint64_t>(off);
    auto add = [&](const char* name, const struct stat& st, bool counted, uint64_t next) {
      size_t need;
      if (plus) {
        fuse_entry_param e;
        if (counted) {
          fillEntry(st, &e);
        } else {
          std::memset(&e, 0, sizeof(e));
          e.attr = st;
        }
        need = fuse_add_direntry_plus(req, buf + *used, size - *used, name, &e,
                                      static_cast<off_t>(next));
      } else {
        need =
            fuse_add_direntry(req, buf + *used, size - *used, name, &st, static_cast<off_t>(next));
      }
      if (need > size - *used) return false;
      *used += need;
      if (plus && counted) ++added_lookups;
      pos = next;
      return true;
    };
    struct stat st;
    std::memset(&st, 0, sizeof(st));
    st.st_mode = S_IFDIR;
    bool full = false;
    if (pos == 0) {
      slot.fillStat(node, true, nullptr, &st);
      full = !add(".", st, false, 1);
    }
    if (!full && pos == 1) {
      // ".." of the root is the pack directory; of another directory, the
      // node of its parent (the first entry under the parent's prefix).
      uint64_t parent = slot.dir_ino;
      if (d.level > 0) {
        auto pp = slot.prefix(d.level - 1, d.index);
        if (!pp.ok()) return errorOf(pp.status());
        auto at = r.lowerBound(*pp);
        if (!at.ok()) return errorOf(at.status());
        parent = encode({d.slot, d.level - 1, d.level == 1 ? 0 : *at});
      }
      std::memset(&st, 0, sizeof(st));
      st.st_ino = parent;
      st.st_mode = S_IFDIR;
      full = !add("..", st, false, 2 + d.index);
    }
    if (pos < 2 + d.index) pos = 2 + d.index;  // an offset from before the directory
    while (!full && pos - 2 < r.size()) {
      const uint64_t k = pos - 2;
      auto e = r.entry(k);
      if (!e.ok()) return errorOf(e.status());
      auto n = r.name(*e);
      if (!n.ok()) return errorOf(n.status());
      if (!n->starts_with(p)) break;  // past this directory
      const std::string_view rest = std::string_view(*n).substr(p.size());
      const size_t slash = rest.find('/');
      const std::string child(rest.substr(0, slash));
      const bool bad = child.empty() || child == "." || child == "..";
      if (slash == std::string_view::npos) {
        if (bad) {
          pos = k + 3;
          continue;
        }
        slot.fillStat(encode({d.slot, kFileLevel, k}), false, &*e, &st);
        full = !add(child.c_str(), st, true, k + 3);
        continue;
      }
      // A directory: its entries run to the first name past "<child>/"
      // ('0' follows '/').
      auto end = r.lowerBound(p + child + "0");
      if (!end.ok()) return errorOf(end.status());
      bool skip = bad || d.level + 1 > kMaxLevel;
      if (!skip) {
        auto file = r.find(p + child);  // a file of the same name wins
        if (!file.ok()) return errorOf(file.status());
        skip = file->has_value();
      }
      if (skip) {
        pos = *end + 2;
        continue;
      }
      slot.fillStat(encode({d.slot, d.level + 1, k}), true, nullptr, &st);
      full = !add(child.c_str(), st, true, *end + 2);
    }
  }
  if (added_lookups > 0) {
    std::lock_guard lock(mu_);
    slot.lookups += added_lookups;
  }
  return {};
}

}  // namespace cistern::fuse
