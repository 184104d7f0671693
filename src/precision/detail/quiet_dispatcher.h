#pragma once
// Registering a kernel over libtorch's own autocast kernel makes the dispatcher warn once per
// operator; volt does it on purpose and says so in one line of its own, so the registrations
// run under QuietWarningsGuard.

#include <c10/util/Exception.h>

#include "volt/core/version.h"

namespace volt::detail {

class QuietWarnings : public c10::WarningHandler {
 public:
#if VOLT_TORCH_AT_LEAST(2, 0)
  void process(const c10::Warning&) override {}
#else
  void process(const c10::SourceLocation&, const std::string&, const bool) override {}
#endif
};

#if VOLT_TORCH_AT_LEAST(2, 0)
using WarningHandlerGuard = c10::WarningUtils::WarningHandlerGuard;
#else
using WarningHandlerGuard = c10::Warning::WarningHandlerGuard;
#endif

/// Drops libtorch's warnings in this thread while it lives: declare one around kernel
/// registrations and Library resets.
class QuietWarningsGuard {
 public:
  QuietWarningsGuard() : guard_(&quiet_) {}
  QuietWarningsGuard(const QuietWarningsGuard&) = delete;
  QuietWarningsGuard& operator=(const QuietWarningsGuard&) = delete;

 private:
  QuietWarnings quiet_;  // declared first: guard_ points at it
  WarningHandlerGuard guard_;
};

}  // namespace volt::detail
