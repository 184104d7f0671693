#pragma once
// Private: which of a Module's overridable steps ran as their default. C++ cannot ask whether
// a virtual is overridden, so each default marks that it ran; the Trainer clears the marks, runs
// a step and reads which defaults did not run. A graphed training step needs it: a graph replays
// what the step did when it was captured, which is all of the default's work but not an
// override's decisions (a learning-rate warm-up in optimizer_step would be frozen).

#include <string>

#include "volt/core/module.h"

namespace volt {
namespace detail {

struct DefaultSteps {
  enum Bit : unsigned {
    kBackward = 1,
    kOptimizerStep = 2,
    kGradientClipping = 4,
  };
  static void mark(Module& m, Bit bit) { m.default_steps_ran_ |= bit; }
  static void clear(Module& m) { m.default_steps_ran_ = 0; }
  /// The steps among backward, optimizer_step and configure_gradient_clipping that ran since
  /// clear() without their default ("backward, optimizer_step"), "" when every one did: call it
  /// after a step that ran all three.
  static std::string overridden(const Module& m) {
    std::string out;
    const auto add = [&](Bit bit, const char* name) {
      if ((m.default_steps_ran_ & bit) != 0) return;
      out += out.empty() ? "" : ", ";
      out += name;
    };
    add(kBackward, "backward");
    add(kOptimizerStep, "optimizer_step");
    add(kGradientClipping, "configure_gradient_clipping");
    return out;
  }
};

}  // namespace detail
}  // namespace volt
