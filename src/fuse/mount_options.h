// The options of a FUSE mount: `cistern mount -o` text, and the keys of a
// config file (`cistern mount --config`, `cistern up --mount --config`).
// Apart from fuse_fs.h so that the commands that only configure a mount do
// not include libfuse.
#pragma once

#include <cstdint>
#include <string>

#include "cistern/client.h"
#include "common/status.h"

namespace cistern {
class ConfigBinder;
}

namespace cistern::fuse {

struct MountOptions {
  std::string mountpoint;
  bool allow_other = false;
  bool writeback_cache = false;
  double attr_timeout_s = 1.0;
  double entry_timeout_s = 1.0;
  double negative_timeout_s = 1.0;
  uint32_t max_idle_threads = 16;
  uint32_t buffered_files_max = 32;
  bool debug = false;
  // Metadata calls to a cluster in this process go over the socket too.
  bool socket_calls = false;
  // As a local file system mounted by root (ext4, NFS): device nodes on the
  // mount open their devices (`dev`), and set-user/group-ID bits take
  // effect on exec (`suid`). libfuse's own default is nodev,nosuid; the
  // options `nodev` and `nosuid` ask for that.
  bool devices = true;
  bool setuid = true;
};

// Parses "-o" text: allow_other, writeback, attr_timeout=S, entry_timeout=S,
// negative_timeout=S, debug, socket_calls, dev, nodev, suid, nosuid. Unknown options are an error
// that names them.
Status parseMountOptions(const std::string& text, MountOptions* out);

// What a config file sets for a mount (`cistern mount --config`, and the
// mount of `cistern up --mount --config`): the mount's options as `mount.*`
// keys, the client's as `client.*` (keys: `cistern config --defaults
// --mount`). `-o` and --timeout-ms given on the command line win over the file.
struct MountConfig {
  MountOptions mount;
  // The mount's defaults, which differ from a library client's: 4 MiB of
  // read-ahead and of write-behind per file (buffered_files_max of them).
  Client::Options client;
  // A request fails with an error after the cluster is unreachable this long.
  uint32_t timeout_ms = 10000;

  MountConfig();
  void bind(ConfigBinder& b);
  // kInvalidArgument naming the field when a value cannot work.
  Status validate() const;
  // `client` with the timeouts of timeout_ms and the calls of mount.socket_calls.
  Client::Options clientOptions(const std::string& cluster) const;
};

}  // namespace cistern::fuse
