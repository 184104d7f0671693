#pragma once
/// scale_batch_size: Lightning's Tuner.scale_batch_size (BatchSizeFinder): short trials of a
/// Trainer entry point at growing batch sizes until one runs out of memory, then the largest
/// size that fitted. The module's tensors and torch's CPU random state are left as they were.

#include <c10/util/Optional.h>
#include <torch/arg.h>

#include <cstdint>
#include <functional>
#include <vector>

#include "volt/core/types.h"
#include "volt/data/data_loader.h"
#include "volt/data/data_module.h"
#include "volt/trainer/trainer_options.h"

namespace volt {

class Module;

enum class BatchSizeScaling {
  /// Double the batch size until a trial runs out of memory; keep the last size that fitted.
  kPower,
  /// Double until a trial runs out of memory, then bisect between the last size that fitted and
  /// the first that did not; the result is then reduced by `margin`.
  kBinsearch,
};

struct BatchSizeFinderOptions {
  /// How the size changes between trials. Default: kPower.
  TORCH_ARG(BatchSizeScaling, mode) = BatchSizeScaling::kPower;
  /// Optimizer steps (kFit) or batches (kValidate, kTest, kPredict) each trial runs; one usually
  /// shows whether a size fits, a few catch memory that grows after the first step (optimizer
  /// state). Default: 3.
  TORCH_ARG(int64_t, steps_per_trial) = 3;
  /// The first batch size tried. Default: 2.
  TORCH_ARG(int64_t, init_val) = 2;
  /// The most trials the search runs. Default: 25.
  TORCH_ARG(int64_t, max_trials) = 25;
  /// kBinsearch only: the size found is reduced to int(size * (1 - margin)) (at least 1), room
  /// for memory a full run takes beyond a short trial. In [0, 1). Default: 0.05.
  TORCH_ARG(double, margin) = 0.05;
  /// No size above this is tried; unset = no cap. Sizes are also capped at the loader's
  /// dataset length. Default: 8192 (as Lightning 2.6).
  TORCH_ARG(c10::optional<int64_t>, max_val) = 8192;
  /// The entry point the trials run and whose loader is sized: kFit (train_dataloader),
  /// kValidate, kTest or kPredict. Default: kFit.
  TORCH_ARG(Stage, stage) = Stage::kFit;
  /// CPU: the most bytes of tensor memory a trial may hold beyond what is alive when it starts
  /// (the model's parameters, the data set); an allocation above it fails as a GPU's would when
  /// full (set_cpu_memory_limit). For finding the batch that fits a memory budget on a shared
  /// machine. Unset: only real allocation failures count. Default: unset.
  TORCH_ARG(c10::optional<int64_t>, max_memory_bytes);

 public:
  /// Throws ConfigError on the first invalid value.
  void validate() const;
};

/// One trial of the search.
struct BatchSizeTrial {
  int64_t batch_size = 0;
  /// False: the trial ran out of memory.
  bool fits = false;
  /// The peak of CPU tensor memory during the trial beyond what was alive before it, in bytes;
  /// -1 when CPU memory is not counted (counted with max_memory_bytes, DeviceStatsMonitor or
  /// install_counting_cpu_allocator()).
  int64_t peak_bytes = -1;
};

struct BatchSizeFinderResult {
  /// The size chosen: the largest that fitted (kBinsearch: less the margin). 0 when the search
  /// did not run (fast_dev_run).
  int64_t batch_size = 0;
  /// Every trial in the order run.
  std::vector<BatchSizeTrial> trials;
};

/// Runs the search with a Trainer built from `options` (its accelerator, precision,
/// accumulation and clipping count; the trials set their own stop and batch limits and run
/// without validation, checkpoints, loggers, callbacks, profiler, CheckpointIO, progress bar or
/// summary), and sets the size found on the DataModule, which must override batch_size() and
/// set_batch_size(). One process only (ConfigError otherwise, as Lightning does not support DDP
/// here). A trial that fails with anything but an out-of-memory error ends the search with that
/// error. When even a batch of one runs out of memory it throws NotAvailable. The module's
/// parameters and buffers and torch's CPU random state are as before the call, also when it throws;
/// with fast_dev_run it does nothing (warned), as Lightning.
BatchSizeFinderResult scale_batch_size(Module& module, DataModule& data,
                                       TrainerOptions options = TrainerOptions(),
                                       BatchSizeFinderOptions finder = BatchSizeFinderOptions());
/// The same on the module's own loaders (Module::train_dataloader() and the others), sized
/// through Module::batch_size() / set_batch_size() (Lightning's Tuner on `model.batch_size`).
BatchSizeFinderResult scale_batch_size(Module& module, TrainerOptions options = TrainerOptions(),
                                       BatchSizeFinderOptions finder = BatchSizeFinderOptions());
/// The same for a program that builds its loaders itself: `make_loader(batch_size)` returns the
/// loader of the finder's stage at that size. The caller builds its run with the size returned.
BatchSizeFinderResult scale_batch_size(Module& module,
                                       const std::function<DataLoader(int64_t)>& make_loader,
                                       TrainerOptions options = TrainerOptions(),
                                       BatchSizeFinderOptions finder = BatchSizeFinderOptions());

}  // namespace volt
