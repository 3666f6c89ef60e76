// Status propagation macros for ucp (Abseil 20220623 ships none).
//
//   UCP_RETURN_IF_ERROR(WriteHeader(out));
//   UCP_ASSIGN_OR_RETURN(Value v, reader.ReadValue());
//   UCP_ASSIGN_OR_RETURN(auto file, TorchFile::Open(path), _.Prepend("shard: "));
//
// The optional third argument of UCP_ASSIGN_OR_RETURN is an expression over a
// `StatusBuilder _` that may add context before the status is returned.
#ifndef UCP_BASE_STATUS_MACROS_H_
#define UCP_BASE_STATUS_MACROS_H_

#include <string>
#include <utility>

#include "absl/strings/string_view.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace ucp {

// StatusBuilder: the `_` in UCP_ASSIGN_OR_RETURN's error expression.
class StatusBuilder {
 public:
  explicit StatusBuilder(absl::Status status) : status_(std::move(status)) {}
  // Adds `prefix` in front of the message, keeping the code.
  StatusBuilder& Prepend(absl::string_view prefix) {
    status_ = absl::Status(status_.code(), absl::StrCat(prefix, status_.message()));
    return *this;
  }
  StatusBuilder& Append(absl::string_view suffix) {
    status_ = absl::Status(status_.code(), absl::StrCat(status_.message(), suffix));
    return *this;
  }
  operator absl::Status() const& { return status_; }   // NOLINT
  operator absl::Status() && { return std::move(status_); }  // NOLINT
  template <typename T>
  operator absl::StatusOr<T>() && {  // NOLINT
    return absl::StatusOr<T>(std::move(status_));
  }

 private:
  absl::Status status_;
};

// Returns a copy of `status` whose message starts with `prefix`.
inline absl::Status Annotate(const absl::Status& status, absl::string_view prefix) {
  if (status.ok()) return status;
  return absl::Status(status.code(), absl::StrCat(prefix, status.message()));
}

}  // namespace ucp

#define UCP_STATUS_MACROS_CONCAT_INNER_(x, y) x##y
#define UCP_STATUS_MACROS_CONCAT_(x, y) UCP_STATUS_MACROS_CONCAT_INNER_(x, y)

#define UCP_RETURN_IF_ERROR(expr)                          \
  do {                                                     \
    ::absl::Status ucp_status_ = (expr);                   \
    if (!ucp_status_.ok()) return ucp_status_;             \
  } while (0)

#define UCP_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, rexpr, error_expr) \
  auto tmp = (rexpr);                                           \
  if (!tmp.ok()) {                                              \
    ::ucp::StatusBuilder _(std::move(tmp).status());            \
    (void)_;                                                    \
    return (error_expr);                                        \
  }                                                             \
  lhs = std::move(tmp).value()

#define UCP_ASSIGN_OR_RETURN_2_(lhs, rexpr)                                   \
  UCP_ASSIGN_OR_RETURN_IMPL_(                                                 \
      UCP_STATUS_MACROS_CONCAT_(ucp_statusor_, __LINE__), lhs, rexpr, _)
#define UCP_ASSIGN_OR_RETURN_3_(lhs, rexpr, error_expr)                       \
  UCP_ASSIGN_OR_RETURN_IMPL_(                                                 \
      UCP_STATUS_MACROS_CONCAT_(ucp_statusor_, __LINE__), lhs, rexpr, error_expr)
#define UCP_ASSIGN_OR_RETURN_SELECT_(_1, _2, _3, NAME, ...) NAME
#define UCP_ASSIGN_OR_RETURN(...)                                              \
  UCP_ASSIGN_OR_RETURN_SELECT_(__VA_ARGS__, UCP_ASSIGN_OR_RETURN_3_,          \
                               UCP_ASSIGN_OR_RETURN_2_)(__VA_ARGS__)

#endif  // UCP_BASE_STATUS_MACROS_H_
