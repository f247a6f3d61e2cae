// `cistern config --defaults`: every key a config file of `cistern up
// --config` (with --mount: of `cistern mount --config`; with --client: of
// `--config` of the commands that talk to a cluster) may set, with its
// default and meaning; `cistern config --check FILE`: validates such a file.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <functional>

#include "cli/commands.h"
#include "client/client_config.h"
#include "common/config.h"
#include "common/log.h"
#include "fuse/mount_options.h"
#include "server/local_cluster.h"
#include "server/meta_server.h"
#include "server/mgmtd_server.h"
#include "server/storage_server.h"

namespace cistern::cli {
namespace {

void bindLogLevel(ConfigBinder& b, std::string* name) {
  b.bind("log.level", name, "trace|debug|info|warn|error|off");
}

// Loads `path` into the fields `bind` binds, then checks them with
// `validate` and log.level; `commit` runs only when all of it holds, so
// that on error nothing is changed.
Status loadConfig(const std::string& path, log::Level* level,
                  const std::function<void(ConfigBinder&)>& bind,
                  const std::function<Status()>& validate, const std::function<void()>& commit) {
  // A file without log.level leaves the level as it was ($CISTERN_LOG_LEVEL).
  std::string log_level(log::levelName(*level));
  ConfigBinder binder;
  bind(binder);
  bindLogLevel(binder, &log_level);
  RETURN_ON_ERROR(binder.loadFile(path));
  log::Level l;
  if (!log::parseLevel(log_level, &l)) {
    return Status(ErrorCode::kConfigInvalid,
                  fmt::format("{}: key 'log.level': unknown level '{}'", path, log_level));
  }
  // The options' own checks, so that `cistern config --check` finds what
  // `cistern up` or `cistern mount` would refuse.
  RETURN_ON_ERROR(validate().withContext(path));
  commit();
  *level = l;
  return Status::OK();
}

}  // namespace

Status loadUpConfig(const std::string& path, server::LocalClusterOptions* options,
                    fuse::MountConfig* mount, log::Level* level) {
  server::LocalClusterOptions o = *options;
  fuse::MountConfig m = *mount;
  return loadConfig(
      path, level,
      [&](ConfigBinder& b) {
        o.bind(b);
        m.bind(b);
      },
      [&]() -> Status {
        RETURN_ON_ERROR(o.validate());
        RETURN_ON_ERROR(m.validate());
        // The mount of `cistern up --mount` must renew its lease well within
        // the meta service's session timeout, or it loses its open files.
        if (m.client.session_renew_ms > 0 &&
            uint64_t{m.client.session_renew_ms} * 2 > o.session_timeout_ms) {
          return Status(ErrorCode::kInvalidArgument,
                        fmt::format("client.session_renew_ms {} is not under half of "
                                    "meta.session_timeout_ms {}",
                                    m.client.session_renew_ms, o.session_timeout_ms));
        }
        return Status::OK();
      },
      [&] {
        *options = o;
        *mount = m;
      });
}

Status loadMgmtdConfig(const std::string& path, server::MgmtdServerOptions* options,
                       log::Level* level) {
  server::MgmtdServerOptions o = *options;
  return loadConfig(
      path, level, [&](ConfigBinder& b) { o.bind(b); }, [&] { return o.validate(); },
      [&] { *options = o; });
}

Status loadMetaConfig(const std::string& path, server::MetaServerOptions* options,
                      log::Level* level) {
  server::MetaServerOptions o = *options;
  return loadConfig(
      path, level, [&](ConfigBinder& b) { o.bind(b); }, [&] { return o.validate(); },
      [&] { *options = o; });
}

Status loadStorageConfig(const std::string& path, server::StorageServerOptions* options,
                         log::Level* level) {
  server::StorageServerOptions o = *options;
  return loadConfig(
      path, level, [&](ConfigBinder& b) { o.bind(b); }, [&] { return o.validate(); },
      [&] { *options = o; });
}

Status loadMountConfig(const std::string& path, fuse::MountConfig* mount, log::Level* level) {
  fuse::MountConfig m = *mount;
  return loadConfig(
      path, level, [&](ConfigBinder& b) { m.bind(b); }, [&] { return m.validate(); },
      [&] { *mount = m; });
}

Status loadClientConfig(const std::string& path, Client::Options* client, log::Level* level) {
  Client::Options c = *client;
  return loadConfig(
      path, level, [&](ConfigBinder& b) { client::bindClientOptions(b, "client", &c); },
      [&] { return client::validateClientOptions(c); }, [&] { *client = c; });
}

void addConfig(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "config", "show or check the configuration of `cistern up` (or `cistern mount`)");
  static bool defaults = false, mount_only = false, client_only = false, mgmtd_only = false,
              meta_only = false, storage_only = false;
  cmd->add_flag("--defaults", defaults, "print every key with its default (the default action)");
  auto* mount_flag =
      cmd->add_flag("--mount", mount_only,
                    "the keys of `cistern mount --config` (mount.*, client.*, log.level) instead");
  cmd->add_flag("--client", client_only,
                "the keys of `--config` of the commands that talk to a cluster (put, get, ls, "
                "bench, ...: client.*, log.level) instead")
      ->excludes(mount_flag);
  cmd->add_flag("--mgmtd", mgmtd_only,
                "the keys of `cistern serve --role mgmtd --config` (mgmtd.*, kv.*, log.level) "
                "instead")
      ->excludes(mount_flag);
  cmd->add_flag("--meta", meta_only,
                "the keys of `cistern serve --role meta --config` (meta.*, kv.*, log.level) "
                "instead")
      ->excludes(mount_flag);
  cmd->add_flag("--storage", storage_only,
                "the keys of `cistern serve --role storage --config` (storage.*, log.level) "
                "instead")
      ->excludes(mount_flag);
  auto* check = cmd->add_option("--check", "validate a TOML config file");
  cmd->callback([check] {
    server::LocalClusterOptions o;
    fuse::MountConfig m;
    if (*check) {
      std::string path = check->as<std::string>();
      log::Level level = log::level();
      Client::Options c;
      server::MgmtdServerOptions g;
      server::MetaServerOptions mo;
      server::StorageServerOptions so;
      Status s = client_only    ? loadClientConfig(path, &c, &level)
                 : mount_only   ? loadMountConfig(path, &m, &level)
                 : mgmtd_only   ? loadMgmtdConfig(path, &g, &level)
                 : meta_only    ? loadMetaConfig(path, &mo, &level)
                 : storage_only ? loadStorageConfig(path, &so, &level)
                                : loadUpConfig(path, &o, &m, &level);
      if (!s.ok()) {
        fmt::print(stderr, "cistern: {}\n", s.message());
        setExitCode(1);
        return;
      }
      fmt::print("{}: ok\n", path);
      return;
    }
    std::string log_level(log::levelName(log::Level::kInfo));
    ConfigBinder binder;
    Client::Options c;  // a library client's defaults, not the mount's
    server::MgmtdServerOptions g;
    server::MetaServerOptions mo;
    server::StorageServerOptions so;
    if (client_only) {
      client::bindClientOptions(binder, "client", &c);
    } else if (mgmtd_only) {
      g.bind(binder);
    } else if (meta_only) {
      mo.bind(binder);
    } else if (storage_only) {
      so.bind(binder);
    } else {
      if (!mount_only) o.bind(binder);
      m.bind(binder);
    }
    bindLogLevel(binder, &log_level);
    fmt::print("{}", binder.describe());
  });
}

}  // namespace cistern::cli
