#pragma once
// Private: Python's repr of a float, for text that Lightning renders with Python's formatting
// (ModelCheckpoint's file names, EarlyStopping's messages).

#include <fmt/format.h>

#include <string>

namespace volt {
namespace detail {

/// The shortest text that reads back to the same double (fmt's "{}", as Python's repr), with
/// ".0" when that is a whole number: 0.1 -> "0.1", 2 -> "2.0", 1e-05 -> "1e-05", inf -> "inf".
inline std::string python_repr(double value) {
  std::string out = fmt::format("{}", value);
  if (out.find_first_of(".en") == std::string::npos) out += ".0";  // "inf" and "nan" have an n
  return out;
}

}  // namespace detail
}  // namespace volt
