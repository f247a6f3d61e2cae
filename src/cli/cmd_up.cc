// `cistern up`: the one-machine cluster (mgmtd + meta + storage on the
// embedded RocksDB KV) in the foreground until SIGINT or SIGTERM.
#include <fmt/format.h>
#include <signal.h>
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <filesystem>

#include "cli/commands.h"
#include "fuse/mount_options.h"
#include "net/endpoint.h"
#include "server/local_cluster.h"

namespace cistern::cli {

void addUp(CLI::App& app) {
  auto* cmd = app.add_subcommand("up", "run a one-machine cluster in the foreground");
  static std::string data = "./cistern-data";
  static uint32_t targets = 1;
  static std::string listen = "127.0.0.1:7420";
  static int metrics_port = -1;
  static std::string mount;
  static std::string mount_options;
  static bool no_sync = false;
  static std::string config;
  cmd->add_option("--data", data, "data directory (created if missing)")->capture_default_str();
  cmd->add_option("--targets", targets, "storage targets (one chain each)")->capture_default_str();
  cmd->add_option("--listen", listen,
                  "host:port of meta+mgmt; storage targets use the next ports (port 0: free ports)")
      ->capture_default_str();
  cmd->add_option("--metrics-port", metrics_port,
                  "port of /metrics (default 9420, or a free one with --listen HOST:0)");
  cmd->add_option("--mount", mount, "also mount the file system here (FUSE; created if missing)");
  cmd->add_option("-o,--mount-options", mount_options,
                  "options of the mount, as `cistern mount -o`");
  cmd->add_flag("--no-sync", no_sync, "do not fsync commits (tests only: a crash loses data)");
  cmd->add_option(
      "--config", config,
      "TOML file of storage, meta, mount, client and log settings (keys: `cistern config "
      "--defaults`)");
  cmd->callback([] {
    auto ep = net::Endpoint::parse(listen);
    if (!ep.ok()) {
      fmt::print(stderr, "cistern up: --listen {}: {}\n", listen, ep.status().message());
      setExitCode(2);
      return;
    }
    server::LocalClusterOptions o;
    fuse::MountConfig mount_config;
    if (!config.empty()) {
      log::Level level = log::level();
      if (Status s = loadUpConfig(config, &o, &mount_config, &level); !s.ok()) {
        fmt::print(stderr, "cistern up: {}\n", s.message());
        setExitCode(2);
        return;
      }
      log::setLevel(level);
    }
    // Signals are taken by sigwait below; block them before any thread starts.
    sigset_t stop_signals;
    blockStopSignals(&stop_signals);

    o.data_dir = data;
    o.targets = targets;
    o.listen_host = ep->host;
    o.listen_port = ep->port;
    o.metrics_port =
        metrics_port >= 0 ? static_cast<uint16_t>(metrics_port) : (ep->port == 0 ? 0 : 9420);
    o.sync = !no_sync;
    auto cluster = server::LocalCluster::start(o);
    if (!cluster.ok()) {
      fmt::print(stderr, "cistern up: {}\n", cluster.status().message());
      setExitCode(1);
      return;
    }
    auto& c = **cluster;
    fmt::print("cistern up: data {}\n", data);
    fmt::print("cistern up: cluster {} (mgmtd + meta)\n", c.endpoint().toString());
    auto storage = c.storageEndpoints();
    for (size_t i = 0; i < storage.size(); ++i)
      fmt::print("cistern up: storage target {} at {}/target-{} on {}\n", i + 1, data, i + 1,
                 storage[i].toString());
    fmt::print("cistern up: metrics http://{}:{}/metrics\n", ep->host, c.metricsPort());
    fmt::print(
        "cistern up: ready; try `build/cistern --help`, e.g. "
        "`build/cistern put FILE /` with CISTERN_CLUSTER={}; Ctrl-C stops\n",
        c.endpoint().toString());
    std::fflush(stdout);
    if (!mount.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(mount, ec);
      // A cluster that checks tokens: the mount acts as its admin unless
      // given a token ($CISTERN_TOKEN, mount.token in the config).
      if (mount_config.client.token.empty() && !std::getenv("CISTERN_TOKEN"))
        mount_config.client.token = c.adminToken();
      // Serves until SIGINT/SIGTERM; then the cluster stops too.
      int rc = mountAndServe(c.endpoint().toString(), mount, mount_config, mount_options,
                             /*metrics_port=*/-1);
      if (rc != 0) setExitCode(rc);
      fmt::print("cistern up: stopping\n");
    } else {
      int sig = 0;
      sigwait(&stop_signals, &sig);
      fmt::print("cistern up: {} received, stopping\n", sig == SIGINT ? "SIGINT" : "SIGTERM");
    }
    std::fflush(stdout);
    cluster->reset();
    fmt::print("cistern up: stopped\n");
  });
}

}  // namespace cistern::cli
