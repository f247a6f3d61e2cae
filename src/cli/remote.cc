#include "cli/remote.h"

#include <fmt/format.h>
#include <CLI/CLI.hpp>

#include <cctype>
#include <cstdlib>
#include <deque>
#include <fstream>
#include <optional>

#include "cli/commands.h"
#include "net/rpc_client.h"

namespace cistern::cli {

ClusterFlags& addClusterFlags(CLI::App* cmd) {
  static std::deque<ClusterFlags> all;  // stable addresses, one per subcommand
  ClusterFlags& f = all.emplace_back();
  cmd->add_option("--cluster", f.cluster,
                  "cluster address host:port (default: $CISTERN_CLUSTER or 127.0.0.1:7420)");
  cmd->add_option("--retry-ms", f.retry_ms, "how long transient errors are retried")
      ->capture_default_str();
  f.shm_flag =
      cmd->add_option(
             "--shm-mib", f.shm_mib,
             "shared memory that storage servers on this host read into and write from (0: off)")
          ->capture_default_str();
  cmd->add_option("--config", f.config,
                  "TOML file of client settings (keys: `cistern config --defaults --client`)");
  cmd->add_option("--token-file", f.token_file,
                  "file holding the token the calls carry (default: $CISTERN_TOKEN)");
  return f;
}

Result<std::string> readTokenFile(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  if (!in || !std::getline(in, line)) {
    return Status(ErrorCode::kInvalidArgument, fmt::format("token file {}: cannot read it", path));
  }
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.front())))
    line.erase(line.begin());
  if (line.empty())
    return Status(ErrorCode::kInvalidArgument, fmt::format("token file {} is empty", path));
  return line;
}

namespace {

// The token the flags name: --token-file's, else empty (the client takes
// $CISTERN_TOKEN itself); nullopt after reporting an unreadable file.
std::optional<std::string> flagsToken(const ClusterFlags& flags) {
  if (flags.token_file.empty()) return std::string();
  auto t = readTokenFile(flags.token_file);
  if (!t.ok()) {
    fmt::print(stderr, "cistern: {}\n", t.status().message());
    setExitCode(2);
    return std::nullopt;
  }
  return std::move(t).value();
}

}  // namespace

bool carryToken(net::RpcClient& rpc, const ClusterFlags& flags) {
  auto token = flagsToken(flags);
  if (!token) return false;
  if (token->empty()) {
    if (const char* env = std::getenv("CISTERN_TOKEN")) *token = env;
  }
  if (!token->empty()) rpc.setCredential([t = *token] { return t; });
  return true;
}

std::unique_ptr<Client> connectOrReport(const ClusterFlags& flags) {
  Client::Options o;
  if (!flags.config.empty()) {
    log::Level level = log::level();
    if (Status s = loadClientConfig(flags.config, &o, &level); !s.ok()) {
      fmt::print(stderr, "cistern: {}\n", s.message());
      setExitCode(2);
      return nullptr;
    }
    log::setLevel(level);
  }
  // The flag's default is the library's; given, it wins over the file.
  if (flags.config.empty() || flags.shm_flag->count() > 0)
    o.shm_bytes = uint64_t{flags.shm_mib} << 20;
  o.cluster = flags.cluster;
  o.retry_ms = flags.retry_ms;
  auto token = flagsToken(flags);
  if (!token) return nullptr;
  o.token = std::move(*token);
  auto [client, err] = Client::connect(o);
  if (report(err)) return nullptr;
  return std::move(client);
}

std::string remotePath(const std::string& p) {
  if (!p.empty() && p[0] == '/') return p;
  return "/" + p;
}

bool report(const Error& e) {
  if (!e) return false;
  fmt::print(stderr, "cistern: {}\n", e.message);
  setExitCode(1);
  return true;
}

bool reportStatus(const Status& s, const std::string& what) {
  if (s.ok()) return false;
  fmt::print(stderr, "cistern: {}: {}\n", what, s.toString());
  setExitCode(1);
  return true;
}

std::string humanBytes(double bytes) {
  static const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  int u = 0;
  while (bytes >= 1024 && u < 5) {
    bytes /= 1024;
    ++u;
  }
  return u == 0 ? fmt::format("{:.0f} B", bytes) : fmt::format("{:.1f} {}", bytes, kUnits[u]);
}

}  // namespace cistern::cli
