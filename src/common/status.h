// Status: the outcome of an operation, an error code plus a message.
//
// Errors are values in cistern: functions that can fail return Status or
// Result<T> (result.h), both [[nodiscard]]; exceptions never cross a module
// boundary. An ok Status holds no allocation, so returning success is free.
// A Status is a value type: copy it, move it, compare its code. Thread-safe
// as any value type (no shared state).
#pragma once

#include <cerrno>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>

#include "common/error_codes.h"

namespace cistern {

enum class ErrorCode : uint16_t {
#define CISTERN_X(name, value, err, desc) name = value,
  CISTERN_ERROR_CODES(CISTERN_X)
#undef CISTERN_X
};

// Name of the code ("kNotFound"), for logs and tests.
std::string_view errorCodeName(ErrorCode code);
// errno that FUSE and the CLI report for the code.
int errorCodeToErrno(ErrorCode code);
// True for codes that exist in the list; used when decoding a code off the wire.
bool isKnownErrorCode(uint16_t value);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string_view message);
  explicit Status(ErrorCode code) : Status(code, {}) {}

  static Status OK() { return Status(); }

  bool ok() const { return state_ == nullptr; }
  ErrorCode code() const { return state_ ? state_->code : ErrorCode::kOk; }
  // The message without the code; empty for ok.
  std::string_view message() const {
    return state_ ? std::string_view(state_->message) : std::string_view();
  }
  int toErrno() const { return errorCodeToErrno(code()); }
  // "kNotFound: /a/b" — for logs.
  std::string toString() const;

  // Returns a copy with `context` prepended to the message ("context: message").
  Status withContext(std::string_view context) const;

  // Marks the status as looked at, for call sites that deliberately ignore it.
  void ignore() const {}

 private:
  struct State {
    ErrorCode code;
    std::string message;
  };
  // Shared and immutable: copying a Status is one refcount increment.
  std::shared_ptr<const State> state_;
};

inline bool operator==(const Status& s, ErrorCode c) { return s.code() == c; }

// Used by the propagation macros so they accept Status and Result<T> alike.
inline Status toStatus(const Status& s) { return s; }
inline Status toStatus(Status&& s) { return std::move(s); }

}  // namespace cistern

// Propagation helpers. RETURN_ON_ERROR / ASSIGN_OR_RETURN for plain functions,
// CO_RETURN_ON_ERROR / CO_ASSIGN_OR_RETURN inside coroutines.
#define CISTERN_CONCAT_INNER(a, b) a##b
#define CISTERN_CONCAT(a, b) CISTERN_CONCAT_INNER(a, b)

#define RETURN_ON_ERROR(expr)                                 \
  do {                                                        \
    ::cistern::Status _cistern_s = ::cistern::toStatus(expr); \
    if (!_cistern_s.ok()) return _cistern_s;                  \
  } while (0)

#define CO_RETURN_ON_ERROR(expr)                              \
  do {                                                        \
    ::cistern::Status _cistern_s = ::cistern::toStatus(expr); \
    if (!_cistern_s.ok()) co_return _cistern_s;               \
  } while (0)
