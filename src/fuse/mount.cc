// Mounting: the libfuse session, its multi-threaded loop, and a clean
// unmount on SIGINT/SIGTERM or when someone unmounts us (fusermount3 -u).
#include <fmt/format.h>
#include <signal.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <sstream>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <fstream>
#include <thread>

#include "common/log.h"
#include "fuse/ops.h"

namespace cistern::fuse {

const fuse_lowlevel_ops& FuseFs::ops() {
  static const fuse_lowlevel_ops table = [] {
    fuse_lowlevel_ops o;
    std::memset(&o, 0, sizeof(o));
    o.init = ops::init;
    o.lookup = ops::lookup;
    o.forget = ops::forget;
    o.forget_multi = ops::forgetMulti;
    o.getattr = ops::getattr;
    o.setattr = ops::setattr;
    o.readlink = ops::readlink;
    o.mknod = ops::mknod;
    o.mkdir = ops::mkdir;
    o.unlink = ops::unlink;
    o.rmdir = ops::rmdir;
    o.symlink = ops::symlink;
    o.rename = ops::rename;
    o.link = ops::link;
    o.open = ops::open;
    o.read = ops::read;
    o.write = ops::write;
    o.flush = ops::flush;
    o.release = ops::release;
    o.fsync = ops::fsync;
    o.fallocate = ops::fallocate;
    o.opendir = ops::opendir;
    o.readdir = ops::readdir;
    o.readdirplus = ops::readdirplus;
    o.releasedir = ops::releasedir;
    o.fsyncdir = ops::fsyncdir;
    o.statfs = ops::statfs;
    o.setxattr = ops::setxattr;
    o.getxattr = ops::getxattr;
    o.listxattr = ops::listxattr;
    o.removexattr = ops::removexattr;
    o.access = ops::access;
    o.ioctl = ops::ioctl;
    o.create = ops::create;
    return o;
  }();
  return table;
}

namespace {

// The FUSE connection number (the minor device) of the mount at `path`,
// from /proc/self/mountinfo: a stat() of our own mount would wait for us.
int connectionOf(const std::string& path) {
  char real[PATH_MAX];
  if (!::realpath(path.c_str(), real)) return -1;
  std::ifstream in("/proc/self/mountinfo");
  std::string line;
  int found = -1;
  while (std::getline(in, line)) {
    // id parent major:minor root mountpoint options ... - fstype source ...
    std::istringstream f(line);
    std::string id, parent, dev, root, mp;
    f >> id >> parent >> dev >> root >> mp;
    if (mp != real || line.find(" - fuse.cistern ") == std::string::npos) continue;
    size_t colon = dev.find(':');
    if (colon != std::string::npos) found = std::atoi(dev.c_str() + colon + 1);
  }
  return found;
}

// Ends a connection the kernel keeps alive for files still open after a
// lazy unmount, so the loop's threads return (needs fusectl, mounted here if missing).
void abortConnection(int connection) {
  std::string path = fmt::format("/sys/fs/fuse/connections/{}/abort", connection);
  if (::access(path.c_str(), W_OK) != 0)
    (void)::mount("fusectl", "/sys/fs/fuse/connections", "fusectl", 0, nullptr);
  std::ofstream abort(path);
  if (abort) abort << "1";
}

}  // namespace

Status serve(Client* client, const MountOptions& options, const std::function<void()>& ready) {
  struct stat mp;
  if (::stat(options.mountpoint.c_str(), &mp) != 0)
    return Status(ErrorCode::kNotFound,
                  fmt::format("mount point {}: {}", options.mountpoint, std::strerror(errno)));
  if (!S_ISDIR(mp.st_mode))
    return Status(ErrorCode::kNotDirectory,
                  fmt::format("mount point {} is not a directory", options.mountpoint));

  FuseFs fs(client, options);
  // default_permissions: the kernel checks mode bits too, also on paths it
  // walks from its dentry cache (where no lookup reaches the meta service).
  std::vector<std::string> argv = {"cistern", "-o",
                                   "fsname=cistern,subtype=cistern,default_permissions"};
  if (options.allow_other) argv.insert(argv.end(), {"-o", "allow_other"});
  // libfuse mounts nodev,nosuid unless told otherwise (only root may).
  if (::geteuid() == 0) {
    argv.insert(argv.end(), {"-o", options.devices ? "dev" : "nodev"});
    argv.insert(argv.end(), {"-o", options.setuid ? "suid" : "nosuid"});
  }
  if (options.debug) argv.push_back("-d");
  std::vector<char*> cargv;
  for (auto& a : argv) cargv.push_back(a.data());
  fuse_args args = FUSE_ARGS_INIT(static_cast<int>(cargv.size()), cargv.data());
  fuse_session* se = fuse_session_new(&args, &FuseFs::ops(), sizeof(fuse_lowlevel_ops), &fs);
  if (!se) return Status(ErrorCode::kInvalidArgument, "fuse_session_new failed (see stderr)");
  fs.setSession(se);
  if (fuse_session_mount(se, options.mountpoint.c_str()) != 0) {
    fuse_session_destroy(se);
    return Status(ErrorCode::kIOError,
                  fmt::format("cannot mount at {} (is /dev/fuse there, and are we root?)",
                              options.mountpoint));
  }
  const int connection = connectionOf(options.mountpoint);

  std::atomic<bool> loop_done{false};
  int loop_rc = 0;
  std::thread loop([&] {
    fuse_loop_config* cfg = fuse_loop_cfg_create();
    fuse_loop_cfg_set_idle_threads(cfg, options.max_idle_threads);
    fuse_loop_cfg_set_max_threads(cfg, std::max(options.max_idle_threads * 4, 16u));
    loop_rc = fuse_session_loop_mt(se, cfg);
    fuse_loop_cfg_destroy(cfg);
    loop_done = true;
  });
  if (ready) ready();

  // SIGINT/SIGTERM are blocked in every thread; wait for one, or for the
  // loop to end because the file system was unmounted from outside.
  sigset_t stop;
  sigemptyset(&stop);
  sigaddset(&stop, SIGINT);
  sigaddset(&stop, SIGTERM);
  bool signalled = false;
  while (!loop_done) {
    timespec tick{0, 200'000'000};
    int sig = sigtimedwait(&stop, nullptr, &tick);
    if (sig == SIGINT || sig == SIGTERM) {
      signalled = true;
      break;
    }
  }
  fuse_session_exit(se);
  fuse_session_unmount(se);
  for (int i = 0; i < 50 && !loop_done; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  if (!loop_done && connection >= 0) abortConnection(connection);
  loop.join();
  fuse_session_destroy(se);
  fuse_opt_free_args(&args);
  if (!signalled && loop_rc != 0 && loop_rc != -ENODEV)
    return Status(ErrorCode::kIOError, fmt::format("FUSE loop ended with {}", loop_rc));
  return Status::OK();
}

}  // namespace cistern::fuse
