#pragma once
/// VOLT_CHECK for conditions the user can cause, VOLT_ASSERT for volt's own invariants.

#include <locale>
#include <sstream>
#include <string>
#include <utility>

#include "volt/core/errors.h"

namespace volt {
namespace detail {

/// Concatenates its arguments as `operator<<` writes them in the "C" locale, whatever the
/// program's global locale: a message reads "step 1000", never "step 1.000".
template <typename... Args>
std::string str_cat(Args&&... args) {
  std::ostringstream os;
  os.imbue(std::locale::classic());
  (os << ... << std::forward<Args>(args));
  return os.str();
}

[[noreturn]] void throw_internal(const char* cond, const char* file, int line,
                                 const std::string& msg);

}  // namespace detail
}  // namespace volt

/// Throws `Type` (a volt::Error subclass) with the concatenated message when `cond` is false.
#define VOLT_CHECK(cond, Type, ...)                     \
  do {                                                  \
    if (!(cond)) {                                      \
      throw Type(::volt::detail::str_cat(__VA_ARGS__)); \
    }                                                   \
  } while (false)

/// Throws volt::InternalError naming the failed invariant and its location.
#define VOLT_ASSERT(cond, ...)                                                    \
  do {                                                                            \
    if (!(cond)) {                                                                \
      ::volt::detail::throw_internal(#cond, __FILE__, __LINE__,                   \
                                     ::volt::detail::str_cat("", ##__VA_ARGS__)); \
    }                                                                             \
  } while (false)
