#pragma once
/// FabricThroughputMonitor: Throughput for a Fabric loop, logging through Fabric::log_dict, as
/// Lightning's lightning.fabric.utilities.ThroughputMonitor.

#include <cstdint>

#include "volt/profiler/throughput.h"

namespace volt {

class Fabric;

/// A Throughput whose world_size is the Fabric's (its processes; launched here if they were
/// not) and whose calls act on global rank 0 only (elsewhere they do nothing; compute and
/// compute_and_log return nothing), as Lightning's rank_zero_only methods.
///
///   volt::FabricThroughputMonitor throughput(fabric);
///   const auto t0 = std::chrono::steady_clock::now();
///   for (int64_t i = 1; i <= steps; ++i) {
///     train_one_batch();
///     const double t = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0)
///                          .count();
///     throughput.update(t, i, i * batch_size);
///     if (i % 10 == 0) throughput.compute_and_log(i);
///   }
class FabricThroughputMonitor {
 public:
  /// `options.world_size()` is replaced by the Fabric's world size.
  explicit FabricThroughputMonitor(Fabric& fabric, ThroughputOptions options = {});

  /// Throughput::update on rank 0.
  void update(double time, int64_t batches, int64_t samples,
              c10::optional<int64_t> lengths = c10::nullopt,
              c10::optional<int64_t> flops = c10::nullopt);
  /// Throughput::compute on rank 0; empty elsewhere.
  Metrics compute() const;
  /// Computes and sends the metrics to the Fabric's loggers at `step` (default: the previous
  /// call's step + 1, from 0), returning them; empty on other ranks.
  Metrics compute_and_log(c10::optional<int64_t> step = c10::nullopt);
  /// Throughput::reset on rank 0.
  void reset();
  /// The step of the last compute_and_log (-1 before the first).
  int64_t step() const { return step_; }

 private:
  Fabric& fabric_;
  bool rank_zero_;
  Throughput throughput_;
  int64_t step_ = -1;
};

}  // namespace volt
