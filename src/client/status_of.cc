#include "client/status_of.h"

#include <cerrno>

namespace cistern {

Status statusOf(const Error& e) {
  if (!e) return Status::OK();
  ErrorCode code = ErrorCode::kIOError;
  switch (e.errno_value) {
    case ENOENT:
      code = ErrorCode::kNotFound;
      break;
    case EEXIST:
      code = ErrorCode::kAlreadyExists;
      break;
    case EACCES:
    case EPERM:
      code = ErrorCode::kPermissionDenied;
      break;
    case EINVAL:
      code = ErrorCode::kInvalidArgument;
      break;
    case ENOSPC:
      code = ErrorCode::kNoSpace;
      break;
    default:
      break;
  }
  return Status(code, e.message);
}

}  // namespace cistern
