// POSIX permission and name checks for metadata operations.
//
// The caller's uid, gid and supplementary groups come with every request
// (Caller). Root (uid 0) passes read and write checks, and execute checks when
// any execute bit is set or the inode is a directory, as on Linux.
#pragma once

#include <string_view>

#include "common/status.h"
#include "meta.pb.h"

namespace cistern::meta {

inline constexpr int kMayRead = 4;
inline constexpr int kMayWrite = 2;
inline constexpr int kMayExec = 1;

// kPermissionDenied unless `caller` may access `inode` with every bit in `mask`.
Status checkAccess(const Inode& inode, const Caller& caller, int mask);
bool inGroup(const Caller& caller, uint32_t gid);

// In a sticky directory only the owner of the entry, the owner of the
// directory or root may remove or rename the entry (kNotPermitted otherwise).
Status checkSticky(const Inode& dir, const Inode& victim, const Caller& caller);

// Validates one path component. Empty: kNotFound; "/" or NUL inside:
// kInvalidArgument; over 255 bytes: kNameTooLong. "." and ".." are accepted
// here; each operation decides what they mean for it (isDotOrDotDot).
Status checkName(std::string_view name);
bool isDotOrDotDot(std::string_view name);

}  // namespace cistern::meta
