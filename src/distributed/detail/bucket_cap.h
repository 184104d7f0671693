#pragma once
// The one bound on DDP's gradient bucket size, shared by DdpStrategy (which checks it when the
// strategy is built, before any process starts) and GradientReducer (which users may build
// directly).

#include "volt/core/check.h"

namespace volt {
namespace detail {

/// Throws ConfigError, prefixed with `tag`, unless 0 < `mb` <= 1 TiB. The upper bound refuses inf
/// and sizes whose byte count would overflow.
inline void check_bucket_cap_mb(double mb, const char* tag) {
  VOLT_CHECK(mb > 0 && mb <= 1024.0 * 1024.0, ConfigError, tag, " bucket_cap_mb=", mb,
             " must be > 0 and at most 1048576 (1 TiB) MiB per gradient bucket; DDP's default "
             "is 25.");
}

}  // namespace detail
}  // namespace volt
