// The libraries built over libcistern's public API (packs, checkpoints)
// speak Status inside; this turns a public Error back into one.
#pragma once

#include "cistern/client.h"
#include "common/status.h"

namespace cistern {

// OK for no error; ENOENT, EEXIST, EACCES/EPERM, EINVAL, ENOSPC map to
// their codes, anything else to kIOError; the message is kept.
Status statusOf(const Error& e);

}  // namespace cistern
