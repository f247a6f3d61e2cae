// Result<T>: either a value of T or a non-ok Status.
//
// Constructed implicitly from a T or from a Status (which must not be ok).
// Access the value only after checking ok(); value() on an error aborts with
// the status in the message, which catches the bug where it happens.
#pragma once

#include <utility>
#include <variant>

#include "common/assert.h"
#include "common/status.h"

namespace cistern {

template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}        // NOLINT(google-explicit-constructor)
  Result(Status status) : v_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    CISTERN_CHECK(!std::get<Status>(v_).ok(), "Result constructed from an ok Status");
  }
  Result(ErrorCode code, std::string_view msg) : Result(Status(code, msg)) {}

  bool ok() const { return std::holds_alternative<T>(v_); }
  Status status() const { return ok() ? Status::OK() : std::get<Status>(v_); }
  ErrorCode code() const { return ok() ? ErrorCode::kOk : std::get<Status>(v_).code(); }

  T& value() & {
    checkOk();
    return std::get<T>(v_);
  }
  const T& value() const& {
    checkOk();
    return std::get<T>(v_);
  }
  T&& value() && {
    checkOk();
    return std::get<T>(std::move(v_));
  }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  void checkOk() const {
    if (!ok()) {
      ::cistern::assertFailed(__FILE__, __LINE__, "Result::value() on error",
                              std::get<Status>(v_).toString());
    }
  }
  std::variant<T, Status> v_;
};

template <typename T>
Status toStatus(const Result<T>& r) {
  return r.status();
}

}  // namespace cistern

#define CISTERN_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr, ret) \
  auto tmp = (expr);                                       \
  if (!tmp.ok()) ret tmp.status();                         \
  lhs = std::move(tmp).value()

// ASSIGN_OR_RETURN(auto x, f()); — declares x from a Result or returns its error.
#define ASSIGN_OR_RETURN(lhs, expr) \
  CISTERN_ASSIGN_OR_RETURN_IMPL(CISTERN_CONCAT(_cistern_r_, __LINE__), lhs, expr, return )
#define CO_ASSIGN_OR_RETURN(lhs, expr) \
  CISTERN_ASSIGN_OR_RETURN_IMPL(CISTERN_CONCAT(_cistern_r_, __LINE__), lhs, expr, co_return )
