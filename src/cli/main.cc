// The `cistern` binary: parses the command line and hands off to one
// subcommand (one file each under src/cli/).
#include <CLI/CLI.hpp>

#include "cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"cistern — a distributed file system for GPU clusters"};
  app.require_subcommand(1);
  app.set_version_flag("--version", cistern::cli::versionString());
  cistern::cli::addVersion(app);
  cistern::cli::addConfig(app);
  cistern::cli::addUp(app);
  cistern::cli::addServe(app);
  cistern::cli::addFileCommands(app);
  cistern::cli::addCopyCommands(app);
  cistern::cli::addClusterCommands(app);
  cistern::cli::addStatusCommands(app);
  cistern::cli::addBench(app);
  cistern::cli::addMount(app);
  cistern::cli::addPackCommands(app);
  CLI11_PARSE(app, argc, argv);
  return cistern::cli::exitCode();
}
