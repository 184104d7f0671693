#pragma once
// Private: the number N of a run folder named "version_N" (what CSVLogger and TensorBoardLogger
// create, what `volt report` looks for).

#include <cstdint>
#include <optional>
#include <string>

namespace volt {
namespace detail {

/// N when `name` is "version_N" with N of 1 to 18 decimal digits (every such number fits an
/// int64); nullopt otherwise, including for more digits, which no volt run writes and which
/// std::stoll would refuse with std::out_of_range.
inline std::optional<int64_t> version_folder_number(const std::string& name) {
  constexpr size_t kPrefix = 8;  // "version_"
  if (name.rfind("version_", 0) != 0 || name.size() == kPrefix || name.size() > kPrefix + 18 ||
      name.find_first_not_of("0123456789", kPrefix) != std::string::npos) {
    return std::nullopt;
  }
  int64_t n = 0;
  for (size_t i = kPrefix; i < name.size(); ++i) n = n * 10 + (name[i] - '0');
  return n;
}

}  // namespace detail
}  // namespace volt
