#pragma once
// Whether the environment configures glibc's malloc itself (host_allocator.cpp; tested apart
// from the process's own environment).

#include <functional>
#include <optional>
#include <string>

namespace volt {
namespace detail {

/// The first variable by which the environment `env` configures glibc's malloc thresholds:
/// MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, MALLOC_TOP_PAD_, MALLOC_MMAP_MAX_, or
/// GLIBC_TUNABLES when it names a glibc.malloc tunable; "" when none does.
std::string malloc_configured_by(
    const std::function<std::optional<std::string>(const std::string&)>& env);

}  // namespace detail
}  // namespace volt
