// `cistern mount`: the FUSE mount of a cluster, in the foreground until
// SIGINT/SIGTERM or an unmount (fusermount3 -u). Also used by `cistern up --mount`.
#include <fmt/format.h>
#include <signal.h>
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/remote.h"
#include "fuse/fuse_fs.h"
#include "server/metrics_http.h"

namespace cistern::cli {

void blockStopSignals(sigset_t* set) {
  sigemptyset(set);
  sigaddset(set, SIGINT);
  sigaddset(set, SIGTERM);
  pthread_sigmask(SIG_BLOCK, set, nullptr);
}

int mountAndServe(const std::string& cluster, const std::string& mountpoint,
                  const fuse::MountConfig& config, const std::string& options, int metrics_port) {
  fuse::MountConfig mc = config;
  mc.mount.mountpoint = mountpoint;
  if (Status s = fuse::parseMountOptions(options, &mc.mount); !s.ok()) {
    fmt::print(stderr, "cistern mount: {}\n", s.message());
    return 2;
  }
  // Stop signals are taken by sigwait in fuse::serve; block them before any thread starts.
  sigset_t stop;
  blockStopSignals(&stop);

  Client::Options co = mc.clientOptions(cluster);
  auto [c, err] = Client::connect(co);
  if (err) {
    fmt::print(stderr, "cistern mount: {}\n", err.message);
    return 1;
  }
  std::unique_ptr<server::MetricsHttp> metrics;
  if (metrics_port >= 0) {
    auto m = server::MetricsHttp::start("127.0.0.1", static_cast<uint16_t>(metrics_port));
    if (!m.ok()) {
      fmt::print(stderr, "cistern mount: metrics: {}\n", m.status().message());
      return 1;
    }
    metrics = std::move(*m);
    fmt::print("cistern mount: metrics http://127.0.0.1:{}/metrics\n", metrics->port());
  }
  Status s = fuse::serve(c.get(), mc.mount, [&] {
    fmt::print("cistern mount: {} mounted at {}; unmount with Ctrl-C or `fusermount3 -u {}`\n",
               co.cluster.empty() ? "cluster" : co.cluster, mountpoint, mountpoint);
    std::fflush(stdout);
  });
  if (!s.ok()) {
    fmt::print(stderr, "cistern mount: {}\n", s.message());
    return 1;
  }
  fmt::print("cistern mount: unmounted {}\n", mountpoint);
  return 0;
}

void addMount(CLI::App& app) {
  auto* cmd = app.add_subcommand("mount", "mount a cluster as a POSIX file system (FUSE)");
  static std::string cluster, mountpoint, options, config, token_file;
  static uint32_t timeout_ms = fuse::MountConfig().timeout_ms;
  static int metrics_port = -1;
  cmd->add_option("--cluster", cluster, "host:port (default $CISTERN_CLUSTER or 127.0.0.1:7420)");
  cmd->add_option("-o,--options", options,
                  "allow_other, writeback, attr_timeout=S, entry_timeout=S, negative_timeout=S, "
                  "debug, socket_calls (comma-separated; over --config)");
  auto* timeout = cmd->add_option(
      "--timeout-ms", timeout_ms,
      "a request fails with an error after the cluster is unreachable this long (over --config)");
  timeout->capture_default_str();
  cmd->add_option("--metrics-port", metrics_port,
                  "serve /metrics (FUSE and client counters) on 127.0.0.1 at this port (0: a free "
                  "one; default: none)");
  cmd->add_option("--config", config,
                  "TOML file of mount, client and log settings (keys: `cistern config --defaults "
                  "--mount`)");
  cmd->add_option("--token-file", token_file,
                  "file holding the tenant token the mount's calls carry (default: "
                  "$CISTERN_TOKEN); the mount then shows the tenant's subtree");
  cmd->add_option("mountpoint", mountpoint, "an existing directory")->required();
  cmd->callback([timeout] {
    fuse::MountConfig mc;
    if (!config.empty()) {
      log::Level level = log::level();
      if (Status s = loadMountConfig(config, &mc, &level); !s.ok()) {
        fmt::print(stderr, "cistern mount: {}\n", s.message());
        setExitCode(2);
        return;
      }
      log::setLevel(level);
    }
    if (*timeout) {
      mc.timeout_ms = timeout_ms;
      if (Status s = mc.validate(); !s.ok()) {
        fmt::print(stderr, "cistern mount: --timeout-ms: {}\n", s.message());
        setExitCode(2);
        return;
      }
    }
    if (!token_file.empty()) {
      auto token = readTokenFile(token_file);
      if (!token.ok()) {
        fmt::print(stderr, "cistern mount: {}\n", token.status().message());
        setExitCode(2);
        return;
      }
      mc.client.token = std::move(token).value();
    }
    setExitCode(mountAndServe(cluster, mountpoint, mc, options, metrics_port));
  });
}

}  // namespace cistern::cli
