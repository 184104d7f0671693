#pragma once
// The lines volt logs while a test body runs (the sink is restored even when the body throws).

#include <functional>
#include <string>
#include <vector>

#include "volt/core/log.h"

namespace volt_test {

inline std::vector<std::string> capture_logs(const std::function<void()>& body) {
  std::vector<std::string> lines;
  volt::set_log_sink([&](volt::LogLevel, const std::string& l) { lines.push_back(l); });
  try {
    body();
  } catch (...) {
    volt::set_log_sink(nullptr);
    throw;
  }
  volt::set_log_sink(nullptr);
  return lines;
}

/// Whether `text` contains `phrase`.
inline bool has(const std::string& text, const std::string& phrase) {
  return text.find(phrase) != std::string::npos;
}

/// Whether any of the logged `lines` contains `phrase`.
inline bool has(const std::vector<std::string>& lines, const std::string& phrase) {
  for (const auto& l : lines) {
    if (has(l, phrase)) return true;
  }
  return false;
}

}  // namespace volt_test
