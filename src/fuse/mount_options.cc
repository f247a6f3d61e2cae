#include "fuse/mount_options.h"

#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <utility>

#include "client/client_config.h"
#include "common/config.h"

namespace cistern::fuse {

Status parseMountOptions(const std::string& text, MountOptions* out) {
  size_t i = 0;
  while (i < text.size()) {
    size_t j = text.find(',', i);
    if (j == std::string::npos) j = text.size();
    std::string opt = text.substr(i, j - i);
    i = j + 1;
    if (opt.empty()) continue;
    std::string key = opt, value;
    if (size_t eq = opt.find('='); eq != std::string::npos) {
      key = opt.substr(0, eq);
      value = opt.substr(eq + 1);
    }
    auto seconds = [&](double* dst) -> Status {
      char* end = nullptr;
      double v = std::strtod(value.c_str(), &end);
      if (value.empty() || *end != '\0' || !(v >= 0) || v > 86400)
        return Status(ErrorCode::kInvalidArgument,
                      fmt::format("option {}: '{}' is not a number of seconds", key, value));
      *dst = v;
      return Status::OK();
    };
    if (key == "allow_other" && value.empty()) {
      out->allow_other = true;
    } else if (key == "writeback" && value.empty()) {
      out->writeback_cache = true;
    } else if (key == "debug" && value.empty()) {
      out->debug = true;
    } else if (key == "socket_calls" && value.empty()) {
      out->socket_calls = true;
    } else if ((key == "dev" || key == "nodev") && value.empty()) {
      out->devices = key == "dev";
    } else if ((key == "suid" || key == "nosuid") && value.empty()) {
      out->setuid = key == "suid";
    } else if (key == "attr_timeout") {
      RETURN_ON_ERROR(seconds(&out->attr_timeout_s));
    } else if (key == "entry_timeout") {
      RETURN_ON_ERROR(seconds(&out->entry_timeout_s));
    } else if (key == "negative_timeout") {
      RETURN_ON_ERROR(seconds(&out->negative_timeout_s));
    } else {
      return Status(ErrorCode::kInvalidArgument, fmt::format("unknown mount option '{}'", opt));
    }
  }
  return Status::OK();
}

MountConfig::MountConfig() {
  client.uid = 0;  // every request carries its caller's credentials
  client.gid = 0;
  client.readahead_max_bytes = 4ull << 20;
  client.write_behind_bytes = 4ull << 20;  // 32 buffered files: at most 128 MiB in flight
}

void MountConfig::bind(ConfigBinder& b) {
  b.bind("mount.allow_other", &mount.allow_other,
         "let users other than the one who mounted use the mount (as -o allow_other)");
  b.bind("mount.writeback", &mount.writeback_cache,
         "the kernel's writeback cache: writes gather in the page cache (as -o writeback)");
  b.bind("mount.attr_timeout", &mount.attr_timeout_s,
         "seconds the kernel keeps attributes (0 to 86400)");
  b.bind("mount.entry_timeout", &mount.entry_timeout_s,
         "seconds the kernel keeps names (0 to 86400)");
  b.bind("mount.negative_timeout", &mount.negative_timeout_s,
         "seconds the kernel remembers that a name does not exist (0 to 86400)");
  b.bind("mount.socket_calls", &mount.socket_calls,
         "metadata calls to a cluster in the same process go over loopback TCP too");
  b.bind("mount.dev", &mount.devices,
         "device nodes on the mount open their devices, as on a local disk (false: as -o nodev)");
  b.bind("mount.suid", &mount.setuid,
         "set-user/group-ID bits take effect on exec, as on a local disk (false: as -o nosuid)");
  b.bind("mount.buffered_files_max", &mount.buffered_files_max,
         "open files that get a write buffer and read-ahead; the rest go straight through "
         "(1 to 4096)");
  b.bind("mount.max_idle_threads", &mount.max_idle_threads,
         "idle FUSE worker threads kept; at most four times as many run (1 to 1024)");
  b.bind("mount.timeout_ms", &timeout_ms,
         "a request fails with an error after the cluster is unreachable this long, in ms "
         "(100 to 3600000; as --timeout-ms)");
  client::bindClientOptions(b, "client", &client);
}

Status MountConfig::validate() const {
  for (auto [name, v] : {std::pair{"attr_timeout", mount.attr_timeout_s},
                         std::pair{"entry_timeout", mount.entry_timeout_s},
                         std::pair{"negative_timeout", mount.negative_timeout_s}}) {
    if (!(v >= 0 && v <= 86400))
      return Status(ErrorCode::kInvalidArgument,
                    fmt::format("mount.{} {} is not a number of seconds in 0..86400", name, v));
  }
  RETURN_ON_ERROR(checkOptionRange("mount.buffered_files_max", mount.buffered_files_max, 1, 4096));
  RETURN_ON_ERROR(checkOptionRange("mount.max_idle_threads", mount.max_idle_threads, 1, 1024));
  RETURN_ON_ERROR(checkOptionRange("mount.timeout_ms", timeout_ms, 100, 3'600'000));
  return client::validateClientOptions(client);
}

Client::Options MountConfig::clientOptions(const std::string& cluster) const {
  Client::Options co = client;
  co.cluster = cluster;
  co.retry_ms = timeout_ms;
  co.call_timeout_ms = std::max<uint32_t>(timeout_ms, 1000);
  co.local_calls = !mount.socket_calls;
  co.buffered_files_max = mount.buffered_files_max;
  return co;
}

}  // namespace cistern::fuse
