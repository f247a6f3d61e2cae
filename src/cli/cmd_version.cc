#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include "cli/commands.h"

namespace cistern::cli {
namespace {
int g_exit_code = 0;
}

int exitCode() { return g_exit_code; }
void setExitCode(int code) { g_exit_code = code; }

std::string versionString() { return "cistern 0.1.0 (frame v1)"; }

void addVersion(CLI::App& app) {
  app.add_subcommand("version", "print the version")->callback([] {
    fmt::print("{}\n", versionString());
  });
}

}  // namespace cistern::cli
