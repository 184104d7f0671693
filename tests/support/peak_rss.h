#pragma once
// The process's peak resident set (KiB), for tests that bound what an operation costs at its
// peak. A high-water mark: ctest runs each test in its own process, so the difference around an
// operation is that operation's (when it sets a new peak).

#include <sys/resource.h>

namespace volt_test {

inline long peak_rss_kb() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return u.ru_maxrss;
}

}  // namespace volt_test
