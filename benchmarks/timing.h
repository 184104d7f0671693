#pragma once
// Timing helpers every benchmark uses: medians of repeated measurements, and the wall time of a
// call.

#include <algorithm>
#include <chrono>
#include <functional>
#include <vector>

namespace volt_bench {

/// The middle value of `v` (the upper one of an even count); 0 when empty.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

/// Milliseconds `f` takes (steady clock).
inline double time_ms(const std::function<void()>& f) {
  const auto t0 = std::chrono::steady_clock::now();
  f();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace volt_bench
