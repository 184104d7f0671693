#pragma once
// Marks the Trainers a tuner runs as its trials, and gives a tuner callback the strategy of the
// run it is part of (the tuners live above the Trainer, in tuner/).

#include <memory>

namespace volt {

class RunContext;
class Strategy;

namespace detail {

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
