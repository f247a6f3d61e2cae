// `cistern mount`: the FUSE mount of a cluster, in the foreground until
// SIGINT/SIGTERM or an unmount (fusermount3 -u). Also used by `cistern up --mount`.
#include <fmt/format.h>
#include <signal.h>
#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "client/client_impl.h"
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
                  const std::string& options, uint32_t timeout_ms, int metrics_port) {
  fuse::MountOptions mo;
  mo.mountpoint = mountpoint;
  if (Status s = fuse::parseMountOptions(options, &mo); !s.ok()) {
    fmt::print(stderr, "cistern mount: {}\n", s.message());
    return 2;
  }
  // Stop signals are taken by sigwait in fuse::serve; block them before any thread starts.
  sigset_t stop;
  blockStopSignals(&stop);

  Client::Options co;
  co.cluster = cluster;
  co.uid = 0;  // every request carries its caller's credentials
  co.gid = 0;
  co.retry_ms = timeout_ms;
  co.call_timeout_ms = std::max<uint32_t>(timeout_ms, 1000);
  co.readahead_max_bytes = 4ull << 20;
  co.write_behind_bytes = 4ull << 20;  // 32 buffered files: at most 128 MiB in flight
  co.local_calls = !mo.socket_calls;
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
  auto* impl = static_cast<client::ClientImpl*>(c.get());
  Status s = fuse::serve(impl, mo, [&] {
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
  static std::string cluster, mountpoint, options;
  static uint32_t timeout_ms = 10000;
  static int metrics_port = -1;
  cmd->add_option("--cluster", cluster, "host:port (default $CISTERN_CLUSTER or 127.0.0.1:7420)");
  cmd->add_option("-o,--options", options,
                  "allow_other, writeback, attr_timeout=S, entry_timeout=S, negative_timeout=S, "
                  "debug, socket_calls (comma-separated)");
  cmd->add_option("--timeout-ms", timeout_ms,
                  "a request fails with an error after the cluster is unreachable this long")
      ->capture_default_str();
  cmd->add_option("--metrics-port", metrics_port,
                  "serve /metrics (FUSE and client counters) on 127.0.0.1 at this port (0: a free "
                  "one; default: none)");
  cmd->add_option("mountpoint", mountpoint, "an existing directory")->required();
  cmd->callback(
      [] { setExitCode(mountAndServe(cluster, mountpoint, options, timeout_ms, metrics_port)); });
}

}  // namespace cistern::cli
