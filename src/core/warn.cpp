#include "volt/core/warn.h"

#include <iostream>
#include <mutex>
#include <set>

namespace volt {

bool warn_once(const std::string& key, const std::string& message) {
  static std::mutex mu;
  static std::set<std::string> seen;
  std::lock_guard<std::mutex> lock(mu);
  if (!seen.insert(key).second) return false;
  std::cerr << "volt: warning: " << message << std::endl;
  return true;
}

}  // namespace volt
