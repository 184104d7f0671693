#pragma once
// What a call threw, for the tests that check an error's type and a key phrase of its message.

#include <string>

#include "volt/core/errors.h"

namespace volt_test {

/// The message of the E that `fn` throws, or "" when it throws none (other exceptions propagate,
/// failing the test).
template <typename E = volt::Error, typename F>
std::string error_of(F&& fn) {
  try {
    fn();
  } catch (const E& e) {
    return e.what();
  }
  return "";
}

}  // namespace volt_test
