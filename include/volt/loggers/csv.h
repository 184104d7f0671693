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
  /// Buffered rows are written when the logged step passes a multiple of this (Lightning's
  /// (step + 1) % n == 0), and at each epoch's end. Default: 100.
  TORCH_ARG(int64_t, flush_logs_every_n_steps) = 100;
};

std::ostream& operator<<(std::ostream& os, const CSVLoggerOptions& o);

/// Writes one CSV row per log_metrics call with columns step + the union of metric names;
/// when a new metric appears the file is rewritten (atomically) with the wider header.
class CSVLogger : public Logger {
 public:
  explicit CSVLogger(CSVLoggerOptions options);
  std::string name() const override { return "csv"; }
  std::string log_dir() override;
  int64_t version();
  void log_hyperparams(const std::map<std::string, std::string>& params) override;
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
  void rewrite_all();
  CSVLoggerOptions options_;
  int64_t version_ = -1;
  std::vector<std::string> columns_;  // metric names in header order (after "step")
  std::vector<Row> rows_;             // every row of this run (needed to rewrite the file)
  size_t flushed_ = 0;                // rows_[0, flushed_) are on disk
  bool header_dirty_ = false;
};

}  // namespace volt
