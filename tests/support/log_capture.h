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

}  // namespace volt_test
