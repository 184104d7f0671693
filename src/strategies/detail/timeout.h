#pragma once
// The one bound on a strategy's collective timeout, shared by DdpStrategy and the strategies
// built on it that take their own timeout_s (PipelineStrategy, ModelParallelStrategy), so each
// refuses a bad value in its own name before any process starts.

#include <cstdint>

#include "volt/core/check.h"

namespace volt {
namespace detail {

/// Throws ConfigError, prefixed with `tag`, unless 0 < `seconds` <= 30 days. The upper bound
/// refuses inf and values whose millisecond count would overflow.
inline void check_timeout_s(double seconds, const char* tag) {
  constexpr int64_t kMaxTimeoutS = 30 * 24 * 3600;
  VOLT_CHECK(seconds > 0 && seconds <= kMaxTimeoutS, ConfigError, tag, " timeout_s=", seconds,
             " must be > 0 seconds and at most 30 days (", kMaxTimeoutS,
             " s); a rank that died is found only after it, so keep it short (default 60).");
}

}  // namespace detail
}  // namespace volt
