// Client::Options from a config file: the keys a deployment tunes, bound to
// `<prefix>.<name>` (`cistern mount --config`, the mount of `cistern up
// --mount --config`; keys: `cistern config --defaults --mount`). Apart from
// include/cistern/client.h so that the public header does not depend on the
// config loader.
#pragma once

#include <string>

#include "cistern/client.h"
#include "common/status.h"

namespace cistern {
class ConfigBinder;
}

namespace cistern::client {

// Binds the options' tunable fields; their current values are the defaults
// that `cistern config --defaults` shows. Not bound: the cluster, the
// credentials and the timeouts (the command's own flags and keys set those),
// and attr_cache_ms, which only path calls use (a mount has the kernel's
// attr_timeout instead).
void bindClientOptions(ConfigBinder& b, const std::string& prefix, Client::Options* options);
// kInvalidArgument naming the field when a value cannot work or would let
// the client's memory grow past what a mount may use (read-ahead windows of
// more than 256 MiB, more than 4 GiB of shared memory, ...).
Status validateClientOptions(const Client::Options& options);

}  // namespace cistern::client
