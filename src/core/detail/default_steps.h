#pragma once
// Private: which of a Module's (or DataModule's) overridable hooks ran as their default. C++
// cannot ask whether a virtual is overridden, so each default marks that it ran; the Trainer
// clears the marks, calls the hook and reads whether the default ran. A graphed training step
// needs it (a graph replays what the step did when it was captured, which is all of the
// default's work but not an override's decisions: a learning-rate warm-up in optimizer_step would
// be frozen), and so do the batch-transfer hooks (a DataModule's override replaces the Module's).
// The same friend access gates Module::skip_rest_of_epoch() to the module's on_train_batch_start
// (train_batch_start).

#include <string>

#include "volt/core/module.h"

namespace volt {
namespace detail {

struct DefaultSteps {
  enum Bit : unsigned {
    kBackward = 1,
    kOptimizerStep = 2,
    kGradientClipping = 4,
    // The DataModule's batch hooks.
    kBeforeBatchTransfer = 8,
    kTransferBatch = 16,
    kAfterBatchTransfer = 32,
    // The Module's evaluation steps (none: nothing to validate or test).
    kValidationStep = 64,
    kTestStep = 128,
  };
  // T: Module or DataModule (both befriend this struct).
  template <typename T>
  static void mark(T& t, Bit bit) {
    t.default_steps_ran_ |= bit;
  }
  template <typename T>
  static void clear(T& t) {
    t.default_steps_ran_ = 0;
  }
  template <typename T>
  static bool ran(const T& t, Bit bit) {
    return (t.default_steps_ran_ & bit) != 0;
  }
  /// `hook` (the module's on_train_batch_start) run with skip_rest_of_epoch() allowed: whether
  /// it called that.
  template <typename Hook>
  static bool train_batch_start(Module& m, Hook&& hook) {
    struct Close {
      Module& m;
      ~Close() { m.batch_start_ = 0; }
    } close{m};
    m.batch_start_ = 1;
    hook();
    return m.batch_start_ == 2;
  }
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
