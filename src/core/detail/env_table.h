#pragma once
// For the readers of environment variables that cannot use env_value (the cluster detection
// must tell set-but-empty from unset): the one check that a name is in volt's table.

#include <string>

#include "volt/core/env.h"

namespace volt {
namespace detail {

/// The table entry for `name`; an InternalError when the table does not list it.
const EnvVar& listed_env_var(const std::string& name);

}  // namespace detail
}  // namespace volt
