#include "meta/permission.h"

#include <fmt/format.h>

namespace cistern::meta {

bool inGroup(const Caller& caller, uint32_t gid) {
  if (caller.gid() == gid) return true;
  for (uint32_t g : caller.groups()) {
    if (g == gid) return true;
  }
  return false;
}

Status checkAccess(const Inode& inode, const Caller& caller, int mask) {
  if (caller.uid() == 0) {
    bool any_exec = (inode.mode() & 0111) != 0 || inode.type() == DIRECTORY;
    if ((mask & kMayExec) && !any_exec) {
      return Status(ErrorCode::kPermissionDenied,
                    fmt::format("inode {}: no execute bit", inode.ino()));
    }
    return Status::OK();
  }
  uint32_t bits;
  if (caller.uid() == inode.uid()) {
    bits = (inode.mode() >> 6) & 7;
  } else if (inGroup(caller, inode.gid())) {
    bits = (inode.mode() >> 3) & 7;
  } else {
    bits = inode.mode() & 7;
  }
  if ((bits & static_cast<uint32_t>(mask)) != static_cast<uint32_t>(mask)) {
    return Status(ErrorCode::kPermissionDenied,
                  fmt::format("inode {} mode {:o} denies uid {}", inode.ino(), inode.mode() & 07777,
                              caller.uid()));
  }
  return Status::OK();
}

Status checkSticky(const Inode& dir, const Inode& victim, const Caller& caller) {
  if (!(dir.mode() & 01000) || caller.uid() == 0 || caller.uid() == dir.uid() ||
      caller.uid() == victim.uid()) {
    return Status::OK();
  }
  return Status(ErrorCode::kNotPermitted,
                fmt::format("sticky directory {}: uid {} owns neither it nor inode {}", dir.ino(),
                            caller.uid(), victim.ino()));
}

Status checkName(std::string_view name) {
  if (name.empty()) return Status(ErrorCode::kNotFound, "empty name");
  if (name.size() > 255) {
    return Status(ErrorCode::kNameTooLong,
                  fmt::format("name of {} bytes exceeds 255", name.size()));
  }
  if (name.find('/') != std::string_view::npos)
    return Status(ErrorCode::kInvalidArgument, "name contains '/'");
  if (name.find('\0') != std::string_view::npos)
    return Status(ErrorCode::kInvalidArgument, "name contains NUL");
  return Status::OK();
}

bool isDotOrDotDot(std::string_view name) { return name == "." || name == ".."; }

}  // namespace cistern::meta
