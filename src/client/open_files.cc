// libcistern's open files: the open-inode table, the handles (File) on it,
// open/openAt/createAt, holds for files unlinked while open, and memory
// shared with same-host servers for direct reads.
#include "client/open_files.h"

#include <fmt/format.h>

#include "client/methods.h"
#include "proto/file_type.h"

namespace cistern::client {

std::shared_ptr<OpenInode> OpenFiles::acquire(ClientImpl* client, const meta::Inode& inode,
                                              const std::string& name) {
  std::lock_guard lock(mu_);
  auto& node = open_[inode.ino()];
  if (!node) {
    node = std::make_shared<OpenInode>();
    node->ino = inode.ino();
    node->file = std::make_unique<FileImpl>(client, name, inode);
    if (buffered_ < buffered_max_) {
      node->buffered = true;
      ++buffered_;
    } else {
      node->file->setUnbuffered();
    }
    open_count_.store(open_.size(), std::memory_order_relaxed);
  }
  ++node->handles;
  return node;
}

std::shared_ptr<OpenInode> OpenFiles::find(uint64_t ino) {
  if (empty()) return nullptr;
  std::lock_guard lock(mu_);
  auto it = open_.find(ino);
  return it == open_.end() ? nullptr : it->second;
}

uint32_t OpenFiles::handles(const OpenInode& node) {
  std::lock_guard lock(mu_);
  return node.handles;
}

bool OpenFiles::drop(OpenInode& node, uint64_t* hold) {
  std::lock_guard lock(mu_);
  *hold = 0;
  if (--node.handles > 0) return false;
  open_.erase(node.ino);
  open_count_.store(open_.size(), std::memory_order_relaxed);
  if (node.buffered) --buffered_;
  *hold = node.hold_session;
  node.hold_session = 0;
  return true;
}

bool OpenFiles::hasHold(const OpenInode& node) {
  std::lock_guard lock(mu_);
  return node.hold_session != 0;
}

bool OpenFiles::keepHold(OpenInode& node, uint64_t session) {
  std::lock_guard lock(mu_);
  if (node.hold_session != 0 || node.handles == 0) return false;
  node.hold_session = session;
  return true;
}

namespace {

// O_TRUNC needs write permission even with O_RDONLY (Linux truncates then).
bool opensForWrite(int flags) { return (flags & O_ACCMODE) != O_RDONLY || (flags & O_TRUNC); }

// A File: one open of an inode, on the inode's shared FileImpl.
class FileHandle final : public File {
 public:
  FileHandle(ClientImpl* client, std::shared_ptr<OpenInode> node, uint64_t session, int flags,
             std::string name)
      : client_(client),
        node_(std::move(node)),
        name_(std::move(name)),
        session_(session),
        read_((flags & O_ACCMODE) != O_WRONLY),
        write_((flags & O_ACCMODE) != O_RDONLY),
        append_((flags & O_APPEND) != 0),
        direct_((flags & O_DIRECT) != 0) {}
  ~FileHandle() override {
    if (!closed_.load()) (void)close();
  }

  Error pread(void* buf, size_t n, uint64_t offset, size_t* done) override {
    *done = 0;
    if (closed_.load() || !read_) return badDescriptor();
    return direct_ ? node_->file->preadDirect(buf, n, offset, done)
                   : node_->file->pread(buf, n, offset, done);
  }
  Error preadMany(std::span<FileRange> ranges) override {
    for (auto& r : ranges) r.done = 0;
    if (closed_.load() || !read_) return badDescriptor();
    return direct_ ? node_->file->preadManyDirect(ranges) : File::preadMany(ranges);
  }
  Error pwrite(const void* buf, size_t n, uint64_t offset, size_t* done) override {
    *done = 0;
    if (closed_.load() || !write_) return badDescriptor();
    return direct_ ? node_->file->pwriteDirect(buf, n, offset, done, append_)
                   : node_->file->pwrite(buf, n, offset, done, append_);
  }
  Error fsync() override {
    if (closed_.load()) return badDescriptor();
    return node_->file->sync();
  }
  Error flush(bool end_session) override {
    if (closed_.load()) return badDescriptor();
    if (!write_ && session_.load() == 0) return {};
    return node_->file->syncAndEnd(end_session ? session_.exchange(0) : 0);
  }
  Error close() override {
    if (closed_.exchange(true)) return badDescriptor();
    return client_->releaseHandle(*node_, session_.exchange(0));
  }
  uint64_t size() const override { return node_->file->size(); }
  uint64_t ino() const override { return node_->ino; }
  bool wholeContents(std::string* out) const override {
    return read_ && !closed_.load() && node_->file->wholeContents(out);
  }
  FileInfo info() const override {
    FileInfo i = toInfo(node_->file->lastInode());
    i.size = node_->file->size();
    i.mode = node_->mode.load();
    return i;
  }
  Error allocate(uint64_t end) override {
    if (closed_.load() || !write_) return badDescriptor();
    return node_->file->extendTo(end);
  }
  uint32_t openHandles() const override { return client_->openFiles().handles(*node_); }

 private:
  Error badDescriptor() const { return Error{EBADF, name_ + ": Bad file descriptor"}; }

  ClientImpl* const client_;
  const std::shared_ptr<OpenInode> node_;
  const std::string name_;
  std::atomic<uint64_t> session_;  // this handle's meta session (0: none or ended)
  const bool read_, write_, append_, direct_;
  std::atomic<bool> closed_{false};
};

class SharedWindow final : public SharedBuffer {
 public:
  explicit SharedWindow(size_t n) : size_(n) {}
  bool borrow(ShmSlots* shm) { return window_.borrow(shm, size_); }
  uint8_t* data() override { return window_.data(); }
  size_t size() const override { return size_; }
  bool intact() override { return window_.intact(); }

 private:
  ShmWindow window_;
  const size_t size_;
};

}  // namespace

std::unique_ptr<SharedBuffer> ClientImpl::borrowSharedBuffer(size_t n) {
  if (!shm_ || n == 0) return nullptr;
  auto b = std::make_unique<SharedWindow>(n);
  if (!b->borrow(shm_.get())) return nullptr;
  return b;
}

Error ClientImpl::attachHandle(const meta::Inode& inode, uint64_t session, int flags, bool fresh,
                               std::string inline_data, const std::string& name,
                               std::unique_ptr<File>* out, FileInfo* info) {
  auto node = open_files_->acquire(this, inode, name);
  // A file this open created may end with its bytes inline; any other open
  // says whether they are (and they are the ones to read then).
  if (fresh && session != 0) {
    node->file->setFresh();
  } else {
    node->file->adoptOpen(inode, std::move(inline_data));
  }
  node->mode = meta::typeBits(inode.type()) | (inode.mode() & 07777);
  if (info) {
    *info = toInfo(inode);
    info->size = node->file->size();
  }
  *out = std::make_unique<FileHandle>(this, std::move(node), session, flags, name);
  return {};
}

namespace {
// Only regular files open through the library.
Error openable(const meta::Inode& inode, const std::string& name) {
  if (inode.type() == meta::DIRECTORY) return toError(Status(ErrorCode::kIsDirectory), name);
  if (meta::isSpecial(inode.type())) {
    return Error{ENXIO, name +
                            ": a FIFO, socket or device moves its data through the kernel: "
                            "open it through a mount"};
  }
  if (inode.type() != meta::REGULAR)
    return toError(Status(ErrorCode::kInvalidArgument, "not a regular file"), name);
  return {};
}
}  // namespace

Error ClientImpl::openInode(const meta::Caller& who, const meta::Inode& inode, int flags,
                            const std::string& name, std::unique_ptr<File>* out, FileInfo* info,
                            bool type_unknown) {
  out->reset();
  const int acc = flags & O_ACCMODE;
  if (acc == O_ACCMODE)
    return toError(Status(ErrorCode::kInvalidArgument, "bad access mode in open flags"), name);
  if (!type_unknown) {
    if (Error e = openable(inode, name)) return e;
  }
  const uint64_t ino = inode.ino();
  const bool write = opensForWrite(flags);
  const bool trunc = (flags & O_TRUNC) != 0;
  std::shared_ptr<OpenInode> open_here;
  if (trunc) {
    // The old bytes leave storage before the open commits the empty file, so
    // that none shows through a hole of the new contents; also the bytes
    // this client wrote and has not recorded yet.
    uint64_t local_size = 0;
    if ((open_here = open_files_->find(ino))) {
      if (Status f = open_here->file->flushBuffers(); !f.ok()) return toError(f, name);
      local_size = open_here->file->size();
    }
    int mask = W_OK | (acc != O_WRONLY ? R_OK : 0);
    auto cut = cutForTruncate(who, ino, mask, 0, local_size);
    if (!cut.ok()) return toError(cut.status(), name);
  }
  meta::OpenReq req;
  *req.mutable_caller() = who;
  req.set_ino(ino);
  req.set_read(acc != O_WRONLY);
  req.set_write(write);
  req.set_truncate(trunc);
  stamp(&req);
  meta::OpenResp resp;
  Status s = metaCall(kOpen(), req, &resp);
  forgetAttrs(ino);
  if (!s.ok()) return toError(s, name);
  noteCapability(ino, resp.capability());
  if (write) noteReservation(ino, resp.under_quota(), resp.reserve_to());
  if (type_unknown) {
    if (Error e = openable(resp.inode(), name)) return e;  // a read open: nothing to undo
  }
  if (open_here) open_here->file->setSize(0);
  if (write) {
    // Writes go to chunks: an inline file's bytes move there first.
    if (Status c = prepareWrites(&resp); !c.ok()) return toError(c, name);
  }
  return attachHandle(resp.inode(), resp.session(), flags, false,
                      std::move(*resp.mutable_inline_data()), name, out, info);
}

Error ClientImpl::createIn(const meta::Caller& who, uint64_t parent, const std::string& entry,
                           uint32_t mode, int flags, const std::string& name,
                           std::unique_ptr<File>* out, FileInfo* info, bool* created) {
  out->reset();
  if (created) *created = false;
  if ((flags & O_ACCMODE) == O_ACCMODE)
    return toError(Status(ErrorCode::kInvalidArgument, "bad access mode in open flags"), name);
  meta::CreateReq req;
  *req.mutable_caller() = who;
  req.set_parent(parent);
  req.set_name(entry);
  req.set_mode(mode & 07777);
  req.set_exclusive((flags & O_EXCL) != 0);
  req.set_open_write(opensForWrite(flags));
  stamp(&req);
  meta::InodeResp resp;
  Status s = metaCall(kCreate(), req, &resp);
  forget(parent, entry);
  if (!s.ok()) return toError(s, name);
  noteCapability(resp.inode().ino(), resp.capability());
  if (resp.session() != 0)
    noteReservation(resp.inode().ino(), resp.under_quota(), resp.reserve_to());
  // An existing file is opened as open(2) would; a new one is open already
  // (for writing, with the session Create took), whatever its mode says.
  if (!resp.created()) return openInode(who, resp.inode(), flags, name, out, info);
  if (created) *created = true;
  return attachHandle(resp.inode(), resp.session(), flags, true, {}, name, out, info);
}

Error ClientImpl::open(const std::string& path, int flags, uint32_t mode,
                       std::unique_ptr<File>* out) {
  out->reset();
  auto parts = split(path);
  if (!parts.ok()) return toError(parts.status(), path);
  if (flags & O_CREAT) {
    if (parts->empty()) return toError(Status(ErrorCode::kIsDirectory), path);
    auto p = resolveParent(*parts);
    if (!p.ok()) return toError(p.status(), path);
    return createIn(caller(), p->ino(), parts->back(), mode, flags, path, out, nullptr, nullptr);
  }
  auto n = resolve(*parts, parts->size());
  if (!n.ok()) return toError(n.status(), path);
  return openInode(caller(), *n, flags, path, out, nullptr);
}

Error ClientImpl::openAt(const Credentials& who, uint64_t ino, int flags,
                         std::unique_ptr<File>* out, FileInfo* info) {
  out->reset();
  // A read open is a read-only transaction at meta that answers with the
  // inode: its type is checked on that answer (one meta call, not two).
  if ((flags & O_ACCMODE) == O_RDONLY && !(flags & O_TRUNC)) {
    meta::Inode known;
    known.set_ino(ino);
    return openInode(callerOf(who), known, flags, fmt::format("inode {}", ino), out, info,
                     /*type_unknown=*/true);
  }
  auto n = getattr(ino);
  if (!n.ok()) return toError(n.status(), fmt::format("inode {}", ino));
  return openInode(callerOf(who), *n, flags, fmt::format("inode {}", ino), out, info);
}

Error ClientImpl::createAt(const Credentials& who, uint64_t parent, const std::string& name,
                           uint32_t mode, int flags, std::unique_ptr<File>* out, FileInfo* info,
                           bool* created) {
  return createIn(callerOf(who), parent, name, mode, flags,
                  fmt::format("inode {}/{}", parent, name), out, info, created);
}

Error ClientImpl::releaseHandle(OpenInode& node, uint64_t session) {
  Error result;
  if (session != 0) result = node.file->syncAndEnd(session);
  uint64_t hold = 0;
  if (!open_files_->drop(node, &hold)) return result;
  // The last handle: the length this client has not recorded yet, and the
  // hold if one was taken. The FileImpl goes with the last reference (a
  // concurrent setattr may still hold the node from find()).
  Error e = node.file->syncAndEnd(hold);
  return result ? result : e;
}

void ClientImpl::holdIfOpen(uint64_t parent, const std::string& name) {
  if (open_files_->empty()) return;
  FileInfo found;
  if (lookup(Credentials{}, parent, name, &found)) return;
  auto node = open_files_->find(found.ino);
  if (!node || open_files_->hasHold(*node)) return;
  meta::OpenReq req;
  *req.mutable_caller() = caller_;
  req.mutable_caller()->set_uid(0);  // the client keeps what its users opened
  req.set_ino(found.ino);
  req.set_read(true);
  req.set_hold(true);
  stamp(&req);
  meta::OpenResp resp;
  if (!metaCall(kOpen(), req, &resp).ok()) return;
  // Raced with the last close: end it again.
  if (!open_files_->keepHold(*node, resp.session()))
    (void)metaClose(found.ino, resp.session(), 0, false);
}

}  // namespace cistern::client
