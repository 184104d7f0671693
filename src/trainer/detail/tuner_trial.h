#pragma once
// Marks the Trainers a tuner runs as its trials (the tuners live above the Trainer, in tuner/).

namespace volt {
namespace detail {

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
