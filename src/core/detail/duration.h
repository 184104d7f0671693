#pragma once
// Lightning's duration forms (its Timer's and Trainer max_time's): "DD:HH:MM:SS" text and the
// keywords of datetime.timedelta. No torch includes: the CLI's resolver reads them too.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace volt {
namespace detail {

/// "DD:HH:MM:SS" (days, hours, minutes, seconds; blanks around it allowed, as Lightning strips
/// it) in seconds; nullopt when `text` is not Lightning's pattern, (\d+):(\d\d):(\d\d):(\d\d):
/// days of any length, then two digits each.
inline std::optional<double> parse_dd_hh_mm_ss(const std::string& text) {
  const size_t b = text.find_first_not_of(" \t");
  const size_t e = text.find_last_not_of(" \t");
  if (b == std::string::npos) return std::nullopt;
  const std::string s = text.substr(b, e - b + 1);
  std::vector<int64_t> parts;
  size_t start = 0;
  while (true) {
    const size_t colon = s.find(':', start);
    const std::string part = s.substr(start, colon == std::string::npos ? colon : colon - start);
    // At most 18 digits: every such number fits an int64.
    const bool days = parts.empty();
    if (part.empty() || part.size() > 18 || (!days && part.size() != 2) ||
        part.find_first_not_of("0123456789") != std::string::npos) {
      return std::nullopt;
    }
    parts.push_back(std::stoll(part));
    if (colon == std::string::npos) break;
    start = colon + 1;
  }
  if (parts.size() != 4) return std::nullopt;
  return ((parts[0] * 24.0 + parts[1]) * 60.0 + parts[2]) * 60.0 + parts[3];
}

/// Seconds per unit of a datetime.timedelta keyword ("weeks" ... "microseconds"); 0 for another
/// word.
inline double timedelta_unit_seconds(const std::string& key) {
  if (key == "weeks") return 7 * 86400.0;
  if (key == "days") return 86400.0;
  if (key == "hours") return 3600.0;
  if (key == "minutes") return 60.0;
  if (key == "seconds") return 1.0;
  if (key == "milliseconds") return 1e-3;
  if (key == "microseconds") return 1e-6;
  return 0.0;
}

}  // namespace detail
}  // namespace volt
