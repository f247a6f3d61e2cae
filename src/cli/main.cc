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
  cistern::cli::addTokenCommands(app);
  cistern::cli::addTenantCommands(app);
  cistern::cli::addQuotaCommands(app);
  cistern::cli::addCkptCommands(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // --help and --version print and succeed; every other parse error is a
    // usage error: its message, and exit code 2 (docs/client.md, "CLI").
    int code = app.exit(e);
    return code == 0 ? 0 : 2;
  }
  return cistern::cli::exitCode();
}
