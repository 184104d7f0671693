#pragma once
/// One-time warnings: a fast path that falls back, a setting that is ignored, said once per key.

#include <string>

namespace volt {

/// Prints "volt: warning: <message>" to stderr the first time `key` is seen in this process;
/// returns true when it printed. Thread-safe.
bool warn_once(const std::string& key, const std::string& message);

}  // namespace volt
