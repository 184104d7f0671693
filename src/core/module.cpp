#include "volt/core/module.h"

#include <torch/torch.h>

#include <set>

#include "core/detail/default_steps.h"
#include "core/detail/tracing.h"
#include "core/detail/training_modes.h"
#include "volt/core/check.h"
#include "volt/core/log.h"

namespace volt {

void ManualOptimizer::zero_grad() {
  ctx_->manual_zero_grad(index_);
}
void ManualOptimizer::step() {
  ctx_->manual_step(index_);
}
void ManualOptimizer::count_step() {
  ctx_->manual_count_step(index_);
}
torch::optim::Optimizer& ManualOptimizer::optimizer() {
  return *ctx_->optimizer_configs().at(index_).optimizer();
}

at::Tensor Module::predict_step(const Batch& batch, int64_t batch_idx) {
  VOLT_CHECK(false, ConfigError,
             "[Module] predict() needs predict_step; override "
             "Module::predict_step(batch, batch_idx) in your module.");
  return {};
}

void Module::replace_configure_optimizers(
    std::function<std::vector<OptimizerConfig>(Module&)> make) {
  configure_optimizers_replacement_ = std::move(make);
}

std::vector<OptimizerConfig> Module::make_optimizers() {
  if (configure_optimizers_replacement_) return configure_optimizers_replacement_(*this);
  return configure_optimizers();
}

void Module::validation_step(const Batch& /*batch*/, int64_t /*batch_idx*/) {
  detail::DefaultSteps::mark(*this, detail::DefaultSteps::kValidationStep);
}

void Module::test_step(const Batch& /*batch*/, int64_t /*batch_idx*/) {
  detail::DefaultSteps::mark(*this, detail::DefaultSteps::kTestStep);
}

void Module::skip_rest_of_epoch() {
  VOLT_CHECK(batch_start_ != 0, ValueError,
             "[Module] skip_rest_of_epoch() was called outside the module's own "
             "on_train_batch_start; it ends the epoch's training before a batch (Lightning's "
             "on_train_batch_start returning -1), so call it from that hook "
             "(run()->request_stop() ends the whole fit from anywhere).");
  batch_start_ = 2;
}

void Module::backward(const at::Tensor& loss) {
  detail::DefaultSteps::mark(*this, detail::DefaultSteps::kBackward);
  loss.backward();
}

void Module::optimizer_step(int64_t /*epoch*/, int64_t /*batch_idx*/,
                            torch::optim::Optimizer& /*optimizer*/,
                            const std::function<bool()>& step) {
  detail::DefaultSteps::mark(*this, detail::DefaultSteps::kOptimizerStep);
  step();
}

Batch Module::transfer_batch_to_device(Batch batch, c10::Device /*device*/) {
  return require_run("transfer_batch_to_device").batch_to_device(batch);
}

void Module::optimizer_zero_grad(int64_t /*epoch*/, int64_t /*batch_idx*/,
                                 torch::optim::Optimizer& optimizer) {
  require_run("optimizer_zero_grad").zero_grad(optimizer);
}

void Module::configure_gradient_clipping(torch::optim::Optimizer& optimizer,
                                         c10::optional<double> gradient_clip_val,
                                         ClipAlgorithm gradient_clip_algorithm) {
  detail::DefaultSteps::mark(*this, detail::DefaultSteps::kGradientClipping);
  clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm);
}

void Module::lr_scheduler_step(LRScheduler& scheduler, c10::optional<double> metric) {
  require_run("lr_scheduler_step").step_lr_scheduler(scheduler, metric);
}

at::Tensor Module::clip_gradients(torch::optim::Optimizer& optimizer,
                                  c10::optional<double> gradient_clip_val,
                                  c10::optional<ClipAlgorithm> gradient_clip_algorithm) {
  return require_run("clip_gradients")
      .clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm);
}

// modules(false) lists the submodules depth first, each before its own submodules, and train(on)
// sets a module and everything below it: setting them in that order leaves each with its own
// recorded mode. (modules(true) would need a shared_ptr to this module, which a module on the
// stack has not.)
namespace detail {

std::vector<bool> training_modes(const torch::nn::Module& module) {
  std::vector<bool> modes{module.is_training()};
  for (const auto& sub : module.modules(/*include_self=*/false)) {
    modes.push_back(sub->is_training());
  }
  return modes;
}

void set_training_modes(torch::nn::Module& module, const std::vector<bool>& modes) {
  const auto subs = module.modules(/*include_self=*/false);
  if (modes.size() != subs.size() + 1) {
    module.train();
    return;
  }
  // In tree order: a module's train() also sets its children's, which come after it.
  module.train(modes[0]);
  for (size_t i = 0; i < subs.size(); ++i) subs[i]->train(modes[i + 1]);
}

}  // namespace detail

std::vector<bool> Module::training_modes() const {
  return detail::training_modes(*this);
}

void Module::set_training_modes(const std::vector<bool>& modes) {
  detail::set_training_modes(*this, modes);
}

void Module::save_training_modes() {
  saved_modes_ = training_modes();
}

void Module::restore_training_modes() {
  set_training_modes(saved_modes_);
}

RunContext& Module::require_run(const char* what) const {
  VOLT_CHECK(run_ != nullptr, ConfigError, "[Module] ", what,
             "() was called outside a Trainer run; call it from training_step or a hook.");
  return *run_;
}

namespace {

// Lightning's: not an error, so that a unit test can call a *_step method without a Trainer.
void warn_logging_without_run() {
  warn_once("Module.log_without_run", "Module",
            "log() was called outside a Trainer run (the module has not been given to a "
            "Trainer), so nothing is logged.");
}

}  // namespace

void Module::log(const std::string& name, const at::Tensor& value, const LogOptions& opts) {
  if (run_ == nullptr) return warn_logging_without_run();
  run_->log(name, value, opts);
}

void Module::log(const std::string& name, double value, const LogOptions& opts) {
  // A trace records the tensor made from the number as a constant: every replay would log
  // this call's value.
  VOLT_CHECK(!detail::tracing(), ValueError, "[Module] log(\"", name,
             "\", number) while the step is traced: the trace would log this value on every "
             "replay; log a tensor (e.g. the tensor the number came from) instead.");
  if (run_ == nullptr) return warn_logging_without_run();
  run_->log(name, torch::scalar_tensor(value, torch::kDouble), opts);
}

void Module::log_dict(const std::map<std::string, at::Tensor>& values, const LogOptions& opts) {
  if (run_ == nullptr) return warn_logging_without_run();
  for (const auto& [name, value] : values) run_->log(name, value, opts);
}

at::Tensor Module::all_gather(const at::Tensor& value, bool sync_grads) {
  VOLT_CHECK(value.defined(), ValueError,
             "[Module] all_gather() got an undefined tensor; pass a defined one.");
  return require_run("all_gather").all_gather(value, sync_grads);
}

int64_t Module::estimated_stepping_batches() const {
  return require_run("estimated_stepping_batches").estimated_stepping_batches();
}

void Module::toggle_optimizer(size_t index) {
  auto& configs = require_run("toggle_optimizer").optimizer_configs();
  VOLT_CHECK(index < configs.size(), ConfigError, "[Module] toggle_optimizer(", index,
             "): configure_optimizers returned ", configs.size(), " optimizer(s).");
  VOLT_CHECK(toggled_.empty(), ConfigError, "[Module] toggle_optimizer(", index,
             ") while another is toggled; call untoggle_optimizer first.");
  // Every parameter of every optimizer remembered with its setting; those not in the toggled
  // optimizer off.
  std::set<const void*> mine, seen;
  for (auto& group : configs[index].optimizer()->param_groups()) {
    for (auto& p : group.params()) mine.insert(p.unsafeGetTensorImpl());
  }
  for (auto& c : configs) {
    for (auto& group : c.optimizer()->param_groups()) {
      for (auto& p : group.params()) {
        if (!seen.insert(p.unsafeGetTensorImpl()).second) continue;
        toggled_.emplace_back(p, p.requires_grad());
        if (mine.count(p.unsafeGetTensorImpl()) == 0) p.set_requires_grad(false);
      }
    }
  }
}

void Module::untoggle_optimizer(size_t index) {
  auto& configs = require_run("untoggle_optimizer").optimizer_configs();
  VOLT_CHECK(index < configs.size(), ConfigError, "[Module] untoggle_optimizer(", index,
             "): configure_optimizers returned ", configs.size(), " optimizer(s).");
  for (auto& [p, on] : toggled_) p.set_requires_grad(on);
  toggled_.clear();
}

void Module::freeze() {
  for (auto& p : parameters()) p.set_requires_grad(false);
  eval();
}

void Module::unfreeze() {
  for (auto& p : parameters()) p.set_requires_grad(true);
  train();
}

void Module::manual_backward(const at::Tensor& loss) {
  require_run("manual_backward").manual_backward(loss);
}

std::vector<ManualOptimizer> Module::optimizers() {
  RunContext& run = require_run("optimizers");
  std::vector<ManualOptimizer> out;
  for (size_t i = 0; i < run.optimizer_configs().size(); ++i) out.emplace_back(&run, i);
  return out;
}

std::vector<std::shared_ptr<LRScheduler>> Module::lr_schedulers() {
  std::vector<std::shared_ptr<LRScheduler>> out;
  for (auto& c : require_run("lr_schedulers").optimizer_configs()) {
    if (c.scheduler()) out.push_back(c.scheduler());
  }
  return out;
}

Profiler& Module::profiler() {
  return require_run("profiler").profiler();
}

int64_t Module::current_epoch() const {
  return run_ ? run_->state().epoch : 0;
}
int64_t Module::global_step() const {
  return run_ ? run_->state().global_step : 0;
}
int64_t Module::dataloader_idx() const {
  return run_ ? run_->state().dataloader_idx : 0;
}

}  // namespace volt
