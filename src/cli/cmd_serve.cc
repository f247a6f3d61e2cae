// `cistern serve --role ROLE --config FILE [--metrics HOST:PORT]`: one role
// of a cluster in the foreground until SIGINT or SIGTERM (DESIGN.md §2;
// deploy/ has examples), with its metrics at http://HOST:PORT/metrics.
#include <fmt/format.h>
#include <signal.h>
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "net/endpoint.h"
#include "server/meta_server.h"
#include "server/metrics_http.h"
#include "server/mgmtd_server.h"
#include "server/storage_server.h"

namespace cistern::cli {
namespace {

// Loads the role's config (if any), applies --listen, starts the server,
// waits for a stop signal, stops it.
template <typename Options, typename Server, typename Load, typename Describe>
void serveRole(const char* role, const std::string& config, const std::string& listen,
               const std::string& metrics, std::string Options::*listen_field, Load load,
               Describe describe) {
  Options o;
  if (!config.empty()) {
    log::Level level = log::level();
    if (Status s = load(config, &o, &level); !s.ok()) {
      fmt::print(stderr, "cistern serve: {}\n", s.message());
      setExitCode(2);
      return;
    }
    log::setLevel(level);
  }
  if (!listen.empty()) o.*listen_field = listen;
  std::unique_ptr<server::MetricsHttp> http;
  std::string metrics_line;
  if (!metrics.empty()) {
    auto ep = net::Endpoint::parse(metrics);
    auto started = ep.ok() ? server::MetricsHttp::start(ep->host, ep->port)
                           : Result<std::unique_ptr<server::MetricsHttp>>(ep.status());
    if (!started.ok()) {
      fmt::print(stderr, "cistern serve: --metrics {}: {}\n", metrics, started.status().message());
      setExitCode(2);
      return;
    }
    http = std::move(*started);
    metrics_line = fmt::format("; metrics http://{}:{}/metrics", ep->host, http->port());
  }
  sigset_t stop_signals;
  blockStopSignals(&stop_signals);
  auto server = Server::start(o);
  if (!server.ok()) {
    fmt::print(stderr, "cistern serve: {}: {}\n", role, server.status().message());
    setExitCode(1);
    return;
  }
  fmt::print("cistern serve: {} on {} ({}){}; ready\n", role, (*server)->endpoint().toString(),
             describe(o), metrics_line);
  std::fflush(stdout);
  int sig = 0;
  sigwait(&stop_signals, &sig);
  fmt::print("cistern serve: {} received, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
  std::fflush(stdout);
  server->reset();
  fmt::print("cistern serve: stopped\n");
  std::fflush(stdout);
}

}  // namespace

void addServe(CLI::App& app) {
  auto* cmd = app.add_subcommand("serve", "run one role of a cluster in the foreground");
  static std::string role;
  static std::string config;
  static std::string listen;
  static std::string metrics;
  cmd->add_option("--role", role, "mgmtd, meta or storage")
      ->required()
      ->check(CLI::IsMember({"mgmtd", "meta", "storage"}));
  cmd->add_option("--config", config,
                  "TOML file (keys: `cistern config --defaults --mgmtd|--meta|--storage`)");
  cmd->add_option("--listen", listen, "host:port to serve on (overrides the config's)");
  cmd->add_option("--metrics", metrics,
                  "host:port to serve /metrics (Prometheus text) and /healthz on (port 0: a free "
                  "one, printed); default: none");
  cmd->callback([] {
    if (role == "mgmtd") {
      serveRole<server::MgmtdServerOptions, server::MgmtdServer>(
          "mgmtd", config, listen, metrics, &server::MgmtdServerOptions::listen, loadMgmtdConfig,
          [](const auto& o) { return "kv " + o.kv.backend; });
    } else if (role == "meta") {
      serveRole<server::MetaServerOptions, server::MetaServer>(
          "meta", config, listen, metrics, &server::MetaServerOptions::listen, loadMetaConfig,
          [](const auto& o) { return "kv " + o.kv.backend; });
    } else {
      serveRole<server::StorageServerOptions, server::StorageServer>(
          "storage", config, listen, metrics, &server::StorageServerOptions::listen,
          loadStorageConfig,
          [](const auto& o) { return "node " + o.node + ", target " + o.target; });
    }
  });
}

}  // namespace cistern::cli
