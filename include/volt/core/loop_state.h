#pragma once
/// LoopState: the loop progress that callbacks and modules may read.

#include <cstdint>

#include "volt/core/types.h"

namespace volt {

/// Loop progress. Saved in every checkpoint; a resume restores it exactly.
struct LoopState {
  Stage stage = Stage::kNone;
  RunStatus status = RunStatus::kInitializing;
  int64_t epoch = 0;               ///< current epoch (0-based)
  int64_t global_step = 0;         ///< optimizer steps taken so far
  int64_t batches_done = 0;        ///< training batches finished in the current epoch
  int64_t total_batches_done = 0;  ///< training batches finished in the whole run
  int64_t accumulated = 0;         ///< backward passes accumulated since the last step
  /// Batches per optimizer step in the current epoch: TrainerOptions::accumulate_grad_batches,
  /// or what a GradientAccumulationScheduler set (not saved: it is set again when the epoch
  /// starts).
  int64_t accumulate_grad_batches = 1;
  int64_t num_training_batches = 0;  ///< batches per epoch after limits
  int64_t num_eval_batches = 0;      ///< batches of the current/last validation or test loader
  /// The fit's validation schedule, for the callbacks that act after validation: the batches of
  /// one validation check over its loaders after the limits (0: the fit does not validate), and
  /// whether TrainerOptions::val_check_interval is 1.0 (once per epoch, at its end) and
  /// check_val_every_n_epoch is 1.
  int64_t num_val_batches = 0;
  bool val_check_at_epoch_end = true;
  bool val_every_epoch = true;
  /// The loader whose batches a validation, test or predict pass runs now (Lightning's
  /// dataloader_idx): given several loaders, a pass runs them one after the other, each from
  /// its batch 0. 0 with one loader; between the loaders (the epoch hooks) the last one's.
  int64_t dataloader_idx = 0;
  /// The loaders of the current/last validation, test or predict pass (1 without several).
  int64_t num_dataloaders = 1;
  bool epoch_finished = false;  ///< the current epoch's training loop has ended
  bool val_pending = false;     ///< a due validation check has not yet run
  bool should_stop = false;     ///< a callback asked to stop
};

}  // namespace volt
