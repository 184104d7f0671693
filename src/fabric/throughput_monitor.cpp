#include "volt/fabric/throughput_monitor.h"

#include "volt/fabric/fabric.h"

namespace volt {
namespace {

ThroughputOptions with_world_size(ThroughputOptions o, Fabric& fabric) {
  return o.world_size(fabric.world_size());
}

}  // namespace

FabricThroughputMonitor::FabricThroughputMonitor(Fabric& fabric, ThroughputOptions options)
    : fabric_(fabric),
      rank_zero_(fabric.is_global_zero()),
      throughput_(with_world_size(std::move(options), fabric)) {}

void FabricThroughputMonitor::update(double time, int64_t batches, int64_t samples,
                                     c10::optional<int64_t> lengths, c10::optional<int64_t> flops) {
  if (rank_zero_) throughput_.update(time, batches, samples, lengths, flops);
}

Metrics FabricThroughputMonitor::compute() const {
  return rank_zero_ ? throughput_.compute() : Metrics{};
}

Metrics FabricThroughputMonitor::compute_and_log(c10::optional<int64_t> step) {
  if (!rank_zero_) return {};
  step_ = step ? *step : step_ + 1;
  const Metrics metrics = throughput_.compute();
  fabric_.log_dict(metrics, step_);
  return metrics;
}

void FabricThroughputMonitor::reset() {
  if (rank_zero_) throughput_.reset();
}

}  // namespace volt
