#pragma once
// Logging that skips the rank-zero filter, for the few messages Lightning prints on every rank
// (EarlyStopping's verbose lines unless log_rank_zero_only). No torch includes.

#include <string>

#include "volt/core/log.h"

namespace volt {
namespace detail {

/// log_message on whatever rank this process is (a rank other than 0 prefixes its lines with
/// it, as errors).
void log_on_every_rank(LogLevel level, const std::string& component, const std::string& message);

}  // namespace detail
}  // namespace volt
