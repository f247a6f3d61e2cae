// FUSE directory listing. The kernel asks by offset; the meta service pages
// by name cookie. A handle keeps one page (at most kPage entries) as a
// window: offset 0 is ".", 1 is "..", entry i of the listing is 2 + i. A
// seek outside the window restarts from the beginning (rewinddir), so memory
// per open directory stays bounded whatever its size.
#include <sys/stat.h>

#include <cstring>
#include <mutex>
#include <vector>

#include "fuse/ops.h"
#include "fuse/pack_view.h"

namespace cistern::fuse::ops {

namespace {

constexpr uint32_t kPage = 512;

struct DirHandle {
  std::mutex mu;
  uint64_t ino = 0;
  uint64_t parent = 0;
  uint64_t base = 2;  // offset of window[0]
  std::vector<DirEntry> window;
  std::string next_cookie;  // of the page after the window
  bool eof = false;
  bool loaded = false;
  bool plus = false;  // the window has the entries' attributes
};

DirHandle* dirOf(fuse_file_info* fi) { return reinterpret_cast<DirHandle*>(fi->fh); }

// Loads the page after the window (or the first page when `restart`).
Error nextPage(FuseFs& f, fuse_req_t req, DirHandle* d, bool plus, bool restart) {
  DirPage page;
  const std::string cookie = restart ? std::string() : d->next_cookie;
  if (Error e = f.client().readdirAt(f.who(req), d->ino, cookie, kPage, plus, &page)) return e;
  d->plus = plus;
  d->base = restart ? 2 : d->base + d->window.size();
  d->window = std::move(page.entries);
  d->next_cookie = std::move(page.next_cookie);
  d->eof = d->next_cookie.empty();
  d->loaded = true;
  return {};
}

int fill(fuse_req_t req, DirHandle* d, std::vector<char>& buf, size_t& used, off_t off, bool plus) {
  FuseFs& f = fs(req);
  std::lock_guard lock(d->mu);
  const size_t size = buf.size();
  uint64_t pos = static_cast<uint64_t>(off);
  auto add = [&](const char* name, const struct stat& st, const FileInfo* info) -> bool {
    size_t need;
    if (plus) {
      fuse_entry_param e;
      if (info) {  // counts as a lookup for the kernel; "." and ".." do not
        e = f.entryOf(*info);
      } else {
        std::memset(&e, 0, sizeof(e));
        e.attr = st;
      }
      need = fuse_add_direntry_plus(req, buf.data() + used, size - used, name, &e,
                                    static_cast<off_t>(pos + 1));
    } else {
      need = fuse_add_direntry(req, buf.data() + used, size - used, name, &st,
                               static_cast<off_t>(pos + 1));
    }
    if (need > size - used) return false;
    used += need;
    ++pos;
    return true;
  };
  struct stat st;
  std::memset(&st, 0, sizeof(st));
  st.st_mode = S_IFDIR;
  if (pos == 0) {
    st.st_ino = d->ino;
    if (!add(".", st, nullptr)) goto done;
  }
  if (pos == 1) {
    st.st_ino = d->parent;
    if (!add("..", st, nullptr)) goto done;
  }
  for (;;) {
    // Position the window over `pos`.
    if (!d->loaded || pos < d->base || (plus && !d->plus)) {
      if (Error e = nextPage(f, req, d, plus, true)) return e.errno_value;
    }
    while (pos >= d->base + d->window.size() && !d->eof) {
      if (Error e = nextPage(f, req, d, plus, false)) return e.errno_value;
    }
    if (pos >= d->base + d->window.size()) {  // end of the directory
      f.noteListed(d->ino);
      break;
    }
    const DirEntry& entry = d->window[static_cast<size_t>(pos - d->base)];
    std::memset(&st, 0, sizeof(st));
    st.st_ino = entry.info.ino;
    st.st_mode = entry.info.mode & S_IFMT;
    // Removed between the listing and its attributes: a plain entry.
    const FileInfo* info = plus && entry.info.nlink > 0 ? &entry.info : nullptr;
    if (plus && !info) std::memset(&st, 0, sizeof(st));
    if (!add(entry.name.c_str(), st, info)) break;
  }
done:
  return 0;
}

void list(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi, bool plus) {
  std::vector<char> buf(size);
  size_t used = 0;
  if (PackViews::isView(ino)) {
    if (fs(req).answered(
            req, fs(req).views().readdir(req, ino, off, plus, buf.data(), buf.size(), &used)))
      fuse_reply_buf(req, buf.data(), used);
    return;
  }
  if (int err = fill(req, dirOf(fi), buf, used, off, plus)) {
    replyErr(req, err);
    return;
  }
  fuse_reply_buf(req, buf.data(), used);
}

}  // namespace

void opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi) {
  CISTERN_FUSE_OP("opendir");
  FuseFs& f = fs(req);
  if (PackViews::isView(ino)) {
    // Listed from the pack's index by offset: no handle state.
    struct stat st;
    if (!f.answered(req, f.views().getattr(ino, &st))) return;
    if (!S_ISDIR(st.st_mode)) {
      replyErr(req, ENOTDIR);
      return;
    }
    fi->fh = 0;
    fuse_reply_open(req, fi);
    return;
  }
  // opendir(3) needs read permission, like open(O_RDONLY).
  if (!f.answered(req, f.client().access(f.who(req), ino, R_OK))) return;
  FileInfo info;
  if (!f.answered(req, f.client().getattr(ino, &info))) return;
  if (!info.isDir()) {
    replyErr(req, ENOTDIR);
    return;
  }
  auto* d = new DirHandle;
  d->ino = ino;
  d->parent = info.parent ? info.parent : ino;
  fi->fh = reinterpret_cast<uint64_t>(d);
  // The kernel keeps the listing in its page cache, for entry_timeout from
  // when this mount last read one to the end (FuseFs::listingFresh).
  if (f.options().entry_timeout_s > 0) {
    fi->cache_readdir = 1;
    fi->keep_cache = f.listingFresh(ino);
  }
  if (fuse_reply_open(req, fi) != 0) delete d;
}

void readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  CISTERN_FUSE_OP("readdir");
  list(req, ino, size, off, fi, false);
}

void readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi) {
  CISTERN_FUSE_OP("readdirplus");
  list(req, ino, size, off, fi, true);
}

// fsync of a directory: every namespace change acknowledged so far durable
// (meta's KV commits them unsynced; docs/fuse.md, "Durability").
void fsyncdir(fuse_req_t req, fuse_ino_t, int, fuse_file_info*) {
  CISTERN_FUSE_OP("fsyncdir");
  Error e = fs(req).client().syncNamespace();
  replyErr(req, e ? e.errno_value : 0);
}

void releasedir(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  CISTERN_FUSE_OP("releasedir");
  delete dirOf(fi);
  replyErr(req, 0);
}

}  // namespace cistern::fuse::ops
