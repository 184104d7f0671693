#pragma once
/// PredictionWriter: Lightning's BasePredictionWriter, a callback that writes predict()'s outputs
/// as they come instead of holding them all; SafetensorsPredictionWriter, a ready one that
/// writes safetensors files (and, with several processes, one file in data set order).

#include <ATen/Tensor.h>
#include <torch/arg.h>

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "volt/callbacks/callback.h"

namespace volt {

/// When a PredictionWriter writes: after each batch, once at the end of the pass, or both.
enum class WriteInterval { kBatch, kEpoch, kBatchAndEpoch };

/// "batch", "epoch", "batch_and_epoch" (Lightning's write_interval values).
const char* to_string(WriteInterval interval);
/// Parses those names; ConfigError listing them otherwise.
WriteInterval parse_write_interval(const std::string& name);

/// Subclass it and override write_on_batch_end and/or write_on_epoch_end, whichever the
/// interval calls (the other throws ConfigError asking to override it when called). With
/// TrainerOptions::return_predictions(false) and the batch interval, predict() keeps no output
/// and memory stays flat however large the data set; the epoch interval holds every
/// prediction until the pass ends, as Lightning's. Each rank writes its own batches: use the
/// batch indices (the data set positions of the rows) to put them back in order.
class PredictionWriter : public Callback {
 public:
  explicit PredictionWriter(WriteInterval write_interval = WriteInterval::kBatch);
  std::string state_key() const override;
  WriteInterval write_interval() const { return interval_; }

  /// After predict_step of batch `batch_idx` of loader `dataloader_idx` (0 with one loader):
  /// `batch_indices` are its samples' data set indices.
  virtual void write_on_batch_end(RunContext& run, Module& module, const at::Tensor& prediction,
                                  const std::vector<int64_t>& batch_indices, const Batch& batch,
                                  int64_t batch_idx, int64_t dataloader_idx);
  /// At the end of the pass: every batch's prediction and indices, in batch order, of loader
  /// `dataloader_idx`. With several loaders it is called once per loader, in loader order
  /// (Lightning calls it once with a list per loader).
  virtual void write_on_epoch_end(RunContext& run, Module& module,
                                  const std::vector<at::Tensor>& predictions,
                                  const std::vector<std::vector<int64_t>>& batch_indices,
                                  int64_t dataloader_idx);

  void on_predict_epoch_start(RunContext& run, Module& module) override;
  void on_predict_batch_end(RunContext& run, Module& module, const at::Tensor& prediction,
                            const Batch& batch, int64_t batch_idx) override;
  void on_predict_epoch_end(RunContext& run, Module& module) override;

 private:
  WriteInterval interval_;
  /// Per loader: its batches' predictions and indices, for the epoch interval.
  std::vector<std::vector<at::Tensor>> predictions_;
  std::vector<std::vector<std::vector<int64_t>>> indices_;
};

struct SafetensorsPredictionWriterOptions {
  /// Folder of the files; "" = `predictions` inside the run's log folder. Default: "".
  TORCH_ARG(std::string, output_dir) = "";
  /// kBatch: a file per batch; kEpoch: one file for the pass; kBatchAndEpoch: both.
  /// Default: kEpoch.
  TORCH_ARG(WriteInterval, write_interval) = WriteInterval::kEpoch;
};

std::ostream& operator<<(std::ostream& os, const SafetensorsPredictionWriterOptions& o);

/// Writes safetensors files (atomically) holding "predictions" and, as int64, "indices": the
/// data set index of each row. With several predict loaders each file name starts with
/// `dataloader<D>_` (`dataloader1_batch_000003.safetensors`,
/// `dataloader1_predictions.safetensors`).
/// - Batch interval: `batch_<NNNNNN>.safetensors` per batch (`batch_<NNNNNN>_rank<R>` with
///   several processes).
/// - Epoch interval: `predictions.safetensors`, the pass's predictions concatenated. With
///   several processes every rank writes `predictions_rank<R>.safetensors`, then global rank 0
///   merges them into `predictions.safetensors` in data set order, each index once (the
///   distributed sampler's padding repeats some), and removes the rank files.
/// Rows are concatenated when every prediction has one row per sample of its batch and the
/// same dtype and trailing shape; otherwise the file holds `batch_<NNNNNN>` and
/// `indices_<NNNNNN>` per batch and several processes keep their rank files (logged).
class SafetensorsPredictionWriter : public PredictionWriter {
 public:
  explicit SafetensorsPredictionWriter(SafetensorsPredictionWriterOptions options = {});
  std::string state_key() const override;
  const SafetensorsPredictionWriterOptions& options() const { return options_; }
  /// The folder written to (known once predict has started).
  const std::string& output_dir() const { return dir_; }

  void on_predict_start(RunContext& run, Module& module) override;
  void write_on_batch_end(RunContext& run, Module& module, const at::Tensor& prediction,
                          const std::vector<int64_t>& batch_indices, const Batch& batch,
                          int64_t batch_idx, int64_t dataloader_idx) override;
  void write_on_epoch_end(RunContext& run, Module& module,
                          const std::vector<at::Tensor>& predictions,
                          const std::vector<std::vector<int64_t>>& batch_indices,
                          int64_t dataloader_idx) override;

 private:
  SafetensorsPredictionWriterOptions options_;
  std::string dir_;
};

}  // namespace volt
