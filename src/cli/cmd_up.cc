// `cistern up`: the one-machine cluster (mgmtd + meta + storage on the
// embedded KV). The services it runs are being built issue by issue; until
// they exist the command says so and exits with EX_UNAVAILABLE (69), rather
// than pretend to serve.
#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "cli/commands.h"

namespace cistern::cli {

void addUp(CLI::App& app) {
  auto* cmd = app.add_subcommand("up", "run a one-machine cluster");
  static std::string data = "./cistern-data";
  cmd->add_option("--data", data, "data directory")->capture_default_str();
  cmd->callback([] {
    fmt::print(stderr,
               "cistern up: the one-machine cluster is not available yet: the foundation\n"
               "(RPC, KV, config, metrics) and the metadata service are built; storage\n"
               "and mgmtd come next.\n"
               "Try `cistern config --defaults` or `make test`.\n");
    setExitCode(69);
  });
}

}  // namespace cistern::cli
