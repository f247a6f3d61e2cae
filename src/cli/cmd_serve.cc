// `cistern serve --role ROLE --config FILE`: one role of a cluster in the
// foreground until SIGINT or SIGTERM (DESIGN.md §2). Today: mgmtd.
#include <fmt/format.h>
#include <signal.h>
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "server/mgmtd_server.h"

namespace cistern::cli {

void addServe(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "run one role of a cluster in the foreground");
  static std::string role;
  static std::string config;
  static std::string listen;
  cmd->add_option("--role", role, "mgmtd (meta and storage: to come)")->required();
  cmd->add_option("--config", config, "TOML file (keys: `cistern config --defaults --mgmtd`)");
  cmd->add_option("--listen", listen, "host:port to serve on (overrides the config's)");
  cmd->callback([] {
    if (role != "mgmtd") {
      fmt::print(stderr, "cistern serve: role {:?} is not served yet (mgmtd is)\n", role);
      setExitCode(2);
      return;
    }
    server::MgmtdServerOptions o;
    if (!config.empty()) {
      log::Level level = log::level();
      if (Status s = loadMgmtdConfig(config, &o, &level); !s.ok()) {
        fmt::print(stderr, "cistern serve: {}\n", s.message());
        setExitCode(2);
        return;
      }
      log::setLevel(level);
    }
    if (!listen.empty()) o.listen = listen;
    sigset_t stop_signals;
    blockStopSignals(&stop_signals);
    auto server = server::MgmtdServer::start(o);
    if (!server.ok()) {
      fmt::print(stderr, "cistern serve: mgmtd: {}\n", server.status().message());
      setExitCode(1);
      return;
    }
    fmt::print("cistern serve: mgmtd on {} (kv {}); ready\n", (*server)->endpoint().toString(),
               o.kv.backend);
    std::fflush(stdout);
    int sig = 0;
    sigwait(&stop_signals, &sig);
    fmt::print("cistern serve: {} received, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    server->reset();
    fmt::print("cistern serve: stopped\n");
    std::fflush(stdout);
  });
}

}  // namespace cistern::cli
