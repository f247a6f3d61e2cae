// Shared by the CLI commands that talk to a cluster: the --cluster option,
// connecting, remote path spelling and coreutils-style error reports.
#pragma once

#include <memory>
#include <string>

#include "cistern/client.h"
#include "common/result.h"

namespace CLI {
class App;
class Option;
}  // namespace CLI

namespace cistern::net {
class RpcClient;
}

namespace cistern::cli {

struct ClusterFlags {
  std::string cluster;  // empty: $CISTERN_CLUSTER, else 127.0.0.1:7420
  uint32_t retry_ms = 5000;
  uint32_t shm_mib = 64;  // same-host shared memory for I/O; 0: off
  // A TOML file of client.* keys and log.level (`cistern config --defaults
  // --client`); --shm-mib given on the command line wins over its shm_bytes.
  std::string config;
  // A file holding the token the calls carry (docs/security.md); empty:
  // $CISTERN_TOKEN, else none.
  std::string token_file;
  const CLI::Option* shm_flag = nullptr;
};

// The token in `path` (its first line, trimmed): kInvalidArgument naming
// the file when it cannot be read or is empty.
Result<std::string> readTokenFile(const std::string& path);

// Adds --cluster, --retry-ms, --shm-mib, --config and --token-file to `cmd`; the flags
// live as long as the program.
ClusterFlags& addClusterFlags(CLI::App* cmd);

// The token the flags name (--token-file, else $CISTERN_TOKEN; empty: none),
// carried by every call of `rpc` (commands that call mgmtd directly).
// False, after reporting it, when the token file cannot be read.
bool carryToken(net::RpcClient& rpc, const ClusterFlags& flags);

// Connects, or prints "cistern: cluster ADDR: ..." and records exit code 1
// (a config file that cannot be used: its message, exit code 2).
std::unique_ptr<Client> connectOrReport(const ClusterFlags& flags);

// A remote path as the user wrote it, made absolute ("a/b" → "/a/b").
std::string remotePath(const std::string& p);

// Prints "cistern: <message>" to stderr and records exit code 1. Returns true
// when there was an error.
bool report(const Error& e);

// As report(), for a Status about `what`.
bool reportStatus(const Status& s, const std::string& what);

// 1536 → "1.5 KiB".
std::string humanBytes(double bytes);

}  // namespace cistern::cli
