#include "volt/callbacks/throughput_monitor.h"

#include <ostream>

#include "volt/core/check.h"
#include "volt/core/run_context.h"
#include "volt/loggers/logger.h"

namespace volt {

std::ostream& operator<<(std::ostream& os, const ThroughputMonitorOptions& o) {
  return os << "ThroughputMonitorOptions(batch_size_fn="
            << (o.batch_size_fn() ? "custom" : "Batch::size") << ")";
}

ThroughputMonitor::ThroughputMonitor(ThroughputMonitorOptions options)
    : options_(std::move(options)) {}

void ThroughputMonitor::start_window(Clock::time_point now) {
  window_start_ = now;
  paused_s_ = 0;
  samples_ = 0;
  batches_ = 0;
}

void ThroughputMonitor::on_train_start(RunContext& run, Module&) {
  VOLT_CHECK(run.has_loggers(), ConfigError,
             "[ThroughputMonitor] the Trainer has no logger, so the throughput would go "
             "nowhere; add a logger (TrainerOptions::logger(true) or loggers({...})) or drop the "
             "callback.");
  last_global_step_ = run.state().global_step;  // a resumed run starts mid-way
  start_window(Clock::now());
}

void ThroughputMonitor::on_train_batch_end(RunContext& run, Module&, const Batch& batch, int64_t) {
  const int64_t n = options_.batch_size_fn() ? options_.batch_size_fn()(batch) : batch.size();
  VOLT_CHECK(n >= 0, ValueError, "[ThroughputMonitor] batch_size_fn returned ", n,
             "; return the number of samples in the batch (>= 0).");
  samples_ += n;
  ++batches_;
  // The Trainer sends step metrics when a batch's optimizer steps take global_step past a
  // multiple of log_every_n_steps (several steps a batch under manual optimization), under the
  // step index global_step - 1; log alongside them. Under gradient accumulation the batches
  // without an optimizer step only add to the window.
  const int64_t step = run.state().global_step;
  const int64_t before = last_global_step_;
  if (step == before) return;
  last_global_step_ = step;
  const int64_t every = run.log_every_n_steps();
  if (step / every <= before / every) return;
  const auto now = Clock::now();
  const double seconds = std::chrono::duration<double>(now - window_start_).count() - paused_s_;
  if (seconds <= 0) return;  // a clock that did not advance: keep counting into the next window
  Metrics stats;
  const double samples = static_cast<double>(samples_) / seconds;
  const double batches = static_cast<double>(batches_) / seconds;
  const int64_t replicas = run.data_parallel_size();
  stats[kSamplesPerSec] = samples * static_cast<double>(replicas);
  stats[kBatchesPerSec] = batches * static_cast<double>(replicas);
  if (replicas > 1) {
    stats[kDeviceSamplesPerSec] = samples;
    stats[kDeviceBatchesPerSec] = batches;
  }
  if (run.is_global_zero()) {
    for (const auto& l : run.loggers()) l->log_metrics(stats, step - 1);
  }
  last_ = stats;
  start_window(now);
}

// Validation inside a window is not training time: leaving it in would make the throughput
// drop at every validation check (Lightning excludes it the same way).
// The sanity check comes before any window (Lightning's monitor skips it too).
void ThroughputMonitor::on_validation_start(RunContext& run, Module&) {
  if (run.sanity_checking()) return;
  validation_start_ = Clock::now();
}

void ThroughputMonitor::on_validation_end(RunContext& run, Module&) {
  if (run.sanity_checking()) return;
  paused_s_ += std::chrono::duration<double>(Clock::now() - validation_start_).count();
}

}  // namespace volt
