// The FUSE low-level operations of the mount, by file: ops_namespace.cc
// (names and attributes), ops_file.cc (open files), ops_dir.cc (directory
// listing). `fuse_req_userdata(req)` is the FuseFs.
#pragma once

#include <chrono>

#include "fuse/fuse_fs.h"
#include "proto/file_type.h"

namespace cistern::fuse::ops {

inline FuseFs& fs(fuse_req_t req) { return *static_cast<FuseFs*>(fuse_req_userdata(req)); }

// Per-operation metrics: fuse_requests_total{op}, fuse_request_latency_us{op}
// and fuse_errors_total{op,errno}.
struct OpStats;
OpStats& opStats(const char* op);
class OpScope {
 public:
  explicit OpScope(OpStats& stats);
  ~OpScope();

 private:
  OpStats& stats_;
  const OpStats* outer_;
  std::chrono::steady_clock::time_point start_;
};
#define CISTERN_FUSE_OP(name)                \
  static OpStats& op_stats_ = opStats(name); \
  OpScope op_scope_(op_stats_)

// fuse_reply_err that counts errors (err != 0) for the current operation.
void replyErr(fuse_req_t req, int err);

void init(void* userdata, fuse_conn_info* conn);
void lookup(fuse_req_t req, fuse_ino_t parent, const char* name);
void forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup);
void forgetMulti(fuse_req_t req, size_t count, fuse_forget_data* forgets);
void getattr(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
void setattr(fuse_req_t req, fuse_ino_t ino, struct stat* attr, int to_set, fuse_file_info* fi);
void readlink(fuse_req_t req, fuse_ino_t ino);
void mknod(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, dev_t rdev);
void mkdir(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode);
void unlink(fuse_req_t req, fuse_ino_t parent, const char* name);
void rmdir(fuse_req_t req, fuse_ino_t parent, const char* name);
void symlink(fuse_req_t req, const char* link, fuse_ino_t parent, const char* name);
void rename(fuse_req_t req, fuse_ino_t parent, const char* name, fuse_ino_t newparent,
            const char* newname, unsigned int flags);
void link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char* newname);
void statfs(fuse_req_t req, fuse_ino_t ino);
void access(fuse_req_t req, fuse_ino_t ino, int mask);
void ioctl(fuse_req_t req, fuse_ino_t ino, unsigned int cmd, void* arg, fuse_file_info* fi,
           unsigned flags, const void* in_buf, size_t in_bufsz, size_t out_bufsz);
void setxattr(fuse_req_t req, fuse_ino_t ino, const char* name, const char* value, size_t size,
              int flags);
void getxattr(fuse_req_t req, fuse_ino_t ino, const char* name, size_t size);
void listxattr(fuse_req_t req, fuse_ino_t ino, size_t size);
void removexattr(fuse_req_t req, fuse_ino_t ino, const char* name);

void create(fuse_req_t req, fuse_ino_t parent, const char* name, mode_t mode, fuse_file_info* fi);
void open(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
void read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi);
void write(fuse_req_t req, fuse_ino_t ino, const char* buf, size_t size, off_t off,
           fuse_file_info* fi);
void flush(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
void release(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
void fsync(fuse_req_t req, fuse_ino_t ino, int datasync, fuse_file_info* fi);
void fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t offset, off_t length,
               fuse_file_info* fi);

void opendir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
void readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi);
void readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, fuse_file_info* fi);
void releasedir(fuse_req_t req, fuse_ino_t ino, fuse_file_info* fi);
void fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, fuse_file_info* fi);

}  // namespace cistern::fuse::ops
