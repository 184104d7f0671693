#include "volt/callbacks/device_stats_monitor.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <ostream>

#include "core/detail/log_cadence.h"
#include "core/detail/numbers.h"
#include "volt/core/check.h"
#include "volt/core/run_context.h"
#include "volt/loggers/logger.h"

namespace volt {
namespace {

double clock_s(clockid_t id) {
  timespec ts{};
  ::clock_gettime(id, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Resident set size: the second field of /proc/self/statm, in pages.
double rss_bytes() {
  auto in = detail::c_stream<std::ifstream>("/proc/self/statm");
  long long size = 0, resident = 0;
  if (!(in >> size >> resident)) return 0;
  return static_cast<double>(resident) * static_cast<double>(::sysconf(_SC_PAGESIZE));
}

}  // namespace

std::ostream& operator<<(std::ostream& os, const DeviceStatsMonitorOptions& o) {
  return os << "DeviceStatsMonitorOptions(logging_interval="
            << (o.logging_interval() == Interval::kStep ? "step" : "epoch")
            << ", host_stats=" << o.host_stats() << ")";
}

DeviceStatsMonitor::DeviceStatsMonitor(DeviceStatsMonitorOptions options) : options_(options) {}

void DeviceStatsMonitor::on_fit_start(RunContext& run, Module&) {
  VOLT_CHECK(run.has_loggers(), ConfigError,
             "[DeviceStatsMonitor] the Trainer has no logger, so the device stats would go "
             "nowhere; add a logger (TrainerOptions::logger(true) or loggers({...})) or drop the "
             "callback.");
  VOLT_CHECK(!run.device_stats().empty(), NotAvailable,
             "[DeviceStatsMonitor] this run's accelerator reports no memory statistics; train on "
             "the CPU or CUDA, or drop the callback.");
  // A resumed fit starts at the checkpoint's step, which was logged (or passed) before it.
  last_step_logged_ = run.state().global_step;
  last_cpu_s_ = clock_s(CLOCK_PROCESS_CPUTIME_ID);
  last_wall_s_ = clock_s(CLOCK_MONOTONIC);
}

void DeviceStatsMonitor::on_train_batch_end(RunContext& run, Module&, const Batch&, int64_t) {
  if (options_.logging_interval() != Interval::kStep) return;
  const int64_t step = run.state().global_step;
  // The Trainer's own cadence: after the batch whose optimizer steps take global_step past a
  // multiple of n (several steps a batch under manual optimization), once per optimizer step
  // under gradient accumulation; logged at the step the Trainer logs it at. The step count did
  // not pass one since the last row exactly when both lie in the same multiple's span.
  if (!detail::passes_log_step(last_step_logged_, step, run.log_every_n_steps())) return;
  last_step_logged_ = step;
  log(run, step - 1);
}

void DeviceStatsMonitor::on_train_epoch_end(RunContext& run, Module&) {
  if (options_.logging_interval() != Interval::kEpoch) return;
  log(run, std::max<int64_t>(run.state().global_step - 1, 0));
}

void DeviceStatsMonitor::log(RunContext& run, int64_t step) {
  Metrics stats;
  for (const auto& kv : run.device_stats()) stats[kPrefix + kv.first] = kv.second;
  if (options_.host_stats()) {
    const double cpu = clock_s(CLOCK_PROCESS_CPUTIME_ID);
    const double wall = clock_s(CLOCK_MONOTONIC);
    stats[std::string(kPrefix) + "host_rss_bytes"] = rss_bytes();
    stats[std::string(kPrefix) + "host_cpu_percent"] =
        wall > last_wall_s_ ? 100.0 * (cpu - last_cpu_s_) / (wall - last_wall_s_) : 0.0;
    last_cpu_s_ = cpu;
    last_wall_s_ = wall;
  }
  for (const auto& l : run.loggers()) l->log_metrics(stats, step);
  last_ = std::move(stats);
}

}  // namespace volt
