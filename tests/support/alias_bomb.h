#pragma once
// YAML "billion laughs" for the tests of volt's bounded YAML reading.

#include <string>

namespace volt_test {

/// Line 0 anchors a list of `per_level` scalars "lol"; each of `levels` more lines anchors a list
/// of `per_level` aliases of the line before, so the last expands to per_level^(levels+1)
/// scalars. `flow`: the same lists inside one flow sequence, on one line (a command-line value).
inline std::string alias_bomb(int levels, int per_level, bool flow = false) {
  std::string s = flow ? "[&l0 [" : "l0: &l0 [";
  for (int j = 0; j < per_level; ++j) s += j ? ", lol" : "lol";
  s += flow ? "]" : "]\n";
  for (int i = 1; i <= levels; ++i) {
    s += flow ? ", &l" + std::to_string(i) + " ["
              : "l" + std::to_string(i) + ": &l" + std::to_string(i) + " [";
    for (int j = 0; j < per_level; ++j) s += (j ? ", *l" : "*l") + std::to_string(i - 1);
    s += flow ? "]" : "]\n";
  }
  return s + (flow ? "]" : "");
}

}  // namespace volt_test
