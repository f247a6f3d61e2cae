// `cistern config --defaults`: every configuration key with its default and
// meaning; `cistern config --check FILE`: validates a config file.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "common/config.h"
#include "net/rpc_server.h"

namespace cistern::cli {
namespace {

struct AllOptions {
  net::ServerOptions rpc;
  std::string log_level = "info";
  void bind(ConfigBinder& b) {
    rpc.bind(b, "rpc");
    b.bind("log.level", &log_level, "trace|debug|info|warn|error|off");
  }
};

}  // namespace

void addConfig(CLI::App& app) {
  auto* cmd = app.add_subcommand("config", "show or check configuration");
  static bool defaults = false;
  cmd->add_flag("--defaults", defaults, "print every key with its default (the default action)");
  auto* check = cmd->add_option("--check", "validate a TOML config file");
  cmd->callback([check] {
    AllOptions opts;
    ConfigBinder binder;
    opts.bind(binder);
    if (*check) {
      std::string path = check->as<std::string>();
      Status s = binder.loadFile(path);
      if (!s.ok()) {
        fmt::print(stderr, "cistern: {}\n", s.message());
        setExitCode(1);
        return;
      }
      fmt::print("{}: ok\n", path);
      return;
    }
    fmt::print("{}", binder.describe());
  });
}

}  // namespace cistern::cli
