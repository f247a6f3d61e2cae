// The Python module `cistern._cistern` (pybind11) over libcistern
// (include/cistern/client.h): a connection and file objects that behave like
// Python's own. `python/cistern/__init__.py` re-exports it and adds what is
// plain Python (walk). Every call that talks to the cluster releases the GIL;
// errors are OSError subclasses chosen by errno (FileNotFoundError, ...),
// with errno, strerror and the path set.
#include <fcntl.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <mutex>
#include <string>

#include "cistern/client.h"
#include "ckpt/checkpoint.h"
#include "common/metrics.h"
#include "pack/pack.h"
#include "pack/prefetch.h"

namespace py = pybind11;

namespace cistern::python {
namespace {

// Raises the OSError subclass Python picks for `e.errno_value`.
[[noreturn]] void raise(const Error& e, const std::string& path) {
  py::gil_scoped_acquire gil;
  py::object err =
      py::module_::import("builtins")
          .attr("OSError")(
              e.errno_value,
              e.message.empty() ? std::string(std::strerror(e.errno_value)) : e.message, path);
  PyErr_SetObject(reinterpret_cast<PyObject*>(Py_TYPE(err.ptr())), err.ptr());
  throw py::error_already_set();
}

void check(const Error& e, const std::string& path) {
  if (e) raise(e, path);
}

// f() with the GIL released: other Python threads run while it waits on
// the cluster.
template <typename F>
auto withoutGil(F f) {
  py::gil_scoped_release nogil;
  return f();
}

// open()'s mode string ("r", "rb", "w", "wb", "a", "r+", "x", ...) as flags.
int flagsOf(const std::string& mode) {
  int access = O_RDONLY, extra = 0;
  bool plus = mode.find('+') != std::string::npos;
  switch (mode.empty() ? 'r' : mode[0]) {
    case 'r':
      access = plus ? O_RDWR : O_RDONLY;
      break;
    case 'w':
      access = plus ? O_RDWR : O_WRONLY;
      extra = O_CREAT | O_TRUNC;
      break;
    case 'a':
      access = plus ? O_RDWR : O_WRONLY;
      extra = O_CREAT | O_APPEND;
      break;
    case 'x':
      access = plus ? O_RDWR : O_WRONLY;
      extra = O_CREAT | O_EXCL;
      break;
    default:
      throw py::value_error("invalid mode: '" + mode + "'");
  }
  for (char c : mode) {
    if (std::string("rwaxb+").find(c) == std::string::npos)
      throw py::value_error("invalid mode: '" + mode + "'");
  }
  if (mode.find('b') == std::string::npos) {
    throw py::value_error("mode '" + mode +
                          "': text mode is not supported, use binary ('rb', 'wb', 'ab', ...)");
  }
  return access | extra;
}

// A contiguous writable (or readable) buffer of any object that exports one
// (bytearray, memoryview, numpy arrays, torch tensors on the CPU).
py::buffer_info bufferOf(const py::buffer& b, bool writable) {
  py::buffer_info info;
  try {
    info = b.request(writable);
  } catch (py::error_already_set& e) {
    if (!e.matches(PyExc_BufferError)) throw;
    throw py::type_error(
        "a writable bytes-like object is required (bytearray, memoryview, "
        "numpy array, tensor), not '" +
        std::string(Py_TYPE(b.ptr())->tp_name) + "'");
  }
  if (info.ndim > 1) {
    // C-contiguous: strides descending, the last one the item size.
    py::ssize_t expect = info.itemsize;
    for (py::ssize_t d = info.ndim - 1; d >= 0; --d) {
      if (info.strides[static_cast<size_t>(d)] != expect)
        throw py::value_error("buffer is not C-contiguous");
      expect *= info.shape[static_cast<size_t>(d)];
    }
  } else if (info.ndim == 1 && info.strides[0] != info.itemsize) {
    throw py::value_error("buffer is not contiguous");
  }
  return info;
}

py::object statResult(const FileInfo& i) {
  py::object os = py::module_::import("os");
  // os.stat_result(st_mode, st_ino, st_dev, st_nlink, st_uid, st_gid,
  // st_size, st_atime, st_mtime, st_ctime) plus the _ns fields by keyword
  // index: built from a 16-tuple as os.stat does.
  py::tuple t(16);
  t[0] = i.mode;
  t[1] = i.ino;
  t[2] = 0;
  t[3] = i.nlink;
  t[4] = i.uid;
  t[5] = i.gid;
  t[6] = i.size;
  t[7] = static_cast<int64_t>(i.atime_ns / 1000000000);
  t[8] = static_cast<int64_t>(i.mtime_ns / 1000000000);
  t[9] = static_cast<int64_t>(i.ctime_ns / 1000000000);
  t[10] = static_cast<double>(i.atime_ns) / 1e9;
  t[11] = static_cast<double>(i.mtime_ns) / 1e9;
  t[12] = static_cast<double>(i.ctime_ns) / 1e9;
  t[13] = i.atime_ns;
  t[14] = i.mtime_ns;
  t[15] = i.ctime_ns;
  return os.attr("stat_result")(t);
}

// A native object made before a fork() is leaked, not destroyed, in the
// child: its destructor would wait on threads (the client's, the
// prefetcher's) that only the parent has. DataLoader workers fork, and
// the parent's garbage may be collected in them.
template <typename T>
void releaseIfForked(std::unique_ptr<T>& p, pid_t owner) {
  if (::getpid() != owner) (void)p.release();
}

class PyFile {
 public:
  PyFile(std::unique_ptr<File> f, std::string path, int flags)
      : f_(std::move(f)), path_(std::move(path)), flags_(flags) {
    if (flags & O_APPEND) pos_ = f_->size();
  }
  ~PyFile() {
    releaseIfForked(f_, pid_);
    if (f_) {
      py::gil_scoped_release nogil;
      (void)f_->close();
    }
  }

  py::bytes read(py::ssize_t n) {
    ensure(true, false);
    const uint64_t size = f_->size();
    uint64_t want = n < 0 ? (size > pos_ ? size - pos_ : 0) : static_cast<uint64_t>(n);
    std::string out(want, '\0');
    size_t done = 0;
    check(withoutGil([&] { return f_->pread(out.data(), want, pos_, &done); }), path_);
    pos_ += done;
    out.resize(done);
    return py::bytes(out);
  }
  // Into the caller's buffer, no copy through Python objects.
  size_t readinto(const py::buffer& b) {
    ensure(true, false);
    py::buffer_info info = bufferOf(b, true);
    const size_t n = static_cast<size_t>(info.size * info.itemsize);
    size_t done = 0;
    check(withoutGil([&] { return f_->pread(info.ptr, n, pos_, &done); }), path_);
    pos_ += done;
    return done;
  }
  py::bytes pread(size_t n, uint64_t offset) {
    ensure(true, false);
    std::string out(n, '\0');
    size_t done = 0;
    check(withoutGil([&] { return f_->pread(out.data(), n, offset, &done); }), path_);
    out.resize(done);
    return py::bytes(out);
  }
  size_t preadinto(const py::buffer& b, uint64_t offset) {
    ensure(true, false);
    py::buffer_info info = bufferOf(b, true);
    size_t done = 0;
    check(withoutGil([&] {
            return f_->pread(info.ptr, static_cast<size_t>(info.size * info.itemsize), offset,
                             &done);
          }),
          path_);
    return done;
  }
  size_t write(const py::buffer& b) {
    ensure(false, true);
    py::buffer_info info = bufferOf(b, false);
    const size_t n = static_cast<size_t>(info.size * info.itemsize);
    if (flags_ & O_APPEND) pos_ = f_->size();
    size_t done = 0;
    check(withoutGil([&] { return f_->pwrite(info.ptr, n, pos_, &done); }), path_);
    pos_ += done;
    return done;
  }
  size_t pwrite(const py::buffer& b, uint64_t offset) {
    ensure(false, true);
    py::buffer_info info = bufferOf(b, false);
    size_t done = 0;
    check(withoutGil([&] {
            return f_->pwrite(info.ptr, static_cast<size_t>(info.size * info.itemsize), offset,
                              &done);
          }),
          path_);
    return done;
  }
  uint64_t seek(int64_t offset, int whence) {
    ensure(false, false);
    int64_t base = whence == 0   ? 0
                   : whence == 1 ? static_cast<int64_t>(pos_)
                   : whence == 2 ? static_cast<int64_t>(f_->size())
                                 : throw py::value_error("whence must be 0, 1 or 2");
    if (base + offset < 0) raise(Error{EINVAL, "negative seek position"}, path_);
    pos_ = static_cast<uint64_t>(base + offset);
    return pos_;
  }
  uint64_t tell() {
    ensure(false, false);
    return pos_;
  }
  void flush() {
    ensure(false, false);
    check(withoutGil([&] { return f_->flush(); }), path_);
  }
  void fsync() {
    ensure(false, false);
    check(withoutGil([&] { return f_->fsync(); }), path_);
  }
  void close() {
    if (!f_) return;
    Error e;
    {
      py::gil_scoped_release nogil;
      e = f_->close();
    }
    f_.reset();
    check(e, path_);
  }
  bool closed() const { return !f_; }
  uint64_t size() {
    ensure(false, false);
    return f_->size();
  }
  const std::string& name() const { return path_; }
  bool readable() const { return (flags_ & O_ACCMODE) != O_WRONLY; }
  bool writable() const { return (flags_ & O_ACCMODE) != O_RDONLY; }

 private:
  void ensure(bool reading, bool writing) {
    if (!f_) throw py::value_error("I/O operation on closed file");
    if (reading && !readable()) raise(Error{EBADF, "file not open for reading"}, path_);
    if (writing && !writable()) raise(Error{EBADF, "file not open for writing"}, path_);
  }

  std::unique_ptr<File> f_;
  pid_t pid_ = ::getpid();
  std::string path_;
  int flags_;
  uint64_t pos_ = 0;
};

class PyClient {
 public:
  PyClient(const std::string& cluster, uint32_t retry_ms, const std::string& token) {
    Client::Options o;
    o.cluster = cluster;
    o.token = token;  // empty: $CISTERN_TOKEN, else none
    if (retry_ms) o.retry_ms = retry_ms;
    std::pair<std::unique_ptr<Client>, Error> r;
    {
      py::gil_scoped_release nogil;
      r = Client::connect(o);
    }
    check(r.second, cluster.empty() ? "$CISTERN_CLUSTER" : cluster);
    c_ = std::move(r.first);
  }

  ~PyClient() { releaseIfForked(c_, pid_); }

  std::unique_ptr<PyFile> open(const std::string& path, const std::string& mode, uint32_t perms) {
    const int flags = flagsOf(mode);
    std::unique_ptr<File> f;
    check(withoutGil([&] { return c_->open(path, flags, perms, &f); }), path);
    return std::make_unique<PyFile>(std::move(f), path, flags);
  }
  py::object stat(const std::string& path) {
    FileInfo info;
    check(withoutGil([&] { return c_->stat(path, &info); }), path);
    return statResult(info);
  }
  std::vector<std::string> listdir(const std::string& path) {
    std::vector<DirEntry> entries;
    check(withoutGil([&] { return c_->list(path, &entries); }), path);
    std::vector<std::string> out;
    out.reserve(entries.size());
    for (auto& d : entries) out.push_back(std::move(d.name));
    return out;
  }
  // (name, is_dir, stat_result) per entry: what os.scandir's DirEntry gives
  // without another call.
  py::list scandir(const std::string& path) {
    std::vector<DirEntry> entries;
    check(withoutGil([&] { return c_->list(path, &entries); }), path);
    py::list out;
    for (const auto& d : entries)
      out.append(py::make_tuple(d.name, d.info.isDir(), statResult(d.info)));
    return out;
  }
  void makedirs(const std::string& path, uint32_t mode, bool exist_ok) {
    Error e;
    FileInfo info;
    {
      py::gil_scoped_release nogil;
      if (exist_ok) {
        e = c_->mkdir(path, mode, /*parents=*/true);
      } else {
        e = c_->stat(path, &info);
        e = !e ? Error{EEXIST, path + ": exists"} : c_->mkdir(path, mode, /*parents=*/true);
      }
    }
    check(e, path);
  }
  void mkdir(const std::string& path, uint32_t mode) {
    run(path, [&] { return c_->mkdir(path, mode, false); });
  }
  void remove(const std::string& path) {
    run(path, [&] { return c_->unlink(path); });
  }
  void rmdir(const std::string& path) {
    run(path, [&] { return c_->rmdir(path); });
  }
  void rename(const std::string& from, const std::string& to) {
    run(from, [&] { return c_->rename(from, to); });
  }
  void truncate(const std::string& path, uint64_t size) {
    run(path, [&] { return c_->truncate(path, size); });
  }
  Client& client() { return *c_; }

  bool exists(const std::string& path) {
    FileInfo info;
    Error e;
    {
      py::gil_scoped_release nogil;
      e = c_->stat(path, &info);
    }
    if (!e) return true;
    if (e.errno_value == ENOENT || e.errno_value == ENOTDIR) return false;
    raise(e, path);
  }

 private:
  template <typename F>
  void run(const std::string& path, F f) {
    check(withoutGil([&] { return f(); }), path);
  }

  std::unique_ptr<Client> c_;
  pid_t pid_ = ::getpid();
};

// Status as the OSError (or ValueError for a bad argument) it stands for.
[[noreturn]] void raiseStatus(const Status& s, const std::string& path) {
  int e = EIO;
  switch (s.code()) {
    case ErrorCode::kNotFound:
      e = ENOENT;
      break;
    case ErrorCode::kAlreadyExists:
      e = EEXIST;
      break;
    case ErrorCode::kPermissionDenied:
      e = EACCES;
      break;
    case ErrorCode::kInvalidArgument:
      e = EINVAL;
      break;
    default:
      break;
  }
  raise(Error{e, std::string(s.message())}, path);
}

// A pack (docs/pack_format.md) opened for reading.
class PyPack {
 public:
  PyPack(PyClient& c, std::string path, uint64_t cache_bytes) : c_(c), path_(std::move(path)) {
    auto r = [&]() -> Result<std::unique_ptr<pack::PackReader>> {
      py::gil_scoped_release nogil;
      return pack::PackReader::open(c.client(), path_, {.cache_bytes = cache_bytes});
    }();
    if (!r.ok()) raiseStatus(r.status(), path_);
    r_ = std::move(*r);
  }
  uint64_t size() const { return r_->size(); }
  pack::Entry entry(int64_t i) {
    if (i < 0) i += static_cast<int64_t>(r_->size());
    if (i < 0 || static_cast<uint64_t>(i) >= r_->size())
      throw py::index_error("pack index out of range");
    auto e = [&]() -> Result<pack::Entry> {
      py::gil_scoped_release nogil;
      return r_->entry(static_cast<uint64_t>(i));
    }();
    if (!e.ok()) raiseStatus(e.status(), path_);
    return *e;
  }
  std::string name(int64_t i) {
    pack::Entry e = entry(i);
    auto n = [&]() -> Result<std::string> {
      py::gil_scoped_release nogil;
      return r_->name(e);
    }();
    if (!n.ok()) raiseStatus(n.status(), path_);
    return *n;
  }
  py::tuple info(int64_t i) {
    pack::Entry e = entry(i);
    py::object label = e.label == pack::kNoLabel ? py::none() : py::cast(e.label);
    return py::make_tuple(name(i), e.length, label, e.mtime_ns);
  }
  py::bytes read(int64_t i) {
    pack::Entry e = entry(i);
    std::string out(e.length, '\0');
    Status s;
    {
      py::gil_scoped_release nogil;
      s = r_->read(e, {reinterpret_cast<uint8_t*>(out.data()), out.size()});
    }
    if (!s.ok()) raiseStatus(s, path_);
    return py::bytes(out);
  }
  size_t readinto(int64_t i, const py::buffer& b) {
    pack::Entry e = entry(i);
    py::buffer_info info = bufferOf(b, true);
    const size_t n = static_cast<size_t>(info.size * info.itemsize);
    if (n < e.length) throw py::value_error("buffer smaller than the sample");
    Status s;
    {
      py::gil_scoped_release nogil;
      s = r_->read(e, {static_cast<uint8_t*>(info.ptr), n});
    }
    if (!s.ok()) raiseStatus(s, path_);
    return e.length;
  }
  py::object find(const std::string& name) {
    auto f = [&]() -> Result<std::optional<uint64_t>> {
      py::gil_scoped_release nogil;
      return r_->find(name);
    }();
    if (!f.ok()) raiseStatus(f.status(), path_);
    return *f ? py::cast(**f) : py::none();
  }
  void verify() {
    Status s;
    {
      py::gil_scoped_release nogil;
      s = r_->verify();
    }
    if (!s.ok()) raiseStatus(s, path_);
  }
  // (G, 2) int64: each WebDataset sample's [begin, end) entry range.
  py::array_t<int64_t> webdatasetGroups() {
    auto g = [&]() -> Result<std::vector<std::pair<uint64_t, uint64_t>>> {
      py::gil_scoped_release nogil;
      return r_->webdatasetGroups();
    }();
    if (!g.ok()) raiseStatus(g.status(), path_);
    py::array_t<int64_t> out({static_cast<py::ssize_t>(g->size()), py::ssize_t{2}});
    auto v = out.mutable_unchecked<2>();
    for (size_t i = 0; i < g->size(); ++i) {
      v(i, 0) = static_cast<int64_t>((*g)[i].first);
      v(i, 1) = static_cast<int64_t>((*g)[i].second);
    }
    return out;
  }
  PyClient& client() { return c_; }
  const std::string& path() const { return path_; }
  ~PyPack() { releaseIfForked(r_, pid_); }

 private:
  PyClient& c_;
  std::string path_;
  std::unique_ptr<pack::PackReader> r_;
  pid_t pid_ = ::getpid();
};

// Iterates (index, name, label, bytes) in a given order, read ahead in C++.
class PyPrefetch {
 public:
  PyPrefetch(PyPack& p, std::vector<uint64_t> order, uint32_t threads, uint64_t max_bytes) {
    pack::Prefetcher::Options o;
    o.threads = threads;
    o.max_bytes = max_bytes;
    auto r = [&]() -> Result<std::unique_ptr<pack::Prefetcher>> {
      py::gil_scoped_release nogil;
      return pack::Prefetcher::start(p.client().client(), p.path(), std::move(order), o);
    }();
    if (!r.ok()) raiseStatus(r.status(), p.path());
    p_ = std::move(*r);
    path_ = p.path();
  }
  py::tuple next() {
    auto s = [&]() -> Result<std::optional<pack::Prefetcher::Sample>> {
      py::gil_scoped_release nogil;
      return p_->next();
    }();
    if (!s.ok()) raiseStatus(s.status(), path_);
    if (!*s) throw py::stop_iteration();
    auto& v = **s;
    py::object label = v.label == pack::kNoLabel ? py::none() : py::cast(v.label);
    return py::make_tuple(v.index, v.name, label,
                          py::bytes(reinterpret_cast<const char*>(v.bytes.data()), v.bytes.size()));
  }
  uint64_t peakBytes() const { return p_->peakBytes(); }
  ~PyPrefetch() { releaseIfForked(p_, pid_); }

 private:
  std::unique_ptr<pack::Prefetcher> p_;
  pid_t pid_ = ::getpid();
  std::string path_;
};

// Checkpoints (src/ckpt/checkpoint.h) for python/cistern/ckpt.py: tensors
// cross as (name, dtype, shape, buffer of their bytes), read with the GIL
// released.
py::dict ckptSave(PyClient& c, const std::string& path, py::list tensors, const std::string& base,
                  std::map<std::string, std::string> metadata, uint64_t block_bytes, uint32_t rank,
                  uint32_t world_size, const std::string& codec) {
  std::vector<py::buffer_info> held;  // keeps the buffers alive and unmoved
  std::vector<ckpt::TensorData> ts;
  held.reserve(tensors.size());
  for (py::handle item : tensors) {
    auto t = item.cast<py::tuple>();
    if (t.size() != 4) throw py::value_error("a tensor is (name, dtype, shape, buffer)");
    auto dtype = ckpt::parseDType(t[1].cast<std::string>());
    if (!dtype) throw py::value_error("unknown dtype " + t[1].cast<std::string>());
    held.push_back(t[3].cast<py::buffer>().request());
    const py::buffer_info& b = held.back();
    ts.push_back({t[0].cast<std::string>(), *dtype, t[2].cast<std::vector<uint64_t>>(),
                  std::span<const uint8_t>(static_cast<const uint8_t*>(b.ptr),
                                           static_cast<size_t>(b.size * b.itemsize))});
  }
  ckpt::SaveOptions o;
  o.base = base;
  o.metadata = std::move(metadata);
  if (block_bytes) o.block_bytes = block_bytes;
  o.rank = rank;
  o.world_size = world_size;
  o.codec = codec;
  ckpt::SaveStats st;
  Status s = withoutGil([&] { return ckpt::save(c.client(), path, ts, o, &st); });
  if (!s.ok()) raiseStatus(s, path);
  py::dict out;
  out["tensors"] = st.tensors;
  out["tensors_reused"] = st.tensors_reused;
  out["bytes_written"] = st.bytes_written;
  out["bytes_reused"] = st.bytes_reused;
  out["reused"] = st.reused;
  return out;
}

// {"metadata": {...}, "base": str, "created_ns": int, "tensors": [(name,
// dtype, shape, bytes), ...]}
py::dict ckptManifest(PyClient& c, const std::string& path) {
  auto m = withoutGil([&] { return ckpt::readManifest(c.client(), path); });
  if (!m.ok()) raiseStatus(m.status(), path);
  py::dict out;
  out["metadata"] = m->metadata;
  out["base"] = m->base;
  out["created_ns"] = m->created_ns;
  py::list ts;
  for (const auto& t : m->tensors)
    ts.append(py::make_tuple(t.name, std::string(ckpt::dtypeName(t.dtype)), t.shape, t.bytes));
  out["tensors"] = ts;
  return out;
}

// Reads tensors `names` of the checkpoint into `buffers` (writable, each
// exactly the tensor's bytes), CRC-checked.
void ckptRead(PyClient& c, const std::string& path, std::vector<std::string> names,
              py::list buffers) {
  if (names.size() != buffers.size()) throw py::value_error("one buffer per name");
  std::vector<py::buffer_info> held;
  for (py::handle b : buffers) {
    held.push_back(b.cast<py::buffer>().request(/*writable=*/true));
  }
  Status s = withoutGil([&]() -> Status {
    ASSIGN_OR_RETURN(ckpt::Manifest m, ckpt::readManifest(c.client(), path));
    ckpt::TensorReader reader(c.client(), path);
    for (size_t i = 0; i < names.size(); ++i) {
      const ckpt::ManifestTensor* t = m.find(names[i]);
      if (!t) return Status(ErrorCode::kNotFound, "no tensor " + names[i] + " in " + path);
      std::span<uint8_t> out(static_cast<uint8_t*>(held[i].ptr),
                             static_cast<size_t>(held[i].size * held[i].itemsize));
      RETURN_ON_ERROR(reader.read(*t, out));
    }
    return Status::OK();
  });
  if (!s.ok()) raiseStatus(s, path);
}

void ckptCall(PyClient& c, const std::string& path, Status (*fn)(Client&, const std::string&)) {
  Status s = withoutGil([&] { return fn(c.client(), path); });
  if (!s.ok()) raiseStatus(s, path);
}
void ckptRemove(PyClient& c, const std::string& path) { ckptCall(c, path, ckpt::remove); }
void ckptCommit(PyClient& c, const std::string& path, uint32_t world_size) {
  Status s = withoutGil([&] { return ckpt::commit(c.client(), path, world_size); });
  if (!s.ok()) raiseStatus(s, path);
}
void ckptVerify(PyClient& c, const std::string& path) { ckptCall(c, path, ckpt::verify); }
std::vector<std::string> ckptList(PyClient& c, const std::string& root) {
  auto r = withoutGil([&] { return ckpt::list(c.client(), root); });
  if (!r.ok()) raiseStatus(r.status(), root);
  return *r;
}

}  // namespace
}  // namespace cistern::python

PYBIND11_MODULE(_cistern, m) {
  using namespace cistern::python;
  m.doc() = "cistern's native client (libcistern): files and directories of a cluster";
  m.def(
      "webdataset_name",
      [](const std::string& name) -> py::object {
        auto w = cistern::pack::webdatasetName(name);
        if (!w) return py::none();
        return py::make_tuple(std::string(w->key), std::string(w->field));
      },
      py::arg("name"),
      "WebDataset's (key, field) of a member name (the key runs to the first '.' of the "
      "last component), or None for names WebDataset skips");
  m.def(
      "metrics", [] { return cistern::metrics::Registry::global().renderPrometheus(); },
      "This process's client metrics (bytes read and written, checkpoint staging waits) in "
      "Prometheus text format");
  m.def(
      "note_staging_wait",
      [] {
        static auto& waits = cistern::metrics::Registry::global().counter(
            "ckpt_staging_pool_waits_total", {},
            "Checkpoint saves that waited for room in the staging pool");
        waits.inc();
      },
      "Counts a checkpoint save that waited for room in its staging pool");
  py::class_<PyFile>(m, "File", "A file of the cluster, as Python's binary file objects")
      .def("read", &PyFile::read, py::arg("size") = -1,
           "Up to `size` bytes from the position (all to the end if negative)")
      .def("readinto", &PyFile::readinto, py::arg("buffer"),
           "Reads into a writable buffer (bytearray, memoryview, numpy array, CPU tensor) "
           "without a copy; returns the bytes read")
      .def("pread", &PyFile::pread, py::arg("size"), py::arg("offset"),
           "Up to `size` bytes at `offset`; the position does not move")
      .def("preadinto", &PyFile::preadinto, py::arg("buffer"), py::arg("offset"),
           "readinto() at `offset`; the position does not move")
      .def("write", &PyFile::write, py::arg("data"), "Writes a bytes-like object at the position")
      .def("pwrite", &PyFile::pwrite, py::arg("data"), py::arg("offset"),
           "Writes at `offset`; the position does not move")
      .def("seek", &PyFile::seek, py::arg("offset"), py::arg("whence") = 0)
      .def("tell", &PyFile::tell)
      .def("flush", &PyFile::flush,
           "Makes this client's writes visible to other clients (as close(2) of one descriptor)")
      .def("fsync", &PyFile::fsync, "Makes the writes durable")
      .def("close", &PyFile::close)
      .def("readable", &PyFile::readable)
      .def("writable", &PyFile::writable)
      .def("seekable", [](const PyFile&) { return true; })
      .def_property_readonly("closed", &PyFile::closed)
      .def_property_readonly("name", &PyFile::name)
      .def("size", &PyFile::size, "The length as this handle knows it")
      .def(
          "__enter__", [](PyFile& f) -> PyFile& { return f; }, py::return_value_policy::reference)
      .def("__exit__", [](PyFile& f, py::args) { f.close(); });
  py::class_<PyClient>(m, "Client", "A connection to a cluster")
      .def(py::init<const std::string&, uint32_t, const std::string&>(), py::arg("cluster") = "",
           py::arg("retry_ms") = 0, py::arg("token") = "")
      .def("open", &PyClient::open, py::arg("path"), py::arg("mode") = "rb",
           py::arg("perms") = 0644, "Opens a file: mode as Python's open(), binary only")
      .def("stat", &PyClient::stat, py::arg("path"))
      .def("listdir", &PyClient::listdir, py::arg("path") = "/")
      .def("scandir_raw", &PyClient::scandir, py::arg("path") = "/")
      .def("makedirs", &PyClient::makedirs, py::arg("path"), py::arg("mode") = 0777,
           py::arg("exist_ok") = false)
      .def("mkdir", &PyClient::mkdir, py::arg("path"), py::arg("mode") = 0777)
      .def("remove", &PyClient::remove, py::arg("path"))
      .def("unlink", &PyClient::remove, py::arg("path"))
      .def("rmdir", &PyClient::rmdir, py::arg("path"))
      .def("rename", &PyClient::rename, py::arg("src"), py::arg("dst"))
      .def("truncate", &PyClient::truncate, py::arg("path"), py::arg("length"))
      .def("exists", &PyClient::exists, py::arg("path"))
      .def("ckpt_save", &ckptSave, py::arg("path"), py::arg("tensors"), py::arg("base") = "",
           py::arg("metadata") = std::map<std::string, std::string>{}, py::arg("block_bytes") = 0,
           py::arg("rank") = 0, py::arg("world_size") = 1, py::arg("codec") = "",
           "Writes checkpoint `path` from [(name, dtype, shape, buffer)]; returns its stats "
           "(with several ranks, rank `rank`'s part, committed by ckpt_commit)")
      .def("ckpt_commit", &ckptCommit, py::arg("path"), py::arg("world_size"))
      .def("ckpt_manifest", &ckptManifest, py::arg("path"))
      .def("ckpt_read", &ckptRead, py::arg("path"), py::arg("names"), py::arg("buffers"))
      .def("ckpt_list", &ckptList, py::arg("root"),
           "Committed checkpoints under `root`, oldest first")
      .def("ckpt_remove", &ckptRemove, py::arg("path"))
      .def("ckpt_verify", &ckptVerify, py::arg("path"));
  py::class_<PyPack>(m, "Pack", "A pack of samples (docs/pack_format.md), opened for reading")
      .def(py::init<PyClient&, std::string, uint64_t>(), py::arg("connection"), py::arg("path"),
           py::arg("cache_bytes") = 64ull << 20, py::keep_alive<1, 2>())
      .def("__len__", &PyPack::size)
      .def("name", &PyPack::name, py::arg("i"), "The i-th sample's name (name order)")
      .def("info", &PyPack::info, py::arg("i"), "(name, length, label or None, mtime_ns)")
      .def("read", &PyPack::read, py::arg("i"), "The i-th sample's bytes, checksum verified")
      .def("readinto", &PyPack::readinto, py::arg("i"), py::arg("buffer"),
           "The i-th sample into a writable buffer; returns its length")
      .def("find", &PyPack::find, py::arg("name"), "The index of `name`, or None")
      .def("verify", &PyPack::verify, "Checks every checksum of the pack (raises on the first bad)")
      .def("webdataset_groups", &PyPack::webdatasetGroups,
           "WebDataset samples as a (G, 2) int64 array of [begin, end) entry ranges: runs of "
           "entries whose names share a key (the name up to the first '.' of its last "
           "component); reads every name once")
      .def_property_readonly("path", &PyPack::path)
      .def(
          "prefetch",
          [](PyPack& p, std::vector<uint64_t> order, uint32_t threads, uint64_t max_bytes) {
            return std::make_unique<PyPrefetch>(p, std::move(order), threads, max_bytes);
          },
          py::arg("order"), py::arg("threads") = 4, py::arg("max_bytes") = 256ull << 20,
          py::keep_alive<0, 1>(),
          "An iterator of (index, name, label, bytes) in `order`, read ahead by `threads` "
          "C++ threads holding at most `max_bytes`");
  py::class_<PyPrefetch>(m, "Prefetch")
      .def(
          "__iter__", [](PyPrefetch& p) -> PyPrefetch& { return p; },
          py::return_value_policy::reference_internal)
      .def("__next__", &PyPrefetch::next)
      .def("peak_bytes", &PyPrefetch::peakBytes);
}
