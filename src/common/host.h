// Facts about the host this process runs on.
#pragma once

#include <string>

namespace cistern {

// This boot of this host (/proc/sys/kernel/random/boot_id), or "" if it
// cannot be read. Two processes with the same non-empty id share a kernel.
const std::string& hostBootId();

}  // namespace cistern
