#pragma once
// Private: the Trainer's per-step logging cadence, one rule for the fit loop and the monitors
// that log beside it (ThroughputMonitor, DeviceStatsMonitor).

#include <cstdint>

namespace volt {
namespace detail {

/// Whether a training batch that took the optimizer step count from `before` to `after` ends
/// where the Trainer sends its step metrics: the count passed a multiple of `every`
/// (log_every_n_steps). One step a batch (automatic optimization) logs after steps n, 2n, ...;
/// a batch without a step (gradient accumulation) never; a batch of several steps (manual
/// optimization) when it crosses a multiple.
inline bool passes_log_step(int64_t before, int64_t after, int64_t every) {
  return after / every > before / every;
}

}  // namespace detail
}  // namespace volt
