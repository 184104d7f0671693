#pragma once
// Registering a kernel over libtorch's own autocast kernel makes the dispatcher warn once per
// operator; volt does it on purpose and says so in one line of its own, so the registrations
// run under QuietWarningsGuard.

#include <c10/util/Exception.h>

#include <string>

#include "volt/core/version.h"

namespace volt::detail {

/// A libtorch warning handler that hands each warning's text to take(): the one place for the
/// handler's signature, which changed in libtorch 2.0. Install it with WarningHandlerGuard.
class WarningSink : public c10::WarningHandler {
 public:
#if VOLT_TORCH_AT_LEAST(2, 0)
  void process(const c10::Warning& w) override {
    take(w.msg());
  }
#else
  void process(const c10::SourceLocation&, const std::string& msg, const bool) override {
    take(msg);
  }
#endif
  virtual void take(const std::string& msg) = 0;
};

class QuietWarnings : public WarningSink {
 public:
  void take(const std::string&) override {}
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
