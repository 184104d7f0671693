#pragma once
// Shared by the libFuzzer targets: which exceptions count as a correct refusal of bad input.
// Anything else escaping volt (a std::exception of another type, a c10::Error, a crash, a
// sanitizer report, a timeout or a memory blow-up) is a finding: libFuzzer stops and saves the
// input.

#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

namespace volt_fuzz {

/// Aborts (a finding) with `what` printed first.
[[noreturn]] inline void finding(const std::string& what) {
  std::fprintf(stderr, "FUZZ FINDING: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

/// With VOLT_FUZZ_VERBOSE=1 in the environment (e.g. replaying one corpus file), prints what the
/// target did with the input: the refusal message or a summary of what was accepted.
inline void trace(const std::string& what) {
  static const bool on = std::getenv("VOLT_FUZZ_VERBOSE") != nullptr;
  if (on) std::fprintf(stderr, "%s\n", what.c_str());
}

}  // namespace volt_fuzz
