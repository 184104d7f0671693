#pragma once
/// CSVLogger: save_dir/name/version_N/{metrics.csv, hparams.yaml}, N auto-incremented.

#include <torch/arg.h>
#include <iosfwd>

#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "volt/loggers/logger.h"

namespace volt {

struct CSVLoggerOptions {
  explicit CSVLoggerOptions(std::string save_dir) : save_dir_(std::move(save_dir)) {}
  /// Root folder of all runs.
  TORCH_ARG(std::string, save_dir);
  /// Experiment name (sub-folder). Default: "volt_logs".
  TORCH_ARG(std::string, name) = "volt_logs";
  /// Version number; -1 picks max(existing version_N) + 1. Default: -1.
  TORCH_ARG(int64_t, version) = -1;
  /// Put before every metric name, joined with "-" (Lightning's prefix and LOGGER_JOIN_CHAR):
  /// "fold1" logs train_loss as "fold1-train_loss". Default: "" (none).
  TORCH_ARG(std::string, prefix) = "";
  /// Buffered rows are written when the logged step passes a multiple of this (Lightning's
  /// (step + 1) % n == 0), when this many rows wait, before a checkpoint, and at each epoch's
  /// end. Default: 100.
  TORCH_ARG(int64_t, flush_logs_every_n_steps) = 100;
};

std::ostream& operator<<(std::ostream& os, const CSVLoggerOptions& o);

/// Writes one CSV row per log_metrics call with columns step + the union of metric names;
/// when a new metric appears the file is rewritten (atomically) with the wider header, from the
/// rows on disk (as Lightning's logger does): memory holds only the rows not yet written, however
/// long the run.
class CSVLogger : public Logger {
 public:
  explicit CSVLogger(CSVLoggerOptions options);
  std::string name() const override { return "csv"; }
  std::string log_dir() override;
  int64_t version();
  /// version() as text.
  std::string version_name() override;
  /// save_dir/name.
  std::string root_dir() override;
  /// Merges `params` into the ones this logger was given before (a later value wins) and
  /// writes them all to hparams.yaml, as Lightning's ExperimentWriter.log_hparams.
  void log_hyperparams(const std::map<std::string, std::string>& params) override;
  /// A metric named "step" is not a column: the row's step is `step` (Lightning's writer sets
  /// "step" last, over a logged one).
  void log_metrics(const Metrics& metrics, int64_t step) override;
  void save() override;
  void save_state(torch::serialize::OutputArchive& archive) const override;
  void load_state(torch::serialize::InputArchive& archive, int64_t step) override;
  /// Path of metrics.csv.
  std::string metrics_path();

 private:
  struct Row {
    int64_t step;
    Metrics values;
  };
  void rewrite();
  CSVLoggerOptions options_;
  int64_t version_ = -1;
  std::map<std::string, std::string> hparams_;  // every log_hyperparams's, merged
  std::vector<std::string> columns_;            // metric names in header order (after "step")
  std::set<std::string> known_;                 // the same names, for lookups
  std::vector<Row> pending_;                    // rows not written yet (a flush interval's at most)
  int64_t last_written_step_ = -1;              // the step of the last row on disk (-1: none)
  // The bytes of metrics.csv that are this run's whole rows (0: it has no file yet); a rewrite
  // copies the rows in them, nothing a failed append left after them.
  uint64_t written_bytes_ = 0;
  size_t written_columns_ = 0;   // metric columns of the header on disk
  int64_t drop_from_step_ = -1;  // after a resume: rows on disk from this step on are dropped
  bool must_rewrite_ = false;    // a resume or a failed append: the next save rewrites the file
};

}  // namespace volt
