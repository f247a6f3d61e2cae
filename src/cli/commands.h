// Subcommands of the `cistern` binary. Each add* registers one subcommand
// whose callback runs the command and records its exit code.
#pragma once

#include <signal.h>

#include <string>

#include "cistern/client.h"
#include "common/log.h"
#include "common/status.h"

namespace CLI {
class App;
}
namespace cistern::server {
struct LocalClusterOptions;
struct MgmtdServerOptions;
struct MetaServerOptions;
struct StorageServerOptions;
}  // namespace cistern::server
namespace cistern::fuse {
struct MountConfig;
}

namespace cistern::cli {

std::string versionString();
void addVersion(CLI::App& app);
void addConfig(CLI::App& app);
// Sets `options`, `mount` (for `cistern up --mount`) and `level` from a
// TOML file of `cistern up --config` (keys: `cistern config --defaults`);
// what the file does not set keeps its value. kConfigInvalid or
// kInvalidArgument naming the file and key; on error nothing is changed.
Status loadUpConfig(const std::string& path, server::LocalClusterOptions* options,
                    fuse::MountConfig* mount, log::Level* level);
// The same for `cistern mount --config`: the mount.*, client.* and log.level
// keys only (`cistern config --defaults --mount`).
Status loadMountConfig(const std::string& path, fuse::MountConfig* mount, log::Level* level);
// The same for the commands that talk to a cluster (`cistern put --config`
// ...): the client.* and log.level keys (`cistern config --defaults --client`).
Status loadClientConfig(const std::string& path, Client::Options* client, log::Level* level);
// The same for `cistern serve --role mgmtd --config`: mgmtd.*, kv.*, log.level.
Status loadMgmtdConfig(const std::string& path, server::MgmtdServerOptions* options,
                       log::Level* level);
// ... for `cistern serve --role meta --config`: meta.*, kv.*, log.level.
Status loadMetaConfig(const std::string& path, server::MetaServerOptions* options,
                      log::Level* level);
// ... for `cistern serve --role storage --config`: storage.*, log.level.
Status loadStorageConfig(const std::string& path, server::StorageServerOptions* options,
                         log::Level* level);
void addUp(CLI::App& app);
void addServe(CLI::App& app);            // serve --role mgmtd|meta|storage
void addFileCommands(CLI::App& app);     // ls, stat, mkdir, rm, mv, cat
void addCopyCommands(CLI::App& app);     // put, get
void addClusterCommands(CLI::App& app);  // df, fsck
void addStatusCommands(CLI::App& app);   // status, chains create
void addBench(CLI::App& app);
void addMount(CLI::App& app);
void addPackCommands(CLI::App& app);           // pack, unpack
void addTokenCommands(CLI::App& app);          // token keygen, issue, inspect, revoke, whoami
void addTenantCommands(CLI::App& app);         // tenant create, ls, rm, set
void addQuotaCommands(CLI::App& app);          // quota set, get, ls, rm
void addTenantQuotaCommand(CLI::App& tenant);  // tenant set (cmd_quota.cc)
void addCkptCommands(CLI::App& app);           // ckpt ls|show|verify|rm
// Mounts `cluster` at `mountpoint` with `config` and serves until
// SIGINT/SIGTERM or an unmount; returns the exit code. `options`: as
// `cistern mount -o`, applied over config.mount; `metrics_port` >= 0 also
// serves /metrics there (0: a free port).
int mountAndServe(const std::string& cluster, const std::string& mountpoint,
                  const fuse::MountConfig& config, const std::string& options, int metrics_port);

// Blocks SIGINT and SIGTERM in this thread and every thread it starts later
// (call before starting any): the command takes them with sigwait.
void blockStopSignals(sigset_t* set);

// Exit code recorded by the subcommand that ran (0 when none failed).
int exitCode();
void setExitCode(int code);

}  // namespace cistern::cli
