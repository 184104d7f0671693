#pragma once
// Private: "did you mean" for a mistyped name. One edit distance and one length bound for the
// registry's closest_match (class names, options, CLI keys) and the autocast operator lists.
// No torch includes.

#include <algorithm>
#include <cstddef>
#include <string_view>
#include <vector>

#include "core/detail/ascii.h"

namespace volt::detail {

/// Words longer than this get no suggestion: no name volt suggests is that long, and comparing a
/// word costs its length times each candidate's (a 40 MB word against two names took 2 s, a 1 MB
/// operator name against aten's ~2,000 24 s).
constexpr size_t kMaxSuggestedWord = 256;

/// Levenshtein distance between `a` and `b`, ASCII letters compared without case.
inline size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t sub = prev[j - 1] + (ascii_lower(a[i - 1]) == ascii_lower(b[j - 1]) ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

}  // namespace volt::detail
