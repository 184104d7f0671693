#pragma once
/// ModelSummary: the table Lightning prints when fit starts (submodules with their types,
/// parameter counts and train/eval mode, then trainable, non-trainable and total parameters, the
/// parameters' size and how many modules are in each mode). `summarize` builds it for any
/// torch::nn::Module without a Trainer.

#include <torch/arg.h>

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "volt/callbacks/callback.h"

namespace torch::nn {
class Module;
}

namespace volt {

struct ModelSummaryOptions {
  /// Submodule depth shown: 1 = the model's direct children, -1 = every submodule, 0 = no
  /// summary. Default: 1 (Lightning's).
  TORCH_ARG(int64_t, max_depth) = 1;

 public:
  /// Throws ConfigError when max_depth < -1.
  void validate() const;
};

std::ostream& operator<<(std::ostream& os, const ModelSummaryOptions& o);

/// One submodule of a summary.
struct ModelSummaryRow {
  std::string name;    ///< dotted path from the model, e.g. "encoder.0"
  std::string type;    ///< class name without namespaces, e.g. "Linear"
  int64_t params = 0;  ///< elements of the parameters it and its children hold (shared ones once)
  bool training = true;
};

/// A model's summary: the rows up to max_depth and totals over the whole model, counting a
/// parameter shared by several submodules once.
struct ModelSummaryTable {
  std::string model_type;
  std::vector<ModelSummaryRow> rows;
  int64_t trainable_params = 0;      ///< elements of parameters with requires_grad
  int64_t non_trainable_params = 0;  ///< elements of frozen parameters
  int64_t total_params = 0;
  int64_t total_param_bytes = 0;  ///< the parameters' bytes in their own dtypes
  /// Parameters no row holds (registered on the model itself): Lightning's "other params" row.
  int64_t other_params = 0;
  int64_t modules_in_train_mode = 0;  ///< submodules in training mode (the model not counted)
  int64_t modules_in_eval_mode = 0;
};

/// Summarises `module` down to `max_depth` (-1: every submodule; 0: totals only). Parameters of
/// ZeRO stage 3 count with their full shapes (their storage may be partitioned).
ModelSummaryTable summarize(const torch::nn::Module& module, int64_t max_depth = 1);

/// Lightning's layout: an index column, Name, Type, Params ("101 K"), Mode (and an "other
/// params" row when the model holds parameters itself), a rule, then the totals, one per line.
/// Not shown: Lightning 2.6's FLOPs column and "Total Flops" line (zeros without an example
/// input; volt::measure_flops counts a whole model) and its In sizes / Out sizes columns.
std::string format_summary(const ModelSummaryTable& table);

/// Lightning's parameter count text: 0 -> "0", 999 -> "999", 1234 -> "1.2 K", 101770 -> "101 K",
/// 2.5e6 -> "2.5 M", then B and T.
std::string human_readable_count(int64_t count);

/// Logs the model's summary (info, rank 0) when fit starts, as Lightning's ModelSummary
/// callback. The Trainer adds one (max_depth 1) unless TrainerOptions::enable_model_summary is
/// false or the run has its own.
class ModelSummary : public Callback {
 public:
  explicit ModelSummary(ModelSummaryOptions options = {});
  std::string state_key() const override { return "ModelSummary"; }
  void on_fit_start(RunContext& run, Module& module) override;
  const ModelSummaryOptions& options() const { return options_; }

 private:
  ModelSummaryOptions options_;
};

}  // namespace volt
