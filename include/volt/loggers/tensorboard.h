#pragma once
/// TensorBoardLogger: TensorFlow event files (TFRecord framing with masked CRC32C, Event and
/// Summary protobufs encoded by volt itself, no TensorFlow or protobuf dependency) under
/// save_dir/name/version_N/, with scalars and an hparams-plugin session.

#include <torch/arg.h>
#include <iosfwd>

#include <cstdint>
#include <fstream>
#include <map>
#include <string>

#include "volt/loggers/logger.h"

namespace volt {

struct TensorBoardLoggerOptions {
  explicit TensorBoardLoggerOptions(std::string save_dir) : save_dir_(std::move(save_dir)) {}
  /// Root folder of all runs (point `tensorboard --logdir` here).
  TORCH_ARG(std::string, save_dir);
  /// Experiment name (sub-folder). Default: "volt_logs".
  TORCH_ARG(std::string, name) = "volt_logs";
  /// Version number; -1 picks max(existing version_N) + 1. Default: -1.
  TORCH_ARG(int64_t, version) = -1;
  /// Put before every metric name, joined with "-" (Lightning's prefix and LOGGER_JOIN_CHAR):
  /// "fold1" logs train_loss as "fold1-train_loss". Default: "" (none).
  TORCH_ARG(std::string, prefix) = "";
  /// Log hp_metric = -1 at step 0 with the hyper-parameters (Lightning's default_hp_metric),
  /// so TensorBoard's HParams tab has a metric column before the run logs its own hp_metric.
  /// Default: true.
  TORCH_ARG(bool, default_hp_metric) = true;
  /// Buffered records are written to disk every this many log_metrics calls. Default: 10.
  TORCH_ARG(int64_t, flush_logs_every_n_steps) = 10;
  /// ... and at a log_metrics call this many seconds after the last write, so a run that logs
  /// rarely still shows up (SummaryWriter's flush_secs, which Lightning keeps). Default: 120.
  TORCH_ARG(double, flush_secs) = 120.0;
};

std::ostream& operator<<(std::ostream& os, const TensorBoardLoggerOptions& o);

/// Writes one Event per log_metrics call (a Summary with one simple_value per metric), the
/// hparams plugin's session-start summary and hparams.yaml (as CSVLogger's, every hparams logged so
/// far) on log_hyperparams (no experiment summary: TensorBoard
/// then builds the experiment from the runs, every scalar tag a metric column; one listing the
/// hparams alone would show no metric columns), and its session-end summary on finalize. A
/// resumed run appends a new events file in the same folder that starts with SessionLog START
/// at the resumed step: TensorBoard's Python event loader discards the killed run's records
/// after it; its Rust data server (the default since 2.5) ignores SessionLog and keeps them,
/// replacing a tag's point only where the resumed run logs the same step again.
class TensorBoardLogger : public Logger {
 public:
  explicit TensorBoardLogger(TensorBoardLoggerOptions options);
  ~TensorBoardLogger() override;
  std::string name() const override { return "tensorboard"; }
  std::string log_dir() override;
  int64_t version();
  /// version() as text.
  std::string version_name() override;
  /// save_dir/name.
  std::string root_dir() override;
  void log_hyperparams(const std::map<std::string, std::string>& params) override;
  void log_metrics(const Metrics& metrics, int64_t step) override;
  void save() override;
  void finalize(RunStatus status) override;
  void save_state(torch::serialize::OutputArchive& archive) const override;
  void load_state(torch::serialize::InputArchive& archive, int64_t step) override;
  /// Path of the events file being written (opened on first use).
  std::string events_path();

 private:
  void write_event(const std::string& event_bytes);
  void open_file();
  TensorBoardLoggerOptions options_;
  int64_t version_ = -1;
  std::string path_;
  std::ofstream file_;
  std::string pending_;  // framed records not yet written
  int64_t unflushed_ = 0;
  int64_t last_save_ns_ = 0;  // steady clock at the last write (0: none yet)
  int64_t resume_step_ = -1;  // >= 0: write SessionLog START at this step first
  bool hparams_logged_ = false;
  std::map<std::string, std::string> hparams_;  // every hparams logged so far (hparams.yaml)
};

/// The masked CRC32C of TFRecord framing: rotate right by 15, add 0xa282ead8.
uint32_t tfrecord_masked_crc32c(const void* data, size_t size);

}  // namespace volt
