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

namespace cistern::fuse::ops {

namespace {

constexpr uint32_t kPage = 512;

struct DirHandle {
  std::mutex mu;
  uint64_t ino = 0;
  uint64_t parent = 0;
  uint64_t base = 2;  // offset of window[0]
  std::vector<std::string> names;
  std::vector<meta::DirEntry> entries;
  std::vector<meta::Inode> inodes;  // readdirplus pages
  std::string next_cookie;          // of the page after the window
  bool eof = false;
  bool loaded = false;
  bool plus = false;
};

DirHandle* dirOf(fuse_file_info* fi) { return reinterpret_cast<DirHandle*>(fi->fh); }

// Loads the page after the window (or the first page when `restart`).
Status nextPage(FuseFs& f, fuse_req_t req, DirHandle* d, bool plus, bool restart) {
  meta::ReaddirReq in;
  *in.mutable_caller() = f.caller(req);
  in.set_ino(d->ino);
  in.set_limit(kPage);
  in.set_plus(plus);
  if (!restart) in.set_cookie(d->next_cookie);
  meta::ReaddirResp out;
  RETURN_ON_ERROR(f.meta("Readdir", in, &out));
  d->base = restart ? 2 : d->base + d->names.size();
  d->names.assign(out.names().begin(), out.names().end());
  d->entries.assign(out.entries().begin(), out.entries().end());
  d->inodes.assign(out.inodes().begin(), out.inodes().end());
  d->next_cookie = out.next_cookie();
  d->eof = out.next_cookie().empty() || out.names_size() == 0;
  d->loaded = true;
  d->plus = plus;
  return Status::OK();
}

// Fills `buf` with entries from offset `off`; returns 0 or an errno. The
// reply is sent by the caller after the handle's lock is released: once the
// kernel has it, a releasedir may free the handle.
int fill(fuse_req_t req, DirHandle* d, std::vector<char>& buf, size_t& used, off_t off, bool plus) {
  FuseFs& f = fs(req);
  std::lock_guard lock(d->mu);
  const size_t size = buf.size();
  uint64_t pos = static_cast<uint64_t>(off);
  auto add = [&](const char* name, const struct stat& st, const meta::Inode* inode) -> bool {
    size_t need;
    if (plus) {
      fuse_entry_param e;
      if (inode) {  // counts as a lookup for the kernel; "." and ".." do not
        e = f.entryOf(*inode);
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
      Status s = nextPage(f, req, d, plus, true);
      if (!s.ok()) return replyErrno(s);
    }
    while (pos >= d->base + d->names.size() && !d->eof) {
      Status s = nextPage(f, req, d, plus, false);
      if (!s.ok()) return replyErrno(s);
    }
    if (pos >= d->base + d->names.size()) break;  // end of the directory
    size_t i = static_cast<size_t>(pos - d->base);
    std::memset(&st, 0, sizeof(st));
    st.st_ino = d->entries[i].ino();
    st.st_mode = meta::typeBits(d->entries[i].type());
    const meta::Inode* inode = plus && i < d->inodes.size() ? &d->inodes[i] : nullptr;
    if (plus && !inode) {
      // Not in the page (removed meanwhile): a plain entry.
      std::memset(&st, 0, sizeof(st));
    }
    if (!add(d->names[i].c_str(), st, inode)) break;
  }
done:
  return 0;
}

void list(fuse_req_t req, size_t size, off_t off, fuse_file_info* fi, bool plus) {
  std::vector<char> buf(size);
  size_t used = 0;
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
  meta::AccessReq check;  // opendir(3) needs read permission, like open(O_RDONLY)
  *check.mutable_caller() = f.caller(req);
  check.set_ino(ino);
  check.set_mask(R_OK);
  meta::Empty ok;
  if (!f.call(req, "Access", check, &ok)) return;
  meta::GetattrReq in;
  in.set_ino(ino);
  meta::InodeResp out;
  if (!f.call(req, "Getattr", in, &out)) return;
  if (out.inode().type() != meta::DIRECTORY) {
    replyErr(req, ENOTDIR);
    return;
  }
  auto* d = new DirHandle;
  d->ino = ino;
  d->parent = out.inode().parent() ? out.inode().parent() : ino;
  fi->fh = reinterpret_cast<uint64_t>(d);
  if (fuse_reply_open(req, fi) != 0) delete d;
}

void readdir(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) {
  CISTERN_FUSE_OP("readdir");
  list(req, size, off, fi, false);
}

void readdirplus(fuse_req_t req, fuse_ino_t, size_t size, off_t off, fuse_file_info* fi) {
  CISTERN_FUSE_OP("readdirplus");
  list(req, size, off, fi, true);
}

void releasedir(fuse_req_t req, fuse_ino_t, fuse_file_info* fi) {
  CISTERN_FUSE_OP("releasedir");
  delete dirOf(fi);
  replyErr(req, 0);
}

}  // namespace cistern::fuse::ops
