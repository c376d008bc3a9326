// The project's one error idiom: absl::Status / absl::StatusOr with early-return macros.
#pragma once

#include "absl/status/status.h"
#include "absl/status/statusor.h"

#define LAZYKV_CONCAT_INNER(a, b) a##b
#define LAZYKV_CONCAT(a, b) LAZYKV_CONCAT_INNER(a, b)

// Returns the status from the enclosing function if `expr` is not OK.
#define RETURN_IF_ERROR(expr)                        \
  do {                                               \
    ::absl::Status lazykv_status_ = (expr);          \
    if (!lazykv_status_.ok()) return lazykv_status_; \
  } while (0)

// `ASSIGN_OR_RETURN(auto x, F())` binds the value of a StatusOr or returns its error.
#define ASSIGN_OR_RETURN(lhs, expr) LAZYKV_ASSIGN_OR_RETURN_IMPL(LAZYKV_CONCAT(lazykv_statusor_, __LINE__), lhs, expr)
#define LAZYKV_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.ok()) return std::move(tmp).status();     \
  lhs = std::move(tmp).value()
