// `cistern config --defaults`: every key a config file of `cistern up
// --config` may set, with its default and meaning; `cistern config --check
// FILE`: validates such a file.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "common/config.h"
#include "common/log.h"
#include "server/local_cluster.h"

namespace cistern::cli {
namespace {

// What a config file sets: the cluster's options and the log level.
struct UpConfig {
  server::LocalClusterOptions* cluster;
  std::string log_level = "info";
  void bind(ConfigBinder& b) {
    cluster->bind(b);
    b.bind("log.level", &log_level, "trace|debug|info|warn|error|off");
  }
};

}  // namespace

Status loadUpConfig(const std::string& path, server::LocalClusterOptions* options,
                    log::Level* level) {
  server::LocalClusterOptions o = *options;
  // A file without log.level leaves the level as it was ($CISTERN_LOG_LEVEL).
  UpConfig c{&o, std::string(log::levelName(*level))};
  ConfigBinder binder;
  c.bind(binder);
  RETURN_ON_ERROR(binder.loadFile(path));
  log::Level l;
  if (!log::parseLevel(c.log_level, &l)) {
    return Status(ErrorCode::kConfigInvalid,
                  fmt::format("{}: key 'log.level': unknown level '{}'", path, c.log_level));
  }
  // The options' own checks, so that `cistern config --check` finds what
  // `cistern up` would refuse.
  RETURN_ON_ERROR(o.validate().withContext(path));
  *options = o;
  *level = l;
  return Status::OK();
}

void addConfig(CLI::App& app) {
  auto* cmd = app.add_subcommand("config", "show or check the configuration of `cistern up`");
  static bool defaults = false;
  cmd->add_flag("--defaults", defaults, "print every key with its default (the default action)");
  auto* check = cmd->add_option("--check", "validate a TOML config file");
  cmd->callback([check] {
    server::LocalClusterOptions o;
    if (*check) {
      std::string path = check->as<std::string>();
      log::Level level = log::level();
      Status s = loadUpConfig(path, &o, &level);
      if (!s.ok()) {
        fmt::print(stderr, "cistern: {}\n", s.message());
        setExitCode(1);
        return;
      }
      fmt::print("{}: ok\n", path);
      return;
    }
    UpConfig c{&o};
    ConfigBinder binder;
    c.bind(binder);
    fmt::print("{}", binder.describe());
  });
}

}  // namespace cistern::cli
