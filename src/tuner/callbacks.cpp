// LearningRateFinder and BatchSizeFinder: lr_find and scale_batch_size called from an entry
// point's hooks, what they found put into the run (the optimizer's rate, the DataModule's size).
#include "volt/tuner/callbacks.h"

#include <torch/torch.h>

#include <functional>
#include <string>
#include <utility>

#include "core/detail/archive_values.h"
#include "core/detail/numbers.h"
#include "data/detail/module_data.h"
#include "tuner/detail/trial.h"
#include "volt/core/check.h"
#include "volt/core/log.h"
#include "volt/core/module.h"
#include "volt/core/optimizer_config.h"
#include "volt/data/data_loader.h"
#include "volt/data/data_module.h"
#include "volt/optim/lr_scheduler.h"
#include "volt/trainer/trainer_options.h"

namespace volt {

namespace {

constexpr const char* kLrTag = "[LearningRateFinder]";
constexpr const char* kLrComponent = "LearningRateFinder";

// Every param group of the fit's optimizers starts at `lr`: a scheduled optimizer's scheduler
// starts again from it (as if configure_optimizers had used it); groups it does not schedule and
// unscheduled optimizers take it as they are (Lightning sets every group's "lr").
void apply(RunContext& run, double lr) {
  for (OptimizerConfig& c : run.optimizer_configs()) {
    if (c.scheduler()) c.scheduler()->restart_at({lr});
    auto& groups = c.optimizer()->param_groups();
    const size_t scheduled = c.scheduler() ? c.scheduler()->base_lrs().size() : 0;
    for (size_t i = scheduled; i < groups.size(); ++i) groups[i].options().set_lr(lr);
  }
}

}  // namespace

LearningRateFinder::LearningRateFinder(LrFinderOptions options, bool update_attr)
    : options_(std::move(options)), update_attr_(update_attr) {
  options_.validate();
}

void LearningRateFinder::setup(RunContext& run, Module&, Stage stage) {
  if (stage != Stage::kFit) return;
  detail::check_trial_strategy(run, kLrTag, /*ddp=*/true);
  // A new fit searches again; a resumed one gets the checkpoint's state after this.
  done_ = false;
  result_ = LrFinderResult();
  optimal_lr_.reset();
}

void LearningRateFinder::on_fit_start(RunContext& run, Module& module) {
  if (done_) {
    if (optimal_lr_ && run.is_global_zero()) {
      auto s = detail::c_stream<std::ostringstream>();
      s << "the range test ran before this checkpoint (suggested " << *optimal_lr_
        << "); the resumed fit keeps its optimizer's rates.";
      log_info(kLrComponent, s.str());
    }
    return;
  }
  if (run.state().global_step > 0) {
    log_warning(kLrComponent, "skipped: the fit resumes at step " +
                                  std::to_string(run.state().global_step) +
                                  " from a checkpoint written without this callback; its rates "
                                  "stay as they are.");
    return;
  }
  // A DataModule's loader is asked for again: a BatchSizeFinder before this callback may have
  // changed its size (the fit's own loaders are rebuilt after these hooks).
  c10::optional<DataLoader> train;
  if (run.data_module() != nullptr) {
    train = run.data_module()->train_dataloader();
  } else if (run.train_dataloader() != nullptr) {
    train = *run.train_dataloader();
  }
  VOLT_CHECK(train.has_value(), InternalError, kLrTag, " fit started without a training loader.");
  {
    detail::KeepDevice keep(module);
    detail::keeping_run_precision(run, [&] {
      result_ = detail::lr_find_in_run(module, *train, run.data_module(),
                                       detail::run_trial_options(run), options_);
    });
  }
  done_ = true;
  if (result_.lrs.empty()) return;  // fast_dev_run: skipped, warned by lr_find
  optimal_lr_ = result_.suggestion();
  if (!optimal_lr_) return;  // lr_find said why
  if (!update_attr_) return;
  apply(run, *optimal_lr_);
  auto s = detail::c_stream<std::ostringstream>();
  s << "Learning rate set to " << *optimal_lr_ << ".";
  log_info(kLrComponent, s.str());
}

void LearningRateFinder::save_state(torch::serialize::OutputArchive& archive) const {
  archive.write("done", c10::IValue(done_));
  archive.write("mode", c10::IValue(static_cast<int64_t>(result_.mode)));
  archive.write("lrs", detail::double_list(result_.lrs));
  archive.write("losses", detail::double_list(result_.losses));
  archive.write("optimal_lr", optimal_lr_ ? c10::IValue(*optimal_lr_) : c10::IValue());
}

void LearningRateFinder::load_state(torch::serialize::InputArchive& archive) {
  c10::IValue done, mode, optimal;
  archive.read("done", done);
  archive.read("mode", mode);
  archive.read("optimal_lr", optimal);
  LrFinderResult result;
  result.mode = mode.toInt() == static_cast<int64_t>(LrFinderMode::kLinear)
                    ? LrFinderMode::kLinear
                    : LrFinderMode::kExponential;
  result.lrs = detail::read_double_list(archive, "lrs");
  result.losses = detail::read_double_list(archive, "losses");
  VOLT_CHECK(result.lrs.size() == result.losses.size(), CheckpointError, kLrTag,
             " the checkpoint holds ", result.lrs.size(), " rates and ", result.losses.size(),
             " losses; it is damaged: resume from another checkpoint.");
  done_ = done.toBool();
  result_ = std::move(result);
  optimal_lr_ = optimal.isNone() ? c10::nullopt : c10::optional<double>(optimal.toDouble());
}

namespace {

constexpr const char* kBsTag = "[BatchSizeFinder]";
constexpr const char* kBsComponent = "BatchSizeFinder";

}  // namespace

BatchSizeFinder::BatchSizeFinder(BatchSizeFinderOptions options) : options_(std::move(options)) {
  options_.validate();
}

void BatchSizeFinder::setup(RunContext& run, Module& module, Stage stage) {
  detail::check_trial_strategy(run, kBsTag, /*ddp=*/false);
  DataModule* data = run.data_module();
  VOLT_CHECK(data != nullptr, ConfigError, kBsTag, " the ", to_string(stage),
             " entry point was given loaders; the search builds loaders at the sizes it tries, so "
             "it needs a DataModule or the module's own loaders (override batch_size() and "
             "set_batch_size() there). Pass the data as a DataModule or drop the callback.");
  const bool own = dynamic_cast<const detail::ModuleData*>(data) != nullptr;
  VOLT_CHECK(data->batch_size().has_value(), ConfigError, kBsTag, " the ",
             own ? "module (whose loaders the run uses)" : "DataModule",
             " does not say its batch size; override ", own ? "Module" : "DataModule",
             "::batch_size() and set_batch_size(int64_t) so that the search can size its "
             "loaders.");
  if (stage == Stage::kFit) {
    fit_batch_size_.reset();  // a resumed fit gets the checkpoint's size after this
    return;
  }
  search(run, module, stage);  // before the entry point asks for its loader
}

void BatchSizeFinder::on_fit_start(RunContext& run, Module& module) {
  DataModule& data = *run.data_module();
  if (fit_batch_size_) {
    data.set_batch_size(*fit_batch_size_);
    optimal_batch_size_ = fit_batch_size_;
    log_info(kBsComponent, "batch size " + std::to_string(*fit_batch_size_) +
                               " from the checkpoint (searched when the fit began).");
    return;
  }
  if (run.state().global_step > 0) {
    log_warning(kBsComponent, "skipped: the fit resumes at step " +
                                  std::to_string(run.state().global_step) +
                                  " from a checkpoint written without this callback; the batch "
                                  "size stays " +
                                  std::to_string(*data.batch_size()) + ".");
    return;
  }
  search(run, module, Stage::kFit);
  if (result_.batch_size > 0) fit_batch_size_ = result_.batch_size;
}

void BatchSizeFinder::search(RunContext& run, Module& module, Stage stage) {
  BatchSizeFinderOptions o = options_;
  o.stage(stage);
  detail::KeepDevice keep(module);
  detail::keeping_run_precision(run, [&] {
    result_ = detail::scale_data_module(module, *run.data_module(), run.trainer_options(), o);
  });
  if (result_.batch_size > 0) optimal_batch_size_ = result_.batch_size;
}

void BatchSizeFinder::save_state(torch::serialize::OutputArchive& archive) const {
  archive.write("fit_batch_size", fit_batch_size_ ? c10::IValue(*fit_batch_size_) : c10::IValue());
}

void BatchSizeFinder::load_state(torch::serialize::InputArchive& archive) {
  c10::IValue size;
  archive.read("fit_batch_size", size);
  fit_batch_size_.reset();
  if (size.isNone()) return;
  VOLT_CHECK(size.isInt() && size.toInt() >= 1, CheckpointError, kBsTag,
             " the checkpoint's batch size is not a positive integer; it is damaged: resume "
             "from another checkpoint.");
  fit_batch_size_ = size.toInt();
}

}  // namespace volt
