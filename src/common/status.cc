#include "common/status.h"

namespace cistern {

std::string_view errorCodeName(ErrorCode code) {
  switch (code) {
#define CISTERN_X(name, value, err, desc) \
  case ErrorCode::name:                   \
    return #name;
    CISTERN_ERROR_CODES(CISTERN_X)
#undef CISTERN_X
  }
  return "kUnknownErrorCode";
}

int errorCodeToErrno(ErrorCode code) {
  switch (code) {
#define CISTERN_X(name, value, err, desc) \
  case ErrorCode::name:                   \
    return err;
    CISTERN_ERROR_CODES(CISTERN_X)
#undef CISTERN_X
  }
  return EIO;
}

bool isKnownErrorCode(uint16_t value) {
  switch (value) {
#define CISTERN_X(name, v, err, desc) \
  case v:                             \
    return true;
    CISTERN_ERROR_CODES(CISTERN_X)
#undef CISTERN_X
  }
  return false;
}

Status::Status(ErrorCode code, std::string_view message) {
  if (code != ErrorCode::kOk) {
    state_ = std::make_shared<const State>(State{code, std::string(message)});
  }
}

std::string Status::toString() const {
  if (ok()) return "kOk";
  std::string out(errorCodeName(code()));
  if (!state_->message.empty()) {
    out += ": ";
    out += state_->message;
  }
  return out;
}

Status Status::withContext(std::string_view context) const {
  if (ok()) return *this;
  std::string msg(context);
  if (!state_->message.empty()) {
    msg += ": ";
    msg += state_->message;
  }
  return Status(code(), msg);
}

}  // namespace cistern
