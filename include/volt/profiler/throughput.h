#pragma once
/// Throughput: rolling-window throughput of a loop (batches, samples, items and FLOPs per
/// second, model FLOPs utilisation), as Lightning's lightning.fabric.utilities.Throughput. The
/// ThroughputMonitor callback and FabricThroughputMonitor compute with it; a loop of one's own
/// can too.

#include <c10/util/Optional.h>
#include <torch/arg.h>

#include <cstdint>
#include <deque>
#include <iosfwd>
#include <string>

#include "volt/core/types.h"

namespace volt {

struct ThroughputOptions {
  /// Theoretical FLOPs per second of one device, MFU's denominator (the device's peak for the
  /// compute dtype; volt has no table of devices). Unset: no "device/mfu". Default: unset.
  TORCH_ARG(c10::optional<double>, available_flops);
  /// Devices that each run the loop on their own data (the data-parallel replicas): the
  /// job-wide figures are a device's times this; they are reported only when it is above 1.
  /// Default: 1.
  TORCH_ARG(int64_t, world_size) = 1;
  /// Updates in the rolling window (at least 2: a rate needs a first and a last); the rates
  /// appear once the window is full. Default: 100.
  TORCH_ARG(int64_t, window_size) = 100;
  /// Between "device" and a rate's name in the keys. Default: "/".
  TORCH_ARG(std::string, separator) = "/";
  /// Whether the model uses 2:4 structured sparsity: MFU's denominator is then
  /// available_flops × sparse_cuda_acceleration_factor. Unset with available_flops set warns
  /// once that MFU assumes a dense model (Lightning's warning). Default: unset.
  TORCH_ARG(c10::optional<bool>, using_sparse_model);
  /// At least 1. Default: 2.0 (NVIDIA 2:4 sparsity).
  TORCH_ARG(double, sparse_cuda_acceleration_factor) = 2.0;
};

std::ostream& operator<<(std::ostream& os, const ThroughputOptions& o);

/// Keys of compute(), with separator "/": "time", "batches", "samples" (the last update's
/// totals), "lengths" (with lengths), and once the window is full "device/batches_per_sec",
/// "device/samples_per_sec", "device/items_per_sec" (with lengths), "device/flops_per_sec"
/// (with flops), "device/mfu" (with flops and available_flops); with world_size > 1 also the
/// job's "batches_per_sec", "samples_per_sec", "items_per_sec", "flops_per_sec".
class Throughput {
 public:
  explicit Throughput(ThroughputOptions options = {});

  /// Adds one point. `time`: seconds since the loop started; `batches`, `samples`: totals on
  /// this device so far; `lengths`: total items (e.g. tokens) so far, in every update or in
  /// none; `flops`: FLOPs this device ran since the previous update. Totals and time must
  /// increase with every update (ValueError otherwise: pass running totals, not per-batch
  /// counts), samples >= batches and lengths >= samples.
  void update(double time, int64_t batches, int64_t samples,
              c10::optional<int64_t> lengths = c10::nullopt,
              c10::optional<int64_t> flops = c10::nullopt);
  /// The metrics of the points in the window (empty before the first update).
  Metrics compute() const;
  /// Forgets every point.
  void reset();

  const ThroughputOptions& options() const { return options_; }

 private:
  template <typename T>
  void push(std::deque<T>& window, T value);
  ThroughputOptions options_;
  double peak_flops_ = 0;  // MFU's denominator; 0: no MFU
  std::deque<double> time_;
  std::deque<int64_t> batches_, samples_, lengths_, flops_;
};

}  // namespace volt
