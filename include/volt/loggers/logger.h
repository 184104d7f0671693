#pragma once
/// Logger: where metrics and hyper-parameters go.

#include <torch/serialize/archive.h>

#include <map>
#include <string>

#include "volt/core/types.h"

namespace volt {

/// Loggers receive already-reduced host values; they never read device tensors themselves.
class Logger {
 public:
  virtual ~Logger() = default;
  virtual std::string name() const = 0;
  /// The run folder this logger writes into (created on first use).
  virtual std::string log_dir() = 0;
  /// The run's version as text, Lightning's Logger.version ("3" for version_3); empty when the
  /// logger has none. The progress bar shows it as v_num.
  virtual std::string version_name() { return ""; }
  /// The folder of the runs' version folders (Lightning's root_dir: save_dir/name); empty when
  /// the logger has none.
  virtual std::string root_dir() { return ""; }
  virtual void log_hyperparams(const std::map<std::string, std::string>& params) = 0;
  virtual void log_metrics(const Metrics& metrics, int64_t step) = 0;
  /// Flushes buffered records to disk.
  virtual void save() {}
  /// Flushes and closes; `status` tells how the run ended.
  virtual void finalize(RunStatus status) { save(); }
  /// Checkpointed state (e.g. the version folder, so a resumed run keeps writing there).
  virtual void save_state(torch::serialize::OutputArchive& archive) const {}
  /// Restores state; `step` is the resumed global step (records after it may be dropped).
  virtual void load_state(torch::serialize::InputArchive& archive, int64_t step) {}
};

}  // namespace volt
