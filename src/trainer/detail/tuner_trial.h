#pragma once
// Marks the Trainers a tuner runs as its trials, gives a tuner callback the strategy of the run
// it is part of, and makes a precision from its Spec as resolve_plan does (the tuners live above
// the Trainer, in tuner/; plan.cpp defines make_precision and uses it itself).

#include <memory>
#include <string>

#include "volt/core/spec.h"

namespace volt {

class Precision;
class RunContext;
class Strategy;

namespace detail {

/// The precision a Spec names (its object, or a new one from the registry): resolve_plan's rule,
/// also for a tuner's trial that needs a precision of its own. ConfigError naming `component`
/// for an unknown name.
std::shared_ptr<Precision> make_precision(const Spec<Precision>& precision,
                                          const std::string& component);

/// The strategy of the Trainer run behind `run`: a tuner callback's trials in a DDP fit run on
/// its processes (DdpStrategy::sharing_processes_of). InternalError for a RunContext that is not
/// a Trainer's.
std::shared_ptr<Strategy> run_strategy(RunContext& run);

/// While one is alive on this thread, the Trainers this thread runs are a tuner's trials: they
/// do not ask the module's configure_callbacks(), as Lightning's tuners run their trials
/// without the run's callbacks (a ModelCheckpoint the module brings would save trial states).
class TunerTrialScope {
 public:
  TunerTrialScope();
  ~TunerTrialScope();
  TunerTrialScope(const TunerTrialScope&) = delete;
  TunerTrialScope& operator=(const TunerTrialScope&) = delete;
  static bool active();
};

}  // namespace detail
}  // namespace volt
